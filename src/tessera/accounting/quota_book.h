// File: tessera/accounting/quota_book.h
//
// QuotaBook: the namespace quota limits set by the ResourceQuota objects the informer holds,
// and the view that joins them with the ledger's usage (docs/quota.md). It keeps no usage of its
// own: Quota(ns, ledger) reads the namespace's usage from the ledger, which derives it from its
// records and reservations in the same step as the per-device usage, so quota usage cannot drift
// from what the audit and the resync check and repair.
//
// Its inputs are level-triggered like the ledger's: Upsert states an object's current spec.hard
// (replacing what was known under its namespace/name), Remove forgets it, Replace sets every
// object at once (after a LIST). A namespace's limits are recomputed from its objects on each
// change (schedule::CollectLimits: the smallest limit of all its objects holds), so an edit or a
// delete takes effect at the next filter.
//
//   QuotaBook book({.memory_name = "nvidia.com/gpumem", .cores_name = "nvidia.com/gpucores"});
//   book.Upsert(quota);                        // informer add/update
//   schedule::NamespaceQuota q = book.Quota("ml", ledger);   // under the decision lock
//
// Errors: none; a limit that is not a whole number is skipped (no limit, as HAMi) and listed in
// Skipped().
//
// Thread safety: internally synchronised; every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/base/mutex.h"
#include "tessera/kube/resource_quota.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/quota.h"

namespace tessera::accounting {

class QuotaBook {
 public:
  struct Options {
    std::string memory_name = "nvidia.com/gpumem";  // the vendor's memory resource
    std::string cores_name = "nvidia.com/gpucores";
    int32_t memory_factor = 1;
  };

  explicit QuotaBook(Options options);

  void Upsert(const kube::ResourceQuota& quota);
  void Remove(std::string_view ns, std::string_view name);
  void Replace(const std::vector<kube::ResourceQuota>& quotas);

  // The limits of `ns` (none: unlimited) with its usage read from `ledger`. Without limits the
  // ledger is not read. O(1) hash lookups.
  schedule::NamespaceQuota Quota(std::string_view ns, const ledger::Ledger& ledger) const;
  // The limits of `ns` only (usage fields zero).
  schedule::NamespaceQuota Limits(std::string_view ns) const;
  // Every namespace with a limit, sorted by namespace, usage zero (metrics join it with a
  // ledger snapshot).
  std::vector<schedule::NamespaceQuota> AllLimits() const;
  // The values skipped as not whole numbers, one line each (for logs and /debug).
  std::vector<std::string> Skipped() const;
  // The namespaces (sorted) where a limit rose or went after `*cursor` (0: since construction),
  // each change counted when it happened: a limit that came and went between two calls is
  // listed. Advances `*cursor`. One record per namespace ever loosened is kept.
  std::vector<std::string> LoosenedSince(uint64_t* cursor) const;

 private:
  struct Namespace {
    // object name -> the kept spec.hard entries (key, value)
    std::map<std::string, std::vector<std::pair<std::string, std::string>>> objects;
    schedule::NamespaceQuota limits;
    std::vector<std::string> skipped;
  };
  void RecomputeLocked(const std::string& ns, Namespace* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a loosening of `ns` when `after` allows more than `before`.
  void NoteLocked(const std::string& ns, const schedule::NamespaceQuota& before,
                  const schedule::NamespaceQuota& after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpsertLocked(const kube::ResourceQuota& quota) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  schedule::NamespaceQuota Empty(std::string_view ns) const;

  const Options options_;
  mutable Mutex mu_;
  std::map<std::string, Namespace, std::less<>> namespaces_ ABSL_GUARDED_BY(mu_);
  uint64_t loosenings_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t, std::less<>> loosened_at_ ABSL_GUARDED_BY(mu_);  // ns -> count
};

}  // namespace tessera::accounting

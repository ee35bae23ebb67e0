// File: tessera/accounting/auditor.h
//
// Auditor: the audit layer of the self-healing accounting. Run() rebuilds the ledger from the
// informer's pods, the registry's registrations and the live ledger's pinned decisions
// (Ledger::Recompute, the same rule as Ledger::Apply), compares it with the live ledger, repairs
// each differing pod through PodFeed::Reconcile, re-registers differing nodes, lists foreign
// allocations (bound pods another scheduler placed) and reports rewritten allocations (bound pods
// whose annotations no longer state the decision the ledger keeps).
//
//   Auditor auditor(&vendor, &ledger, &feed, pods_source, pod_by_uid, registrations);
//   AuditReport report = auditor.Run(clock->Now());
//
// Errors: none returned; differences are reported in the AuditReport. What counts as a
// correction, the race with deliveries, foreign allocations and the cost: docs/self-healing.md
// "The audit".
//
// Thread safety: Run may be called from any one thread at a time; last() from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

#include "tessera/accounting/pod_feed.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {

// A bound pod with an allocation that names another scheduler.
struct ForeignAllocation {
  std::string uid, ns, name;
  std::string scheduler;  // spec.schedulerName
  std::string node;       // spec.nodeName
};

struct AuditorOptions {
  // Our spec.schedulerName (--scheduler-name). Empty: no pod is foreign.
  std::string scheduler_name;
  // A bound pod's MIG reservation that the device plugin has not realised (ledger::MigProblemKind
  // kUnrealised) is reported once the audits have seen it for this long; the other problems are
  // reported at once.
  absl::Duration mig_realise_deadline = absl::Minutes(5);
  // Times each run (AuditReport::took); nullptr: the real clock. Must outlive the auditor.
  Clock* clock = nullptr;
};

// Every cause an AuditReport's corrections can name (described there).
inline constexpr std::array<std::string_view, 6> kAuditCauses = {
    "stale_record", "missing_record", "changed_record", "node", "usage", "quota"};

// A namespace whose quota usage (ledger::NamespaceUsage, what /filter checks quotas against)
// differed from the usage recomputed from the store.
struct QuotaCorrection {
  std::string ns;
  ledger::NamespaceUsage filter;  // what the live ledger held before the audit's repairs
  ledger::NamespaceUsage truth;   // recomputed from the store's pods and the reservations
  ledger::NamespaceUsage after;   // the live ledger after the repairs
};

struct AuditReport {
  absl::Time at = absl::InfinitePast();  // when it ran (InfinitePast: never)
  absl::Duration took;
  size_t pods = 0;   // pods in the informer's store
  size_t nodes = 0;  // registrations
  // Corrections by cause: "stale_record" (the ledger held a pod the store says holds nothing or
  // does not have), "missing_record" (the store's pod holds devices the ledger did not count),
  // "changed_record" (node, bound state or devices differ), "node" (a registration differs),
  // "usage" (device usage differs with no record difference: a ledger bug, counted and logged),
  // "quota" (a namespace's quota usage differed from the truth and the counted record or node
  // corrections changed it: one per namespace, beside the corrections that caused it).
  std::map<std::string, int64_t> corrections;
  // One line per correction (at most 100): the cause, the pod or node, the devices involved.
  std::vector<std::string> details;
  ledger::Problems problems;  // conflicts, orphans, unregistered holders, unreadable blockers
  std::vector<ForeignAllocation> foreign;  // sorted by uid
  // Every namespace whose quota usage differed, sorted by namespace (a difference the repairs
  // did not change, e.g. a delivery racing the audit, is listed but not counted).
  std::vector<QuotaCorrection> quota;
  // Of problems.rewritten, those the previous audit did not report with the same rewritten
  // value (the caller records an event for each), sorted by uid.
  std::vector<ledger::Rewritten> new_rewrites;
};

class Auditor {
 public:
  using PodSource = std::function<std::vector<std::shared_ptr<const kube::Pod>>()>;
  using PodByUid = std::function<std::shared_ptr<const kube::Pod>(std::string_view uid)>;
  using NodeSource = std::function<std::vector<std::shared_ptr<const device::NodeDevices>>()>;

  // Every pointer and function must outlive the auditor.
  Auditor(const device::Vendor* vendor, ledger::Ledger* ledger, PodFeed* feed, PodSource pods,
          PodByUid pod_by_uid, NodeSource registrations, AuditorOptions options = {});

  AuditReport Run(absl::Time now);
  AuditReport last() const;

 private:
  const device::Vendor* vendor_;
  ledger::Ledger* ledger_;
  PodFeed* feed_;
  PodSource pods_;
  PodByUid pod_by_uid_;
  NodeSource registrations_;
  const AuditorOptions options_;
  Clock* const clock_;

  mutable Mutex mu_;
  AuditReport last_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> foreign_seen_ ABSL_GUARDED_BY(mu_);  // uids already logged
  // When an audit first saw each unrealised MIG reservation (key: uid, card and text).
  absl::flat_hash_map<std::string, absl::Time> unrealised_since_ ABSL_GUARDED_BY(mu_);
  // The rewritten value the last audit reported, by uid.
  absl::flat_hash_map<std::string, ledger::Decision> rewritten_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::accounting

// File: tessera/accounting/pod_feed.h
//
// PodFeed: the "apply" layer of the self-healing accounting. Each delivery of the pod informer
// (add, update, delete, final-state-unknown tombstone) becomes one level-triggered ledger call
// through accounting::ProjectPodForLedger, the rule the audit's recomputation uses too.
//
//   PodFeed feed(&vendor, &ledger, clock, {.reservation_ttl = absl::Minutes(5)});
//   Informer<Pod> pods(&client, opts, feed.Handlers());
//
// Errors: none returned. An allocation that does not decode is applied as an `unreadable` record
// (fail closed), counted in stats().projection_errors and logged. The rules (uid changes,
// tombstones, re-reservation after a restart): docs/self-healing.md "The pod feed".
//
// Thread safety: the handlers run on the informer's worker thread; stats() may be called from
// any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {

struct PodFeedOptions {
  // The in-flight window of a filter decision (--reservation-ttl). Zero disables the
  // re-reservation of in-flight pods.
  absl::Duration reservation_ttl = absl::Minutes(5);
};

struct PodFeedStats {
  int64_t applied = 0;            // Ledger::Apply calls
  int64_t removed = 0;            // Ledger::Remove calls that found something
  int64_t tombstones = 0;         // final-state-unknown deletions seen
  int64_t uid_changes = 0;        // updates whose uid changed
  int64_t projection_errors = 0;  // pods whose allocation did not decode
  int64_t rereserved = 0;         // in-flight pods re-reserved (restart)
  std::string last_error;         // the latest projection or ledger error, for /debug
};

class PodFeed {
 public:
  // `vendor`, `ledger` and `clock` must outlive the feed.
  PodFeed(const device::Vendor* vendor, ledger::Ledger* ledger, Clock* clock,
          PodFeedOptions options = {});
  PodFeed(const PodFeed&) = delete;
  PodFeed& operator=(const PodFeed&) = delete;

  void OnAdd(const kube::Pod& pod, bool in_initial_list = false);
  void OnUpdate(const kube::Pod& old_pod, const kube::Pod& new_pod);
  void OnDelete(const kube::Pod& last, bool final_state_unknown);

  // Level-triggered repair (the audit's and the resync's): makes the ledger agree with
  // `current`, the pod of uid `uid` as the informer's store now holds it (nullptr: the store
  // has no such pod, so it is gone). Serialised with the handlers, so a repair never undoes a
  // newer delivery: a handler that runs after it applies its (newer) object again.
  void Reconcile(std::string_view uid, const kube::Pod* current);

  // Handlers for an Informer<Pod> that call the three methods above.
  kube::EventHandlers<kube::Pod> Handlers();

  PodFeedStats stats() const;

 private:
  void Observe(const kube::Pod& pod, bool in_initial_list);
  void NoteError(const std::string& message) ABSL_LOCKS_EXCLUDED(mu_);

  const device::Vendor* vendor_;
  ledger::Ledger* ledger_;
  Clock* clock_;
  const PodFeedOptions options_;

  // Serialises deliveries and repairs (held around each ledger update).
  Mutex apply_mu_;
  mutable Mutex mu_;
  PodFeedStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::accounting

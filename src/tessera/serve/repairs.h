// File: tessera/serve/repairs.h
//
// Repairs records what serve's self-healing layers repaired — the apply layer (tombstones, uid
// changes, reservations a relist no longer returns), the audit, the resync and reservation
// expiry — as totals since start and the latest 200 lines for /debug/audit, and counts the
// layers' reports in the metrics. What each layer repairs and why: docs/self-healing.md; the
// rules are the layers' own (accounting/auditor.h, accounting/resyncer.h), this class keeps
// their account.
//
// Errors: none. Thread safety: every method from any thread (the log has its own lock).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/resyncer.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/extender/event_recorder.h"
#include "tessera/extender/scheduler.h"
#include "tessera/kube/store.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/registry.h"

namespace tessera::serve {

class Repairs {
 public:
  // Both must outlive the object.
  Repairs(Clock* clock, metrics::Registry* metrics);

  // One line under `layer` ("apply", "audit", "resync" or "expiry"), stamped clock->Now().
  void Note(std::string_view layer, std::string what);
  // Adds `counts` to the totals of `layer`.
  void Count(std::string_view layer, const std::map<std::string, int64_t>& counts);

  // Ends the reservations made before `list_started` whose pod `pods` (which now reflects a
  // complete LIST taken after that time) does not have; counted under `layer` as
  // "absent_reservation".
  void ReleaseAbsentReservations(extender::Scheduler* scheduler, const kube::Store<kube::Pod>& pods,
                                 absl::Time list_started, std::string_view layer);
  // The reservations the housekeeping loop expired (no bind observed).
  void Expired(const std::vector<ledger::Reservation>& expired);
  // A resync pass's corrections.
  void Resynced(const accounting::ResyncReport& report);
  // An audit's corrections and problems; a leader also sends one event per new rewrite.
  void Audited(const accounting::AuditReport& report, bool leader, extender::EventRecorder* events);

  // The /debug/audit document: the last audit and resync, the ledger's problems, the totals
  // and the latest lines.
  std::string DebugAuditJson(const accounting::Auditor& auditor,
                             const accounting::Resyncer& resyncer, const ledger::Ledger& ledger,
                             absl::Duration audit_period, absl::Duration resync_period) const;

 private:
  struct Repair {
    absl::Time at;
    std::string layer;
    std::string what;
  };

  Clock* const clock_;
  metrics::Registry* const metrics_;
  mutable Mutex mu_;
  std::deque<Repair> recent_ ABSL_GUARDED_BY(mu_);  // newest last
  std::map<std::string, std::map<std::string, int64_t>> totals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::serve

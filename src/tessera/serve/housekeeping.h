// File: tessera/serve/housekeeping.h
//
// The housekeeping loop: every `period`, or at once when the node informer queues handshake
// writes, it follows the role (Leadership::Tick), writes the handshakes due (leader only),
// expires reservations, exports the informer and pending-pod metrics, logs the first sync, and
// every `audit_period` runs the audit (docs/serve.md "What runs inside", docs/self-healing.md).
//
// Inbox is what wakes the loop: the queued handshake writes and the stop, which also ends the
// pauses of a bind waiting for a node lock (so Stop does not wait out
// --node-lock-retry-timeout).
//
// Errors: none (each part logs its own). Thread safety: Inbox from any thread; Housekeeping's
// Start, Stop and the destructor from one thread, TrimAgain from any.
#pragma once

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "absl/time/time.h"

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/node_registry.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/extender/scheduler.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/informers.h"
#include "tessera/serve/leadership.h"
#include "tessera/serve/repairs.h"

namespace tessera::serve {

class Inbox {
 public:
  void Queue(std::vector<accounting::NodePatch> patches);
  // Waits up to `period` unless writes are queued or Stop has run; returns the queued writes
  // (maybe none), or nullopt once stopping.
  std::optional<std::vector<accounting::NodePatch>> Wait(absl::Duration period);
  // Sleeps `d`, less if Stop runs meanwhile.
  void Pause(absl::Duration d);
  bool stopping() const;
  // Wakes every waiter for good. Returns false if it had already run.
  bool Stop();

 private:
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<accounting::NodePatch> patches_ ABSL_GUARDED_BY(mu_);
};

class Housekeeping {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    Inbox* inbox = nullptr;
    Leadership* leadership = nullptr;
    accounting::NodeRegistry* registry = nullptr;
    extender::Scheduler* scheduler = nullptr;
    Informers* informers = nullptr;
    Repairs* repairs = nullptr;
    accounting::Auditor* auditor = nullptr;
    metrics::Registry* metrics = nullptr;
    Clock* clock = nullptr;
  };
  struct Options {
    absl::Duration period;
    absl::Duration audit_period;  // zero: no audit
    absl::Time started;           // for the "informers synced" line
  };
  Housekeeping(Parts parts, Options options);
  ~Housekeeping();  // Stop()

  // Starts the loop's thread.
  void Start();
  // Stops the inbox and waits for the loop to end. Idempotent.
  void Stop();
  // A large request was served: trim the allocator's free memory once more (base/allocator.h).
  void TrimAgain() { trim_again_.store(true); }

 private:
  void Loop();
  void Round(std::vector<accounting::NodePatch> patches);
  // tessera_pending_pods from the verdicts of the pods still pending (leader only).
  void UpdatePendingPods(bool leader);
  void AuditIfDue(absl::Time now, bool leader);

  const Parts parts_;
  const Options options_;
  std::atomic<bool> trim_again_{false};
  std::thread loop_;
  // Loop thread only.
  bool logged_synced_ = false;
  absl::Time next_audit_ = absl::InfinitePast();
};

}  // namespace tessera::serve

// File: tessera/serve/requeueing.h
//
// Requeueing: extender::Requeuer as serve runs it (docs/requeue.md) — a round every `period` on
// its own thread ("sched-requeue"), only while this replica leads and the informers have synced;
// the candidates are the leader's refused pods (its verdict writer) as the pod informer has them
// while pending; a replica that does not lead only keeps its view current. Each round's writes are
// counted in tessera_pending_pods_requeued_total.
//
// Errors: the requeuer's (logged). Thread safety: Start and Stop from one thread; the rest runs
// on the component's own thread.
#pragma once

#include <memory>

#include "absl/time/time.h"

#include "tessera/base/work_queue.h"
#include "tessera/extender/requeue.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/informers.h"
#include "tessera/serve/leadership.h"

namespace tessera::serve {

class Requeueing {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    const device::Vendor* vendor = nullptr;
    const ledger::Ledger* ledger = nullptr;
    const accounting::QuotaBook* quotas = nullptr;
    kube::ApiClient* client = nullptr;
    Clock* clock = nullptr;
    const extender::VerdictWriter* verdicts = nullptr;
    Informers* informers = nullptr;
    const Leadership* leadership = nullptr;
    metrics::Registry* metrics = nullptr;
  };
  Requeueing(extender::Requeuer::Options options, absl::Duration period, Parts parts);
  ~Requeueing();
  Requeueing(const Requeueing&) = delete;
  Requeueing& operator=(const Requeueing&) = delete;

  void Start();
  void Stop();

 private:
  absl::Duration Tick();

  const absl::Duration period_;
  const Parts parts_;
  extender::Requeuer requeuer_;
  uint64_t written_ = 0;  // requeues already counted in the metrics
  std::unique_ptr<WorkQueue> loop_;
};

}  // namespace tessera::serve

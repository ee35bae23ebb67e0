// File: tessera/serve/preempting.h
//
// Preempting: extender::SelfPreemptor as serve runs it with --preemption=self
// (docs/preemption.md "Before Kubernetes 1.38") — a round every `period` on its own thread
// ("sched-preempt"), only while this replica leads and the informers have synced; its evictions
// counted in tessera_preempt_evictions_total.
//
// Errors: the self-preemptor's (logged). Thread safety: Start and Stop from one thread; the rest
// runs on the loop.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/time/time.h"

#include "tessera/base/work_queue.h"
#include "tessera/extender/self_preempt.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/informers.h"
#include "tessera/serve/leadership.h"

namespace tessera::serve {

class Preempting {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    extender::SelfPreemptor* self = nullptr;
    Informers* informers = nullptr;
    const Leadership* leadership = nullptr;
    metrics::Registry* metrics = nullptr;
  };
  Preempting(absl::Duration period, Parts parts);
  ~Preempting();
  Preempting(const Preempting&) = delete;
  Preempting& operator=(const Preempting&) = delete;

  void Start();
  void Stop();

 private:
  absl::Duration Tick();

  const absl::Duration period_;
  const Parts parts_;
  extender::SelfPreemptor::Counts counted_;  // already in the metrics
  std::unique_ptr<WorkQueue> loop_;
};

}  // namespace tessera::serve

// File: tessera/sim/scheduler_events.h
//
// SchedulerEvents is the emulated kube-scheduler's watch in a `tessera simulate` run on apisim:
// pod and node informers whose events move the pods its queue keeps (SchedulingQueue), as
// kube-scheduler's event handlers do for a pod an extender refused (docs/requeue.md): any add,
// update or delete of an assigned pod and any node change that matters to scheduling moves every
// waiting pod; an update of a pending pod moves that pod. The events come from the API server,
// so a watch fault (dropped events) hides them here as it does from the scheduler under test.
//
// Errors: the informers retry the API themselves. Thread safety: Start, Stop and WaitForSync
// from the run's thread; `retry` is called from the informers' threads without the run book's
// mutex.
#pragma once

#include <functional>
#include <memory>

#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/objects.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

// What kube-scheduler's queue makes of a pod event (`before` null: an add; `after` null: a
// delete): nothing, a cluster event (every waiting pod moves), or an update of the pending pod
// itself (that pod moves). An update that changes nothing (the same resourceVersion) is nothing.
enum class PodEvent { kNone, kClusterEvent, kPodUpdated };
PodEvent ClassifyPodEvent(const kube::Pod* before, const kube::Pod* after);
// Whether a node update matters to scheduling (labels, annotations, allocatable,
// unschedulable, readiness); an add or a delete always does.
bool NodeUpdateMatters(const kube::Node& before, const kube::Node& after);

class SchedulerEvents {
 public:
  struct Options {
    const Scenario* scenario = nullptr;
    RunBook* book = nullptr;
    kube::ApiClient* client = nullptr;  // a connection of its own
    Clock* clock = nullptr;
    std::function<void(const SchedulingQueue::Now&)> retry;  // tries the pods now
  };
  explicit SchedulerEvents(Options options) : options_(std::move(options)) {}
  ~SchedulerEvents() { Stop(); }
  SchedulerEvents(const SchedulerEvents&) = delete;
  SchedulerEvents& operator=(const SchedulerEvents&) = delete;

  void Start();
  void Stop();
  // Whether both informers have listed, waiting up to `timeout` (events before that are in the
  // first list, not events).
  bool WaitForSync(absl::Duration timeout) const;
  // kube-scheduler's periodic flush of the pods that waited 5 minutes; call every 30 s.
  void Flush();
  // The backing-off pods due now (SchedulingQueue::Pump); call every 50 ms.
  void Pump();

 private:
  void ClusterEvent();
  void PodUpdated(const std::string& name);
  // Runs `step` on the queue under the run book's mutex and tries the pods it returns.
  void Move(const std::function<SchedulingQueue::Now(SchedulingQueue&, absl::Time)>& step);

  const Options options_;
  std::unique_ptr<kube::Informer<kube::Pod>> pods_;
  std::unique_ptr<kube::Informer<kube::Node>> nodes_;
};

}  // namespace tessera::sim

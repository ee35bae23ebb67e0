#include "tessera/sim/scheduler_events.h"

#include <string>
#include <utility>

namespace tessera::sim {

PodEvent ClassifyPodEvent(const kube::Pod* before, const kube::Pod* after) {
  if (before == nullptr || after == nullptr) {
    const kube::Pod* pod = before == nullptr ? after : before;
    return pod != nullptr && !pod->node_name.empty() ? PodEvent::kClusterEvent : PodEvent::kNone;
  }
  if (before->meta.resource_version == after->meta.resource_version) {
    return PodEvent::kNone;
  }
  if (!before->node_name.empty() || !after->node_name.empty()) {
    return PodEvent::kClusterEvent;  // a binding, or an update of an assigned pod
  }
  // The decoder keeps only HAMi's annotations, so a change of tessera.io/* shows only as a new
  // resourceVersion; the emulated scheduler writes no status to a pending pod.
  return PodEvent::kPodUpdated;
}

bool NodeUpdateMatters(const kube::Node& before, const kube::Node& after) {
  return before.meta.labels != after.meta.labels ||
         before.meta.annotations != after.meta.annotations ||
         before.allocatable != after.allocatable || before.unschedulable != after.unschedulable ||
         before.ready != after.ready;
}

void SchedulerEvents::Start() {
  const auto on_pod = [this](const kube::Pod* before, const kube::Pod* after) {
    switch (ClassifyPodEvent(before, after)) {
      case PodEvent::kClusterEvent:
        ClusterEvent();
        break;
      case PodEvent::kPodUpdated:
        PodUpdated(after->meta.name);
        break;
      case PodEvent::kNone:
        break;
    }
  };
  kube::Informer<kube::Pod>::Options po;
  po.name = "sim-scheduler";
  po.reflector.ns = options_.scenario->namespaces.empty() ? kNamespace : "";  // "": all
  kube::EventHandlers<kube::Pod> ph;
  ph.on_add = [on_pod](const kube::Pod& p, bool initial) {
    if (!initial) {
      on_pod(nullptr, &p);
    }
  };
  ph.on_update = [on_pod](const kube::Pod& a, const kube::Pod& b) { on_pod(&a, &b); };
  ph.on_delete = [on_pod](const kube::Pod& p, bool) { on_pod(&p, nullptr); };
  pods_ = std::make_unique<kube::Informer<kube::Pod>>(options_.client, po, std::move(ph));

  kube::Informer<kube::Node>::Options no;
  no.name = "sim-sched-nodes";
  kube::EventHandlers<kube::Node> nh;
  nh.on_add = [this](const kube::Node&, bool initial) {
    if (!initial) {
      ClusterEvent();
    }
  };
  nh.on_update = [this](const kube::Node& a, const kube::Node& b) {
    if (NodeUpdateMatters(a, b)) {
      ClusterEvent();
    }
  };
  nh.on_delete = [this](const kube::Node&, bool) { ClusterEvent(); };
  nodes_ = std::make_unique<kube::Informer<kube::Node>>(options_.client, no, std::move(nh));
  pods_->Start();
  nodes_->Start();
}

void SchedulerEvents::Stop() {
  if (pods_ != nullptr) {
    pods_->Stop();
  }
  if (nodes_ != nullptr) {
    nodes_->Stop();
  }
}

bool SchedulerEvents::WaitForSync(absl::Duration timeout) const {
  return pods_ != nullptr && pods_->WaitForSync(timeout) && nodes_->WaitForSync(timeout);
}

void SchedulerEvents::ClusterEvent() {
  Move([](SchedulingQueue& q, absl::Time now) { return q.ClusterEvent(now); });
}

void SchedulerEvents::PodUpdated(const std::string& name) {
  Move([&](SchedulingQueue& q, absl::Time now) { return q.PodUpdated(name, now); });
}

void SchedulerEvents::Flush() {
  Move([](SchedulingQueue& q, absl::Time now) { return q.Flush(now); });
}

void SchedulerEvents::Pump() {
  Move([](SchedulingQueue& q, absl::Time now) { return q.Pump(now); });
}

void SchedulerEvents::Move(
    const std::function<SchedulingQueue::Now(SchedulingQueue&, absl::Time)>& step) {
  SchedulingQueue::Now now;
  {
    MutexLock l(&options_.book->mutex);
    now = step(options_.book->queue, options_.clock->Now());
  }
  if (!now.empty()) {
    options_.retry(now);
  }
}

}  // namespace tessera::sim

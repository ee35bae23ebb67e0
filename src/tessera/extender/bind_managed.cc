// Scheduler::BindManaged: the bind of a pod this scheduler filtered, once Bind has checked the
// request: its decision, HAMi's node lock (node_lock.h), the devices re-check (bind_recheck.cc)
// and the Binding, which carries the bind-phase annotations.
#include <string>

#include <fmt/core.h>

#include "tessera/accounting/projection.h"
#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {

using internal::Message;

absl::StatusOr<NodeLockHolder> Scheduler::LockHolder(std::string_view ns, std::string_view name,
                                                     bool fresh) {
  auto state = [](const kube::Pod& pod, bool from_api) {
    NodeLockHolder h;
    h.terminal = pod.Terminal();
    h.running = pod.phase == kube::PodPhase::kRunning;
    h.node_name = pod.node_name;
    h.bind_phase = std::string(pod.meta.annotations.Get(device::kBindPhaseAnnotation));
    h.fresh = from_api;
    return h;
  };
  if (!fresh && lookup_) {
    if (std::optional<kube::Pod> pod = lookup_(ns, name)) {
      return state(*pod, false);
    }
  }
  absl::StatusOr<kube::Pod> pod = client_->GetPod(ns, name);
  if (pod.ok()) {
    return state(*pod, true);
  }
  if (absl::IsNotFound(pod.status())) {
    NodeLockHolder gone;
    gone.gone = true;
    gone.fresh = true;
    return gone;
  }
  return pod.status();
}

absl::Status Scheduler::PostBinding(const kube::Pod& pod, std::string_view node,
                                    const kube::ApiClient::Annotations& annotations,
                                    bool* bound_already) {
  constexpr int kPosts = 3;
  std::string version = pod.meta.resource_version;
  for (int post = 1;; ++post) {
    absl::Status b =
        client_->BindPod(pod.meta.ns, pod.meta.name, pod.meta.uid, node, annotations, version);
    if (b.ok() || !absl::IsAborted(b)) {
      return b;
    }
    absl::StatusOr<kube::Pod> now = client_->GetPod(pod.meta.ns, pod.meta.name);
    if (!now.ok() || now->meta.uid != pod.meta.uid || now->Deleting()) {
      return b;  // gone, recreated or being deleted: the 409 says it
    }
    if (!now->node_name.empty()) {
      *bound_already = true;
      return absl::AbortedError(fmt::format("pod {} is already assigned to node {} ({})", pod.Key(),
                                            now->node_name, Message(b)));
    }
    // The decision this bind checked is the one on the pod, or another scheduler replica (or a
    // newer filter) has decided again, or someone rewrote it: then this decision is not bound.
    for (std::string_view key :
         {device::kVgpuNodeAnnotation, device::kDevicesToAllocateAnnotation,
          device::kDevicesAllocatedAnnotation, device::kMigAllocationsAnnotation}) {
      if (now->meta.annotations.Get(key) != pod.meta.annotations.Get(key)) {
        return absl::FailedPreconditionError(fmt::format(
            "pod {} was filtered again since this bind read it: {} is now \"{}\" (another "
            "scheduler replica or a newer filter decided, or it was rewritten); not binding it "
            "to {}",
            pod.Key(), key, std::string(now->meta.annotations.Get(key)), node));
      }
    }
    if (post == kPosts) {
      return b;
    }
    version = now->meta.resource_version;
  }
}

absl::Status Scheduler::BindManaged(const kube::Pod& pod, const BindArgs& args,
                                    BindOutcome* outcome, bool* still_held) {
  const std::string& node = args.node;
  absl::StatusOr<ledger::PodAllocation> alloc = accounting::ProjectPod(*options_.vendor, pod);
  if (!alloc.ok()) {
    outcome->code = BindCode::kNoAllocation;
    return alloc.status();
  }
  if (alloc->node != node) {
    outcome->code = BindCode::kNoAllocation;
    return absl::FailedPreconditionError(
        alloc->node.empty()
            ? fmt::format("pod {} carries no {} annotation: it was not filtered by this scheduler",
                          pod.Key(), device::kVgpuNodeAnnotation)
            : fmt::format("pod {} was filtered to node {}, not {}", pod.Key(), alloc->node, node));
  }

  if (absl::Status decided = CheckDecided(pod, *alloc); !decided.ok()) {
    outcome->code = BindCode::kNoAllocation;
    return decided;
  }

  NodeLockOptions lock_options = options_.lock;
  lock_options.timeout = options_.node_lock_timeout;
  // Only max_lock_waiters binds at once may wait for a held lock (each holds an HTTP worker).
  const bool may_wait = lock_waiters_.fetch_add(1) < options_.max_lock_waiters;
  lock_options.wait = may_wait ? options_.node_lock_retry_timeout : absl::ZeroDuration();
  const absl::Time t_lock = clock_->Now();
  absl::StatusOr<NodeLockResult> lock =
      AcquireNodeLockWaiting(client_, node, pod.meta.ns, pod.meta.name, *clock_, lock_options,
                             [this](std::string_view ns, std::string_view name, bool fresh) {
                               return LockHolder(ns, name, fresh);
                             });
  lock_waiters_.fetch_sub(1);
  if (!lock.ok()) {
    const bool held = absl::IsAborted(lock.status());
    outcome->code = held ? BindCode::kLockHeld : BindCode::kLockError;
    outcome->lock_wait = held && lock_options.wait > absl::ZeroDuration();  // and timed out
    return lock.status();
  }
  outcome->lock = lock->outcome;
  outcome->lock_version = lock->resource_version;
  outcome->lock_conflicts = lock->conflicts;
  if (lock->refusals > 0) {
    outcome->lock_wait = true;
    outcome->lock_waited = lock->waited;
  }
  if (lock->outcome != NodeLockOutcome::kAcquired && lock->took) {
    TESSERA_LOG(kInfo, "node {}: lock \"{}\" taken over for {} ({})", node, lock->previous,
                pod.Key(), NodeLockOutcomeName(lock->outcome));
  }
  // A failure releases the lock only if this bind took it: a lock that was already the pod's
  // belongs to an earlier bind of it (kube-scheduler retried), which the device plugin needs.
  auto unlock = [&] {
    if (!lock->took) {
      return;
    }
    absl::Status released =
        ReleaseNodeLock(client_, node, pod.meta.ns, pod.meta.name, lock_options);
    if (!released.ok()) {
      TESSERA_LOG(kWarning, "node {}: releasing the lock of {} failed: {}", node, pod.Key(),
                  Message(released));
    }
  };

  const absl::Time t_recheck = clock_->Now();
  if (absl::Status free = Recheck(pod, node, alloc->devices, alloc->init_count, alloc->mig);
      !free.ok()) {
    unlock();
    outcome->code = BindCode::kDevicesNotFree;
    return free;
  }
  // HAMi patches bind-phase=allocating and bind-time, then posts the Binding. The Binding
  // carries them instead: the API server merges its annotations into the pod in the write that
  // sets spec.nodeName, so the device plugin (which lists the pods of its node) sees both at
  // once, a failed binding leaves no "allocating" pod behind, and a bind costs one API write
  // (and one watch event) less. docs/compatibility.md.
  const absl::Time now = clock_->Now();
  const kube::ApiClient::Annotations phase = {
      {std::string(device::kBindPhaseAnnotation), std::string(device::kBindPhaseAllocating)},
      {std::string(device::kBindTimeAnnotation), std::to_string(absl::ToUnixSeconds(now))}};
  const absl::Time t_binding = clock_->Now();
  bool bound_already = false;
  if (absl::Status b = PostBinding(pod, node, phase, &bound_already); !b.ok()) {
    unlock();
    outcome->code = BindCode::kBindingRejected;
    if (bound_already) {
      // A 409 because the pod is bound already (a duplicate bind, or someone else's): its
      // devices are in use, so the reservation holds them until the informer observes the
      // binding (or bound_hold passes), as after a binding of our own.
      MutexLock l(&decide_mu_);
      if (auto it = binding_.find(pod.meta.uid); it != binding_.end()) {
        it->second = clock_->Now();
        *still_held = true;
      }
    }
    return b;
  }
  {
    // Bound: the reservation holds the devices until the informer observes it.
    MutexLock l(&decide_mu_);
    if (auto it = binding_.find(pod.meta.uid); it != binding_.end()) {
      it->second = clock_->Now();
    }
  }
  TESSERA_VLOG(2, "bind {} to {}: lock {}, re-check {}, binding {}", pod.Key(), node,
               absl::FormatDuration(t_recheck - t_lock),
               absl::FormatDuration(t_binding - t_recheck),
               absl::FormatDuration(clock_->Now() - t_binding));
  return absl::OkStatus();
}

}  // namespace tessera::extender

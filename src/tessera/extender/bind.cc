// Scheduler::Bind (docs/serve.md "Filter and bind"): the request's checks and refusals, the one
// bind per pod at a time, the wait for the filter's patch and the pod's lookup. The bind of a pod
// that passes them is BindManaged (bind_managed.cc).
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include <fmt/core.h>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {

using internal::Message;

std::string_view BindCodeName(BindCode code) {
  switch (code) {
    case BindCode::kBound:
      return "bound";
    case BindCode::kInProgress:
      return "in_progress";
    case BindCode::kPodNotFound:
      return "pod_not_found";
    case BindCode::kNotOurs:
      return "not_ours";
    case BindCode::kNodeUnregistered:
      return "node_unregistered";
    case BindCode::kNoAllocation:
      return "no_allocation";
    case BindCode::kLockHeld:
      return "lock_held";
    case BindCode::kLockError:
      return "lock_error";
    case BindCode::kDevicesNotFree:
      return "devices_not_free";
    case BindCode::kPatchFailed:
      return "patch_failed";
    case BindCode::kBindingRejected:
      return "binding_rejected";
    case BindCode::kError:
      return "error";
  }
  return "error";
}

absl::StatusOr<kube::Pod> Scheduler::FindPod(std::string_view ns, std::string_view name) {
  if (lookup_) {
    std::optional<kube::Pod> pod = lookup_(ns, name);
    if (pod) {
      return *std::move(pod);
    }
  }
  return client_->GetPod(ns, name);
}

BindResult Scheduler::Bind(const BindArgs& args, BindOutcome* outcome) {
  BindResult result;
  BindOutcome local;
  BindOutcome& out = outcome != nullptr ? *outcome : local;
  out = BindOutcome();
  kube::Pod subject;  // the event's involved object until the pod is known
  subject.meta.ns = args.pod_namespace;
  subject.meta.name = args.pod_name;
  subject.meta.uid = args.pod_uid;
  // A failure releases the pod's reservation; a refusal (the request names a pod or node that
  // is not ours to bind, or one another bind is handling) changes nothing.
  auto finish = [&](const kube::Pod& pod, BindCode code, const absl::Status& s, bool release) {
    if (release) {
      MutexLock l(&decide_mu_);
      if (!pod.meta.uid.empty()) {
        ledger_->Release(pod.meta.uid);
        binding_.erase(pod.meta.uid);
      }
      if (!args.pod_uid.empty() && args.pod_uid != pod.meta.uid) {
        ledger_->Release(args.pod_uid);
        binding_.erase(args.pod_uid);
      }
    }
    result.error = Message(s);
    events_.Record(pod.meta, "BindingFailed", result.error, EventType::kWarning);
    out.code = code;
    TESSERA_VLOGS(1, "bind", "pod", fmt::format("{}/{}", args.pod_namespace, args.pod_name), "node",
                  args.node, "outcome", BindCodeName(code), "err", result.error);
    return result;
  };
  auto fail = [&](const kube::Pod& pod, BindCode code, const absl::Status& s) {
    return finish(pod, code, s, /*release=*/true);
  };
  auto refuse = [&](const kube::Pod& pod, BindCode code, const absl::Status& s) {
    return finish(pod, code, s, /*release=*/false);
  };
  if (!kube::IsDnsSubdomain(args.pod_name) || !kube::IsDnsLabel(args.pod_namespace) ||
      !kube::IsDnsSubdomain(args.node)) {
    // The HTTP layer refuses these (DecodeBindArgs); no API path is built from them here either,
    // and no event, which would have no pod to name.
    result.error = fmt::format("bind of pod \"{}/{}\" to node \"{}\": not valid Kubernetes names",
                               absl::CEscape(args.pod_namespace), absl::CEscape(args.pod_name),
                               absl::CEscape(args.node));
    out.code = BindCode::kError;
    return result;
  }

  const std::string key = args.pod_namespace + "/" + args.pod_name;
  {
    MutexLock l(&decide_mu_);
    if (!binds_in_flight_.insert(key).second) {
      return refuse(
          subject, BindCode::kInProgress,
          absl::AbortedError(fmt::format(
              "a bind of pod {} is already in progress; this duplicate changes nothing", key)));
    }
  }
  struct InFlight {
    Scheduler* self;
    const std::string& key;
    const BindArgs& args;
    const BindOutcome& out;
    ~InFlight() {
      // Bound, the node is busy with the lock the bind took (busy_nodes.h); else no longer.
      if (out.code == BindCode::kBound) {
        self->busy_.Bound(args.pod_uid, args.node, out.lock_version,
                          self->clock_->Now() + self->options_.busy_after_bind);
      } else {
        self->busy_.Ended(args.pod_uid);
      }
      MutexLock l(&self->decide_mu_);
      self->binds_in_flight_.erase(key);
    }
  } in_flight{this, key, args, out};

  // The filter's patch, written behind its reply: it must have landed, and the pod it
  // returned is the freshest copy there is (no GET needed).
  std::optional<kube::Pod> from_patch;
  if (!args.pod_uid.empty()) {
    if (std::optional<PatchWriter::Landed> landed = patches_.Take(args.pod_uid)) {
      if (!landed->done) {
        return fail(
            subject, BindCode::kError,
            absl::DeadlineExceededError(fmt::format(
                "the filter's annotation patch of {}/{} is still in flight after {}",
                args.pod_namespace, args.pod_name, absl::FormatDuration(options_.patch_wait))));
      }
      if (!landed->status.ok()) {
        return fail(subject, BindCode::kPatchFailed, landed->status);
      }
      from_patch = std::move(landed->pod);
    }
  }
  absl::StatusOr<kube::Pod> pod = from_patch ? absl::StatusOr<kube::Pod>(*std::move(from_patch))
                                             : FindPod(args.pod_namespace, args.pod_name);
  if (!pod.ok()) {
    return fail(subject, absl::IsNotFound(pod.status()) ? BindCode::kPodNotFound : BindCode::kError,
                pod.status());
  }
  // A cached copy may predate the filter's patch or belong to an earlier pod of the same name.
  const bool stale = (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) ||
                     pod->meta.annotations.Get(device::kVgpuNodeAnnotation) != args.node;
  if (stale && lookup_) {
    absl::StatusOr<kube::Pod> fresh = client_->GetPod(args.pod_namespace, args.pod_name);
    if (!fresh.ok()) {
      return fail(subject,
                  absl::IsNotFound(fresh.status()) ? BindCode::kPodNotFound : BindCode::kError,
                  fresh.status());
    }
    pod = std::move(fresh);
  }
  if (!args.pod_uid.empty() && pod->meta.uid != args.pod_uid) {
    return fail(subject, BindCode::kPodNotFound,
                absl::NotFoundError(fmt::format("pod {}/{} has uid {}, not {}: it was recreated",
                                                args.pod_namespace, args.pod_name, pod->meta.uid,
                                                args.pod_uid)));
  }
  // Only Tessera's pods, on nodes it knows, are bound here (kube-scheduler binds the rest: the
  // scheduler configuration's managedResources send only pods asking for a managed device).
  if (!options_.scheduler_name.empty() && pod->scheduler_name != options_.scheduler_name) {
    return refuse(
        *pod, BindCode::kNotOurs,
        absl::FailedPreconditionError(fmt::format(
            "pod {} names scheduler \"{}\", not \"{}\": this extender binds only its own pods",
            pod->Key(), pod->scheduler_name, options_.scheduler_name)));
  }
  absl::StatusOr<device::PodRequest> request = options_.vendor->DecodeRequest(*pod);
  if (!request.ok()) {
    return refuse(*pod, BindCode::kError, request.status());
  }
  if (request->Empty()) {
    return refuse(*pod, BindCode::kNotOurs,
                  absl::FailedPreconditionError(fmt::format(
                      "pod {} asks for no device this scheduler manages: kube-scheduler binds it "
                      "(list the device resources in the extender's managedResources)",
                      pod->Key())));
  }
  if (!pod->node_name.empty()) {
    return refuse(*pod, BindCode::kBindingRejected,
                  absl::FailedPreconditionError(fmt::format("pod {} is already assigned to node {}",
                                                            pod->Key(), pod->node_name)));
  }
  if (pod->Deleting()) {
    return refuse(*pod, BindCode::kBindingRejected,
                  absl::FailedPreconditionError(
                      fmt::format("pod {} is being deleted: it cannot be bound", pod->Key())));
  }
  if (std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({args.node});
      !snap[0] || !snap[0]->devices) {
    return refuse(*pod, BindCode::kNodeUnregistered,
                  absl::FailedPreconditionError(fmt::format(
                      "node {} is not registered: it has no device registration this scheduler "
                      "can read, so it binds no pod there",
                      args.node)));
  }
  bool still_held = false;
  if (absl::Status bound = BindManaged(*pod, args, &out, &still_held); !bound.ok()) {
    return finish(*pod, out.code, bound, /*release=*/!still_held);
  }
  events_.Record(pod->meta, "BindingSucceed",
                 fmt::format("Successfully binding node [{}] to {}/{}", args.node, pod->meta.ns,
                             pod->meta.name),
                 EventType::kNormal);
  out.code = BindCode::kBound;
  verdicts_.Forget(pod->meta.uid);  // scheduled: no longer pending
  TESSERA_VLOGS(2, "bind", "pod", pod->Key(), "node", args.node, "devices",
                pod->meta.annotations.Get(device::kDevicesAllocatedAnnotation), "outcome", "bound");
  return result;
}

}  // namespace tessera::extender

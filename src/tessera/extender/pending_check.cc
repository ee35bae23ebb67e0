// Filter step 2 (docs/serve.md "Filter and bind"): the request's pod must be the stored pod of
// its name, and pending. Scheduler::CheckPending, and the rule it and the patch writer share.
#include <optional>
#include <string>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {

namespace internal {

absl::Status NotPending(const kube::Pod& pod) {
  if (!pod.node_name.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} is already bound to node {}: only a pending pod can be filtered",
                    pod.Key(), pod.node_name));
  }
  if (pod.Deleting()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} is being deleted: only a pending pod can be filtered", pod.Key()));
  }
  if (pod.Terminal()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} has finished (phase {}): only a pending pod can be filtered", pod.Key(),
                    kube::PodPhaseName(pod.phase)));
  }
  return absl::OkStatus();
}

}  // namespace internal

using internal::Message;
using internal::NotPending;

absl::StatusOr<std::string> Scheduler::CheckPending(const kube::Pod& claimed,
                                                    std::optional<kube::Pod>* stored) {
  TESSERA_RETURN_IF_ERROR(NotPending(claimed));
  std::optional<kube::Pod>& current = *stored;
  if (!current || current->meta.uid != claimed.meta.uid) {
    // Not cached, or the cache holds another pod of that name: ask the API server.
    absl::StatusOr<kube::Pod> got = client_->GetPod(claimed.meta.ns, claimed.meta.name);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          fmt::format("pod {}: {}", claimed.Key(), Message(got.status())));
    }
    current = *std::move(got);
  }
  if (current->meta.uid != claimed.meta.uid) {
    return absl::FailedPreconditionError(
        fmt::format("pod {} has uid {}, not {}: the request names a pod that no longer exists",
                    claimed.Key(), current->meta.uid, claimed.meta.uid));
  }
  TESSERA_RETURN_IF_ERROR(NotPending(*current));
  return current->meta.resource_version;
}

}  // namespace tessera::extender

// Scheduler::Refit: the NUMA refit's decision (refit.h; rules 1-8 in docs/serve.md "NUMA
// refit", after HAMi refs/pull/2731 pkg/scheduler/numa_refit_handler.go:RefitNumaAllocation).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fmt/format.h"

#include "tessera/base/logging.h"
#include "tessera/device/codec.h"
#include "tessera/device/codec_internal.h"  // Quote: Go's %q for printable ASCII
#include "tessera/extender/refit.h"
#include "tessera/extender/scheduler.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {
namespace {

// HAMi's AllowedSetUnmatched: no card of the type is in the allowed set.
constexpr std::string_view kAllowedSetUnmatched = "AllowedDeviceSetUnmatched";

RefitResponse Refused(std::string reason) {
  TESSERA_VLOGS(2, "refit", "outcome", "refused", "reason", reason);
  return RefitResponse{
      .succeeded = false, .container_devices = {}, .failure_reason = std::move(reason)};
}

// The name of the container at allocation index `index` (init containers first).
std::optional<std::string> ContainerNameAt(const kube::Pod& pod, int64_t index) {
  if (index < 0) {
    return std::nullopt;
  }
  const auto i = static_cast<uint64_t>(index);
  if (i < pod.init_containers.size()) {
    return pod.init_containers[i].name;
  }
  if (i - pod.init_containers.size() < pod.containers.size()) {
    return pod.containers[i - pod.init_containers.size()].name;
  }
  return std::nullopt;
}

// `node` cut down to the devices in `allowed` (node order kept), with the usage of `current`
// (the container's own reservation) taken off its cards, clamped at zero as HAMi's
// releaseContainerUsage does.
device::NodeSnapshot Restrict(const device::NodeSnapshot& node,
                              const absl::flat_hash_set<std::string>& allowed,
                              const device::ContainerDevices& current) {
  auto devices = std::make_shared<device::NodeDevices>();
  devices->node = node.devices->node;
  devices->format = node.devices->format;
  devices->cordoned = node.devices->cordoned;
  device::NodeSnapshot out;
  for (size_t i = 0; i < node.devices->devices.size(); ++i) {
    const device::DeviceInfo& info = node.devices->devices[i];
    if (!allowed.contains(info.id)) {
      continue;
    }
    device::DeviceUsage usage = node.usage[i];
    for (const device::ContainerDevice& d : current) {
      if (d.uuid == info.id) {
        usage.used = std::max(usage.used - 1, 0);
        usage.usedmem = std::max<int64_t>(usage.usedmem - d.usedmem, 0);
        usage.usedcores = std::max<int64_t>(usage.usedcores - d.usedcores, 0);
      }
    }
    devices->devices.push_back(info);
    out.usage.push_back(usage);
  }
  out.devices = std::move(devices);
  return out;
}

}  // namespace

RefitResponse Scheduler::Refit(const RefitRequest& req) {
  // Rule 1: the request itself.
  if (req.pod_uid.empty() || req.pod_namespace.empty() || req.pod_name.empty() ||
      req.node_name.empty()) {
    return Refused("incomplete refit request: pod UID, namespace, name, and node are required");
  }
  if (req.allowed_device_uuids.empty()) {
    return Refused("refit request carries an empty allowed device set");
  }
  if (req.allowed_device_uuids.size() > kMaxRefitAllowedDevices) {
    return Refused(fmt::format("refit request carries {} allowed devices, limit is {}",
                               req.allowed_device_uuids.size(), kMaxRefitAllowedDevices));
  }
  if (req.device_type != options_.vendor->Key()) {
    return Refused(fmt::format("unknown device type {}", device::internal::Quote(req.device_type)));
  }
  // The pod as the API server has it now: its allocation annotations and the resourceVersion
  // the patch is conditioned on (the informer's copy may trail the plugin's own writes). Read
  // before the decision lock, so that no API read holds up /filter.
  absl::StatusOr<kube::Pod> fresh = client_->GetPod(req.pod_namespace, req.pod_name);
  if (!fresh.ok() && !absl::IsNotFound(fresh.status())) {
    return Refused(fmt::format("cannot read pod {}/{}: {}", req.pod_namespace, req.pod_name,
                               std::string(fresh.status().message())));
  }

  // Rule 2: the decision lock /filter holds, across snapshot, fit, patch and ledger move.
  MutexLock l(&decide_mu_);
  // Rule 3: tracked, and the same pod.
  const std::optional<ledger::Held> held = ledger_->Find(req.pod_uid);
  if (!held.has_value()) {
    return Refused(fmt::format("pod {} is not tracked by the scheduler", req.pod_uid));
  }
  if (held->ns != req.pod_namespace || held->name != req.pod_name) {
    return Refused(
        fmt::format("pod {} does not match {}/{}", req.pod_uid, req.pod_namespace, req.pod_name));
  }
  if (!fresh.ok() || fresh->meta.uid != req.pod_uid) {
    return Refused(fmt::format("pod {} is not tracked by the scheduler", req.pod_uid));
  }
  const kube::Pod& pod = *fresh;
  auto fail = [&](std::string reason) {
    events_.Record(pod.meta, kNumaRefitFailedReason, reason, EventType::kWarning);
    return Refused(std::move(reason));
  };
  if (held->node != req.node_name) {
    return fail(fmt::format("pod {}/{} is tracked on node {}, not {}", pod.meta.ns, pod.meta.name,
                            held->node, req.node_name));
  }
  const std::optional<std::string> name = ContainerNameAt(pod, req.container_index);
  if (!name.has_value()) {
    return fail(
        fmt::format("container index {} is outside the pod's containers", req.container_index));
  }
  if (!req.container_name.empty() && *name != req.container_name) {
    return fail(fmt::format("container index {} is {}, not {}", req.container_index,
                            device::internal::Quote(*name),
                            device::internal::Quote(req.container_name)));
  }

  // Rule 4: the container's entries, not yet consumed by the plugin, in both annotations.
  const std::string_view to_allocate_raw =
      pod.meta.annotations.Get(options_.vendor->ToAllocateAnnotation());
  const std::string_view allocated_raw =
      pod.meta.annotations.Get(options_.vendor->AllocatedAnnotation());
  absl::StatusOr<device::PodDevices> pending = device::DecodePodDevices(to_allocate_raw);
  if (!pending.ok()) {
    return fail(fmt::format("cannot decode pending allocation annotation: {}",
                            std::string(pending.status().message())));
  }
  absl::StatusOr<device::PodDevices> allocated = device::DecodePodDevices(allocated_raw);
  if (!allocated.ok()) {
    return fail(fmt::format("cannot decode allocated annotation: {}",
                            std::string(allocated.status().message())));
  }
  const auto index = static_cast<size_t>(req.container_index);  // >= 0: ContainerNameAt
  if (index >= pending->size() || (*pending)[index].empty()) {
    return fail(fmt::format("container {} has no pending {} allocation to refit",
                            req.container_index, req.device_type));
  }
  if (index >= allocated->size() || (*allocated)[index].empty()) {
    return fail(fmt::format("container {} has no recorded {} allocation", req.container_index,
                            req.device_type));
  }
  const device::ContainerDevices current = (*allocated)[index];

  // Rule 5: already inside the allowed set: nothing to do.
  const absl::flat_hash_set<std::string> allowed(req.allowed_device_uuids.begin(),
                                                 req.allowed_device_uuids.end());
  if (std::all_of(current.begin(), current.end(),
                  [&](const device::ContainerDevice& d) { return allowed.contains(d.uuid); })) {
    TESSERA_VLOGS(2, "refit", "pod", pod.Key(), "container", req.container_index, "outcome",
                  "already inside the allowed set");
    return RefitResponse{.succeeded = true,
                         .container_devices = EncodeContainerDevices(current),
                         .failure_reason = {}};
  }
  // Rule 6: one amount per device, and no MIG.
  for (const device::ContainerDevice& d : current) {
    if (d.usedmem != current[0].usedmem || d.usedcores != current[0].usedcores) {
      return fail(fmt::format(
          "container {} reserves differing amounts per device; the refit does not support "
          "heterogeneous reservations",
          req.container_index));
    }
  }
  std::vector<std::optional<device::NodeSnapshot>> snapshots =
      ledger_->Snapshot({std::string_view(req.node_name)});
  if (!snapshots[0].has_value()) {
    return fail(fmt::format("node {} unavailable: {}", req.node_name, schedule::kNodeUnregistered));
  }
  const device::NodeSnapshot& node = *snapshots[0];
  if (!node.blocked_by.empty()) {
    return fail(fmt::format("node {} unavailable: {}", req.node_name,
                            schedule::NodeBlockedReason(node.blocked_by)));
  }
  for (const device::DeviceInfo& info : node.devices->devices) {
    if (allowed.contains(info.id) && info.mode == "mig") {
      return fail(fmt::format(
          "allowed device {} is in MIG mode; the NUMA refit does not support MIG", info.id));
    }
  }

  // Rule 7: the normal fit of this container alone, on the allowed cards, with its own
  // reservation taken off; the pod's other containers stay in the node's usage.
  absl::StatusOr<device::PodConstraints> constraints = options_.vendor->DecodeConstraints(pod);
  if (!constraints.ok()) {
    return fail(fmt::format("cannot read the pod's scheduling annotations: {}",
                            std::string(constraints.status().message())));
  }
  const device::NodeSnapshot restricted = Restrict(node, allowed, current);
  if (restricted.devices->devices.empty()) {
    return fail(fmt::format("no allowed device fits: {}", kAllowedSetUnmatched));
  }
  device::ContainerRequest want;
  want.nums = static_cast<int32_t>(current.size());
  want.type = std::string(options_.vendor->Key());
  want.memreq = current[0].usedmem;
  want.coresreq = current[0].usedcores;
  device::PodRequest request;
  request.containers.emplace_back(std::move(want));
  const device::GpuPolicy& policy =
      constraints->gpu_policy.has_value() ? *constraints->gpu_policy : options_.gpu_policy;
  const schedule::FitResult fit = schedule::FitPod(restricted, request, *constraints, policy);
  if (!fit.fit) {
    return fail(fmt::format("no allowed device fits: {}", fit.reason));
  }
  if (fit.devices.size() != 1 || fit.devices[0].size() != current.size()) {
    return fail(fmt::format("restricted fit selected {} container sets, want 1 with {} devices",
                            fit.devices.size(), current.size()));
  }
  const device::ContainerDevices& chosen = fit.devices[0];

  // Rule 8: only this container's segment changes, in both annotations, in one merge patch at
  // the resourceVersion read (a conflict is a failure: the plugin or someone else moved on).
  absl::StatusOr<std::string> to_allocate =
      ReplaceContainerEntry(to_allocate_raw, req.container_index, chosen);
  if (!to_allocate.ok()) {
    return fail(fmt::format("cannot rewrite pending allocation annotation: {}",
                            std::string(to_allocate.status().message())));
  }
  absl::StatusOr<std::string> allocated_value =
      ReplaceContainerEntry(allocated_raw, req.container_index, chosen);
  if (!allocated_value.ok()) {
    return fail(fmt::format("cannot rewrite allocated annotation: {}",
                            std::string(allocated_value.status().message())));
  }
  kube::MetadataPatch patch;
  patch.annotations.emplace_back(std::string(options_.vendor->ToAllocateAnnotation()),
                                 *std::move(to_allocate));
  patch.annotations.emplace_back(std::string(options_.vendor->AllocatedAnnotation()),
                                 *std::move(allocated_value));
  patch.uid = pod.meta.uid;
  if (!pod.meta.resource_version.empty()) {
    patch.resource_version = pod.meta.resource_version;
  }
  if (absl::StatusOr<kube::Pod> patched =
          client_->PatchPodMetadata(pod.meta.ns, pod.meta.name, patch);
      !patched.ok()) {
    return fail(
        fmt::format("cannot patch pod annotations: {}", std::string(patched.status().message())));
  }
  // The ledger's record (and reservation) of the pod: that container's usage replaced in one
  // step, never removed and added back (HAMi #3027). 0 moved: the informer got there first.
  absl::StatusOr<int> moved =
      ledger_->ReplaceContainer(req.pod_uid, static_cast<int32_t>(index), current, chosen);
  if (!moved.ok()) {
    TESSERA_LOG(kInfo, "refit of pod {}: ledger not updated ({}); the informer applies the patch",
                pod.Key(), std::string(moved.status().message()));
  }
  std::string message =
      fmt::format("NUMA refit moved container {} from {} to {}", req.container_index,
                  DeviceIdList(current), DeviceIdList(chosen));
  TESSERA_VLOGS(2, "refit", "pod", pod.Key(), "node", req.node_name, "outcome", message);
  events_.Record(pod.meta, kNumaRefitSucceedReason, std::move(message), EventType::kNormal);
  return RefitResponse{
      .succeeded = true, .container_devices = EncodeContainerDevices(chosen), .failure_reason = {}};
}

}  // namespace tessera::extender

#include "tessera/accounting/projection.h"

#include <string>
#include <utility>

#include "tessera/device/annotations.h"
#include "tessera/device/mig.h"

namespace tessera::accounting {
namespace {

// A record with the pod's identity and state and no allocation.
ledger::PodAllocation PodState(const kube::Pod& pod) {
  ledger::PodAllocation out;
  out.uid = pod.meta.uid;
  out.ns = pod.meta.ns;
  out.name = pod.meta.name;
  out.bound_node = pod.node_name;
  out.terminal = pod.Terminal();
  out.bind_failed =
      pod.meta.annotations.Get(device::kBindPhaseAnnotation) == device::kBindPhaseFailed;
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const device::NodeDevices>> ProjectNode(const device::Vendor& vendor,
                                                                       const kube::Node& node) {
  absl::StatusOr<device::NodeDevices> devices = vendor.DecodeNode(node);
  if (!devices.ok()) {
    return devices.status();
  }
  return std::make_shared<const device::NodeDevices>(std::move(*devices));
}

absl::StatusOr<ledger::PodAllocation> ProjectPod(const device::Vendor& vendor,
                                                 const kube::Pod& pod) {
  ledger::PodAllocation out = PodState(pod);
  const std::string* node = pod.meta.annotations.Find(device::kVgpuNodeAnnotation);
  if (node == nullptr || node->empty()) {
    return out;
  }
  out.node = *node;
  absl::StatusOr<device::PodDevices> devices = vendor.DecodeAllocation(pod);
  if (devices.ok()) {
    out.devices = std::move(*devices);
  } else if (!absl::IsNotFound(devices.status())) {
    return devices.status();
  }
  // An allocation written in the HAMi v2.9+ index space has one entry per container, init
  // containers first; the ledger then collapses init usage with the app containers' as the fit
  // does. Any other entry count is an older scheduler's compacted string (v2.5–v2.8 list app
  // containers only), whose entries cannot be told apart: count them all, additively.
  const size_t containers = pod.init_containers.size() + pod.containers.size();
  if (!pod.init_containers.empty() && out.devices.size() == containers) {
    out.init_count = static_cast<int32_t>(pod.init_containers.size());
  }
  // The MIG placements: a value that does not decode holds none, as in HAMi's usage rebuild
  // (the pod's mig cards then fail closed in the ledger).
  if (const std::string* mig = pod.meta.annotations.Find(device::kMigAllocationsAnnotation);
      mig != nullptr) {
    if (absl::StatusOr<std::vector<device::MigAllocation>> a = device::DecodeMigAllocations(*mig);
        a.ok()) {
      out.mig = *std::move(a);
    }
  }
  return out;
}

ledger::PodAllocation ProjectPodForLedger(const device::Vendor& vendor, const kube::Pod& pod,
                                          absl::Status* error) {
  absl::StatusOr<ledger::PodAllocation> alloc = ProjectPod(vendor, pod);
  absl::Status status = alloc.status();
  if (alloc.ok() && alloc->node.empty() && !pod.node_name.empty() &&
      pod.meta.annotations.Find(device::kDevicesAllocatedAnnotation) != nullptr) {
    // No hami.io/vgpu-node, so ProjectPod did not look at the devices.
    absl::StatusOr<device::PodDevices> devices = vendor.DecodeAllocation(pod);
    if (!devices.ok() && !absl::IsNotFound(devices.status())) {
      status = devices.status();
    }
  }
  if (error != nullptr) {
    *error = status;
  }
  if (status.ok()) {
    return *std::move(alloc);
  }
  ledger::PodAllocation out = PodState(pod);
  out.node = !pod.node_name.empty() ? pod.node_name
                                    : pod.meta.annotations.Get(device::kVgpuNodeAnnotation);
  out.unreadable = true;
  return out;
}

}  // namespace tessera::accounting

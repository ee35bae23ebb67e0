// File: tessera/metrics/device_families.h
//
// The HAMi device metric families, rendered from one ledger::FullSnapshot in the Prometheus text
// exposition format 0.0.4. Names, labels and units are those of HAMi's scheduler at HEAD
// (docs/hami-protocol.md §5.3), so HAMi's dashboards and alerts keep working. Every sample
// carries the constant label zone="vGPU"; every family is a gauge.
//
// Per registered device (node = the node's name, device_index = DeviceInfo::index,
// device_type = DeviceInfo::type, device_uuid = DeviceInfo::id):
//   hami_gpu_memory_limit_bytes            devmem MiB x 1048576
//   hami_gpu_core_limit_ratio              devcore (100 for a type starting with "AMD")
//   hami_gpu_memory_allocated_bytes        usedmem x 1048576; label device_cores = devcore
//   hami_gpu_shared_count                  used (slots)
//   hami_gpu_core_allocated_ratio          usedcores (AMD: ceil(usedcores / devcore x 100))
//   hami_node_gpu_overview                 usedmem x 1048576; labels device_cores = devcore,
//                                          device_memory_limit = devmem (MiB)
//   hami_node_gpu_memory_allocated_ratio   usedmem / devmem; omitted when devmem is 0
// Per pod holding a device (labels namespace, node, pod, container_index, device_uuid):
//   hami_vgpu_memory_allocated_bytes       the pod's collapsed MiB on the device x 1048576
//   hami_vgpu_core_allocated_ratio         the pod's collapsed cores on the device (AMD as above)
//
// Collapsed per-pod usage (HAMi HEAD's caveat, followed on purpose): HEAD's podManager keeps the
// usage after CollapseInitContainerUsage, so it exports ONE sample per (pod, device UUID) with
// container_index="0", whatever containers hold the device. Tessera does the same, with the
// ledger's counting rule 5: memory = max(largest init container's MiB, sum of the app
// containers' MiB) over the pod's entries on that device, cores likewise. The sum of a device's
// per-pod samples therefore equals its hami_gpu_memory_allocated_bytes. device_uuid is the UUID
// the node registers (a pod's MIG "[a-b]" suffix is not repeated). Per-container detail is on
// /debug/ledger.
//
// What "allocated" counts: exactly what the ledger's holder rule says holds a device, i.e. what
// /filter sees as used — observed bound pods AND in-flight reservations (filter decisions not
// yet observed bound). HAMi counts a pod as soon as its filter-time annotations are observed,
// bound or not, so counting reservations matches what HAMi's gauges show while a pod is being
// bound; leaving them out would show a device as free that the next /filter already treats as
// taken. Pods that hold nothing under the ledger's rule (conflicts, orphan UUIDs, nodes that are
// not registered, bind-failed, terminal or deleted pods, unbound annotated pods without a
// reservation) appear in no family.
//
// With `legacy` the pre-v2.9 names that HEAD still emits under --legacy-metrics are added:
//   GPUDeviceMemoryLimit, GPUDeviceCoreLimit, GPUDeviceSharedNum, GPUDeviceCoreAllocated
//       labels nodeid, deviceuuid, deviceidx, devicetype (raw values: no AMD normalisation)
//   GPUDeviceMemoryAllocated   + devicecores (= devcore)
//   nodeGPUOverview            + devicecores, devicememorylimit (no sharedcontainers at HEAD)
//   nodeGPUMemoryPercentage    labels nodeid, deviceuuid, deviceidx; omitted when devmem is 0
//   vGPUMemoryAllocated, vGPUCoreAllocated (raw)
//       labels podnamespace, nodename, podname, containeridx ("0"), deviceuuid
//
// Not rendered, because a FullSnapshot does not carry the data: hami_node_gpu_mig_instance_info
// and nodeGPUMigInstance (MIG instance placement), hami_resource_quota_used/_limit and QuotaUsed
// (namespace quotas), and hami_build_info (Tessera exports tessera_build_info instead).
//
// Output layout, like Go's client_golang: families sorted by name, label names sorted within a
// sample, families without samples left out (an empty snapshot renders nothing). Samples follow
// the snapshot's order (nodes by name, devices in registration order, pods by UID).
//
// Cost: O(devices + holders) time; memory beyond the output is bounded (families are built and
// serialised in chunks of a few thousand samples), so the streaming overload can hand a large
// scrape to the HTTP layer piece by piece.
//
// Thread safety: pure functions of their arguments; safe to call concurrently.
#pragma once

#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"

#include "tessera/ledger/ledger.h"

namespace tessera::metrics {

// The Content-Type of the text exposition format these functions produce.
inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

// Appends the device families of `snapshot` to `sink`, in pieces (each piece ends with '\n').
void RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy,
                          absl::FunctionRef<void(std::string_view)> sink);
// The same, as one string.
std::string RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy);

}  // namespace tessera::metrics

// File: tessera/device/request.h
//
// Request derivation: what a pod asks of the NVIDIA devices, read from its containers'
// resources under the names the device config gives (nvidia.com/gpu, nvidia.com/gpumem,
// nvidia.com/gpumem-percentage, nvidia.com/gpucores by default). This is HAMi v2.10's
// GenerateResourceRequests, applied to init containers and then app containers:
//
//   count  limits[count], else requests[count]; a non-negative integer. Absent or 0: the
//          container asks for nothing (nullopt) and its other resources are not read.
//   mem    limits[mem], else requests[mem], MiB per device; a non-negative integer, absent = 0.
//          Multiplied by memoryFactor when that is above 1; mem * memoryFactor must fit int32.
//   pct    limits[pct], else requests[pct]; an integer. Above 100 clamps to 100; 0 or below
//          means unset (kPercentageUnset); absent = unset.
//          When pct is unset and mem is 0: mem = defaultMemory if that is non-zero, otherwise
//          pct = 100 (the whole device).
//   cores  limits[cores], else requests[cores]; a non-negative integer fitting int32;
//          absent = defaultCores.
//
// Malformed values on these resources are errors, where HAMi silently treats the container as
// asking for nothing (see DerivePodRequest).
//
// Thread safety: pure functions.
#pragma once

#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

#include "tessera/device/device_config.h"
#include "tessera/device/model.h"
#include "tessera/kube/objects.h"

namespace tessera::device {

// The request of one container, or nullopt when it asks for no device. Returns
// InvalidArgument when a managed resource's value is not a quantity, not an integer, negative,
// or does not fit (count, cores and mem * memoryFactor must fit int32); the message names the
// resource and the value, e.g. `nvidia.com/gpumem: "1.5" is not an integer`.
absl::StatusOr<std::optional<ContainerRequest>> DeriveContainerRequest(
    const kube::Container& container, const NvidiaConfig& config);

// The pod's request: one entry per container, init containers first (init_count of them),
// then app containers, each as DeriveContainerRequest gives it. A pod that asks for nothing
// yields a request whose Empty() is true. Errors are DeriveContainerRequest's, prefixed with
// the pod and container: `pod ns/name: init container "setup": nvidia.com/gpu: ...`.
//
// Why errors rather than HAMi's "no request": the API server only admits non-negative integer
// extended resources, so a malformed value reaches Tessera only from a file or an unvalidated
// path; scheduling such a pod as if it wanted no GPU would place it where the device plugin
// then fails it, while an error surfaces in the pod's scheduling events.
absl::StatusOr<PodRequest> DerivePodRequest(const kube::Pod& pod, const NvidiaConfig& config);

// A vendor's rule for one container: its request, nullopt when it asks for none of the vendor's
// devices, or InvalidArgument naming the resource.
using ContainerRule =
    absl::FunctionRef<absl::StatusOr<std::optional<ContainerRequest>>(const kube::Container&)>;
// The pod's request with `rule` applied to each container, init containers first; errors are
// prefixed with the pod and container as DerivePodRequest's. Every vendor's pod request.
absl::StatusOr<PodRequest> DerivePodRequestWith(const kube::Pod& pod, ContainerRule rule);

}  // namespace tessera::device

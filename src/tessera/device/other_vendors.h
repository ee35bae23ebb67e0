// File: tessera/device/other_vendors.h
//
// The extended resources of the device kinds HAMi schedules and Tessera does not (yet): the
// non-NVIDIA entries of the managedResources HAMi's Helm chart hands kube-scheduler (v2.5.2 and
// v2.10.0: Cambricon, Hygon, MetaX, Moore Threads, Enflame, Kunlunxin, AWS Neuron, Vastai,
// Biren, AMD, and Huawei Ascend and Iluvatar when enabled). Such a pod reaches /filter under
// that chart; without this check it would ask for "no device" and pass to any node, its devices
// unaccounted. The NVIDIA vendor refuses it instead, naming the vendor (docs/compatibility.md).
//
// A resource belongs to a vendor by prefix (cambricon.com/, huawei.com/Ascend, ...), so the
// names HAMi's per-vendor flags and device config can choose within a vendor's domain are
// covered too.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/status.h"

#include "tessera/device/device_config.h"
#include "tessera/kube/objects.h"

namespace tessera::device {

// The vendor ("Cambricon MLU", ...) whose device `resource` names, when it is not NVIDIA's.
std::optional<std::string_view> OtherVendorOf(std::string_view resource);

// OK unless a container (init containers first) asks, in limits or requests, for another
// vendor's resource that is not one of `config`'s NVIDIA names. Then kUnimplemented: "pod ns/p:
// container "c" asks for cambricon.com/vmlu: Cambricon MLU devices are not supported by
// Tessera (NVIDIA only) ...".
absl::Status RefuseOtherVendors(const kube::Pod& pod, const NvidiaConfig& config);

}  // namespace tessera::device

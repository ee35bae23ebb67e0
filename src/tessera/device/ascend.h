// File: tessera/device/ascend.h
//
// Huawei Ascend NPUs as HAMi v2.10 schedules them (pkg/device/ascend): every configured chip
// (AscendChipConfig, device_config.h) is a vendor of its own whose key is the chip's common word.
// This file holds the chip's pure rules — its annotation keys, the webhook's template rounding
// and validation, request derivation, the runtime-info annotation — and the chip's
// device::Vendor. Its fit rules are schedule/vendors/ascend_fit.h. docs/ascend.md has the
// formats with examples and every difference from HAMi.
//
// Errors: InvalidArgument naming the pod, container and resource (requests, registrations,
// allocations); the webhook's refusals carry HAMi's exact texts (AdmitAscendContainer).
//
// Thread safety: pure functions; the vendor is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/device_config.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/objects.h"

namespace tessera::device {

// Pod annotation: "hami-core" asks for the soft split (cores, any memory) instead of templates.
inline constexpr std::string_view kVnpuModeAnnotation = "huawei.com/vnpu-mode";
inline constexpr std::string_view kVnpuModeHamiCore = "hami-core";
// Node annotation the Ascend plugin writes ("true"/"false"): whether the node allows hami-core
// mode; it overrides vnpus.hamiVnpuCore when present.
inline constexpr std::string_view kVnpuNodeAnnotation = "hami-vnpu-core";
// Written beside the allocation by HAMi's Ascend PatchAnnotations (Unix seconds).
inline constexpr std::string_view kPredicateTimeAnnotation = "predicate-time";
// Topology applies to chips whose common word starts with this; 910C is allocated in pairs.
inline constexpr std::string_view kAscend910Prefix = "Ascend910";
inline constexpr std::string_view kAscend910C = "Ascend910C";
// HAMi's weight of the same-network share in an Ascend 910 node score.
inline constexpr int32_t kAscend910NetworkWeight = 10;

// The chip's annotation keys, derived from its common word <cw>.
struct AscendKeys {
  std::string register_key;   // hami.io/node-register-<cw> (node)
  std::string handshake_key;  // hami.io/node-handshake-<cw> (node)
  std::string to_allocate;    // hami.io/<cw>-devices-to-allocate (pod)
  std::string allocated;      // hami.io/<cw>-devices-allocated (pod)
  std::string use_uuid;       // hami.io/use-<cw>-uuid (pod)
  std::string no_use_uuid;    // hami.io/no-use-<cw>-uuid (pod)
  std::string runtime_info;   // huawei.com/<cw> (pod): [{UUID,temp,memory,core}]
};
AscendKeys AscendKeysOf(std::string_view common_word);

// HAMi's trimMemory: the smallest template of at least `memory` MiB (its memory and name), else
// the whole card (memoryAllocatable, no name) when memory <= memoryCapacity, else {0, ""}.
struct TrimmedMemory {
  int64_t memory = 0;
  std::string template_name;
  friend bool operator==(const TrimmedMemory&, const TrimmedMemory&) = default;
};
TrimmedMemory TrimAscendMemory(const AscendChipConfig& chip, int64_t memory);

// What the webhook does to one container for one chip (HAMi's MutateAdmission).
struct AscendAdmission {
  bool found = false;  // limits name the chip's count resource: the pod is ours
  // With `found`: the count written back into limits (and requests, when they have it), set
  // only when it changed (910C SuperPod: 1 becomes 2); and the MiB written as the memory
  // resource's limit and request (in Kubernetes' canonical form, as HAMi's marshalled pod
  // carries it: 40000 is written "40k").
  std::optional<int64_t> count;
  int64_t memory = 0;
  // Without `found`: ASCEND_VISIBLE_DEVICES="" is appended to the container's env (overwriteEnv).
  bool empty_visible_devices = false;
};
// `hami_core`: the pod's kVnpuModeAnnotation is "hami-core". Refusals, which the webhook
// answers with HTTP 500 and the text as HAMi does: "Ascend910C device request must be 1 or 2*n,
// got 3"; "<core resource> is only supported in hami-core (soft split) mode"; "<memory
// resource> <n> is invalid" (no template and above memoryCapacity); "vNPU not supported for
// multiple devices" (several cards, not whole). A count that is not a quantity is an
// InvalidArgument naming the resource (HAMi's decoder rejects the pod before its webhook).
absl::StatusOr<AscendAdmission> AdmitAscendContainer(const AscendChipConfig& chip,
                                                     const kube::Container& container,
                                                     bool hami_core);

// The webhook for one chip over a whole pod, applied to it: each container (init containers
// first) admitted as above, its count and memory written into its limits and requests (the count
// into requests only where they had it), and a note per change for a reader, e.g. `container
// "main": huawei.com/Ascend910B3-memory 3000 becomes 16384 (template vir05_1c_16g)`. `found`:
// some container asks for the chip. Errors: the first refusal, HAMi's text unchanged.
struct AscendPodAdmission {
  bool found = false;
  std::vector<std::string> notes;
};
absl::StatusOr<AscendPodAdmission> AdmitAscendPod(const AscendChipConfig& chip, kube::Pod* pod);

// HAMi's GenerateResourceRequests for one container: nullopt when the container asks for none
// of the chip (count absent or 0). count: limits, else requests; mem: MiB, limits else requests,
// times memoryFactor above 1, 0 when absent, and then MemPercentagereq 100 (the whole card);
// cores: the core resource, 0 when absent. Unlike HAMi, which treats a malformed value as no
// request, a negative or fractional count, a negative, fractional or over-int32 memory (with
// HAMi's hint that the unit is MiB), and a negative or over-int32 core value are
// InvalidArgument errors naming the resource.
absl::StatusOr<std::optional<ContainerRequest>> DeriveAscendRequest(
    const AscendChipConfig& chip, const kube::Container& container);

// The value of huawei.com/<cw> for the devices of one pod (containers in order): per device
// {"UUID","temp","memory","core"} as Go marshals HAMi's RuntimeInfo (keys omitted when empty or
// zero); temp, the template of the device's memory, only outside hami-core mode; "null" when
// there is no device.
std::string EncodeAscendRuntimeInfo(const AscendChipConfig& chip, const PodDevices& devices,
                                    bool hami_core);

// HAMi's Ascend ScoreNode, added to the node score of a pod placed on `node`: for a 910 chip
// (common word "Ascend910…"), per container with devices of the chip the share of them on the
// container's largest NetworkID group, summed, times kAscend910NetworkWeight; 0 for other chips
// and as soon as one of the devices has no custominfo.NetworkID. float, as HAMi computes it.
float AscendNetworkScore(std::string_view common_word, const PodDevices& devices,
                         const NodeDevices& node);

// The chip's vendor. `hami_vnpu_core`: vnpus.hamiVnpuCore.
std::unique_ptr<Vendor> NewAscendVendor(AscendChipConfig chip, bool hami_vnpu_core);

}  // namespace tessera::device

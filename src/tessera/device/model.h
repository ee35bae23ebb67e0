// File: tessera/device/model.h
//
// The vocabulary of the scheduling core, shared by the codecs, request derivation, fit and
// scoring, the ledger and the metrics. Units follow HAMi: device memory in MiB, cores in percent
// of one GPU (100 = a whole GPU before deviceCoreScaling), slots = the registered split count.
//
// Container indices are always "init containers first, then app containers, in spec order":
// entry i of a PodDevices or PodRequest is container i in that numbering.
//
// Thread safety: plain values. NodeDevices is immutable once built and shared between threads
// through std::shared_ptr<const NodeDevices>.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace tessera::device {

// The vendor key HAMi writes as the Type of every allocated NVIDIA device. The device plugin
// (v2.8+) decides that allocation is complete when the to-allocate string no longer contains it.
inline constexpr std::string_view kNvidiaVendor = "NVIDIA";

// The memory-percentage sentinel meaning "no percentage requested".
inline constexpr int32_t kPercentageUnset = 101;

// One MIG placement: the GPU's memory slices [start, start + size) that a GPU instance of some
// profile occupies (NVML's placement; 8 slices on A100/H100/H200). tessera/device/mig.h.
struct MigPlacement {
  uint32_t start = 0;
  uint32_t size = 0;

  // True when the two ranges share a slice.
  bool Overlaps(const MigPlacement& other) const {
    return start < other.start + other.size && other.start < start + size;
  }
  friend bool operator==(const MigPlacement&, const MigPlacement&) = default;
};

// A MIG profile as a v2.10 device plugin registers it for a card in "mig" mode.
struct MigProfile {
  std::string name;       // "1g.5gb"
  int32_t memory_mb = 0;  // NVML memory size of one instance, MiB
  int32_t core = 0;       // percent of the card's SMs, rounded up
  uint32_t slice_count = 0;
  std::vector<MigPlacement> placements;  // where an instance may start, NVML's order

  friend bool operator==(const MigProfile&, const MigProfile&) = default;
};

// Whether a registered device carries custominfo.NetworkID: not at all, as a JSON number, or as
// another JSON value (HAMi's Ascend Fit then counts the key as present, its grouping ignores it).
enum class NetworkKey : uint8_t { kNone, kNumber, kOther };

// A device as its node registers it (hami.io/node-nvidia-register), in either format.
struct DeviceInfo {
  std::string id;  // NVML UUID, "GPU-…"
  int32_t index = 0;
  int32_t count = 0;    // split count: how many allocations may share the device
  int32_t devmem = 0;   // MiB (already scaled by deviceMemoryScaling)
  int32_t devcore = 0;  // percent (deviceCoreScaling * 100)
  std::string type;     // "NVIDIA-Tesla T4", "NVIDIA A100-SXM4-40GB", …
  int32_t numa = 0;
  std::string mode = "hami-core";  // "hami-core", "mig" or "mps"
  // The JSON key migProfiles (v2.10 plugin, mode "mig"); empty otherwise.
  std::vector<MigProfile> mig_profiles = {};
  bool health = true;
  // custominfo.NetworkID, which Ascend 910 plugins register: the card's network group.
  NetworkKey network_key = NetworkKey::kNone;
  int64_t network_id = 0;  // with kNumber: Go's int(float64) of the value

  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

// Which on-the-wire format a node's registration used. kDelimited is written by the v2.5–v2.7
// device plugin (which also speaks the handshake); kJson by v2.8 and later.
enum class RegisterFormat { kDelimited, kJson };

// Everything Tessera knows about one node's devices. Immutable once built.
struct NodeDevices {
  std::string node;
  std::vector<DeviceInfo> devices;
  RegisterFormat format = RegisterFormat::kJson;
  // UUIDs listed in hami.io/device-cordon, sorted and unique.
  std::vector<std::string> cordoned;
  // hami.io/node-nvidia-score over `devices` (device/node_scores.h): pair_scores[i * n + j] is
  // device i's score towards device j, n = devices.size(). Empty when the node has no scores or
  // every score is 0 (HAMi reads both as all zeros), so most nodes pay nothing for it.
  std::vector<int64_t> pair_scores;
  // Ascend: whether the node allows hami-core (soft split) mode — its hami-vnpu-core annotation
  // when present, else vnpus.hamiVnpuCore.
  bool hami_core_allowed = false;

  // Index of the device with `uuid` in `devices`, or -1.
  int Find(std::string_view uuid) const {
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].id == uuid) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  bool IsCordoned(std::string_view uuid) const;
  // Device i's score towards device j (positions in `devices`); 0 without scores.
  int64_t PairScore(size_t i, size_t j) const {
    return pair_scores.empty() ? 0 : pair_scores[i * devices.size() + j];
  }
  // Orders `devices` by index, then id (a canonical order: plugins list devices in Go map
  // order), permuting pair_scores along.
  void SortByIndex();
};

// Usage of one device: what the ledger holds per device and what fit consumes.
struct DeviceUsage {
  int32_t used = 0;       // slots taken
  int64_t usedmem = 0;    // MiB
  int64_t usedcores = 0;  // percent

  friend bool operator==(const DeviceUsage&, const DeviceUsage&) = default;
};

// The usage of a node's devices, usage[i] for devices[i]: up to 8 devices without a heap
// allocation (a /filter snapshots 500 nodes).
using UsageList = absl::InlinedVector<DeviceUsage, 8>;

// The MIG state of one card at one instant: the placements in use, and whether some pod's MIG
// reservations disagree with its devices there (HAMi then marks the card unhealthy: it fails
// closed, CardNotHealth). tessera/device/mig_usage.h.
struct MigCardUsage {
  std::vector<MigPlacement> occupied;
  bool unusable = false;
  friend bool operator==(const MigCardUsage&, const MigCardUsage&) = default;
};

// A consistent view of one node for a fit decision: its devices and their usage
// (usage[i] belongs to devices->devices[i]).
struct NodeSnapshot {
  std::shared_ptr<const NodeDevices> devices;
  UsageList usage;
  // Non-empty: "namespace/name" of a running pod bound here whose allocation annotation does
  // not decode (the one with the smallest uid when there are several). Which devices it uses is
  // unknown, so no new pod may be placed on the node (fail closed; docs/self-healing.md).
  std::string blocked_by = {};
  // mig[i] belongs to devices[i]; empty when no card of the node has MIG state.
  std::vector<MigCardUsage> mig = {};
};

// One device handed to one container: one "UUID,Type,MiB,cores:" item of
// hami.io/vgpu-devices-allocated.
struct ContainerDevice {
  std::string uuid;
  std::string type;  // the vendor key, "NVIDIA"
  int32_t usedmem = 0;
  int32_t usedcores = 0;

  friend bool operator==(const ContainerDevice&, const ContainerDevice&) = default;
};
using ContainerDevices = std::vector<ContainerDevice>;
// One entry per container, init containers first. A container without devices has an empty entry.
using PodDevices = std::vector<ContainerDevices>;

// Which rules fit a request: the device family of the vendor that derived it.
enum class DeviceFamily : uint8_t { kNvidia, kAscend };

// What one container asks of one vendor (HAMi's ContainerDeviceRequest).
struct ContainerRequest {
  int32_t nums = 0;                               // number of devices
  std::string type = std::string(kNvidiaVendor);  // the vendor key: "NVIDIA", "Ascend910B3"
  int32_t memreq = 0;                             // MiB per device; 0 = use the percentage
  int32_t mem_percentage = kPercentageUnset;      // percent of each device's memory
  int32_t coresreq = 0;                           // percent per device
  DeviceFamily family = DeviceFamily::kNvidia;

  friend bool operator==(const ContainerRequest&, const ContainerRequest&) = default;
};

// A pod's requests: containers[i] is container i (init first); nullopt where the container asks
// for no managed device.
struct PodRequest {
  std::vector<std::optional<ContainerRequest>> containers;
  size_t init_count = 0;  // how many of `containers` are init containers

  // True when no container asks for a device: such pods pass the filter untouched.
  bool Empty() const {
    for (const auto& c : containers) {
      if (c.has_value() && c->nums > 0) {
        return false;
      }
    }
    return true;
  }
};

enum class NodePolicy { kBinpack, kSpread };

// One key of a GPU policy chain (hami.io/gpu-scheduler-policy, e.g. "binpack,numa").
// In a chain, kMutex and kTopologyAware are no sort keys (HAMi v2.10 gpu_policy.go: filters);
// alone, mutex has its own order and topology-aware sorts as spread (schedule/fit.h).
enum class GpuPolicyKey { kBinpack, kSpread, kNuma, kMutex, kTopologyAware };

struct GpuPolicy {
  std::vector<GpuPolicyKey> chain = {GpuPolicyKey::kSpread};
  friend bool operator==(const GpuPolicy&, const GpuPolicy&) = default;
};

// The pod-level constraints read from its annotations (nvidia.com/use-gputype and friends).
// Lists are trimmed, empty tokens dropped (HAMi v2.10 semantics).
struct PodConstraints {
  std::vector<std::string> use_types;     // nvidia.com/use-gputype
  std::vector<std::string> nouse_types;   // nvidia.com/nouse-gputype
  std::vector<std::string> use_uuids;     // nvidia.com/use-gpuuuid
  std::vector<std::string> nouse_uuids;   // nvidia.com/nouse-gpuuuid
  std::optional<std::string> vgpu_mode;   // nvidia.com/vgpu-mode
  bool numa_bind = false;                 // nvidia.com/numa-bind
  std::optional<NodePolicy> node_policy;  // hami.io/node-scheduler-policy
  std::optional<GpuPolicy> gpu_policy;    // hami.io/gpu-scheduler-policy

  friend bool operator==(const PodConstraints&, const PodConstraints&) = default;
};

}  // namespace tessera::device

// File: tessera/device/device_config.h
//
// HAMi's device configuration: the YAML of the `hami-scheduler-device` ConfigMap
// (/device-config.yaml, --device-config-file), which HAMi's device plugin reads too. The scheduler
// uses the `nvidia:` section (resource names, defaults, memoryFactor, gpuCorePolicy,
// runtimeClassName, ...; every key optional, chart defaults when absent or null) and the `vnpus:`
// section (Huawei Ascend chips, ascend_config.h); the other vendor sections are accepted and
// ignored. The keys and their defaults: docs/deploy.md "The device configuration file".
//
// MIG keys: migProfileAllowlist and knownMigGeometries (docs/mig.md); an allowlist entry
// without models or profiles, or with a profile name HAMi rejects, is an error, as in HAMi.
//
// Errors: InvalidArgument for a quoted or mistyped integer or boolean, a negative integer or
// scaling, an empty resource name or one with whitespace, a duplicate key, or a document whose
// vendor sections are all empty (as HAMi rejects it). Unknown keys are ignored, as in HAMi.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::device {

// nvidia.gpuCorePolicy: what the webhook injects as GPU_CORE_UTILIZATION_POLICY (nothing for
// kDefault).
enum class GpuCorePolicy { kDefault, kForce, kDisable };

// "default", "force", "disable".
std::string_view GpuCorePolicyName(GpuCorePolicy policy);

// One nvidia.migProfileAllowlist entry (HAMi v2.10): the MIG profiles a v2.10 plugin registers
// for a card whose type contains one of `models`. Both lists are non-empty and every profile
// passes ValidateMigProfileName (tessera/device/mig.h).
struct MigAllowlistEntry {
  std::vector<std::string> models;
  std::vector<std::string> profiles;
  friend bool operator==(const MigAllowlistEntry&, const MigAllowlistEntry&) = default;
};

// One template of a static MIG geometry (HAMi v2.5–v2.9 knownMigGeometries): `count` instances
// of `name`, each with `memory` MiB and `core` percent.
struct MigTemplate {
  std::string name;
  int32_t core = 0;
  int32_t memory = 0;
  int32_t count = 0;
  friend bool operator==(const MigTemplate&, const MigTemplate&) = default;
};

// One nvidia.knownMigGeometries entry: the geometries (each a list of templates) a v2.5–v2.9
// scheduler attaches to a "mig" card whose type contains one of `models`.
struct MigGeometryEntry {
  std::vector<std::string> models;
  std::vector<std::vector<MigTemplate>> geometries;
  friend bool operator==(const MigGeometryEntry&, const MigGeometryEntry&) = default;
};

struct NvidiaConfig {
  // Extended-resource names a container asks with.
  std::string resource_count_name = "nvidia.com/gpu";
  std::string resource_memory_name = "nvidia.com/gpumem";  // MiB per device
  std::string resource_memory_percentage_name = "nvidia.com/gpumem-percentage";
  std::string resource_core_name = "nvidia.com/gpucores";  // percent per device
  std::string resource_priority_name = "nvidia.com/priority";
  // Webhook: give containers without a GPU NVIDIA_VISIBLE_DEVICES=none.
  bool overwrite_env = false;
  // MiB booked when a container gives neither memory nor percentage; 0 = the whole device.
  int32_t default_memory = 0;
  // Cores booked when a container gives no core request.
  int32_t default_cores = 0;
  // Webhook: the device count added when a container gives memory, cores or percentage only.
  int32_t default_gpu_num = 1;
  // Multiplier applied to the memory request (HAMi v2.6+); 0 and 1 both mean "none".
  int32_t memory_factor = 1;
  // Device-plugin settings, kept so one parsed file describes the whole deployment. The
  // scheduler sees their effect through the node registration, not through these fields.
  int32_t device_split_count = 10;
  double device_memory_scaling = 1.0;
  double device_core_scaling = 1.0;
  // Webhook settings.
  GpuCorePolicy gpu_core_policy = GpuCorePolicy::kDefault;
  std::string runtime_class_name;  // empty: leave spec.runtimeClassName alone
  // MIG: v2.10's allowlist (plugin side; the scheduler trusts what is registered) and v2.5–v2.9's
  // static geometries. Empty when absent.
  std::vector<MigAllowlistEntry> mig_profile_allowlist;
  std::vector<MigGeometryEntry> known_mig_geometries;

  friend bool operator==(const NvidiaConfig&, const NvidiaConfig&) = default;
};

// One vnpus.configs[].templates entry: a hard-split vNPU shape of an Ascend chip, `memory` MiB.
struct AscendTemplate {
  std::string name;  // "vir05_1c_16g"
  int64_t memory = 0;
  int32_t ai_core = 0;
  int32_t ai_cpu = 0;
  friend bool operator==(const AscendTemplate&, const AscendTemplate&) = default;
};

// One vnpus.configs entry: an Ascend chip type, which HAMi schedules as a vendor of its own whose
// key is `common_word` ("Ascend910B3": the Type of its allocated devices and the infix of its
// annotations). No chart default: a chip exists only when configured.
struct AscendChipConfig {
  std::string common_word;
  std::string chip_name;             // "910B3" (informational)
  std::string resource_name;         // "huawei.com/Ascend910B3": the device count
  std::string resource_memory_name;  // MiB per device
  std::string resource_core_name;    // percent per device, hami-core mode only; may be empty
  int64_t memory_allocatable = 0;    // MiB a whole card offers a pod
  int64_t memory_capacity = 0;       // the largest memory request a whole card takes
  int32_t memory_factor = 0;         // multiplier of the memory request; 0 and 1 mean none
  int32_t ai_core = 0;
  int32_t ai_cpu = 0;
  std::string runtime_class_name;  // webhook: empty leaves spec.runtimeClassName alone
  bool overwrite_env = false;      // webhook: ASCEND_VISIBLE_DEVICES="" for containers without
  bool super_pod = false;          // 910C SuperPod: whole module pairs (a request of 1 becomes 2)
  std::vector<AscendTemplate> templates;  // memory ascending, as HAMi sorts them (stable)
  friend bool operator==(const AscendChipConfig&, const AscendChipConfig&) = default;
};

// The `vnpus:` section. HAMi v2.10 writes it as {hamiVnpuCore, configs}; the v2.5–v2.9 chart as
// the bare list of configs, accepted here too (hami_vnpu_core false).
struct AscendConfig {
  bool hami_vnpu_core = false;  // every node allows hami-core mode unless it says otherwise
  std::vector<AscendChipConfig> chips;
  friend bool operator==(const AscendConfig&, const AscendConfig&) = default;
};

// Everything the scheduler reads from the file.
struct DeviceConfig {
  NvidiaConfig nvidia;
  AscendConfig ascend;
  friend bool operator==(const DeviceConfig&, const DeviceConfig&) = default;
};

// The first entry with a model that is a substring of the card `type` (HAMi's rule for both
// lists), or nullptr.
const MigAllowlistEntry* FindMigAllowlist(const NvidiaConfig& config, std::string_view type);
const MigGeometryEntry* FindMigGeometries(const NvidiaConfig& config, std::string_view type);

// The HAMi chart's defaults (the values shown in the format above).
NvidiaConfig DefaultNvidiaConfig();
// The NVIDIA defaults and no Ascend chip: what Tessera runs with when no file is given.
DeviceConfig DefaultDeviceConfig();

// Parses a device-config document. Returns InvalidArgument naming the key and the problem, for
// example `nvidia.defaultMemory: not an integer: "x"`, `nvidia: not a mapping`, or
// `device config: every vendor section is empty`; YAML syntax errors carry yaml-cpp's line and
// column. The `vnpus:` errors: ascend_config.h.
absl::StatusOr<DeviceConfig> ParseDeviceConfig(std::string_view yaml);

// Reads and parses the file at `path`. File errors map errno to a status code (NotFound,
// PermissionDenied, ...) and name the path; parse errors are ParseDeviceConfig's, prefixed
// with the path.
absl::StatusOr<DeviceConfig> LoadDeviceConfigFile(const std::string& path);

}  // namespace tessera::device

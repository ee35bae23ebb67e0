// File: tessera/device/device_config.h
//
// HAMi's device configuration: the YAML of the `hami-scheduler-device` ConfigMap
// (/device-config.yaml, --device-config-file), which HAMi's device plugin reads too. The scheduler
// uses the `nvidia:` section (resource names, defaults, memoryFactor, gpuCorePolicy,
// runtimeClassName, ...; every key optional, chart defaults when absent or null); the other vendor
// sections are accepted and ignored. The keys and their defaults: docs/deploy.md "The device
// configuration file".
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

// The first entry with a model that is a substring of the card `type` (HAMi's rule for both
// lists), or nullptr.
const MigAllowlistEntry* FindMigAllowlist(const NvidiaConfig& config, std::string_view type);
const MigGeometryEntry* FindMigGeometries(const NvidiaConfig& config, std::string_view type);

// The HAMi chart's defaults (the values shown in the format above).
NvidiaConfig DefaultNvidiaConfig();

// Parses a device-config document. Returns InvalidArgument naming the key and the problem, for
// example `nvidia.defaultMemory: not an integer: "x"`, `nvidia: not a mapping`, or
// `device config: every vendor section is empty`; YAML syntax errors carry yaml-cpp's line and
// column.
absl::StatusOr<NvidiaConfig> ParseDeviceConfig(std::string_view yaml);

// Reads and parses the file at `path`. File errors map errno to a status code (NotFound,
// PermissionDenied, ...) and name the path; parse errors are ParseDeviceConfig's, prefixed
// with the path.
absl::StatusOr<NvidiaConfig> LoadDeviceConfigFile(const std::string& path);

}  // namespace tessera::device

#include "tessera/device/device_config.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "yaml-cpp/yaml.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/ascend_config.h"
#include "tessera/device/config_yaml.h"
#include "tessera/device/mig_config.h"
#include "tessera/device/quantity.h"

namespace tessera::device {
namespace {

using internal::ForEachEntry;
using internal::GenericIsZero;
using internal::KeyError;
using internal::KindName;
using internal::ParseBool;
using internal::ParseNonNegativeDouble;
using internal::ParseNonNegativeInt32;
using internal::ParseResourceName;
using internal::ParseString;

// The top-level sections HAMi's config knows (v2.5.2 and v2.10). Only these count when deciding
// whether the document is empty; any other top-level key is ignored, as HAMi ignores it.
constexpr std::string_view kVendorSections[] = {
    "nvidia", "cambricon", "hygon",  "metax", "mthreads", "iluvatar", "iluvatars",
    "vnpus",  "enflame",   "kunlun", "amd",   "vastai",   "biren",    "awsneuron",
};

absl::Status ParseGpuCorePolicy(const YAML::Node& node, std::string_view key, GpuCorePolicy& out,
                                bool& nonzero) {
  std::string value;
  TESSERA_RETURN_IF_ERROR(ParseString(node, key, value, nonzero));
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (value.empty() || value == "default") {
    out = GpuCorePolicy::kDefault;
  } else if (value == "force") {
    out = GpuCorePolicy::kForce;
  } else if (value == "disable") {
    out = GpuCorePolicy::kDisable;
  } else {
    return KeyError(key, fmt::format("unknown policy {} (want default, force or disable)",
                                     QuoteForError(value)));
  }
  return absl::OkStatus();
}

absl::Status ParseNvidia(const YAML::Node& section, NvidiaConfig& config, bool& nonzero) {
  if (section.IsNull()) {
    return absl::OkStatus();
  }
  if (!section.IsMap()) {
    return KeyError("nvidia", fmt::format("not a mapping: got {}", KindName(section)));
  }
  int budget = 10000;
  return ForEachEntry(
      section, "nvidia", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        std::string path = "nvidia." + key;
        if (key == "resourceCountName") {
          return ParseResourceName(value, path, config.resource_count_name, nonzero);
        }
        if (key == "resourceMemoryName") {
          return ParseResourceName(value, path, config.resource_memory_name, nonzero);
        }
        if (key == "resourceMemoryPercentageName") {
          return ParseResourceName(value, path, config.resource_memory_percentage_name, nonzero);
        }
        if (key == "resourceCoreName") {
          return ParseResourceName(value, path, config.resource_core_name, nonzero);
        }
        if (key == "resourcePriorityName") {
          return ParseResourceName(value, path, config.resource_priority_name, nonzero);
        }
        if (key == "overwriteEnv") {
          return ParseBool(value, path, config.overwrite_env, nonzero);
        }
        if (key == "defaultMemory") {
          return ParseNonNegativeInt32(value, path, config.default_memory, nonzero);
        }
        if (key == "defaultCores") {
          return ParseNonNegativeInt32(value, path, config.default_cores, nonzero);
        }
        if (key == "defaultGPUNum") {
          return ParseNonNegativeInt32(value, path, config.default_gpu_num, nonzero);
        }
        if (key == "memoryFactor") {
          return ParseNonNegativeInt32(value, path, config.memory_factor, nonzero);
        }
        if (key == "deviceSplitCount") {
          return ParseNonNegativeInt32(value, path, config.device_split_count, nonzero);
        }
        if (key == "deviceMemoryScaling") {
          return ParseNonNegativeDouble(value, path, config.device_memory_scaling, nonzero);
        }
        if (key == "deviceCoreScaling") {
          return ParseNonNegativeDouble(value, path, config.device_core_scaling, nonzero);
        }
        if (key == "gpuCorePolicy") {
          return ParseGpuCorePolicy(value, path, config.gpu_core_policy, nonzero);
        }
        if (key == "runtimeClassName") {
          return ParseString(value, path, config.runtime_class_name, nonzero);
        }
        if (key == "migProfileAllowlist") {
          return internal::ParseMigAllowlist(value, path, config.mig_profile_allowlist, nonzero);
        }
        if (key == "knownMigGeometries") {
          return internal::ParseMigGeometries(value, path, &ParseNonNegativeInt32,
                                              config.known_mig_geometries, nonzero);
        }
        // disableCoreLimit and other plugin-side or
        // unknown keys: not interpreted here, but they make the section non-empty.
        nonzero = nonzero || !GenericIsZero(value, 1, budget);
        return absl::OkStatus();
      });
}

// A resource name may belong to one vendor only: a pod's request would otherwise be counted
// twice.
absl::Status CheckDistinctResources(const DeviceConfig& config) {
  const NvidiaConfig& nv = config.nvidia;
  for (const AscendChipConfig& chip : config.ascend.chips) {
    for (const std::string* name :
         {&chip.resource_name, &chip.resource_memory_name, &chip.resource_core_name}) {
      for (const std::string* other :
           {&nv.resource_count_name, &nv.resource_memory_name, &nv.resource_memory_percentage_name,
            &nv.resource_core_name, &nv.resource_priority_name}) {
        if (!name->empty() && *name == *other) {
          return absl::InvalidArgumentError(
              fmt::format("device config: resource name {} is both an nvidia and a vnpus ({}) "
                          "resource",
                          QuoteForError(*name), chip.common_word));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceConfig> ParseDocument(const YAML::Node& root) {
  if (root.IsNull() || !root.IsDefined()) {
    return absl::InvalidArgumentError("device config: every vendor section is empty");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        fmt::format("device config: the top level is {}, not a mapping", KindName(root)));
  }
  DeviceConfig config = DefaultDeviceConfig();
  bool any_section = false;
  int budget = 100000;
  TESSERA_RETURN_IF_ERROR(
      ForEachEntry(root, "device config", [&](const std::string& key, const YAML::Node& value) {
        if (key == "nvidia") {
          bool nonzero = false;
          absl::Status status = ParseNvidia(value, config.nvidia, nonzero);
          any_section = any_section || nonzero;
          return status;
        }
        if (key == "vnpus") {
          bool nonzero = false;
          absl::Status status = internal::ParseAscendSection(value, config.ascend, nonzero);
          any_section = any_section || nonzero;
          return status;
        }
        for (std::string_view vendor : kVendorSections) {
          if (key == vendor) {
            any_section = any_section || !GenericIsZero(value, 1, budget);
          }
        }
        return absl::OkStatus();
      }));
  if (!any_section) {
    return absl::InvalidArgumentError("device config: every vendor section is empty");
  }
  TESSERA_RETURN_IF_ERROR(CheckDistinctResources(config));
  return config;
}

}  // namespace

std::string_view GpuCorePolicyName(GpuCorePolicy policy) {
  switch (policy) {
    case GpuCorePolicy::kDefault:
      return "default";
    case GpuCorePolicy::kForce:
      return "force";
    case GpuCorePolicy::kDisable:
      return "disable";
  }
  return "default";
}

NvidiaConfig DefaultNvidiaConfig() { return NvidiaConfig{}; }

DeviceConfig DefaultDeviceConfig() { return DeviceConfig{}; }

absl::StatusOr<DeviceConfig> ParseDeviceConfig(std::string_view yaml) {
  // yaml-cpp reports errors by throwing; nothing it throws may leave this function.
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    return ParseDocument(root);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(fmt::format("device config: invalid YAML: {}", e.msg));
    }
    return absl::InvalidArgumentError(
        fmt::format("device config: invalid YAML at line {}, "
                    "column {}: {}",
                    e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("device config: YAML parser failed: {}", e.what()));
  }
}

absl::StatusOr<DeviceConfig> LoadDeviceConfigFile(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        fmt::format("device config {}: {}", path, ErrnoText(err)));
  }
  std::string content;
  char buffer[1 << 14];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) {
    content.append(buffer, n);
  }
  if (std::ferror(file.get()) != 0) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        fmt::format("device config {}: read failed: {}", path, ErrnoText(err)));
  }
  absl::StatusOr<DeviceConfig> config = ParseDeviceConfig(content);
  if (!config.ok()) {
    return Annotate(config.status(), path);
  }
  return config;
}

}  // namespace tessera::device

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
#include "tessera/device/mig_config.h"
#include "tessera/device/quantity.h"

namespace tessera::device {
namespace {

// The top-level sections HAMi's config knows (v2.5.2 and v2.10). Only these count when deciding
// whether the document is empty; any other top-level key is ignored, as HAMi ignores it.
constexpr std::string_view kVendorSections[] = {
    "nvidia", "cambricon", "hygon",  "metax", "mthreads", "iluvatar", "iluvatars",
    "vnpus",  "enflame",   "kunlun", "amd",   "vastai",   "biren",    "awsneuron",
};

constexpr std::string_view kYamlIntTag = "tag:yaml.org,2002:int";
constexpr std::string_view kYamlBoolTag = "tag:yaml.org,2002:bool";
constexpr std::string_view kYamlFloatTag = "tag:yaml.org,2002:float";

absl::Status KeyError(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", key, what));
}

std::string_view KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "undefined";
}

// A scalar that YAML would resolve by itself (no quotes) or that carries the explicit `tag`.
bool IsPlainOrTagged(const YAML::Node& node, std::string_view tag) {
  return node.Tag() == "?" || node.Tag() == tag;
}

// Go's zero value, approximated for sections whose schema Tessera does not model: null, "",
// "0", "false", an empty sequence, or a mapping of zero values. `budget` bounds the walk
// (aliases can make a small document a huge tree); running out counts as non-zero.
bool GenericIsZero(const YAML::Node& node, int depth, int& budget) {
  if (--budget < 0 || depth > 64) {
    return false;
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return true;
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      return s.empty() || s == "0" || s == "false";
    }
    case YAML::NodeType::Sequence:
      return node.size() == 0;
    case YAML::NodeType::Map:
      for (const auto& entry : node) {
        if (!GenericIsZero(entry.second, depth + 1, budget)) {
          return false;
        }
      }
      return true;
  }
  return false;
}

// The entries of a mapping as (key, value), rejecting non-scalar and duplicate keys.
absl::Status ForEachEntry(
    const YAML::Node& map, std::string_view where,
    const std::function<absl::Status(const std::string& key, const YAML::Node& value)>& fn) {
  std::set<std::string, std::less<>> seen;
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) {
      return KeyError(where, fmt::format("a key is {}, not a scalar", KindName(entry.first)));
    }
    const std::string& key = entry.first.Scalar();
    if (!seen.insert(key).second) {
      return KeyError(where, fmt::format("duplicate key {}", QuoteForError(key)));
    }
    TESSERA_RETURN_IF_ERROR(fn(key, entry.second));
  }
  return absl::OkStatus();
}

absl::Status NotScalar(std::string_view key, std::string_view want, const YAML::Node& node) {
  return KeyError(key, fmt::format("not {}: got {}", want, KindName(node)));
}

// Each parser leaves `out` untouched for a null value (the key then keeps its default) and
// sets `nonzero` when the value differs from Go's zero value.
absl::Status ParseNonNegativeInt32(const YAML::Node& node, std::string_view key, int32_t& out,
                                   bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsScalar()) {
    return NotScalar(key, "an integer", node);
  }
  const std::string& s = node.Scalar();
  std::string_view digits = s;
  bool plus = !digits.empty() && digits[0] == '+';
  if (plus) {
    digits.remove_prefix(1);
  }
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  bool whole = !digits.empty() && end == digits.data() + digits.size() &&
               ((digits[0] == '-' && !plus) || (digits[0] >= '0' && digits[0] <= '9'));
  if (!IsPlainOrTagged(node, kYamlIntTag) || !whole ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return KeyError(key, fmt::format("not an integer: {}", QuoteForError(s)));
  }
  if (ec == std::errc::result_out_of_range || value > std::numeric_limits<int32_t>::max() ||
      value < std::numeric_limits<int32_t>::min()) {
    return KeyError(key, fmt::format("out of range: {}", s));
  }
  if (value < 0) {
    return KeyError(key, fmt::format("must not be negative: {}", s));
  }
  out = static_cast<int32_t>(value);
  nonzero = nonzero || value != 0;
  return absl::OkStatus();
}

absl::Status ParseNonNegativeDouble(const YAML::Node& node, std::string_view key, double& out,
                                    bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsScalar()) {
    return NotScalar(key, "a number", node);
  }
  const std::string& s = node.Scalar();
  std::string_view text = s;
  bool plus = !text.empty() && text[0] == '+';
  if (plus) {
    text.remove_prefix(1);
  }
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool starts_numeric = !text.empty() && ((text[0] == '-' && !plus) || text[0] == '.' ||
                                          (text[0] >= '0' && text[0] <= '9'));
  if (!IsPlainOrTagged(node, kYamlFloatTag) || !starts_numeric || ec != std::errc() ||
      end != text.data() + text.size() || !std::isfinite(value)) {
    return KeyError(key, fmt::format("not a finite number: {}", QuoteForError(s)));
  }
  if (value < 0) {
    return KeyError(key, fmt::format("must not be negative: {}", s));
  }
  out = value;
  nonzero = nonzero || value != 0;
  return absl::OkStatus();
}

absl::Status ParseBool(const YAML::Node& node, std::string_view key, bool& out, bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsScalar()) {
    return NotScalar(key, "a boolean", node);
  }
  // YAML 1.1 booleans, which HAMi's Go YAML decoder accepts.
  static constexpr std::string_view kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                               "YES",  "on",   "On",   "ON"};
  static constexpr std::string_view kFalse[] = {"false", "False", "FALSE", "no", "No",
                                                "NO",    "off",   "Off",   "OFF"};
  const std::string& s = node.Scalar();
  if (IsPlainOrTagged(node, kYamlBoolTag)) {
    for (std::string_view t : kTrue) {
      if (s == t) {
        out = true;
        nonzero = true;
        return absl::OkStatus();
      }
    }
    for (std::string_view f : kFalse) {
      if (s == f) {
        out = false;
        return absl::OkStatus();
      }
    }
  }
  return KeyError(key, fmt::format("not a boolean: {}", QuoteForError(s)));
}

absl::Status ParseString(const YAML::Node& node, std::string_view key, std::string& out,
                         bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsScalar()) {
    return NotScalar(key, "a string", node);
  }
  out = node.Scalar();
  nonzero = nonzero || !out.empty();
  return absl::OkStatus();
}

absl::Status ParseResourceName(const YAML::Node& node, std::string_view key, std::string& out,
                               bool& nonzero) {
  std::string value = out;
  TESSERA_RETURN_IF_ERROR(ParseString(node, key, value, nonzero));
  if (value.empty()) {
    return KeyError(key, "must not be empty");
  }
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return KeyError(key, fmt::format("resource name contains whitespace or a control "
                                       "character: {}",
                                       QuoteForError(value)));
    }
  }
  out = std::move(value);
  return absl::OkStatus();
}

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

absl::StatusOr<NvidiaConfig> ParseDocument(const YAML::Node& root) {
  if (root.IsNull() || !root.IsDefined()) {
    return absl::InvalidArgumentError("device config: every vendor section is empty");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        fmt::format("device config: the top level is {}, not a mapping", KindName(root)));
  }
  NvidiaConfig config = DefaultNvidiaConfig();
  bool any_section = false;
  int budget = 100000;
  TESSERA_RETURN_IF_ERROR(
      ForEachEntry(root, "device config", [&](const std::string& key, const YAML::Node& value) {
        if (key == "nvidia") {
          bool nonzero = false;
          absl::Status status = ParseNvidia(value, config, nonzero);
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

absl::StatusOr<NvidiaConfig> ParseDeviceConfig(std::string_view yaml) {
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

absl::StatusOr<NvidiaConfig> LoadDeviceConfigFile(const std::string& path) {
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
  absl::StatusOr<NvidiaConfig> config = ParseDeviceConfig(content);
  if (!config.ok()) {
    return Annotate(config.status(), path);
  }
  return config;
}

}  // namespace tessera::device

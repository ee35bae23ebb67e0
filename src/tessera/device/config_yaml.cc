#include "tessera/device/config_yaml.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "yaml-cpp/yaml.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/quantity.h"

namespace tessera::device::internal {
namespace {

constexpr std::string_view kYamlIntTag = "tag:yaml.org,2002:int";
constexpr std::string_view kYamlBoolTag = "tag:yaml.org,2002:bool";
constexpr std::string_view kYamlFloatTag = "tag:yaml.org,2002:float";

// A scalar that YAML would resolve by itself (no quotes) or that carries the explicit `tag`.
bool IsPlainOrTagged(const YAML::Node& node, std::string_view tag) {
  return node.Tag() == "?" || node.Tag() == tag;
}

absl::Status NotScalar(std::string_view key, std::string_view want, const YAML::Node& node) {
  return KeyError(key, fmt::format("not {}: got {}", want, KindName(node)));
}

// A non-negative integer up to `max`; `out` untouched for null.
absl::Status ParseNonNegativeInteger(const YAML::Node& node, std::string_view key, int64_t max,
                                     int64_t& out, bool& nonzero) {
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
  if (ec == std::errc::result_out_of_range || value > max || value < -max - 1) {
    return KeyError(key, fmt::format("out of range: {}", s));
  }
  if (value < 0) {
    return KeyError(key, fmt::format("must not be negative: {}", s));
  }
  out = value;
  nonzero = nonzero || value != 0;
  return absl::OkStatus();
}

}  // namespace

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

absl::Status ParseNonNegativeInt32(const YAML::Node& node, std::string_view key, int32_t& out,
                                   bool& nonzero) {
  int64_t value = out;
  TESSERA_RETURN_IF_ERROR(
      ParseNonNegativeInteger(node, key, std::numeric_limits<int32_t>::max(), value, nonzero));
  out = static_cast<int32_t>(value);
  return absl::OkStatus();
}

absl::Status ParseNonNegativeInt64(const YAML::Node& node, std::string_view key, int64_t& out,
                                   bool& nonzero) {
  return ParseNonNegativeInteger(node, key, std::numeric_limits<int64_t>::max(), out, nonzero);
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

}  // namespace tessera::device::internal

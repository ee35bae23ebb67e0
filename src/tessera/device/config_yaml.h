// File: tessera/device/config_yaml.h
//
// Internal to the device-config parsers (device_config.cc, ascend_config.cc, mig_config.cc): the
// YAML scalar rules HAMi's Go decoder applies, with Tessera's stricter checks. Each parser leaves
// `out` untouched for a null value (the key keeps its default) and sets `nonzero` when the value
// differs from Go's zero value (HAMi rejects a document whose vendor sections are all zero).
// Errors are InvalidArgument naming the key path, e.g. `nvidia.defaultMemory: not an integer: "x"`.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "yaml-cpp/yaml.h"

namespace tessera::device::internal {

absl::Status KeyError(std::string_view key, std::string_view what);
// "null", "a scalar", "a sequence", "a mapping".
std::string_view KindName(const YAML::Node& node);

// Go's zero value, approximated for sections whose schema Tessera does not model: null, "",
// "0", "false", an empty sequence, or a mapping of zero values. `budget` bounds the walk
// (aliases can make a small document a huge tree); running out counts as non-zero.
bool GenericIsZero(const YAML::Node& node, int depth, int& budget);

// The entries of a mapping as (key, value), rejecting non-scalar and duplicate keys.
absl::Status ForEachEntry(
    const YAML::Node& map, std::string_view where,
    const std::function<absl::Status(const std::string& key, const YAML::Node& value)>& fn);

// A plain or !!int scalar, non-negative, at most int32 (or int64) max.
absl::Status ParseNonNegativeInt32(const YAML::Node& node, std::string_view key, int32_t& out,
                                   bool& nonzero);
absl::Status ParseNonNegativeInt64(const YAML::Node& node, std::string_view key, int64_t& out,
                                   bool& nonzero);
// A plain or !!float scalar, finite and non-negative.
absl::Status ParseNonNegativeDouble(const YAML::Node& node, std::string_view key, double& out,
                                    bool& nonzero);
// A YAML 1.1 boolean (true/yes/on, false/no/off in three casings), plain or !!bool.
absl::Status ParseBool(const YAML::Node& node, std::string_view key, bool& out, bool& nonzero);
absl::Status ParseString(const YAML::Node& node, std::string_view key, std::string& out,
                         bool& nonzero);
// A string that is non-empty and has no whitespace or control character.
absl::Status ParseResourceName(const YAML::Node& node, std::string_view key, std::string& out,
                               bool& nonzero);

}  // namespace tessera::device::internal

// File: tessera/device/mig_config.h
//
// Internal to device_config.cc: the parsers of the device config's MIG keys
// (nvidia.migProfileAllowlist, nvidia.knownMigGeometries), kept apart from the scalar keys.
// Same conventions as device_config.cc: null keeps the default (empty), `nonzero` is set when the
// value differs from Go's zero value, errors are InvalidArgument naming the key path, e.g.
// `nvidia.migProfileAllowlist[0]: MIG profile allowlist must define models and profiles`.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "yaml-cpp/yaml.h"

#include "tessera/device/device_config.h"

namespace tessera::device::internal {

// device_config.cc's integer rule (plain or !!int scalar, non-negative int32).
using YamlIntParser = absl::Status (*)(const YAML::Node& node, std::string_view key, int32_t& out,
                                       bool& nonzero);

absl::Status ParseMigAllowlist(const YAML::Node& node, std::string_view key,
                               std::vector<MigAllowlistEntry>& out, bool& nonzero);

absl::Status ParseMigGeometries(const YAML::Node& node, std::string_view key,
                                YamlIntParser parse_int, std::vector<MigGeometryEntry>& out,
                                bool& nonzero);

}  // namespace tessera::device::internal

// File: tessera/device/ascend_config.h
//
// Internal to device_config.cc: the parser of the `vnpus:` section (Huawei Ascend chips, HAMi
// pkg/device/ascend/vnpu.go), in v2.10's form {hamiVnpuCore, configs} or v2.5's bare list of
// configs. Same conventions as the other keys (config_yaml.h). Beyond HAMi, which accepts any
// entry, a chip must make valid annotation keys and resource names: commonWord is required, at
// most 40 characters of [A-Za-z0-9._-] starting and ending alphanumeric, and unique;
// resourceName and resourceMemoryName are required; templates are sorted by memory (stably).
// Errors name the path, e.g. `vnpus.configs[2].commonWord: duplicate "Ascend910B3"`.
//
// Thread safety: pure functions.
#pragma once

#include "absl/status/status.h"
#include "yaml-cpp/yaml.h"

#include "tessera/device/device_config.h"

namespace tessera::device::internal {

absl::Status ParseAscendSection(const YAML::Node& node, AscendConfig& out, bool& nonzero);

}  // namespace tessera::device::internal

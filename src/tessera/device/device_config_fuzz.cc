// Fuzz target: ParseDeviceConfig is total (yaml-cpp exceptions never escape), and an accepted
// document yields a configuration that satisfies the documented invariants (the Ascend chips'
// too: unique common words, required names, templates sorted by memory).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "tessera/device/device_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::device::DeviceConfig> config = tessera::device::ParseDeviceConfig(yaml);
  if (!config.ok()) {
    if (config.status().message().empty()) {
      std::abort();  // every error says what is wrong
    }
    return 0;
  }
  const tessera::device::NvidiaConfig& c = config->nvidia;
  if (c.resource_count_name.empty() || c.resource_memory_name.empty() ||
      c.resource_memory_percentage_name.empty() || c.resource_core_name.empty() ||
      c.resource_priority_name.empty() || c.default_memory < 0 || c.default_cores < 0 ||
      c.default_gpu_num < 0 || c.memory_factor < 0 || c.device_split_count < 0 ||
      !(c.device_memory_scaling >= 0) || !(c.device_core_scaling >= 0)) {
    std::abort();
  }
  std::set<std::string> words;
  for (const tessera::device::AscendChipConfig& chip : config->ascend.chips) {
    if (chip.common_word.empty() || !words.insert(chip.common_word).second ||
        chip.resource_name.empty() || chip.resource_memory_name.empty() ||
        chip.memory_allocatable < 0 || chip.memory_capacity < 0 || chip.memory_factor < 0 ||
        !std::is_sorted(chip.templates.begin(), chip.templates.end(),
                        [](const auto& a, const auto& b) { return a.memory < b.memory; })) {
      std::abort();
    }
  }
  return 0;
}

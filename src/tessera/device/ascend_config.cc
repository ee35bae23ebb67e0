#include "tessera/device/ascend_config.h"

#include <algorithm>
#include <cstddef>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "yaml-cpp/yaml.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/config_yaml.h"
#include "tessera/device/quantity.h"

namespace tessera::device::internal {
namespace {

constexpr size_t kMaxCommonWord = 40;

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// The common word is the infix of annotation keys (hami.io/node-register-<cw>, ...): their name
// part allows [A-Za-z0-9._-], alphanumeric at both ends, 63 characters in all.
bool ValidCommonWord(std::string_view word) {
  if (word.empty() || word.size() > kMaxCommonWord || !IsAlnum(word.front()) ||
      !IsAlnum(word.back())) {
    return false;
  }
  return std::all_of(word.begin(), word.end(),
                     [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

absl::Status ParseTemplate(const YAML::Node& node, const std::string& where, AscendTemplate& out,
                           bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsMap()) {
    return KeyError(where, fmt::format("not a mapping: got {}", KindName(node)));
  }
  return ForEachEntry(node, where,
                      [&](const std::string& key, const YAML::Node& value) -> absl::Status {
                        std::string path = where + "." + key;
                        if (key == "name") {
                          return ParseString(value, path, out.name, nonzero);
                        }
                        if (key == "memory") {
                          return ParseNonNegativeInt64(value, path, out.memory, nonzero);
                        }
                        if (key == "aiCore") {
                          return ParseNonNegativeInt32(value, path, out.ai_core, nonzero);
                        }
                        if (key == "aiCPU") {
                          return ParseNonNegativeInt32(value, path, out.ai_cpu, nonzero);
                        }
                        return absl::OkStatus();
                      });
}

absl::Status ParseTemplates(const YAML::Node& node, const std::string& where,
                            std::vector<AscendTemplate>& out, bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsSequence()) {
    return KeyError(where, fmt::format("not a sequence: got {}", KindName(node)));
  }
  out.clear();
  for (size_t i = 0; i < node.size(); ++i) {
    nonzero = true;
    AscendTemplate entry;
    TESSERA_RETURN_IF_ERROR(
        ParseTemplate(node[i], fmt::format("{}[{}]", where, i), entry, nonzero));
    out.push_back(std::move(entry));
  }
  std::stable_sort(out.begin(), out.end(), [](const AscendTemplate& a, const AscendTemplate& b) {
    return a.memory < b.memory;
  });
  return absl::OkStatus();
}

absl::Status ParseChipKey(const std::string& key, const YAML::Node& value, const std::string& path,
                          AscendChipConfig& chip, bool& nonzero) {
  if (key == "commonWord") {
    return ParseString(value, path, chip.common_word, nonzero);
  }
  if (key == "chipName") {
    return ParseString(value, path, chip.chip_name, nonzero);
  }
  if (key == "resourceName") {
    return ParseResourceName(value, path, chip.resource_name, nonzero);
  }
  if (key == "resourceMemoryName") {
    return ParseResourceName(value, path, chip.resource_memory_name, nonzero);
  }
  if (key == "resourceCoreName") {
    // May be empty: the chip then has no core resource (HAMi checks for "").
    std::string name;
    TESSERA_RETURN_IF_ERROR(ParseString(value, path, name, nonzero));
    if (!name.empty()) {
      TESSERA_RETURN_IF_ERROR(ParseResourceName(value, path, chip.resource_core_name, nonzero));
    }
    return absl::OkStatus();
  }
  if (key == "memoryAllocatable") {
    return ParseNonNegativeInt64(value, path, chip.memory_allocatable, nonzero);
  }
  if (key == "memoryCapacity") {
    return ParseNonNegativeInt64(value, path, chip.memory_capacity, nonzero);
  }
  if (key == "memoryFactor") {
    return ParseNonNegativeInt32(value, path, chip.memory_factor, nonzero);
  }
  if (key == "aiCore") {
    return ParseNonNegativeInt32(value, path, chip.ai_core, nonzero);
  }
  if (key == "aiCPU") {
    return ParseNonNegativeInt32(value, path, chip.ai_cpu, nonzero);
  }
  if (key == "runtimeClassName") {
    return ParseString(value, path, chip.runtime_class_name, nonzero);
  }
  if (key == "overwriteEnv") {
    return ParseBool(value, path, chip.overwrite_env, nonzero);
  }
  if (key == "superPod") {
    return ParseBool(value, path, chip.super_pod, nonzero);
  }
  if (key == "templates") {
    return ParseTemplates(value, path, chip.templates, nonzero);
  }
  return absl::OkStatus();  // unknown keys are ignored, as in HAMi
}

absl::Status ParseChip(const YAML::Node& node, const std::string& where, AscendChipConfig& chip,
                       bool& nonzero) {
  if (!node.IsMap()) {
    return KeyError(where, fmt::format("not a mapping: got {}", KindName(node)));
  }
  TESSERA_RETURN_IF_ERROR(ForEachEntry(
      node, where, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        return ParseChipKey(key, value, where + "." + key, chip, nonzero);
      }));
  if (!ValidCommonWord(chip.common_word)) {
    return KeyError(where + ".commonWord",
                    chip.common_word.empty()
                        ? std::string("required")
                        : fmt::format("{} cannot be part of an annotation key (at most {} of "
                                      "[A-Za-z0-9._-], alphanumeric at both ends)",
                                      QuoteForError(chip.common_word), kMaxCommonWord));
  }
  if (chip.resource_name.empty()) {
    return KeyError(where + ".resourceName", "required");
  }
  if (chip.resource_memory_name.empty()) {
    return KeyError(where + ".resourceMemoryName", "required");
  }
  return absl::OkStatus();
}

absl::Status ParseChips(const YAML::Node& node, const std::string& where, AscendConfig& out,
                        bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsSequence()) {
    return KeyError(where, fmt::format("not a sequence: got {}", KindName(node)));
  }
  std::set<std::string, std::less<>> words;
  std::set<std::string, std::less<>> resources;
  for (size_t i = 0; i < node.size(); ++i) {
    std::string path = fmt::format("{}[{}]", where, i);
    if (node[i].IsNull()) {
      return KeyError(path, "not a mapping: got null");
    }
    nonzero = true;
    AscendChipConfig chip;
    TESSERA_RETURN_IF_ERROR(ParseChip(node[i], path, chip, nonzero));
    if (!words.insert(chip.common_word).second) {
      return KeyError(path + ".commonWord",
                      fmt::format("duplicate {}", QuoteForError(chip.common_word)));
    }
    for (const std::string* name :
         {&chip.resource_name, &chip.resource_memory_name, &chip.resource_core_name}) {
      if (!name->empty() && !resources.insert(*name).second) {
        return KeyError(path, fmt::format("resource name {} is used twice", QuoteForError(*name)));
      }
    }
    out.chips.push_back(std::move(chip));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseAscendSection(const YAML::Node& node, AscendConfig& out, bool& nonzero) {
  if (node.IsNull()) {
    return absl::OkStatus();
  }
  out = AscendConfig{};
  if (node.IsSequence()) {  // v2.5–v2.9: the list of configs
    return ParseChips(node, "vnpus", out, nonzero);
  }
  if (!node.IsMap()) {
    return KeyError("vnpus", fmt::format("not a mapping: got {}", KindName(node)));
  }
  return ForEachEntry(
      node, "vnpus", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        if (key == "hamiVnpuCore") {
          // Only configs count towards a non-empty document, as in HAMi.
          bool ignored = false;
          return ParseBool(value, "vnpus.hamiVnpuCore", out.hami_vnpu_core, ignored);
        }
        if (key == "configs") {
          return ParseChips(value, "vnpus.configs", out, nonzero);
        }
        return absl::OkStatus();
      });
}

}  // namespace tessera::device::internal

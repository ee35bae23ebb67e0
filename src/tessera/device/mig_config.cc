// The device config's MIG keys. See mig_config.h.
#include "tessera/device/mig_config.h"

#include <string>

#include "fmt/format.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/mig.h"
#include "tessera/device/quantity.h"

namespace tessera::device {
namespace internal {
namespace {

absl::Status Error(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", key, what));
}

// The value at `key` of a mapping, or a null node when the key is absent (yaml-cpp's own
// lookup returns a node on which every query throws).
YAML::Node Child(const YAML::Node& map, std::string_view key) {
  const YAML::Node child = map[std::string(key)];
  return child.IsDefined() ? child : YAML::Node(YAML::NodeType::Null);
}

// A sequence (null: empty) whose elements are passed to fn(path, element).
template <typename Fn>
absl::Status ForEachElement(const YAML::Node& node, std::string_view key, Fn fn) {
  if (!node.IsDefined() || node.IsNull()) {
    return absl::OkStatus();
  }
  if (!node.IsSequence()) {
    return Error(key, "not a sequence");
  }
  for (size_t i = 0; i < node.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(fn(fmt::format("{}[{}]", key, i), node[i]));
  }
  return absl::OkStatus();
}

absl::Status ParseStrings(const YAML::Node& node, std::string_view key,
                          std::vector<std::string>& out) {
  auto string_of = [&](const std::string& path, const YAML::Node& element) -> absl::Status {
    if (!element.IsScalar()) {
      return Error(path, "not a string");
    }
    out.push_back(element.Scalar());
    return absl::OkStatus();
  };
  return ForEachElement(node, key, string_of);
}

// An error unless `node` is a mapping.
absl::Status CheckMap(const YAML::Node& node, std::string_view path) {
  if (!node.IsMap()) {
    return Error(path, "not a mapping");
  }
  return absl::OkStatus();
}

// Reads every element of the sequence with entry_of (which appends to `entries`); only when all
// passed does `entries` replace `out`, so a bad value changes nothing.
template <typename Entry, typename Fn>
absl::Status ReadAll(const YAML::Node& node, std::string_view key, Fn entry_of,
                     std::vector<Entry>& entries, std::vector<Entry>& out, bool& nonzero) {
  TESSERA_RETURN_IF_ERROR(ForEachElement(node, key, entry_of));
  nonzero = nonzero || !entries.empty();
  out = std::move(entries);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseMigAllowlist(const YAML::Node& node, std::string_view key,
                               std::vector<MigAllowlistEntry>& out, bool& nonzero) {
  std::vector<MigAllowlistEntry> entries;
  auto entry_of = [&](const std::string& path, const YAML::Node& element) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckMap(element, path));
    MigAllowlistEntry entry;
    TESSERA_RETURN_IF_ERROR(ParseStrings(Child(element, "models"), path + ".models", entry.models));
    TESSERA_RETURN_IF_ERROR(
        ParseStrings(Child(element, "profiles"), path + ".profiles", entry.profiles));
    // HAMi's ValidateMigProfileAllowlist, fatal in its scheduler and plugin.
    if (entry.models.empty() || entry.profiles.empty()) {
      return Error(path, "MIG profile allowlist must define models and profiles");
    }
    for (const std::string& profile : entry.profiles) {
      if (absl::Status s = ValidateMigProfileName(profile); !s.ok()) {
        return Error(path, std::string(s.message()));
      }
    }
    entries.push_back(std::move(entry));
    return absl::OkStatus();
  };
  return ReadAll(node, key, entry_of, entries, out, nonzero);
}

absl::Status ParseMigGeometries(const YAML::Node& node, std::string_view key,
                                YamlIntParser parse_int, std::vector<MigGeometryEntry>& out,
                                bool& nonzero) {
  std::vector<MigGeometryEntry> entries;
  std::vector<MigTemplate> templates;  // of the geometry being read
  auto template_of = [&](const std::string& path, const YAML::Node& t) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckMap(t, path));
    MigTemplate mt;
    bool any = false;
    const YAML::Node name = Child(t, "name");
    if (!name.IsNull()) {
      if (!name.IsScalar()) {
        return Error(path + ".name", "not a string");
      }
      mt.name = name.Scalar();
    }
    TESSERA_RETURN_IF_ERROR(parse_int(Child(t, "core"), path + ".core", mt.core, any));
    TESSERA_RETURN_IF_ERROR(parse_int(Child(t, "memory"), path + ".memory", mt.memory, any));
    TESSERA_RETURN_IF_ERROR(parse_int(Child(t, "count"), path + ".count", mt.count, any));
    templates.push_back(std::move(mt));
    return absl::OkStatus();
  };
  MigGeometryEntry entry;
  auto geometry_of = [&](const std::string& path, const YAML::Node& geometry) -> absl::Status {
    templates.clear();
    TESSERA_RETURN_IF_ERROR(ForEachElement(geometry, path, template_of));
    entry.geometries.push_back(templates);
    return absl::OkStatus();
  };
  auto entry_of = [&](const std::string& path, const YAML::Node& element) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckMap(element, path));
    entry = MigGeometryEntry{};
    TESSERA_RETURN_IF_ERROR(ParseStrings(Child(element, "models"), path + ".models", entry.models));
    TESSERA_RETURN_IF_ERROR(ForEachElement(Child(element, "allowedGeometries"),
                                           path + ".allowedGeometries", geometry_of));
    entries.push_back(entry);
    return absl::OkStatus();
  };
  return ReadAll(node, key, entry_of, entries, out, nonzero);
}

}  // namespace internal

namespace {

// HAMi's rule for both MIG lists: the first entry with a model that is a substring of `type`.
template <typename Entry>
const Entry* FirstForType(const std::vector<Entry>& entries, std::string_view type) {
  for (const Entry& e : entries) {
    for (const std::string& model : e.models) {
      if (type.find(model) != std::string_view::npos) {
        return &e;
      }
    }
  }
  return nullptr;
}

}  // namespace

const MigAllowlistEntry* FindMigAllowlist(const NvidiaConfig& config, std::string_view type) {
  return FirstForType(config.mig_profile_allowlist, type);
}

const MigGeometryEntry* FindMigGeometries(const NvidiaConfig& config, std::string_view type) {
  return FirstForType(config.known_mig_geometries, type);
}

}  // namespace tessera::device

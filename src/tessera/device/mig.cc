// The MIG wire formats: migProfiles, hami.io/vgpu-mig-allocations, profile names. See mig.h.
#include "tessera/device/mig.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

#include "tessera/base/status_macros.h"
#include "tessera/device/codec_internal.h"
#include "tessera/json/text.h"

namespace tessera::device {
namespace {

using Json = nlohmann::ordered_json;
using internal::Quote;

// Parses `text` as one JSON document; nlohmann reports errors by exception.
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: not JSON: {}", what, e.what()));
  }
}

// The members of an object, calling fn(canonical key, value) for each key Go would match to one
// of `keys` (ASCII case-insensitively); other keys are ignored as Go ignores them.
template <typename Fn>
absl::Status ForEachKnownKey(const Json& object, std::initializer_list<std::string_view> keys,
                             Fn fn) {
  for (const auto& [key, value] : object.items()) {
    for (std::string_view want : keys) {
      if (json::KeyEqualsFold(key, want)) {
        TESSERA_RETURN_IF_ERROR(fn(want, value));
        break;
      }
    }
  }
  return absl::OkStatus();
}

// An integer field into [lo, hi]; JSON null keeps the Go zero value 0.
absl::Status ReadInteger(const Json& v, const std::string& where, int64_t lo, int64_t hi,
                         int64_t* out) {
  if (v.is_null()) {
    *out = 0;
    return absl::OkStatus();
  }
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return absl::InvalidArgumentError(fmt::format("{}: out of range: {}", where, u));
    }
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (v.is_number_integer()) {
    auto i = v.get<int64_t>();
    if (i < lo || i > hi) {
      return absl::InvalidArgumentError(fmt::format("{}: out of range: {}", where, i));
    }
    *out = i;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(fmt::format("{}: not an integer: {}", where, v.dump()));
}

absl::Status ReadInt32(const Json& v, const std::string& where, int32_t* out) {
  int64_t value = 0;
  TESSERA_RETURN_IF_ERROR(ReadInteger(v, where, std::numeric_limits<int32_t>::min(),
                                      std::numeric_limits<int32_t>::max(), &value));
  *out = static_cast<int32_t>(value);
  return absl::OkStatus();
}

absl::Status ReadUint32(const Json& v, const std::string& where, uint32_t* out) {
  int64_t value = 0;
  TESSERA_RETURN_IF_ERROR(ReadInteger(v, where, 0, std::numeric_limits<uint32_t>::max(), &value));
  *out = static_cast<uint32_t>(value);
  return absl::OkStatus();
}

absl::Status ReadString(const Json& v, const std::string& where, std::string* out) {
  if (v.is_null()) {
    out->clear();
    return absl::OkStatus();
  }
  if (!v.is_string()) {
    return absl::InvalidArgumentError(fmt::format("{}: not a string: {}", where, v.dump()));
  }
  *out = v.get<std::string>();
  return absl::OkStatus();
}

// A JSON array (or null = empty) of objects (or null = zero object), each passed to fn(i, obj).
template <typename Fn>
absl::Status ForEachObject(const Json& v, std::string_view where, Fn fn) {
  if (v.is_null()) {
    return absl::OkStatus();
  }
  if (!v.is_array()) {
    return absl::InvalidArgumentError(fmt::format("{}: not an array", where));
  }
  static const Json kEmpty = Json::object();
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& element = v[i];
    if (!element.is_null() && !element.is_object()) {
      return absl::InvalidArgumentError(fmt::format("{} {}: not an object", where, i));
    }
    TESSERA_RETURN_IF_ERROR(fn(i, element.is_null() ? kEmpty : element));
  }
  return absl::OkStatus();
}

absl::Status ReadPlacement(const Json& v, const std::string& where, MigPlacement* out) {
  *out = MigPlacement{};
  if (v.is_null()) {
    return absl::OkStatus();
  }
  if (!v.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: not an object", where));
  }
  return ForEachKnownKey(v, {"start", "size"}, [&](std::string_view key, const Json& value) {
    return ReadUint32(value, fmt::format("{}.{}", where, key),
                      key == "start" ? &out->start : &out->size);
  });
}

void AppendPlacement(std::string* out, const MigPlacement& p) {
  *out += fmt::format("{{\"start\":{},\"size\":{}}}", p.start, p.size);
}

}  // namespace

absl::StatusOr<std::vector<MigProfile>> DecodeMigProfiles(std::string_view json) {
  TESSERA_ASSIGN_OR_RETURN(Json doc, ParseJson(json, "migProfiles"));
  std::vector<MigProfile> profiles;
  auto profile_of = [&](size_t i, const Json& object) -> absl::Status {
    MigProfile p;
    auto field = [&](std::string_view key) {
      return fmt::format("migProfiles {}: field {}", i, key);
    };
    auto placement_of = [&](const std::string& where, const Json& placement) -> absl::Status {
      MigPlacement out;
      TESSERA_RETURN_IF_ERROR(ReadPlacement(placement, where, &out));
      p.placements.push_back(out);
      return absl::OkStatus();
    };
    absl::Status status =
        ForEachKnownKey(object, {"name", "memoryMB", "core", "sliceCount", "placements"},
                        [&](std::string_view key, const Json& v) -> absl::Status {
                          if (key == "name") {
                            return ReadString(v, field(key), &p.name);
                          }
                          if (key == "memoryMB") {
                            return ReadInt32(v, field(key), &p.memory_mb);
                          }
                          if (key == "core") {
                            return ReadInt32(v, field(key), &p.core);
                          }
                          if (key == "sliceCount") {
                            return ReadUint32(v, field(key), &p.slice_count);
                          }
                          p.placements.clear();
                          return ForEachObject(v, field(key), [&](size_t k, const Json& placement) {
                            return placement_of(fmt::format("{} {}", field(key), k), placement);
                          });
                        });
    if (!status.ok()) {
      return status;
    }
    profiles.push_back(std::move(p));
    return absl::OkStatus();
  };
  if (absl::Status s = ForEachObject(doc, "migProfiles", profile_of); !s.ok()) {
    return s;
  }
  return profiles;
}

void AppendMigProfilesJson(std::string* out, const std::vector<MigProfile>& profiles) {
  *out += '[';
  for (size_t i = 0; i < profiles.size(); ++i) {
    const MigProfile& p = profiles[i];
    if (i > 0) {
      *out += ',';
    }
    *out += "{\"name\":";
    json::AppendGoString(out, p.name);
    *out += fmt::format(",\"memoryMB\":{},\"core\":{},\"sliceCount\":{},\"placements\":[",
                        p.memory_mb, p.core, p.slice_count);
    for (size_t k = 0; k < p.placements.size(); ++k) {
      if (k > 0) {
        *out += ',';
      }
      AppendPlacement(out, p.placements[k]);
    }
    *out += "]}";
  }
  *out += ']';
}

absl::StatusOr<std::vector<MigAllocation>> DecodeMigAllocations(std::string_view value) {
  std::vector<MigAllocation> out;
  if (value.empty()) {
    return out;
  }
  const std::string what(kMigAllocationsAnnotation);
  TESSERA_ASSIGN_OR_RETURN(Json doc, ParseJson(value, what));
  std::set<std::pair<int32_t, int32_t>> seen;
  auto allocation_of = [&](size_t i, const Json& object) -> absl::Status {
    MigAllocation a;
    auto field = [&](std::string_view key) {
      return fmt::format("MIG allocation {}: field {}", i, key);
    };
    absl::Status status = ForEachKnownKey(
        object,
        {"containerIndex", "deviceIndex", "gpuUUID", "profile", "placement", "migUUID",
         "gpuInstanceID", "computeInstanceID"},
        [&](std::string_view key, const Json& v) -> absl::Status {
          if (key == "containerIndex") {
            return ReadInt32(v, field(key), &a.container_index);
          }
          if (key == "deviceIndex") {
            return ReadInt32(v, field(key), &a.device_index);
          }
          if (key == "gpuUUID") {
            return ReadString(v, field(key), &a.gpu_uuid);
          }
          if (key == "profile") {
            return ReadString(v, field(key), &a.profile);
          }
          if (key == "placement") {
            return ReadPlacement(v, field(key), &a.placement);
          }
          if (key == "migUUID") {
            return ReadString(v, field(key), &a.mig_uuid);
          }
          // A pointer field: null leaves it unset, as Go leaves the pointer nil.
          bool gi = key == "gpuInstanceID";
          std::optional<uint32_t>& id = gi ? a.gpu_instance_id : a.compute_instance_id;
          if (v.is_null()) {
            id.reset();
            return absl::OkStatus();
          }
          uint32_t n = 0;
          TESSERA_RETURN_IF_ERROR(ReadUint32(v, field(key), &n));
          id = n;
          return absl::OkStatus();
        });
    if (!status.ok()) {
      return status;
    }
    if (a.container_index < 0 || a.device_index < 0 || a.gpu_uuid.empty() || a.profile.empty() ||
        a.placement.size == 0) {
      return absl::InvalidArgumentError(fmt::format("MIG allocation {} is incomplete", i));
    }
    int runtime = (a.mig_uuid.empty() ? 0 : 1) + (a.gpu_instance_id.has_value() ? 1 : 0) +
                  (a.compute_instance_id.has_value() ? 1 : 0);
    if (runtime != 0 && runtime != 3) {
      return absl::InvalidArgumentError(
          fmt::format("MIG allocation {} has partial runtime identity", i));
    }
    if (!seen.emplace(a.container_index, a.device_index).second) {
      return absl::InvalidArgumentError(
          fmt::format("duplicate MIG allocation for container {} device {}", a.container_index,
                      a.device_index));
    }
    out.push_back(std::move(a));
    return absl::OkStatus();
  };
  if (absl::Status s = ForEachObject(doc, what, allocation_of); !s.ok()) {
    return s;
  }
  return out;
}

std::vector<MigAllocation> MigAllocationsOf(const PodDevices& devices,
                                            const PodMigReservations& reservations) {
  std::vector<MigAllocation> out;
  for (size_t c = 0; c < devices.size() && c < reservations.size(); ++c) {
    for (size_t d = 0; d < devices[c].size() && d < reservations[c].size(); ++d) {
      const std::optional<MigReservation>& r = reservations[c][d];
      if (!r.has_value() || r->profile.empty() || r->placement.size == 0) {
        continue;
      }
      MigAllocation a;
      a.container_index = static_cast<int32_t>(c);
      a.device_index = static_cast<int32_t>(d);
      a.gpu_uuid = devices[c][d].uuid;
      a.profile = r->profile;
      a.placement = r->placement;
      out.push_back(std::move(a));
    }
  }
  return out;
}

std::string EncodeMigAllocations(const std::vector<MigAllocation>& allocations) {
  std::string out;
  if (allocations.empty()) {
    return out;
  }
  out += '[';
  for (size_t i = 0; i < allocations.size(); ++i) {
    const MigAllocation& a = allocations[i];
    if (i > 0) {
      out += ',';
    }
    out += fmt::format("{{\"containerIndex\":{},\"deviceIndex\":{},\"gpuUUID\":", a.container_index,
                       a.device_index);
    json::AppendGoString(&out, a.gpu_uuid);
    out += ",\"profile\":";
    json::AppendGoString(&out, a.profile);
    out += ",\"placement\":";
    AppendPlacement(&out, a.placement);
    if (!a.mig_uuid.empty()) {
      out += ",\"migUUID\":";
      json::AppendGoString(&out, a.mig_uuid);
    }
    if (a.gpu_instance_id.has_value()) {
      out += fmt::format(",\"gpuInstanceID\":{}", *a.gpu_instance_id);
    }
    if (a.compute_instance_id.has_value()) {
      out += fmt::format(",\"computeInstanceID\":{}", *a.compute_instance_id);
    }
    out += '}';
  }
  out += ']';
  return out;
}

absl::Status ValidateMigProfileName(std::string_view name) {
  size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot < 2 || name[dot - 1] != 'g') {
    return absl::InvalidArgumentError(fmt::format("invalid MIG profile {}", Quote(name)));
  }
  return absl::OkStatus();
}

uint32_t MigProfileComputeSlices(std::string_view name) {
  size_t g = name.find("g.");
  if (g == std::string_view::npos || g == 0 || g > 2) {
    return 0;
  }
  uint32_t n = 0;
  for (size_t i = 0; i < g; ++i) {
    if (name[i] < '0' || name[i] > '9') {
      return 0;
    }
    n = n * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  return n;
}

}  // namespace tessera::device

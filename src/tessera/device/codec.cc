// Node registration, pod device lists and the cordon list. See codec.h and
// docs/wire-formats.md for the formats.
#include "tessera/device/codec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>

#include "absl/status/status.h"
#include "simdjson.h"
#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/device/codec_internal.h"
#include "tessera/device/mig.h"
#include "tessera/json/text.h"

namespace tessera::device {
namespace {

using internal::ParseGoBool;
using internal::ParseGoInt32;
using internal::Quote;
using internal::Split;

constexpr std::string_view kHamiCore = "hami-core";
constexpr char kJsonSpace[] = " \t\n\r";

absl::Status DeviceError(size_t device, std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(fmt::format("device {}: field {}: {}", device, field, problem));
}

// Ids must be present and unique: the ledger and NodeDevices::Find key devices by UUID.
absl::Status CheckIds(const std::vector<DeviceInfo>& devices) {
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].id.empty()) {
      return DeviceError(i, "id", "empty");
    }
    if (!seen.insert(devices[i].id).second) {
      return DeviceError(i, "id", fmt::format("duplicate {}", Quote(devices[i].id)));
    }
  }
  return absl::OkStatus();
}

// ---- Delimited register (v2.5–v2.7 plugin) -------------------------------------------------

absl::StatusOr<std::vector<DeviceInfo>> DecodeRegisterDelimited(std::string_view value) {
  if (value.find(':') == std::string_view::npos) {
    return absl::InvalidArgumentError(fmt::format(
        "node register: neither a JSON array nor ':'-terminated devices: {}", Quote(value)));
  }
  std::vector<DeviceInfo> devices;
  for (std::string_view segment : Split(value, ':')) {
    if (segment.find(',') == std::string_view::npos) {
      continue;
    }
    const size_t n = devices.size();
    std::vector<std::string_view> f = Split(segment, ',');
    if (f.size() != 7 && f.size() != 9) {
      return absl::InvalidArgumentError(
          fmt::format("device {}: {} comma fields, want 7 or 9: {}", n, f.size(), Quote(segment)));
    }
    DeviceInfo d;
    d.id = std::string(f[0]);
    // Re-encoded, such an id would make the value look like JSON.
    if (size_t k = d.id.find_first_not_of(kJsonSpace); k != std::string::npos && d.id[k] == '[') {
      return DeviceError(n, "id", fmt::format("starts with '[': {}", Quote(d.id)));
    }
    auto number = [&](std::string_view field, std::string_view text, int32_t* out) -> absl::Status {
      std::optional<int32_t> v = ParseGoInt32(text);
      if (!v.has_value()) {
        return DeviceError(n, field, fmt::format("not an integer: {}", Quote(text)));
      }
      *out = *v;
      return absl::OkStatus();
    };
    if (absl::Status s = number("count", f[1], &d.count); !s.ok()) {
      return s;
    }
    if (absl::Status s = number("devmem", f[2], &d.devmem); !s.ok()) {
      return s;
    }
    if (absl::Status s = number("devcore", f[3], &d.devcore); !s.ok()) {
      return s;
    }
    d.type = std::string(f[4]);
    if (absl::Status s = number("numa", f[5], &d.numa); !s.ok()) {
      return s;
    }
    std::optional<bool> health = ParseGoBool(f[6]);
    if (!health.has_value()) {
      return DeviceError(n, "health", fmt::format("not a boolean: {}", Quote(f[6])));
    }
    d.health = *health;
    d.index = 0;
    d.mode = std::string(kHamiCore);
    if (f.size() == 9) {
      if (absl::Status s = number("index", f[7], &d.index); !s.ok()) {
        return s;
      }
      if (d.index < 0) {
        return DeviceError(n, "index", fmt::format("negative: {}", d.index));
      }
      if (!f[8].empty()) {
        d.mode = std::string(f[8]);
      }
    }
    devices.push_back(std::move(d));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "node register: no device (no ':'-separated segment with ','): {}", Quote(value)));
  }
  return devices;
}

// ---- JSON register (v2.8+ plugin) ----------------------------------------------------------

bool KeyIs(std::string_view key, std::string_view want) {
  if (key.size() != want.size()) {
    return false;
  }
  for (size_t i = 0; i < key.size(); ++i) {
    char c = key[i];
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
    if (c != want[i]) {
      return false;
    }
  }
  return true;
}

std::string_view JsonError(simdjson::error_code error) { return simdjson::error_message(error); }

// Checks that `v` is JSON null or of type `want`; sets *is_null accordingly. A null field takes
// the Go zero value, so the callers then store that.
absl::Status ExpectType(simdjson::ondemand::value& v, size_t n, std::string_view field,
                        simdjson::ondemand::json_type want, std::string_view want_error,
                        bool* is_null) {
  simdjson::ondemand::json_type type;
  if (auto e = v.type().get(type); e) {
    return DeviceError(n, field, JsonError(e));
  }
  *is_null = type == simdjson::ondemand::json_type::null;
  if (*is_null) {
    bool null_value = false;
    if (auto e = v.is_null().get(null_value); e || !null_value) {
      return DeviceError(n, field, "invalid null");
    }
    return absl::OkStatus();
  }
  if (type != want) {
    return DeviceError(n, field, want_error);
  }
  return absl::OkStatus();
}

// Reads an int32 field; JSON null leaves the Go zero value.
absl::Status ReadInt(simdjson::ondemand::value& v, size_t n, std::string_view field, int32_t* out) {
  bool is_null = false;
  TESSERA_RETURN_IF_ERROR(
      ExpectType(v, n, field, simdjson::ondemand::json_type::number, "not a number", &is_null));
  if (is_null) {
    *out = 0;
    return absl::OkStatus();
  }
  int64_t value = 0;
  if (auto e = v.get_int64().get(value); e) {
    return DeviceError(n, field, fmt::format("not an integer ({})", JsonError(e)));
  }
  if (value < INT32_MIN || value > INT32_MAX) {
    return DeviceError(n, field, fmt::format("out of int32 range: {}", value));
  }
  *out = static_cast<int32_t>(value);
  return absl::OkStatus();
}

absl::Status ReadString(simdjson::ondemand::value& v, size_t n, std::string_view field,
                        std::string* out) {
  bool is_null = false;
  TESSERA_RETURN_IF_ERROR(
      ExpectType(v, n, field, simdjson::ondemand::json_type::string, "not a string", &is_null));
  if (is_null) {
    out->clear();
    return absl::OkStatus();
  }
  std::string_view s;
  if (auto e = v.get_string().get(s); e) {
    return DeviceError(n, field, JsonError(e));
  }
  out->assign(s.data(), s.size());
  return absl::OkStatus();
}

absl::Status ReadBool(simdjson::ondemand::value& v, size_t n, std::string_view field, bool* out) {
  bool is_null = false;
  TESSERA_RETURN_IF_ERROR(
      ExpectType(v, n, field, simdjson::ondemand::json_type::boolean, "not a boolean", &is_null));
  if (is_null) {
    *out = false;
    return absl::OkStatus();
  }
  if (auto e = v.get_bool().get(*out); e) {
    return DeviceError(n, field, JsonError(e));
  }
  return absl::OkStatus();
}

// The migProfiles value, decoded by tessera/device/mig.h from its raw text.
absl::Status ReadMigProfiles(simdjson::ondemand::value& v, size_t n, std::vector<MigProfile>* out) {
  std::string_view raw;
  if (auto e = simdjson::to_json_string(v).get(raw); e) {
    return DeviceError(n, "migProfiles", JsonError(e));
  }
  absl::StatusOr<std::vector<MigProfile>> profiles = DecodeMigProfiles(raw);
  if (!profiles.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("device {}: {}", n, std::string(profiles.status().message())));
  }
  *out = *std::move(profiles);
  return absl::OkStatus();
}

// custominfo: a JSON object of anything (Go map[string]any) or null; only NetworkID is read, as
// HAMi's Ascend vendor reads it (a number becomes Go's int(float64)). The last NetworkID wins.
absl::Status ReadCustomInfo(simdjson::ondemand::value& v, size_t n, DeviceInfo* d) {
  bool is_null = false;
  TESSERA_RETURN_IF_ERROR(ExpectType(v, n, "custominfo", simdjson::ondemand::json_type::object,
                                     "not an object", &is_null));
  d->network_key = NetworkKey::kNone;
  d->network_id = 0;
  if (is_null) {
    return absl::OkStatus();
  }
  simdjson::ondemand::object object;
  if (auto e = v.get_object().get(object); e) {
    return DeviceError(n, "custominfo", JsonError(e));
  }
  for (auto field_result : object) {
    simdjson::ondemand::field field;
    if (auto e = std::move(field_result).get(field); e) {
      return DeviceError(n, "custominfo", JsonError(e));
    }
    std::string_view key;
    if (auto e = field.unescaped_key().get(key); e) {
      return DeviceError(n, "custominfo", JsonError(e));
    }
    if (key != "NetworkID") {
      continue;
    }
    simdjson::ondemand::json_type type;
    if (auto e = field.value().type().get(type); e) {
      return DeviceError(n, "custominfo.NetworkID", JsonError(e));
    }
    if (type != simdjson::ondemand::json_type::number) {
      d->network_key = NetworkKey::kOther;
      d->network_id = 0;
      continue;
    }
    double value = 0;
    if (auto e = field.value().get_double().get(value); e) {
      return DeviceError(n, "custominfo.NetworkID", JsonError(e));
    }
    // Go's int(float64) is undefined outside int64's range; such an id is no real network.
    if (!(value > -9.2e18 && value < 9.2e18)) {
      return DeviceError(n, "custominfo.NetworkID", fmt::format("out of range: {}", value));
    }
    d->network_key = NetworkKey::kNumber;
    d->network_id = static_cast<int64_t>(value);
  }
  return absl::OkStatus();
}

absl::Status DecodeJsonDevice(simdjson::ondemand::value& element, size_t n, DeviceInfo* d) {
  // Go zero values: every key is omitempty, so an omitted key means zero/empty/false.
  d->index = 0;
  d->count = 0;
  d->devmem = 0;
  d->devcore = 0;
  d->numa = 0;
  d->health = false;
  d->mode.clear();
  d->mig_profiles.clear();
  d->network_key = NetworkKey::kNone;
  d->network_id = 0;
  simdjson::ondemand::object object;
  if (auto e = element.get_object().get(object); e) {
    return absl::InvalidArgumentError(
        fmt::format("device {}: not an object ({})", n, JsonError(e)));
  }
  for (auto field_result : object) {
    simdjson::ondemand::field field;
    if (auto e = std::move(field_result).get(field); e) {
      return absl::InvalidArgumentError(fmt::format("device {}: {}", n, JsonError(e)));
    }
    std::string_view key;
    if (auto e = field.unescaped_key().get(key); e) {
      return absl::InvalidArgumentError(fmt::format("device {}: bad key: {}", n, JsonError(e)));
    }
    simdjson::ondemand::value& v = field.value();
    absl::Status s;
    if (KeyIs(key, "id")) {
      s = ReadString(v, n, "id", &d->id);
    } else if (KeyIs(key, "index")) {
      s = ReadInt(v, n, "index", &d->index);
      if (s.ok() && d->index < 0) {
        s = DeviceError(n, "index", fmt::format("negative: {}", d->index));
      }
    } else if (KeyIs(key, "count")) {
      s = ReadInt(v, n, "count", &d->count);
    } else if (KeyIs(key, "devmem")) {
      s = ReadInt(v, n, "devmem", &d->devmem);
    } else if (KeyIs(key, "devcore")) {
      s = ReadInt(v, n, "devcore", &d->devcore);
    } else if (KeyIs(key, "type")) {
      s = ReadString(v, n, "type", &d->type);
    } else if (KeyIs(key, "numa")) {
      s = ReadInt(v, n, "numa", &d->numa);
    } else if (KeyIs(key, "mode")) {
      s = ReadString(v, n, "mode", &d->mode);
    } else if (KeyIs(key, "health")) {
      s = ReadBool(v, n, "health", &d->health);
    } else if (KeyIs(key, "migprofiles")) {
      s = ReadMigProfiles(v, n, &d->mig_profiles);
    } else if (KeyIs(key, "custominfo")) {
      s = ReadCustomInfo(v, n, d);
    } else {
      // Unknown keys (migtemplate, devicevendor, ...): the iterator skips the
      // value when it moves to the next field.
    }
    if (!s.ok()) {
      return s;
    }
  }
  if (d->mode.empty()) {
    d->mode = std::string(kHamiCore);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DeviceInfo>> DecodeRegisterJson(std::string_view value) {
  thread_local simdjson::ondemand::parser parser;
  simdjson::padded_string padded(value);
  simdjson::ondemand::document doc;
  if (auto e = parser.iterate(padded).get(doc); e) {
    return absl::InvalidArgumentError(fmt::format("node register JSON: {}", JsonError(e)));
  }
  simdjson::ondemand::array array;
  if (auto e = doc.get_array().get(array); e) {
    return absl::InvalidArgumentError(
        fmt::format("node register JSON: not an array: {}", JsonError(e)));
  }
  std::vector<DeviceInfo> devices;
  for (auto element_result : array) {
    simdjson::ondemand::value element;
    if (auto e = std::move(element_result).get(element); e) {
      return absl::InvalidArgumentError(
          fmt::format("node register JSON: device {}: {}", devices.size(), JsonError(e)));
    }
    DeviceInfo d;
    if (absl::Status s = DecodeJsonDevice(element, devices.size(), &d); !s.ok()) {
      return s;
    }
    devices.push_back(std::move(d));
  }
  // The array must be the whole document.
  const char* location = nullptr;
  if (auto e = doc.current_location().get(location); !e) {
    return absl::InvalidArgumentError("node register JSON: trailing content after the array");
  }
  // HAMi's plugin reads an empty list as an error ("no gpu found on node"): the node is
  // unregistered, not a node with zero devices.
  if (devices.empty()) {
    return absl::InvalidArgumentError("node register JSON: no device (empty array)");
  }
  return devices;
}

// ---- Pod devices -----------------------------------------------------------------------------

// Strips a v2.5.2 MIG suffix "[<digits>-<digits>]" when it is the only '[' and ends the UUID.
std::string_view StripMigSuffix(std::string_view uuid) {
  size_t open = uuid.find('[');
  if (open == std::string_view::npos || open == 0 || uuid.back() != ']') {
    return uuid;
  }
  std::string_view inner = uuid.substr(open + 1, uuid.size() - open - 2);
  size_t dash = inner.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == inner.size()) {
    return uuid;
  }
  for (size_t k = 0; k < inner.size(); ++k) {
    if (k != dash && (inner[k] < '0' || inner[k] > '9')) {
      return uuid;
    }
  }
  return uuid.substr(0, open);
}

}  // namespace

absl::StatusOr<DecodedRegister> DecodeNodeRegister(std::string_view value) {
  size_t first = value.find_first_not_of(kJsonSpace);
  DecodedRegister result;
  absl::StatusOr<std::vector<DeviceInfo>> devices;
  if (first != std::string_view::npos && value[first] == '[') {
    result.format = RegisterFormat::kJson;
    devices = DecodeRegisterJson(value);
  } else {
    result.format = RegisterFormat::kDelimited;
    devices = DecodeRegisterDelimited(value);
  }
  if (!devices.ok()) {
    return devices.status();
  }
  if (absl::Status s = CheckIds(*devices); !s.ok()) {
    return s;
  }
  result.devices = *std::move(devices);
  return result;
}

std::string EncodeNodeRegisterDelimited(const std::vector<DeviceInfo>& devices) {
  std::string out;
  for (const DeviceInfo& d : devices) {
    out += fmt::format("{},{},{},{},{},{},{},{},{}:", d.id, d.count, d.devmem, d.devcore, d.type,
                       d.numa, d.health ? "true" : "false", d.index, d.mode);
  }
  return out;
}

std::string EncodeNodeRegisterJson(const std::vector<DeviceInfo>& devices) {
  std::string out = "[";
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& d = devices[i];
    if (i > 0) {
      out += ',';
    }
    out += '{';
    bool first = true;
    auto key = [&](std::string_view k) {
      if (!first) {
        out += ',';
      }
      first = false;
      out += '"';
      out += k;
      out += "\":";
    };
    auto string_field = [&](std::string_view k, const std::string& v) {
      if (!v.empty()) {
        key(k);
        json::AppendGoString(&out, v);
      }
    };
    auto int_field = [&](std::string_view k, int32_t v) {
      if (v != 0) {
        key(k);
        out += std::to_string(v);
      }
    };
    string_field("id", d.id);
    int_field("index", d.index);
    int_field("count", d.count);
    int_field("devmem", d.devmem);
    int_field("devcore", d.devcore);
    string_field("type", d.type);
    int_field("numa", d.numa);
    string_field("mode", d.mode);
    if (!d.mig_profiles.empty()) {
      key("migProfiles");
      AppendMigProfilesJson(&out, d.mig_profiles);
    }
    if (d.health) {
      key("health");
      out += "true";
    }
    if (d.network_key != NetworkKey::kNone) {
      // A NetworkID that is no number is written as null: present, and no number, as read.
      key("custominfo");
      out += "{\"NetworkID\":";
      out += d.network_key == NetworkKey::kNumber ? std::to_string(d.network_id) : "null";
      out += '}';
    }
    out += '}';
  }
  out += ']';
  return out;
}

std::string EncodePodDevices(const PodDevices& devices) {
  std::string out;
  for (const ContainerDevices& container : devices) {
    for (const ContainerDevice& d : container) {
      if (d.uuid.empty()) {
        continue;
      }
      out += fmt::format("{},{},{},{}:", d.uuid, d.type, d.usedmem, d.usedcores);
    }
    out += ';';
  }
  return out;
}

absl::StatusOr<PodDevices> DecodePodDevices(std::string_view value) {
  std::vector<std::string_view> entries = Split(value, ';');
  // ';' terminates an entry: the text after the last ';' is an entry only if non-empty.
  if (entries.back().empty()) {
    entries.pop_back();
  }
  PodDevices pod;
  pod.reserve(entries.size());
  for (size_t c = 0; c < entries.size(); ++c) {
    ContainerDevices container;
    size_t n = 0;
    for (std::string_view piece : Split(entries[c], ':')) {
      if (piece.find(',') == std::string_view::npos) {
        continue;
      }
      const size_t device = n++;
      auto error = [&](std::string_view problem) {
        return absl::InvalidArgumentError(
            fmt::format("container {} device {}: {}", c, device, problem));
      };
      std::vector<std::string_view> f = Split(piece, ',');
      if (f.size() < 4) {
        return error(
            fmt::format("{} comma fields, want at least 4 (UUID,Type,usedmem,usedcores): {}",
                        f.size(), Quote(piece)));
      }
      std::optional<int32_t> mem = ParseGoInt32(f[2]);
      if (!mem.has_value()) {
        return error(fmt::format("usedmem: not an integer: {}", Quote(f[2])));
      }
      if (*mem < 0) {
        return error(fmt::format("usedmem: negative: {}", *mem));
      }
      std::optional<int32_t> cores = ParseGoInt32(f[3]);
      if (!cores.has_value()) {
        return error(fmt::format("usedcores: not an integer: {}", Quote(f[3])));
      }
      if (*cores < 0) {
        return error(fmt::format("usedcores: negative: {}", *cores));
      }
      if (f[0].empty()) {
        if (f[1].empty() && *mem == 0 && *cores == 0) {
          continue;  // v2.5.2 blank placeholder ",,0,0": holds nothing.
        }
        return error(fmt::format("empty UUID: {}", Quote(piece)));
      }
      container.push_back(
          ContainerDevice{std::string(StripMigSuffix(f[0])), std::string(f[1]), *mem, *cores});
    }
    pod.push_back(std::move(container));
  }
  return pod;
}

std::vector<std::string> ParseCordonList(std::string_view value) {
  std::vector<std::string> out;
  for (std::string_view piece : Split(value, ',')) {
    piece = internal::TrimAscii(piece);
    if (!piece.empty()) {
      out.emplace_back(piece);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace tessera::device

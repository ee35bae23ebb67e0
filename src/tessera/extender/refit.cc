#include "tessera/extender/refit.h"

#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"
#include <nlohmann/json.hpp>

#include "tessera/device/codec.h"
#include "tessera/json/text.h"

namespace tessera::extender {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;
constexpr char kSeparator = ';';

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("refit request: {}: {}", field, what));
}

absl::Status ReadString(const json& value, std::string_view field, std::string* out) {
  if (value.is_null()) {
    out->clear();
    return absl::OkStatus();
  }
  if (!value.is_string()) {
    return FieldError(field, "expected a string");
  }
  *out = value.get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadIndex(const json& value, int64_t* out) {
  if (value.is_null()) {
    *out = 0;
    return absl::OkStatus();
  }
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError("containerIndex", "out of range");
    }
    *out = value.get<int64_t>();
    return absl::OkStatus();
  }
  if (value.is_number()) {
    return FieldError("containerIndex", "expected an integer");
  }
  return FieldError("containerIndex", "expected a number");
}

absl::Status ReadStrings(const json& value, std::vector<std::string>* out) {
  out->clear();
  if (value.is_null()) {
    return absl::OkStatus();
  }
  if (!value.is_array()) {
    return FieldError("allowedDeviceUUIDs", "expected an array of strings");
  }
  out->reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) {
      return FieldError(fmt::format("allowedDeviceUUIDs[{}]", i), "expected a string");
    }
    out->push_back(value[i].get<std::string>());
  }
  return absl::OkStatus();
}

void AppendField(std::string* out, std::string_view key, std::string_view value) {
  *out += ",\"";
  *out += key;
  *out += "\":";
  tessera::json::AppendGoString(out, value);
}

}  // namespace

absl::StatusOr<RefitRequest> DecodeRefitRequest(std::string_view body) {
  if (tessera::json::ExceedsDepth(body, kMaxDepth)) {
    return absl::InvalidArgumentError(
        fmt::format("refit request: nests deeper than {} levels", kMaxDepth));
  }
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("refit request: not a JSON document");
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError("refit request: expected a JSON object");
  }
  RefitRequest out;
  for (const auto& [key, value] : doc.items()) {
    absl::Status s;
    if (tessera::json::KeyEqualsFold(key, "podUID")) {
      s = ReadString(value, "podUID", &out.pod_uid);
    } else if (tessera::json::KeyEqualsFold(key, "podNamespace")) {
      s = ReadString(value, "podNamespace", &out.pod_namespace);
    } else if (tessera::json::KeyEqualsFold(key, "podName")) {
      s = ReadString(value, "podName", &out.pod_name);
    } else if (tessera::json::KeyEqualsFold(key, "nodeName")) {
      s = ReadString(value, "nodeName", &out.node_name);
    } else if (tessera::json::KeyEqualsFold(key, "containerIndex")) {
      s = ReadIndex(value, &out.container_index);
    } else if (tessera::json::KeyEqualsFold(key, "containerName")) {
      s = ReadString(value, "containerName", &out.container_name);
    } else if (tessera::json::KeyEqualsFold(key, "deviceType")) {
      s = ReadString(value, "deviceType", &out.device_type);
    } else if (tessera::json::KeyEqualsFold(key, "allowedDeviceUUIDs")) {
      s = ReadStrings(value, &out.allowed_device_uuids);
    }
    if (!s.ok()) {
      return s;
    }
  }
  return out;
}

std::string EncodeRefitRequest(const RefitRequest& request) {
  std::string out = "{\"podUID\":";
  tessera::json::AppendGoString(&out, request.pod_uid);
  AppendField(&out, "podNamespace", request.pod_namespace);
  AppendField(&out, "podName", request.pod_name);
  AppendField(&out, "nodeName", request.node_name);
  out += fmt::format(",\"containerIndex\":{}", request.container_index);
  if (!request.container_name.empty()) {
    AppendField(&out, "containerName", request.container_name);
  }
  AppendField(&out, "deviceType", request.device_type);
  out += ",\"allowedDeviceUUIDs\":";
  if (request.allowed_device_uuids.empty()) {
    out += "null";  // Go marshals a nil slice as null
  } else {
    out += '[';
    for (size_t i = 0; i < request.allowed_device_uuids.size(); ++i) {
      if (i > 0) {
        out += ',';
      }
      tessera::json::AppendGoString(&out, request.allowed_device_uuids[i]);
    }
    out += ']';
  }
  out += '}';
  return out;
}

std::string EncodeRefitResponse(const RefitResponse& response) {
  std::string out = response.succeeded ? "{\"succeeded\":true" : "{\"succeeded\":false";
  if (!response.container_devices.empty()) {
    AppendField(&out, "containerDevices", response.container_devices);
  }
  if (!response.failure_reason.empty()) {
    AppendField(&out, "failureReason", response.failure_reason);
  }
  out += '}';
  return out;
}

std::string EncodeContainerDevices(const device::ContainerDevices& devices) {
  std::string out = device::EncodePodDevices({devices});
  if (!out.empty() && out.back() == kSeparator) {
    out.pop_back();
  }
  return out;
}

std::string DeviceIdList(const device::ContainerDevices& devices) {
  std::string out = "[";
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i > 0) {
      out += ' ';
    }
    out += devices[i].uuid;
  }
  out += ']';
  return out;
}

absl::StatusOr<std::string> ReplaceContainerEntry(std::string_view annotation, int64_t index,
                                                  const device::ContainerDevices& devices) {
  // Find the bounds of segment `index` without splitting the rest.
  size_t begin = 0;
  for (int64_t i = 0; i < index && begin <= annotation.size(); ++i) {
    const size_t next = annotation.find(kSeparator, begin);
    begin = next == std::string_view::npos ? annotation.size() + 1 : next + 1;
  }
  if (index < 0 || begin > annotation.size()) {
    return absl::InvalidArgumentError(
        fmt::format("annotation has no container entry at index {}", index));
  }
  size_t end = annotation.find(kSeparator, begin);
  if (end == std::string_view::npos) {
    end = annotation.size();
  }
  if (end == begin) {
    return absl::InvalidArgumentError(
        fmt::format("annotation has no container entry at index {}", index));
  }
  std::string out;
  out.reserve(annotation.size() + 64);
  out.append(annotation.substr(0, begin));
  out += EncodeContainerDevices(devices);
  out.append(annotation.substr(end));
  return out;
}

}  // namespace tessera::extender

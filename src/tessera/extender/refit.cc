#include "tessera/extender/refit.h"

#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"
#include <nlohmann/json.hpp>

#include "tessera/device/codec.h"
#include "tessera/json/text.h"

namespace tessera::extender {
namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = 64;
constexpr char kSeparator = ';';

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("refit request: {}: {}", field, what));
}

// The request's fields, as matched against a key.
enum class Field : uint8_t {
  kNone,  // an unknown key: its value is skipped
  kPodUid,
  kPodNamespace,
  kPodName,
  kNodeName,
  kContainerIndex,
  kContainerName,
  kDeviceType,
  kAllowedDeviceUuids,
};

struct FieldName {
  std::string_view name;
  Field field;
};
constexpr FieldName kFieldNames[] = {
    {"podUID", Field::kPodUid},
    {"podNamespace", Field::kPodNamespace},
    {"podName", Field::kPodName},
    {"nodeName", Field::kNodeName},
    {"containerIndex", Field::kContainerIndex},
    {"containerName", Field::kContainerName},
    {"deviceType", Field::kDeviceType},
    {"allowedDeviceUUIDs", Field::kAllowedDeviceUuids},
};
static_assert(std::size(kFieldNames) == kRefitFields);

// The kinds of JSON value a SAX event starts.
enum class Kind : uint8_t { kNull, kBool, kInteger, kUnsigned, kFloat, kString, kObject, kArray };

// Reads the request as nlohmann's parser streams it: each top-level key is matched once against
// the field names and its value applied at once, so the work is linear in the body and nothing
// but the request is kept. The object is never built: nlohmann's ordered_map searched every key
// held for each new one, quadratic in the keys (issue #41). Keys repeat as Go reads them: each
// occurrence is applied, the last one wins; the first field error is kept while the rest of the
// body is still checked for syntax (a broken document is "not a JSON document" whatever else).
class RequestReader final : public nlohmann::json_sax<json> {
 public:
  RequestReader(RefitRequest* out, RefitDecodeStats* stats) : out_(out), stats_(stats) {}

  // After a successful parse: the request's error, or OK.
  absl::Status Finish() const {
    if (!top_is_object_) {
      return absl::InvalidArgumentError("refit request: expected a JSON object");
    }
    return error_;
  }

  bool null() override { return Scalar(Kind::kNull, nullptr); }
  bool boolean(bool /*val*/) override { return Scalar(Kind::kBool, nullptr); }
  bool number_integer(number_integer_t val) override {
    integer_ = val;
    return Scalar(Kind::kInteger, nullptr);
  }
  bool number_unsigned(number_unsigned_t val) override {
    unsigned_ = val;
    return Scalar(Kind::kUnsigned, nullptr);
  }
  bool number_float(number_float_t /*val*/, const string_t& /*s*/) override {
    return Scalar(Kind::kFloat, nullptr);
  }
  bool string(string_t& val) override { return Scalar(Kind::kString, &val); }
  bool binary(binary_t& /*val*/) override { return Scalar(Kind::kNull, nullptr); }
  bool start_object(std::size_t /*elements*/) override {
    if (depth_ == 0) {
      top_is_object_ = true;
    } else {
      Value(Kind::kObject, nullptr);
    }
    ++depth_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t /*elements*/) override {
    if (depth_ > 0) {
      Value(Kind::kArray, nullptr);
    }
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    if (depth_ == 1) {
      in_uuids_ = false;
    }
    return true;
  }
  bool key(string_t& val) override {
    if (depth_ != 1) {
      return true;
    }
    ++stats_->keys;
    field_ = Field::kNone;
    for (const FieldName& f : kFieldNames) {
      ++stats_->key_comparisons;
      if (tessera::json::KeyEqualsFold(val, f.name)) {
        field_ = f.field;
        break;
      }
    }
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& /*ex*/) override {
    return false;
  }

 private:
  bool Scalar(Kind kind, string_t* text) {
    if (depth_ > 0) {
      Value(kind, text);
    }
    return true;
  }

  // A value starts at the current depth: a field's value (depth 1) or an element of
  // allowedDeviceUUIDs (depth 2); anything deeper belongs to a value already judged.
  void Value(Kind kind, string_t* text) {
    if (!error_.ok()) {
      return;
    }
    if (depth_ == 2 && in_uuids_) {
      if (kind == Kind::kString) {
        out_->allowed_device_uuids.push_back(std::move(*text));
      } else {
        error_ =
            FieldError(fmt::format("allowedDeviceUUIDs[{}]", out_->allowed_device_uuids.size()),
                       "expected a string");
      }
      return;
    }
    if (depth_ != 1) {
      return;
    }
    switch (field_) {
      case Field::kNone:
        return;
      case Field::kPodUid:
        return String(kind, text, "podUID", &out_->pod_uid);
      case Field::kPodNamespace:
        return String(kind, text, "podNamespace", &out_->pod_namespace);
      case Field::kPodName:
        return String(kind, text, "podName", &out_->pod_name);
      case Field::kNodeName:
        return String(kind, text, "nodeName", &out_->node_name);
      case Field::kContainerName:
        return String(kind, text, "containerName", &out_->container_name);
      case Field::kDeviceType:
        return String(kind, text, "deviceType", &out_->device_type);
      case Field::kContainerIndex:
        return Index(kind);
      case Field::kAllowedDeviceUuids:
        out_->allowed_device_uuids.clear();
        if (kind == Kind::kArray) {
          in_uuids_ = true;
        } else if (kind != Kind::kNull) {
          error_ = FieldError("allowedDeviceUUIDs", "expected an array of strings");
        }
        return;
    }
  }

  void String(Kind kind, string_t* text, std::string_view field, std::string* out) {
    if (kind == Kind::kNull) {
      out->clear();
    } else if (kind == Kind::kString) {
      *out = std::move(*text);
    } else {
      error_ = FieldError(field, "expected a string");
    }
  }

  void Index(Kind kind) {
    switch (kind) {
      case Kind::kNull:
        out_->container_index = 0;
        return;
      case Kind::kInteger:
        out_->container_index = integer_;
        return;
      case Kind::kUnsigned:
        if (unsigned_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          error_ = FieldError("containerIndex", "out of range");
        } else {
          out_->container_index = static_cast<int64_t>(unsigned_);
        }
        return;
      case Kind::kFloat:
        error_ = FieldError("containerIndex", "expected an integer");
        return;
      default:
        error_ = FieldError("containerIndex", "expected a number");
        return;
    }
  }

  RefitRequest* const out_;
  RefitDecodeStats* const stats_;
  absl::Status error_;
  bool top_is_object_ = false;
  int depth_ = 0;               // containers open
  Field field_ = Field::kNone;  // the field of the current top-level key
  bool in_uuids_ = false;       // inside allowedDeviceUUIDs' array
  int64_t integer_ = 0;
  uint64_t unsigned_ = 0;
};

void AppendField(std::string* out, std::string_view key, std::string_view value) {
  *out += ",\"";
  *out += key;
  *out += "\":";
  tessera::json::AppendGoString(out, value);
}

}  // namespace

absl::StatusOr<RefitRequest> DecodeRefitRequest(std::string_view body) {
  RefitDecodeStats stats;
  return DecodeRefitRequest(body, &stats);
}

absl::StatusOr<RefitRequest> DecodeRefitRequest(std::string_view body, RefitDecodeStats* stats) {
  if (tessera::json::ExceedsDepth(body, kMaxDepth)) {
    return absl::InvalidArgumentError(
        fmt::format("refit request: nests deeper than {} levels", kMaxDepth));
  }
  RefitRequest out;
  RequestReader reader(&out, stats);
  if (!json::sax_parse(body, &reader)) {
    return absl::InvalidArgumentError("refit request: not a JSON document");
  }
  if (absl::Status s = reader.Finish(); !s.ok()) {
    return s;
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

#include <string>

#include "absl/strings/cord.h"
#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"

namespace tessera::apisim {

using internal::Json;

namespace {

constexpr char kApiPayload[] = "tessera.apisim/api";

Json PayloadOf(const absl::Status& status) {
  auto p = status.GetPayload(kApiPayload);
  if (!p) {
    return Json();
  }
  return Json::parse(std::string(*p), nullptr, false);
}

}  // namespace

namespace internal {

const char* JsonTypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

absl::Status TypeError(const Json& got, std::string_view want, std::string_view field) {
  return ApiError(400, "BadRequest",
                  fmt::format("json: cannot unmarshal {} into Go struct field {} of type {}",
                              JsonTypeName(got), field, want));
}

// A resource or kind as kube-apiserver names it in messages: "pods", "leases.coordination.k8s.io",
// "Lease.coordination.k8s.io".
std::string Qualified(std::string_view name, std::string_view group) {
  return group.empty() ? std::string(name) : fmt::format("{}.{}", name, group);
}

absl::Status Invalid(const ResourceInfo& r, std::string_view name, std::string_view field,
                     std::string_view what, std::string_view detail) {
  ApiErrorDetails d;
  d.name = std::string(name);
  d.group = r.group;
  d.kind = r.kind;
  d.cause_reason = what == "Required value" ? "FieldValueRequired" : "FieldValueInvalid";
  d.cause_field = std::string(field);
  d.cause_message = fmt::format("{}: {}", what, detail);
  return ApiError(422, "Invalid",
                  fmt::format("{} \"{}\" is invalid: {}: {}: {}", Qualified(r.kind, r.group), name,
                              field, what, detail),
                  d);
}

absl::Status NotFound(const ResourceInfo& r, std::string_view name) {
  ApiErrorDetails d;
  d.name = std::string(name);
  d.group = r.group;
  d.kind = r.name;
  return ApiError(404, "NotFound",
                  fmt::format("{} \"{}\" not found", Qualified(r.name, r.group), name), d);
}

absl::Status Conflict(const ResourceInfo& r, std::string_view name, std::string_view why) {
  ApiErrorDetails d;
  d.name = std::string(name);
  d.group = r.group;
  d.kind = r.name;
  return ApiError(409, "Conflict",
                  fmt::format("Operation cannot be fulfilled on {} \"{}\": {}",
                              Qualified(r.name, r.group), name, why),
                  d);
}

absl::Status TooLarge(uint64_t want, uint64_t have) {
  ApiErrorDetails d;
  d.retry_after_seconds = 1;
  d.cause_reason = "ResourceVersionTooLarge";
  d.cause_message = "Too large resource version";
  return ApiError(504, "Timeout",
                  fmt::format("Timeout: Too large resource version: {}, current: {}", want, have),
                  d);
}

absl::Status ListOptionsInvalid(std::string_view field, std::string_view what,
                                std::string_view detail) {
  ApiErrorDetails d;
  d.group = "meta.k8s.io";
  d.kind = "ListOptions";
  d.cause_reason = "FieldValueForbidden";
  d.cause_field = std::string(field);
  d.cause_message = fmt::format("{}: {}", what, detail);
  return ApiError(
      422, "Invalid",
      fmt::format("ListOptions.meta.k8s.io \"\" is invalid: {}: {}: {}", field, what, detail), d);
}

}  // namespace internal

// ---- errors -------------------------------------------------------------------------------

absl::Status ApiError(int code, std::string_view reason, std::string_view message,
                      const ApiErrorDetails& details) {
  absl::StatusCode c = absl::StatusCode::kUnknown;
  switch (code) {
    case 400:
      c = absl::StatusCode::kInvalidArgument;
      break;
    case 401:
      c = absl::StatusCode::kUnauthenticated;
      break;
    case 403:
      c = absl::StatusCode::kPermissionDenied;
      break;
    case 404:
      c = absl::StatusCode::kNotFound;
      break;
    case 409:
      c = reason == "AlreadyExists" ? absl::StatusCode::kAlreadyExists : absl::StatusCode::kAborted;
      break;
    case 410:
      c = absl::StatusCode::kOutOfRange;
      break;
    case 422:
      c = absl::StatusCode::kFailedPrecondition;
      break;
    case 429:
      c = absl::StatusCode::kResourceExhausted;
      break;
    case 504:
      c = absl::StatusCode::kDeadlineExceeded;
      break;
    default:
      c = code >= 500 ? absl::StatusCode::kInternal : absl::StatusCode::kInvalidArgument;
  }
  absl::Status s(c, std::string(message));
  Json p = Json::object();
  p["code"] = code;
  p["reason"] = reason;
  if (!details.name.empty()) {
    p["details"]["name"] = details.name;
  }
  if (!details.group.empty()) {
    p["details"]["group"] = details.group;
  }
  if (!details.kind.empty()) {
    p["details"]["kind"] = details.kind;
  }
  if (!details.cause_reason.empty() || !details.cause_message.empty()) {
    Json cause = Json::object();
    cause["reason"] = details.cause_reason;
    cause["message"] = details.cause_message;
    if (!details.cause_field.empty()) {
      cause["field"] = details.cause_field;
    }
    p["details"]["causes"] = Json::array({cause});
  }
  if (details.retry_after_seconds > 0) {
    p["details"]["retryAfterSeconds"] = details.retry_after_seconds;
  }
  if (!details.list_continue.empty()) {
    p["metadata"]["continue"] = details.list_continue;
  }
  s.SetPayload(kApiPayload, absl::Cord(p.dump()));
  return s;
}

int HttpCodeOf(const absl::Status& status) {
  if (status.ok()) {
    return 200;
  }
  Json p = PayloadOf(status);
  if (p.is_object() && p.contains("code")) {
    return p["code"].get<int>();
  }
  return 500;
}

std::string ReasonOf(const absl::Status& status) {
  Json p = PayloadOf(status);
  if (p.is_object() && p.contains("reason")) {
    return p["reason"].get<std::string>();
  }
  return status.ok() ? "" : "InternalError";
}

int RetryAfterOf(const absl::Status& status) {
  Json p = PayloadOf(status);
  if (p.is_object() && p.contains("details") && p["details"].contains("retryAfterSeconds")) {
    return p["details"]["retryAfterSeconds"].get<int>();
  }
  return 0;
}

std::string ToStatusJson(const absl::Status& status) {
  Json o = Json::object();
  o["kind"] = "Status";
  o["apiVersion"] = "v1";
  o["metadata"] = Json::object();
  o["status"] = status.ok() ? "Success" : "Failure";
  o["message"] = std::string(status.message());
  Json p = PayloadOf(status);
  if (p.is_object() && p.contains("metadata")) {
    o["metadata"] = p["metadata"];
  }
  o["reason"] = ReasonOf(status);
  if (p.is_object() && p.contains("details")) {
    o["details"] = p["details"];
  }
  o["code"] = HttpCodeOf(status);
  return o.dump();
}

}  // namespace tessera::apisim

#include "tessera/apisim/store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "fmt/core.h"
#include "nlohmann/json.hpp"

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/json/text.h"
#include "tessera/kube/objects.h"

namespace tessera::apisim {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kApiPayload[] = "tessera.apisim/api";
constexpr char kRvSentinel[] = "\\u0001";  // how "\x01" is serialised
constexpr size_t kPods = 0;                // index of pods in Resources()
constexpr size_t kNamespaces = 2;

// ---- small helpers ------------------------------------------------------------------------

std::string FormatTimeRfc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

bool ParseRfc3339(const std::string& s, absl::Time* t) {
  std::string err;
  return absl::ParseTime(absl::RFC3339_full, s, t, &err);
}

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

std::string Key(const ResourceInfo& r, std::string_view ns, std::string_view name) {
  if (!r.namespaced) {
    return std::string(name);
  }
  std::string k(ns);
  k += '/';
  k += name;
  return k;
}

// metadata.uid when it is a string, else "".
std::string MetadataUid(const Json& doc) {
  if (!doc.is_object()) {
    return "";
  }
  auto md = doc.find("metadata");
  if (md == doc.end() || !md->is_object()) {
    return "";
  }
  auto uid = md->find("uid");
  return uid != md->end() && uid->is_string() ? uid->get<std::string>() : "";
}

// Field paths (dotted) that each resource supports in field selectors.
const std::vector<std::string>& SelectableFields(const ResourceInfo& r) {
  static const std::vector<std::string> kCommon = {"metadata.name", "metadata.namespace"};
  static const std::vector<std::string> kPod = {
      "metadata.name",      "metadata.namespace",      "spec.nodeName",    "spec.restartPolicy",
      "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
      "status.podIP",       "status.nominatedNodeName"};
  static const std::vector<std::string> kNode = {"metadata.name", "spec.unschedulable"};
  static const std::vector<std::string> kNamespace = {"metadata.name", "status.phase"};
  static const std::vector<std::string> kEvent = {"metadata.name",
                                                  "metadata.namespace",
                                                  "involvedObject.kind",
                                                  "involvedObject.namespace",
                                                  "involvedObject.name",
                                                  "involvedObject.uid",
                                                  "involvedObject.apiVersion",
                                                  "involvedObject.resourceVersion",
                                                  "involvedObject.fieldPath",
                                                  "reason",
                                                  "reportingComponent",
                                                  "source",
                                                  "type"};
  if (r.group.empty()) {
    if (r.name == "pods") {
      return kPod;
    }
    if (r.name == "nodes") {
      return kNode;
    }
    if (r.name == "namespaces") {
      return kNamespace;
    }
    if (r.name == "events") {
      return kEvent;
    }
  }
  return kCommon;
}

std::string FieldValue(const Json& doc, const std::string& path) {
  if (path == "source") {  // core events: source.component
    const Json* src = doc.contains("source") ? &doc["source"] : nullptr;
    if (src != nullptr && src->is_object() && src->contains("component") &&
        (*src)["component"].is_string()) {
      return (*src)["component"].get<std::string>();
    }
    return "";
  }
  const Json* cur = &doc;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(part)) {
      return "";
    }
    cur = &(*cur)[part];
    if (dot == std::string::npos) {
      break;
    }
    start = dot + 1;
  }
  if (cur->is_string()) {
    return cur->get<std::string>();
  }
  if (cur->is_boolean()) {
    return cur->get<bool>() ? "true" : "false";
  }
  if (cur->is_null()) {
    return "";
  }
  if (path == "spec.hostNetwork" || path == "spec.unschedulable") {
    return "false";
  }
  return cur->dump();
}

// Whether two stored objects serialise the same apart from their revision digits.
bool SameButRevision(const StoredObject& a, const StoredObject& b) {
  if (a.rv_len == 0 || b.rv_len == 0) {
    return a.json == b.json;
  }
  const std::string_view x = a.json, y = b.json;
  return x.substr(0, a.rv_pos) == y.substr(0, b.rv_pos) &&
         x.substr(a.rv_pos + a.rv_len) == y.substr(b.rv_pos + b.rv_len);
}

// Builds the stored form of `doc`, stamping `rv` into metadata.resourceVersion.
ObjectPtr MakeObject(const ResourceInfo& r, Json& doc, uint64_t rv) {
  auto obj = std::make_shared<StoredObject>();
  Json& md = doc["metadata"];
  obj->name = md.value("name", "");
  obj->ns = r.namespaced ? md.value("namespace", "") : "";
  obj->key = Key(r, obj->ns, obj->name);
  obj->rv = rv;
  md["resourceVersion"] = "\x01";
  std::string text = doc.dump();
  const std::string needle = std::string("\"resourceVersion\":\"") + kRvSentinel + "\"";
  size_t at = text.find(needle);
  std::string digits = std::to_string(rv);
  md["resourceVersion"] = digits;
  if (at == std::string::npos) {  // cannot happen: the sentinel was just written
    obj->json = doc.dump();
  } else {
    size_t pos = at + sizeof("\"resourceVersion\":\"") - 1;
    text.replace(pos, sizeof(kRvSentinel) - 1, digits);
    obj->json = std::move(text);
    obj->rv_pos = pos;
    obj->rv_len = digits.size();
  }
  if (md.contains("labels") && md["labels"].is_object()) {
    for (auto it = md["labels"].begin(); it != md["labels"].end(); ++it) {
      if (it.value().is_string()) {
        obj->labels.emplace(it.key(), it.value().get<std::string>());
      }
    }
  }
  for (const std::string& f : SelectableFields(r)) {
    obj->fields.emplace(f, FieldValue(doc, f));
  }
  obj->has_deletion = md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null();
  obj->has_finalizers =
      md.contains("finalizers") && md["finalizers"].is_array() && !md["finalizers"].empty();
  if (r.group.empty() && r.name == "pods") {
    const std::string& phase = obj->fields["status.phase"];
    obj->terminal = phase == "Succeeded" || phase == "Failed";
  }
  return obj;
}

absl::StatusOr<Json> ParseBody(std::string_view body) {
  if (json::ExceedsDepth(body, kMaxJsonDepth)) {
    return ApiError(400, "BadRequest", "the request body nests deeper than 1000 levels");
  }
  Json doc = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return ApiError(400, "BadRequest",
                    "the request body is not valid JSON: couldn't get version/kind; json parse "
                    "error");
  }
  if (!doc.is_object()) {
    return ApiError(
        400, "BadRequest",
        fmt::format("json: cannot unmarshal {} into Go value of type struct", JsonTypeName(doc)));
  }
  return doc;
}

absl::Status CheckStringMap(const Json& md, const char* field, std::string_view path) {
  if (!md.contains(field) || md[field].is_null()) {
    return absl::OkStatus();
  }
  const Json& m = md[field];
  if (!m.is_object()) {
    return TypeError(m, "map[string]string", path);
  }
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it.value().is_string()) {
      return TypeError(it.value(), "string", path);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptionalType(const Json& parent, const char* field, Json::value_t want,
                               std::string_view path) {
  if (!parent.is_object() || !parent.contains(field) || parent[field].is_null()) {
    return absl::OkStatus();
  }
  const Json& v = parent[field];
  bool ok = v.type() == want;
  if (want == Json::value_t::number_integer) {
    ok = v.is_number_integer();
  }
  if (!ok) {
    const char* name = want == Json::value_t::string           ? "string"
                       : want == Json::value_t::object         ? "object"
                       : want == Json::value_t::array          ? "array"
                       : want == Json::value_t::boolean        ? "bool"
                       : want == Json::value_t::number_integer ? "int64"
                                                               : "value";
    return TypeError(v, name, path);
  }
  return absl::OkStatus();
}

// An object as a list item: without kind and apiVersion, which kube-apiserver leaves out of the
// items of a List (the List's own kind says what they are).
std::string ItemPrefix(const ResourceInfo& r) {
  return fmt::format(R"({{"kind":"{}","apiVersion":"{}",)", r.kind, r.api_version());
}
void AppendItemJson(const std::string& prefix, const StoredObject& obj, std::string* out) {
  if (obj.json.compare(0, prefix.size(), prefix) == 0) {
    *out += '{';
    out->append(obj.json, prefix.size(), std::string::npos);
    return;
  }
  // Stored in another order (a state file from before 2026-12-05, or a patch that moved them).
  Json doc = Json::parse(obj.json);
  doc.erase("kind");
  doc.erase("apiVersion");
  *out += doc.dump();
}

// Shape checks shared by create and update: kind/apiVersion, metadata types (400) and the
// resource's own required fields (422).
absl::Status ValidateDocument(const ResourceInfo& r, Json& doc) {
  if (doc.contains("kind") && !doc["kind"].is_null()) {
    if (!doc["kind"].is_string() || doc["kind"].get<std::string>() != r.kind) {
      return ApiError(
          400, "BadRequest",
          fmt::format("the kind in the data ({}) does not match the expected kind "
                      "({})",
                      doc["kind"].is_string() ? doc["kind"].get<std::string>() : doc["kind"].dump(),
                      r.kind));
    }
  }
  if (doc.contains("apiVersion") && !doc["apiVersion"].is_null()) {
    if (!doc["apiVersion"].is_string() || doc["apiVersion"].get<std::string>() != r.api_version()) {
      return ApiError(400, "BadRequest",
                      fmt::format("the API version in the data ({}) does not match the expected "
                                  "API version ({})",
                                  doc["apiVersion"].dump(), r.api_version()));
    }
  }
  // kind, apiVersion and metadata first, as kube-apiserver writes them; List drops exactly the
  // kind and apiVersion prefix from each item (AppendItemJson).
  Json ordered = Json::object();
  ordered["kind"] = r.kind;
  ordered["apiVersion"] = r.api_version();
  ordered["metadata"] = doc.contains("metadata") ? std::move(doc["metadata"]) : Json();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "kind" && it.key() != "apiVersion" && it.key() != "metadata") {
      ordered[it.key()] = std::move(it.value());
    }
  }
  doc = std::move(ordered);
  if (!doc.contains("metadata") || doc["metadata"].is_null()) {
    doc["metadata"] = Json::object();
  }
  Json& md = doc["metadata"];
  if (!md.is_object()) {
    return TypeError(md, "v1.ObjectMeta", "Object.metadata");
  }
  for (const char* f : {"name", "namespace", "generateName", "resourceVersion", "uid"}) {
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(md, f, Json::value_t::string, fmt::format("ObjectMeta.metadata.{}", f)));
  }
  TESSERA_RETURN_IF_ERROR(CheckStringMap(md, "labels", "ObjectMeta.metadata.labels"));
  TESSERA_RETURN_IF_ERROR(CheckStringMap(md, "annotations", "ObjectMeta.metadata.annotations"));
  TESSERA_RETURN_IF_ERROR(
      CheckOptionalType(md, "finalizers", Json::value_t::array, "ObjectMeta.metadata.finalizers"));
  for (const char* f : {"spec", "status"}) {
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(doc, f, Json::value_t::object, fmt::format("{}.{}", r.kind, f)));
  }
  const std::string name = md.value("name", "");
  if (r.group.empty() && r.name == "pods") {
    if (!doc.contains("spec") || !doc["spec"].is_object()) {
      return Invalid(r, name, "spec.containers", "Required value", "must have at least one");
    }
    Json& spec = doc["spec"];
    for (const char* f : {"nodeName", "schedulerName", "restartPolicy", "serviceAccountName"}) {
      TESSERA_RETURN_IF_ERROR(
          CheckOptionalType(spec, f, Json::value_t::string, fmt::format("PodSpec.spec.{}", f)));
    }
    TESSERA_RETURN_IF_ERROR(CheckOptionalType(spec, "terminationGracePeriodSeconds",
                                              Json::value_t::number_integer,
                                              "PodSpec.spec.terminationGracePeriodSeconds"));
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(spec, "hostNetwork", Json::value_t::boolean, "PodSpec.spec.hostNetwork"));
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(spec, "containers", Json::value_t::array, "PodSpec.spec.containers"));
    if (!spec.contains("containers") || spec["containers"].empty()) {
      return Invalid(r, name, "spec.containers", "Required value", "must have at least one");
    }
    size_t i = 0;
    for (Json& c : spec["containers"]) {
      std::string field = fmt::format("spec.containers[{}]", i++);
      if (!c.is_object()) {
        return TypeError(c, "v1.Container", "PodSpec.spec.containers");
      }
      TESSERA_RETURN_IF_ERROR(
          CheckOptionalType(c, "name", Json::value_t::string, "Container.spec.containers.name"));
      TESSERA_RETURN_IF_ERROR(
          CheckOptionalType(c, "image", Json::value_t::string, "Container.spec.containers.image"));
      if (c.value("name", "").empty()) {
        return Invalid(r, name, field + ".name", "Required value", "");
      }
      if (c.value("image", "").empty()) {
        return Invalid(r, name, field + ".image", "Required value", "");
      }
    }
    if (doc.contains("status") && doc["status"].is_object()) {
      TESSERA_RETURN_IF_ERROR(CheckOptionalType(doc["status"], "phase", Json::value_t::string,
                                                "PodStatus.status.phase"));
    }
  } else if (r.group.empty() && r.name == "nodes") {
    if (doc.contains("spec")) {
      TESSERA_RETURN_IF_ERROR(CheckOptionalType(
          doc["spec"], "unschedulable", Json::value_t::boolean, "NodeSpec.spec.unschedulable"));
    }
  } else if (r.group.empty() && r.name == "configmaps") {
    TESSERA_RETURN_IF_ERROR(CheckStringMap(doc, "data", "ConfigMap.data"));
    TESSERA_RETURN_IF_ERROR(CheckStringMap(doc, "binaryData", "ConfigMap.binaryData"));
  } else if (r.group.empty() && r.name == "events") {
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(doc, "involvedObject", Json::value_t::object, "Event.involvedObject"));
    for (const char* f : {"reason", "message", "type"}) {
      TESSERA_RETURN_IF_ERROR(
          CheckOptionalType(doc, f, Json::value_t::string, fmt::format("Event.{}", f)));
    }
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(doc, "count", Json::value_t::number_integer, "Event.count"));
  } else if (r.group == "events.k8s.io") {
    if (!doc.contains("eventTime") || doc["eventTime"].is_null()) {
      return Invalid(r, name, "eventTime", "Required value", "");
    }
  } else if (r.group == "coordination.k8s.io") {
    if (doc.contains("spec") && doc["spec"].is_object()) {
      Json& spec = doc["spec"];
      TESSERA_RETURN_IF_ERROR(CheckOptionalType(spec, "holderIdentity", Json::value_t::string,
                                                "LeaseSpec.spec.holderIdentity"));
      for (const char* f : {"leaseDurationSeconds", "leaseTransitions"}) {
        TESSERA_RETURN_IF_ERROR(CheckOptionalType(spec, f, Json::value_t::number_integer,
                                                  fmt::format("LeaseSpec.spec.{}", f)));
      }
      for (const char* f : {"acquireTime", "renewTime"}) {
        if (!spec.contains(f) || spec[f].is_null()) {
          continue;
        }
        absl::Time t;
        if (!spec[f].is_string() || !ParseRfc3339(spec[f].get<std::string>(), &t)) {
          return ApiError(
              400, "BadRequest",
              fmt::format("LeaseSpec.spec.{}: {} is not an RFC 3339 time", f, spec[f].dump()));
        }
        spec[f] = FormatMicroTime(t);  // MicroTime: always six fractional digits
      }
    }
  } else if (r.group.empty() && r.name == "resourcequotas") {
    if (doc.contains("spec") && doc["spec"].is_object()) {
      TESSERA_RETURN_IF_ERROR(
          CheckOptionalType(doc["spec"], "hard", Json::value_t::object, "ResourceQuotaSpec.hard"));
    }
  }
  return absl::OkStatus();
}

// Equal as JSON values: objects whatever the order of their keys, arrays element by element.
// `ignored`: keys of the top-level objects left out of the comparison (nested keys all count).
bool SameValue(const Json& a, const Json& b, std::initializer_list<const char*> ignored = {}) {
  if (a.is_object() && b.is_object()) {
    auto is_ignored = [&](const std::string& key) {
      return std::find(ignored.begin(), ignored.end(), key) != ignored.end();
    };
    auto compared = [&](const Json& doc) {
      size_t n = doc.size();
      for (const char* key : ignored) {
        n -= doc.contains(key) ? 1 : 0;
      }
      return n;
    };
    if (compared(a) != compared(b)) {
      return false;
    }
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (is_ignored(it.key())) {
        continue;
      }
      auto other = b.find(it.key());
      if (other == b.end() || !SameValue(it.value(), *other)) {
        return false;
      }
    }
    return true;
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) {
      return false;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (!SameValue(a[i], b[i])) {
        return false;
      }
    }
    return true;
  }
  return a == b;
}

std::string EventLine(std::string_view type, std::string_view object) {
  std::string line;
  line.reserve(object.size() + 32);
  line += "{\"type\":\"";
  line += type;
  line += "\",\"object\":";
  line += object;
  line += "}\n";
  return line;
}

std::string ErrorEventLine(const absl::Status& status) {
  return EventLine("ERROR", ToStatusJson(status));
}

std::string BookmarkLine(const ResourceInfo& r, uint64_t rv, bool initial_end) {
  Json o = Json::object();
  o["kind"] = r.kind;
  o["apiVersion"] = r.api_version();
  o["metadata"]["resourceVersion"] = std::to_string(rv);
  if (initial_end) {
    o["metadata"]["annotations"]["k8s.io/initial-events-end"] = "true";
  }
  return EventLine("BOOKMARK", o.dump());
}

absl::Status ExpiredWatch(uint64_t want, uint64_t oldest) {
  return ApiError(410, "Expired", fmt::format("too old resource version: {} ({})", want, oldest));
}

bool ParseRv(const std::string& s, uint64_t* out) { return absl::SimpleAtoi(s, out); }

// The token also carries the snapshot's item count and how many were returned before, so
// that remainingItemCount costs nothing on later pages (total < 0: unknown, with selectors).
// A continue token whose revision is this one continues at the latest revision (kube-apiserver
// writes -1); revisions start at 1.
constexpr uint64_t kLatestRevisionToken = 0;

std::string EncodeContinue(uint64_t rv, const std::string& start, int64_t total, int64_t offset) {
  Json t = Json::object();
  t["v"] = "meta.k8s.io/v1";
  t["rv"] = rv;
  t["start"] = start;
  if (total >= 0) {
    t["total"] = total;
    t["offset"] = offset;
  }
  return absl::WebSafeBase64Escape(t.dump());
}

bool DecodeContinue(const std::string& token, uint64_t* rv, std::string* start, int64_t* total,
                    int64_t* offset) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) {
    return false;
  }
  Json t = Json::parse(raw, nullptr, false);
  if (t.is_discarded() || !t.is_object() || !t.contains("rv") || !t["rv"].is_number_unsigned() ||
      !t.contains("start") || !t["start"].is_string() || t.value("v", "") != "meta.k8s.io/v1") {
    return false;
  }
  *rv = t["rv"].get<uint64_t>();
  *start = t["start"].get<std::string>();
  *total = -1;
  *offset = 0;
  if (t.contains("total") && t["total"].is_number_integer() && t.contains("offset") &&
      t["offset"].is_number_integer()) {
    *total = t["total"].get<int64_t>();
    *offset = t["offset"].get<int64_t>();
  }
  return true;
}

std::string RandomSuffix(std::mt19937_64& rng, size_t n) {
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  }
  return s;
}

std::string RandomUid(std::mt19937_64& rng) {
  uint64_t a = rng();
  uint64_t b = rng();
  a = (a & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;  // version 4
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // variant 1
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xffff,
                     b >> 48, b & 0xffffffffffffULL);
}

const char* TypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "";
}

bool Matches(const StoredObject& o, const LabelSelector& l, const FieldSelector& f) {
  return l.Matches(o.labels) && f.Matches(o.fields);
}

absl::Status CheckFieldSelector(const ResourceInfo& r, const FieldSelector& f) {
  const std::vector<std::string>& ok = SelectableFields(r);
  for (const FieldSelector::Term& t : f.terms()) {
    if (std::find(ok.begin(), ok.end(), t.field) == ok.end()) {
      return ApiError(400, "BadRequest", fmt::format("field label not supported: {}", t.field));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<LabelSelector, FieldSelector>> ParseSelectors(const ResourceInfo& r,
                                                                       const std::string& label,
                                                                       const std::string& field) {
  absl::StatusOr<LabelSelector> l = LabelSelector::Parse(label);
  if (!l.ok()) {
    return ApiError(
        400, "BadRequest",
        fmt::format("unable to parse requirement: {}", std::string(l.status().message())));
  }
  absl::StatusOr<FieldSelector> f = FieldSelector::Parse(field);
  if (!f.ok()) {
    return ApiError(400, "BadRequest", std::string(f.status().message()));
  }
  TESSERA_RETURN_IF_ERROR(CheckFieldSelector(r, *f));
  return std::make_pair(*std::move(l), *std::move(f));
}

}  // namespace

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

namespace {
Json PayloadOf(const absl::Status& status) {
  auto p = status.GetPayload(kApiPayload);
  if (!p) {
    return Json();
  }
  return Json::parse(std::string(*p), nullptr, false);
}
}  // namespace

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

// ---- resources ----------------------------------------------------------------------------

const std::vector<ResourceInfo>& Resources() {
  static const std::vector<ResourceInfo>* const kResources = new std::vector<ResourceInfo>{
      {"", "v1", "pods", "pod", "Pod", true, true, {"po"}},
      {"", "v1", "nodes", "node", "Node", false, true, {"no"}},
      {"", "v1", "namespaces", "namespace", "Namespace", false, true, {"ns"}},
      {"", "v1", "events", "event", "Event", true, false, {"ev"}},
      {"", "v1", "configmaps", "configmap", "ConfigMap", true, false, {"cm"}},
      {"", "v1", "resourcequotas", "resourcequota", "ResourceQuota", true, true, {"quota"}},
      {"coordination.k8s.io", "v1", "leases", "lease", "Lease", true, false, {}},
      {"events.k8s.io", "v1", "events", "event", "Event", true, false, {"ev"}},
  };
  return *kResources;
}

const ResourceInfo* FindResource(std::string_view group, std::string_view version,
                                 std::string_view name) {
  for (const ResourceInfo& r : Resources()) {
    if (r.group == group && r.version == version && r.name == name) {
      return &r;
    }
  }
  return nullptr;
}

std::string StoredObject::JsonWithRv(uint64_t new_rv) const {
  if (rv_len == 0) {
    return json;
  }
  std::string out;
  std::string digits = std::to_string(new_rv);
  out.reserve(json.size() + digits.size());
  out.append(json, 0, rv_pos);
  out += digits;
  out.append(json, rv_pos + rv_len, std::string::npos);
  return out;
}

namespace {
ObjectPtr Restamp(const StoredObject& o, uint64_t rv) {
  auto copy = std::make_shared<StoredObject>(o);
  copy->json = o.JsonWithRv(rv);
  copy->rv_len = std::to_string(rv).size();
  copy->rv = rv;
  return copy;
}
}  // namespace

// ---- store --------------------------------------------------------------------------------

Store::Store(StoreOptions options, Clock* clock)
    : options_(options),
      clock_(clock),
      changed_by_resource_(new CondVar[Resources().size()]),
      newest_rv_by_resource_(Resources().size(), 0),
      trimmed_rv_by_resource_(Resources().size(), 0),
      objects_(Resources().size()),
      rng_(1) {
  TESSERA_CHECK(Resources().size() <= sizeof(wake_pending_) * 8);  // a bit per resource
  std::random_device rd;
  uid_rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

Store::~Store() { Shutdown(); }

size_t Store::IndexOf(const ResourceInfo& r) const {
  const std::vector<ResourceInfo>& all = Resources();
  return static_cast<size_t>(&r - all.data());
}

void Store::EnsureDefaultNamespaces() {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    std::string body = fmt::format(R"({{"metadata":{{"name":"{}"}}}})", ns);
    (void)Create(Resources()[kNamespaces], "", body);  // AlreadyExists is fine
  }
}

absl::StatusOr<ObjectPtr> Store::Lookup(size_t r, std::string_view ns, std::string_view name) {
  const ResourceInfo& info = Resources()[r];
  auto it = objects_[r].find(Key(info, ns, name));
  if (it == objects_[r].end()) {
    return NotFound(info, name);
  }
  return it->second;
}

bool Store::ShouldDrop(const ResourceInfo& r, EventType type) {
  for (DropRule& rule : faults_.drop_watch_events) {
    if (rule.count == 0) {
      continue;
    }
    if (!rule.resource.empty() && rule.resource != r.name) {
      continue;
    }
    if (!rule.type.empty() && rule.type != TypeName(type)) {
      continue;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(rng_) < rule.probability) {
      if (rule.count > 0) {
        --rule.count;
      }
      return true;
    }
  }
  return false;
}

void Store::Commit(size_t r, EventType type, ObjectPtr obj, ObjectPtr prev) {
  rv_ = obj->rv;
  if (type == EventType::kDeleted) {
    objects_[r].erase(obj->key);
  } else {
    objects_[r][obj->key] = obj;
  }
  Event e;
  e.rv = obj->rv;
  e.type = type;
  e.resource = r;
  e.obj = std::move(obj);
  e.prev = std::move(prev);
  e.dropped = ShouldDrop(Resources()[r], type);
  if (e.dropped) {
    ++events_dropped_;
  }
  newest_rv_by_resource_[r] = e.rv;
  history_.push_back(std::move(e));
  while (history_.size() > std::max<size_t>(options_.watch_history, 1)) {
    const Event& front = history_.front();
    oldest_rv_ = std::max(oldest_rv_, front.rv);
    trimmed_rv_by_resource_[front.resource] =
        std::max(trimmed_rv_by_resource_[front.resource], front.rv);
    history_.pop_front();
  }
  wake_pending_ |= uint64_t{1} << r;  // StoreLock wakes the watchers after unlocking
}

Store::StoreLock::StoreLock(Store* s) : s_(s) { s_->mu_.Lock(); }

Store::StoreLock::~StoreLock() {
  const uint64_t wake = s_->wake_pending_;
  s_->wake_pending_ = 0;
  s_->mu_.Unlock();
  if (wake == 0) {
    return;
  }
  s_->changed_.SignalAll();
  for (size_t r = 0; r < Resources().size(); ++r) {
    if ((wake & (uint64_t{1} << r)) != 0) {
      s_->changed_by_resource_[r].SignalAll();
    }
  }
}

void Store::WakeEveryWatcherLocked() {
  // StoreLock wakes them after unlocking, as for a write.
  wake_pending_ |=
      Resources().size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << Resources().size()) - 1;
}

void Store::ForgetHistoryLocked() {
  history_.clear();
  oldest_rv_ = rv_;
  // Every event is gone; a watcher that had sent all of its resource's keeps running.
  trimmed_rv_by_resource_ = newest_rv_by_resource_;
}

void Store::Remove(size_t r, const ObjectPtr& old) {
  ObjectPtr last = Restamp(*old, rv_ + 1);
  if (r == kPods) {
    for (auto it = deadlines_.begin(); it != deadlines_.end(); ++it) {
      if (it->second == old->key) {
        deadlines_.erase(it);
        break;
      }
    }
  }
  Commit(r, EventType::kDeleted, std::move(last), old);
}

std::string Store::Finish(size_t r, const ObjectPtr& old, const ObjectPtr& obj,
                          const WriteOptions& w) {
  if (w.dry_run) {
    return obj->json;
  }
  const bool complete = obj->has_deletion && !obj->has_finalizers &&
                        (r != kPods || obj->terminal || obj->fields.at("spec.nodeName").empty());
  // A pod whose grace period already ended goes as soon as its finalizers are gone.
  bool grace_over = false;
  if (r == kPods && obj->has_deletion && !obj->has_finalizers) {
    for (const auto& d : deadlines_) {
      if (d.second == obj->key && d.first <= clock_->Now()) {
        grace_over = true;
      }
    }
  }
  std::string answer = obj->json;
  Commit(r, EventType::kModified, obj, old);
  if (complete || grace_over) {
    Remove(r, obj);
  }
  return answer;
}

absl::StatusOr<std::string> Store::Get(const ResourceInfo& r, std::string_view ns,
                                       std::string_view name) {
  StoreLock l(this);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr o, Lookup(IndexOf(r), ns, name));
  return o->json;
}

template <typename Fn>
void Store::ForEachAt(size_t r, std::string_view ns, uint64_t at, std::string_view start, Fn fn) {
  // The state at `at` is the current state with every later event of this resource undone:
  // the first later event of a key holds the key's state at `at` in `prev`.
  std::map<std::string_view, const ObjectPtr*> overlay;
  if (at < rv_ && !history_.empty()) {
    size_t first = at + 1 >= history_.front().rv ? at + 1 - history_.front().rv : 0;
    for (size_t i = first; i < history_.size(); ++i) {
      const Event& e = history_[i];
      if (e.resource == r) {
        overlay.emplace(e.obj->key, &e.prev);
      }
    }
  }
  std::string prefix = ns.empty() ? std::string() : std::string(ns) + "/";
  std::string lower = std::max(prefix, std::string(start));
  const auto& cur = objects_[r];
  auto ci = cur.lower_bound(lower);
  auto oi = overlay.lower_bound(lower);
  auto in_prefix = [&](std::string_view k) { return k.substr(0, prefix.size()) == prefix; };
  while (true) {
    const bool c_ok = ci != cur.end() && in_prefix(ci->first);
    const bool o_ok = oi != overlay.end() && in_prefix(oi->first);
    if (!c_ok && !o_ok) {
      return;
    }
    const ObjectPtr* pick = nullptr;
    if (c_ok && (!o_ok || std::string_view(ci->first) < oi->first)) {
      pick = &ci->second;
      ++ci;
    } else if (c_ok && std::string_view(ci->first) == oi->first) {
      pick = oi->second;
      ++ci;
      ++oi;
    } else {
      pick = oi->second;
      ++oi;
    }
    if (*pick != nullptr && !fn(*pick)) {
      return;
    }
  }
}

bool Store::WaitForRevision(uint64_t rv) {
  absl::Time until = absl::Now() + options_.too_large_rv_wait;
  while (rv_ < rv && !shutdown_) {
    absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      break;
    }
    changed_.WaitFor(&mu_, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  return rv_ >= rv;
}

absl::StatusOr<std::string> Store::List(const ResourceInfo& r, std::string_view ns,
                                        const ListOptions& o) {
  const bool has_rv = !o.resource_version.empty();
  if (!o.resource_version_match.empty()) {
    if (!has_rv) {
      return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                                "resourceVersionMatch is forbidden unless resourceVersion is "
                                "provided");
    }
    if (!o.continue_token.empty()) {
      return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                                "resourceVersionMatch is forbidden when continue is provided");
    }
    if (o.resource_version_match != "Exact" && o.resource_version_match != "NotOlderThan") {
      return ListOptionsInvalid(
          "resourceVersionMatch", "Unsupported value",
          fmt::format("\"{}\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
                      o.resource_version_match));
    }
    if (o.resource_version_match == "Exact" && o.resource_version == "0") {
      return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                                "resourceVersionMatch \"exact\" is forbidden for resourceVersion "
                                "\"0\"");
    }
  }
  TESSERA_ASSIGN_OR_RETURN(auto selectors, ParseSelectors(r, o.label_selector, o.field_selector));
  const LabelSelector& lsel = selectors.first;
  const FieldSelector& fsel = selectors.second;
  const size_t idx = IndexOf(r);

  StoreLock l(this);
  uint64_t at = rv_;
  std::string start;
  int64_t limit = std::max<int64_t>(o.limit, 0);  // kube-apiserver: a negative limit is none
  int64_t known_total = -1;
  int64_t offset = 0;
  if (!o.continue_token.empty()) {
    if (has_rv && o.resource_version != "0") {
      return ApiError(400, "BadRequest",
                      "specifying resource version is not allowed when using continue");
    }
    if (!DecodeContinue(o.continue_token, &at, &start, &known_total, &offset)) {
      return ApiError(400, "BadRequest",
                      "invalid continue token: continue key is not valid: malformed token");
    }
    if (at == kLatestRevisionToken) {
      at = rv_;  // the successor of an expired token: the rest at the latest revision
    }
    if (at < oldest_rv_ || at > rv_) {
      expired_answers_.fetch_add(1);
      // As kube-apiserver: the Status carries a token that lists the rest of the items at the
      // latest revision, which the message offers.
      ApiErrorDetails d;
      d.list_continue = EncodeContinue(kLatestRevisionToken, start, -1, 0);
      return ApiError(410, "Expired",
                      "The provided continue parameter is too old to display a consistent list "
                      "result. You can start a new list without the continue parameter, or use "
                      "the continue token in this response to retrieve the remainder of the "
                      "results. Continuing with the provided token results in an inconsistent "
                      "list - objects that were created, modified, or deleted between the time "
                      "the first chunk was returned and now may show up in the list.",
                      d);
    }
  } else if (o.resource_version == "0") {
    limit = 0;  // the watch cache ignores limit for resourceVersion=0
  } else if (has_rv) {
    uint64_t want = 0;
    if (!ParseRv(o.resource_version, &want)) {
      return ApiError(400, "BadRequest",
                      fmt::format("Invalid value: \"{}\": resourceVersion must be an integer",
                                  o.resource_version));
    }
    const bool exact =
        o.resource_version_match == "Exact" || (o.resource_version_match.empty() && o.limit > 0);
    if (want > rv_ && !WaitForRevision(want)) {
      return TooLarge(want, rv_);
    }
    if (exact) {
      if (want < oldest_rv_) {
        expired_answers_.fetch_add(1);
        return ApiError(410, "Expired", "The resourceVersion for the provided list is too old.");
      }
      at = want;
    } else {
      at = rv_;
    }
  }

  std::string items;
  int64_t n = 0;
  std::string next_key;
  int64_t remaining = 0;
  const bool no_selector = lsel.empty() && fsel.empty();
  // Count the rest of the snapshot only when the token does not already know the total.
  const bool count_rest = no_selector && known_total < 0;
  const std::string item_prefix = ItemPrefix(r);
  ForEachAt(idx, ns, at, start, [&](const ObjectPtr& obj) {
    if (!Matches(*obj, lsel, fsel)) {
      return true;
    }
    if (limit > 0 && n >= limit) {
      if (next_key.empty()) {
        next_key = obj->key;
      }
      ++remaining;
      return count_rest;
    }
    if (n > 0) {
      items += ',';
    }
    AppendItemJson(item_prefix, *obj, &items);
    ++n;
    return true;
  });
  std::string out;
  out.reserve(items.size() + 256);
  out += fmt::format(R"({{"kind":"{}","apiVersion":"{}","metadata":{{"resourceVersion":"{}")",
                     r.list_kind(), r.api_version(), at);
  if (!next_key.empty()) {
    int64_t total = -1;
    if (no_selector) {
      total = known_total >= 0 ? known_total : offset + n + remaining;
      remaining = total - offset - n;
    }
    out += fmt::format(R"(,"continue":"{}")", EncodeContinue(at, next_key, total, offset + n));
    if (no_selector) {
      out += fmt::format(R"(,"remainingItemCount":{})", remaining);
    }
  }
  out += R"(},"items":[)";
  out += items;
  out += "]}";
  return out;
}

absl::StatusOr<std::string> Store::Create(const ResourceInfo& r, std::string_view ns,
                                          std::string_view body, const WriteOptions& w) {
  TESSERA_ASSIGN_OR_RETURN(Json doc, ParseBody(body));
  TESSERA_RETURN_IF_ERROR(ValidateDocument(r, doc));
  Json& md = doc["metadata"];
  if (r.namespaced) {
    std::string body_ns = md.value("namespace", "");
    if (!body_ns.empty() && body_ns != ns) {
      return ApiError(400, "BadRequest",
                      "the namespace of the provided object does not match the namespace sent "
                      "on the request");
    }
    md["namespace"] = std::string(ns);
  } else {
    md.erase("namespace");
  }
  StoreLock l(this);
  const size_t idx = IndexOf(r);
  std::string name = md.value("name", "");
  if (name.empty()) {
    std::string gen = md.value("generateName", "");
    if (gen.empty()) {
      return Invalid(r, "", "metadata.name", "Required value", "name or generateName is required");
    }
    name = gen + RandomSuffix(uid_rng_, 5);
    md["name"] = name;
  }
  const bool name_ok = r.name == "namespaces" ? kube::IsDnsLabel(name) : kube::IsDnsSubdomain(name);
  if (!name_ok) {
    // kube-apiserver v1.37.2's words, example and regular expression included.
    return Invalid(r, name, "metadata.name", fmt::format("Invalid value: \"{}\"", name),
                   r.name == "namespaces"
                       ? "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                         "characters or '-', and must start and end with an alphanumeric "
                         "character (e.g. 'my-name',  or '123-abc', regex used for validation "
                         "is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                       : "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                         "characters, '-' or '.', and must start and end with an alphanumeric "
                         "character (e.g. 'example.com', regex used for validation is "
                         "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')");
  }
  if (r.namespaced && objects_[kNamespaces].count(std::string(ns)) == 0) {
    ApiErrorDetails d;
    d.name = std::string(ns);
    d.kind = "namespaces";
    return ApiError(404, "NotFound", fmt::format("namespaces \"{}\" not found", ns), d);
  }
  const std::string key = Key(r, ns, name);
  if (objects_[idx].count(key) != 0) {
    ApiErrorDetails d;
    d.name = name;
    d.group = r.group;
    d.kind = r.name;
    return ApiError(409, "AlreadyExists",
                    fmt::format("{} \"{}\" already exists", Qualified(r.name, r.group), name), d);
  }
  md.erase("resourceVersion");
  md.erase("deletionTimestamp");
  md.erase("deletionGracePeriodSeconds");
  md.erase("managedFields");
  md["uid"] = RandomUid(uid_rng_);
  md["creationTimestamp"] = FormatTimeRfc(clock_->Now());
  if (r.group.empty() && r.name == "pods") {
    // kube-apiserver gives only pods (of the kinds served here) a generation; the others keep
    // whatever the client sent (docs/apisim.md, "Checked against kube-apiserver").
    md["generation"] = 1;
    Json& spec = doc["spec"];
    if (!spec.contains("schedulerName")) {
      spec["schedulerName"] = "default-scheduler";
    }
    if (!spec.contains("terminationGracePeriodSeconds")) {
      spec["terminationGracePeriodSeconds"] = 30;
    }
    if (!spec.contains("restartPolicy")) {
      spec["restartPolicy"] = "Always";
    }
    if (!spec.contains("dnsPolicy")) {
      spec["dnsPolicy"] = "ClusterFirst";
    }
    if (!doc.contains("status") || !doc["status"].is_object()) {
      doc["status"] = Json::object();
    }
    if (!doc["status"].contains("phase")) {
      doc["status"]["phase"] = "Pending";
    }
  } else if (r.group.empty() && r.name == "namespaces") {
    doc["status"]["phase"] = "Active";
  }
  ObjectPtr obj = MakeObject(r, doc, rv_ + 1);
  if (w.dry_run) {
    return obj->json;
  }
  Commit(idx, EventType::kAdded, obj, nullptr);
  return obj->json;
}

absl::StatusOr<std::string> Store::UpdateLocked(size_t r, const ObjectPtr& old,
                                                std::string_view subresource, Json doc,
                                                const Json& prev, const WriteOptions& w) {
  const ResourceInfo& info = Resources()[r];
  TESSERA_RETURN_IF_ERROR(ValidateDocument(info, doc));
  Json& md = doc["metadata"];
  if (md.value("name", old->name) != old->name) {
    return ApiError(400, "BadRequest",
                    fmt::format("the name of the object ({}) does not match the name on the URL "
                                "({})",
                                md.value("name", ""), old->name));
  }
  if (info.namespaced && md.value("namespace", old->ns) != old->ns) {
    return ApiError(400, "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request");
  }
  std::string want_rv = md.value("resourceVersion", "");
  if (!want_rv.empty() && want_rv != std::to_string(old->rv)) {
    return Conflict(info, old->name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again");
  }
  Json next;
  if (subresource == "status") {
    next = prev;
    if (doc.contains("status")) {
      next["status"] = doc["status"];
    } else {
      next.erase("status");
    }
  } else {
    next = std::move(doc);
    Json& nmd = next["metadata"];
    const Json& pmd = prev["metadata"];
    nmd["name"] = old->name;
    if (info.namespaced) {
      nmd["namespace"] = old->ns;
    }
    for (const char* f : {"uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation"}) {
      if (pmd.contains(f)) {
        nmd[f] = pmd[f];
      } else {
        nmd.erase(f);
      }
    }
    if (info.has_status) {
      if (prev.contains("status")) {
        next["status"] = prev["status"];
      } else {
        next.erase("status");
      }
    }
    if (r == kPods) {
      std::string old_node = prev["spec"].value("nodeName", "");
      std::string new_node = next["spec"].value("nodeName", "");
      if (!old_node.empty() && old_node != new_node) {
        return Invalid(info, old->name, "spec", "Forbidden",
                       "pod updates may not change spec.nodeName once it is set");
      }
    }
    // What moves a pod's metadata.generation: a change outside metadata and status.
    if (r == kPods && !SameValue(next, prev, {"metadata", "status"})) {
      nmd["generation"] = pmd.value("generation", 0) + 1;
    }
  }
  // A deletion can only be started by DELETE; an update cannot remove it.
  ObjectPtr obj = MakeObject(info, next, rv_ + 1);
  if (SameButRevision(*obj, *old)) {
    return old->json;  // a no-op write keeps the revision and sends no event
  }
  return Finish(r, old, obj, w);
}

absl::StatusOr<std::string> Store::Update(const ResourceInfo& r, std::string_view ns,
                                          std::string_view name, std::string_view subresource,
                                          std::string_view body, const WriteOptions& w) {
  StoreLock l(this);
  const size_t idx = IndexOf(r);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr old, Lookup(idx, ns, name));
  TESSERA_ASSIGN_OR_RETURN(Json doc, ParseBody(body));
  Json prev = Json::parse(old->json);
  // A PUT's metadata.uid is a precondition (the generic registry's Preconditions{UID}).
  const std::string want_uid = MetadataUid(doc);
  if (!want_uid.empty() && want_uid != MetadataUid(prev)) {
    return Conflict(r, old->name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                want_uid, MetadataUid(prev)));
  }
  return UpdateLocked(idx, old, subresource, std::move(doc), prev, w);
}

absl::StatusOr<std::string> Store::Patch(const ResourceInfo& r, std::string_view ns,
                                         std::string_view name, std::string_view subresource,
                                         PatchType type, std::string_view body,
                                         const WriteOptions& w) {
  StoreLock l(this);
  const size_t idx = IndexOf(r);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr old, Lookup(idx, ns, name));
  const Json prev = Json::parse(old->json);
  absl::StatusOr<Json> patched = ApplyPatchToDocument(type, prev, body);
  if (!patched.ok()) {
    const absl::Status& s = patched.status();
    if (absl::IsResourceExhausted(s)) {
      return ApiError(413, "RequestEntityTooLarge", std::string(s.message()));
    }
    if (absl::IsFailedPrecondition(s)) {
      return ApiError(422, "Invalid", std::string(s.message()));
    }
    if (absl::IsInvalidArgument(s)) {
      return ApiError(400, "BadRequest", std::string(s.message()));
    }
    return ApiError(500, "InternalError", std::string(s.message()));
  }
  // A patch carries no preconditions; a uid it sets meets the update validation instead
  // (ValidateObjectMetaUpdate: metadata.uid is immutable), so naming another object's uid is a
  // 422 and nothing is written.
  if (const std::string uid = MetadataUid(*patched); !uid.empty() && uid != MetadataUid(prev)) {
    return Invalid(r, old->name, "metadata.uid", "Invalid value",
                   fmt::format("\"{}\": field is immutable", uid));
  }
  return UpdateLocked(idx, old, subresource, *std::move(patched), prev, w);
}

absl::StatusOr<std::string> Store::Delete(const ResourceInfo& r, std::string_view ns,
                                          std::string_view name, std::string_view body,
                                          const WriteOptions& w) {
  Json opts = Json::object();
  if (body.find_first_not_of(" \t\r\n") != std::string_view::npos) {
    TESSERA_ASSIGN_OR_RETURN(opts, ParseBody(body));
  }
  std::optional<int64_t> grace;
  if (opts.contains("gracePeriodSeconds") && !opts["gracePeriodSeconds"].is_null()) {
    if (!opts["gracePeriodSeconds"].is_number_integer()) {
      return TypeError(opts["gracePeriodSeconds"], "int64", "DeleteOptions.gracePeriodSeconds");
    }
    grace = opts["gracePeriodSeconds"].get<int64_t>();
  }
  std::string pre_uid;
  std::string pre_rv;
  if (opts.contains("preconditions") && opts["preconditions"].is_object()) {
    const Json& p = opts["preconditions"];
    if (p.contains("uid") && p["uid"].is_string()) {
      pre_uid = p["uid"].get<std::string>();
    }
    if (p.contains("resourceVersion") && p["resourceVersion"].is_string()) {
      pre_rv = p["resourceVersion"].get<std::string>();
    }
  }
  StoreLock l(this);
  const size_t idx = IndexOf(r);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr old, Lookup(idx, ns, name));
  Json doc = Json::parse(old->json);
  Json& md = doc["metadata"];
  const std::string uid = md.value("uid", "");
  if (!pre_uid.empty() && pre_uid != uid) {
    return Conflict(r, name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                pre_uid, uid));
  }
  if (!pre_rv.empty() && pre_rv != std::to_string(old->rv)) {
    return Conflict(r, name,
                    fmt::format("Precondition failed: ResourceVersion in precondition: {}, "
                                "ResourceVersion in object meta: {}",
                                pre_rv, old->rv));
  }
  auto deleted_answer = [&](const ObjectPtr& last) -> std::string {
    if (idx == kPods) {
      return last->json;
    }
    Json s = Json::object();
    s["kind"] = "Status";
    s["apiVersion"] = "v1";
    s["metadata"] = Json::object();
    s["status"] = "Success";
    s["details"]["name"] = old->name;
    if (!r.group.empty()) {
      s["details"]["group"] = r.group;
    }
    s["details"]["kind"] = r.name;
    s["details"]["uid"] = uid;
    return s.dump();
  };
  int64_t g = 0;
  if (idx == kPods) {
    g = grace.value_or(doc["spec"].value("terminationGracePeriodSeconds", int64_t{30}));
    if (g < 0) {
      g = 1;
    }
    if (old->fields.at("spec.nodeName").empty() || old->terminal) {
      g = 0;
    }
  }
  const absl::Time now = clock_->Now();
  // kube-apiserver deletes a pod in two writes even when it goes at once (unbound, terminal,
  // grace 0): MODIFIED with deletionTimestamp and deletionGracePeriodSeconds, then DELETED
  // (docs/apisim.md, "Checked against kube-apiserver"). Other kinds, and a pod whose deletion
  // already has grace 0, go in one.
  const bool old_grace_zero =
      old->has_deletion && md.value("deletionGracePeriodSeconds", int64_t{-1}) == 0;
  if (g == 0 && !old->has_finalizers && (idx != kPods || old_grace_zero)) {
    if (w.dry_run) {
      return deleted_answer(old);
    }
    Remove(idx, old);
    return deleted_answer(history_.back().obj);
  }
  // Graceful (or finalizer-blocked) deletion: stamp deletionTimestamp.
  absl::Time deadline = now + absl::Seconds(g);
  if (old->has_deletion) {
    absl::Time current;
    const bool shortened_to_zero = idx == kPods && g == 0 && !old_grace_zero;
    if (!shortened_to_zero &&
        (!ParseRfc3339(md.value("deletionTimestamp", ""), &current) || deadline >= current)) {
      return old->json;  // already being deleted, at least as soon
    }
  } else if (idx == kPods && md.value("generation", int64_t{0}) > 0) {
    // As kube-apiserver's graceful deletion does when it first sets deletionTimestamp.
    md["generation"] = md.value("generation", int64_t{0}) + 1;
  }
  md["deletionTimestamp"] = FormatTimeRfc(deadline);
  md["deletionGracePeriodSeconds"] = g;
  ObjectPtr obj = MakeObject(r, doc, rv_ + 1);
  if (w.dry_run) {
    return obj->json;
  }
  if (idx == kPods) {
    for (auto it = deadlines_.begin(); it != deadlines_.end(); ++it) {
      if (it->second == old->key) {
        deadlines_.erase(it);
        break;
      }
    }
    deadlines_.emplace(deadline, obj->key);
  }
  std::string answer = obj->json;
  Commit(idx, EventType::kModified, obj, old);
  if (g == 0 && !obj->has_finalizers) {
    Remove(idx, obj);
    answer = deleted_answer(history_.back().obj);  // the object as deleted, as kube-apiserver
  }
  return answer;
}

absl::StatusOr<std::string> Store::Bind(std::string_view ns, std::string_view name,
                                        std::string_view body, const WriteOptions& w) {
  const ResourceInfo& pods = Resources()[kPods];
  TESSERA_ASSIGN_OR_RETURN(Json b, ParseBody(body));
  if (b.contains("kind") && b["kind"] != "Binding") {
    return ApiError(400, "BadRequest",
                    fmt::format("the kind in the data ({}) does not match the expected kind "
                                "(Binding)",
                                b["kind"].dump()));
  }
  if (!b.contains("metadata") || !b["metadata"].is_object()) {
    b["metadata"] = Json::object();
  }
  Json& bmd = b["metadata"];
  TESSERA_RETURN_IF_ERROR(CheckStringMap(bmd, "annotations", "ObjectMeta.metadata.annotations"));
  for (const char* f : {"name", "uid", "resourceVersion"}) {
    TESSERA_RETURN_IF_ERROR(
        CheckOptionalType(bmd, f, Json::value_t::string, fmt::format("ObjectMeta.metadata.{}", f)));
  }
  if (bmd.value("name", std::string(name)) != name) {
    return ApiError(400, "BadRequest", "name in URL does not match name in Binding object");
  }
  if (!b.contains("target") || !b["target"].is_object() || !b["target"].contains("name") ||
      !b["target"]["name"].is_string() || b["target"]["name"].get<std::string>().empty()) {
    ApiErrorDetails d;
    d.name = std::string(name);
    d.kind = "Binding";
    d.cause_reason = "FieldValueRequired";
    d.cause_field = "target.name";
    return ApiError(422, "Invalid",
                    fmt::format("Binding \"{}\" is invalid: target.name: Required value", name), d);
  }
  const std::string node = b["target"]["name"].get<std::string>();
  StoreLock l(this);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr old, Lookup(kPods, ns, name));
  Json doc = Json::parse(old->json);
  Json& md = doc["metadata"];
  std::string want_uid = bmd.value("uid", "");
  if (!want_uid.empty() && want_uid != md.value("uid", "")) {
    return Conflict(pods, name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                want_uid, md.value("uid", "")));
  }
  std::string want_rv = bmd.value("resourceVersion", "");
  if (!want_rv.empty() && want_rv != std::to_string(old->rv)) {
    return Conflict(pods, name,
                    fmt::format("Precondition failed: ResourceVersion in precondition: {}, "
                                "ResourceVersion in object meta: {}",
                                want_rv, old->rv));
  }
  auto binding_conflict = [&](const std::string& why) {
    ApiErrorDetails d;
    d.name = std::string(name);
    d.kind = "pods/binding";
    return ApiError(
        409, "Conflict",
        fmt::format("Operation cannot be fulfilled on pods/binding \"{}\": {}", name, why), d);
  };
  if (old->has_deletion) {
    return binding_conflict(
        fmt::format("pod {} is being deleted, cannot be assigned to a host", name));
  }
  std::string bound = doc["spec"].value("nodeName", "");
  if (!bound.empty()) {
    return binding_conflict(fmt::format("pod {} is already assigned to node \"{}\"", name, bound));
  }
  if (doc["spec"].contains("schedulingGates") && doc["spec"]["schedulingGates"].is_array() &&
      !doc["spec"]["schedulingGates"].empty()) {
    return binding_conflict(fmt::format("pod {} has non-empty .spec.schedulingGates", name));
  }
  doc["spec"]["nodeName"] = node;
  if (bmd.contains("annotations") && bmd["annotations"].is_object()) {
    for (auto it = bmd["annotations"].begin(); it != bmd["annotations"].end(); ++it) {
      md["annotations"][it.key()] = it.value();
    }
  }
  Json& status = doc["status"];
  if (!status.is_object()) {
    status = Json::object();
  }
  Json cond = Json::object();
  cond["type"] = "PodScheduled";
  cond["status"] = "True";
  cond["lastProbeTime"] = nullptr;
  cond["lastTransitionTime"] = FormatTimeRfc(clock_->Now());
  Json& conds = status["conditions"];
  if (!conds.is_array()) {
    conds = Json::array();
  }
  bool replaced = false;
  for (Json& c : conds) {
    if (c.is_object() && c.value("type", "") == "PodScheduled") {
      c = cond;
      replaced = true;
    }
  }
  if (!replaced) {
    conds.push_back(cond);
  }
  ObjectPtr obj = MakeObject(pods, doc, rv_ + 1);
  if (!w.dry_run) {
    Commit(kPods, EventType::kModified, obj, old);
  }
  return std::string(
      R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201})");
}

int Store::Reap() {
  StoreLock l(this);
  const absl::Time now = clock_->Now();
  int n = 0;
  // A pod whose grace ended but whose finalizers still hold it keeps its (past) deadline, so
  // that Finish removes it the moment the last finalizer goes.
  std::vector<std::pair<absl::Time, std::string>> blocked;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    std::pair<absl::Time, std::string> entry = *deadlines_.begin();
    deadlines_.erase(deadlines_.begin());
    auto it = objects_[kPods].find(entry.second);
    if (it == objects_[kPods].end() || !it->second->has_deletion) {
      continue;
    }
    if (it->second->has_finalizers) {
      blocked.push_back(std::move(entry));
      continue;
    }
    // What a kubelet does when the containers have stopped: DELETE with grace 0, which
    // kube-apiserver turns into MODIFIED (deletionTimestamp now, grace 0), then DELETED.
    ObjectPtr old = it->second;
    Json doc = Json::parse(old->json);
    doc["metadata"]["deletionTimestamp"] = FormatTimeRfc(now);
    doc["metadata"]["deletionGracePeriodSeconds"] = 0;
    ObjectPtr zero = MakeObject(Resources()[kPods], doc, rv_ + 1);
    Commit(kPods, EventType::kModified, zero, old);
    Remove(kPods, zero);
    ++n;
  }
  for (auto& entry : blocked) {
    deadlines_.emplace(entry.first, std::move(entry.second));
  }
  return n;
}

void Store::SetFaults(const Faults& faults) {
  StoreLock l(this);
  faults_ = faults;
  request_faults_set_.store(faults.latency_ms > 0 || faults.fail_probability > 0,
                            std::memory_order_release);
  rng_.seed(faults.seed);
  WakeEveryWatcherLocked();
}

Faults Store::GetFaults() {
  StoreLock l(this);
  return faults_;
}

int Store::SeverWatches() {
  StoreLock l(this);
  ++sever_generation_;
  WakeEveryWatcherLocked();
  return static_cast<int>(watches_open_.load());
}

uint64_t Store::Compact() {
  StoreLock l(this);
  ForgetHistoryLocked();
  WakeEveryWatcherLocked();
  return rv_;
}

uint64_t Store::Snapshot() {
  StoreLock l(this);
  // Objects are immutable and shared: the snapshot copies pointers, not objects.
  snapshot_ = Saved{.rv = rv_, .objects = objects_, .deadlines = deadlines_};
  return rv_;
}

absl::StatusOr<uint64_t> Store::Restore(uint64_t bump_revision) {
  StoreLock l(this);
  if (!snapshot_.has_value()) {
    return absl::FailedPreconditionError("no snapshot to restore: take one first");
  }
  if (bump_revision > std::numeric_limits<uint64_t>::max() / 2 - snapshot_->rv) {
    return absl::InvalidArgumentError("bumpRevision is too large");
  }
  objects_ = snapshot_->objects;
  deadlines_ = snapshot_->deadlines;
  rv_ = snapshot_->rv + bump_revision;
  history_.clear();
  oldest_rv_ = rv_;
  // The restarted API server's watch cache starts at the restored revision: every earlier
  // revision is gone for every resource.
  std::fill(newest_rv_by_resource_.begin(), newest_rv_by_resource_.end(), rv_);
  std::fill(trimmed_rv_by_resource_.begin(), trimmed_rv_by_resource_.end(), rv_);
  ++sever_generation_;  // the API server restarts: every open watch breaks
  WakeEveryWatcherLocked();
  return rv_;
}

void Store::Shutdown() {
  StoreLock l(this);
  shutdown_ = true;
  WakeEveryWatcherLocked();
}

uint64_t Store::CurrentRevision() {
  StoreLock l(this);
  return rv_;
}

std::string Store::StatsJson() {
  StoreLock l(this);
  Json o = Json::object();
  o["resourceVersion"] = std::to_string(rv_);
  o["compactedRevision"] = std::to_string(oldest_rv_);
  o["historyEvents"] = history_.size();
  Json counts = Json::object();
  for (size_t i = 0; i < Resources().size(); ++i) {
    const ResourceInfo& r = Resources()[i];
    counts[r.group.empty() ? r.name : r.name + "." + r.group] = objects_[i].size();
  }
  o["objects"] = counts;
  o["watchesOpen"] = watches_open_.load();
  o["watchesStarted"] = watches_started_.load();
  o["watchEventsSent"] = watch_events_sent_.load();
  o["watchEventsDropped"] = events_dropped_;
  o["watchesSevered"] = watches_severed_;
  o["expiredAnswers"] = expired_answers_.load();
  o["pendingGracefulDeletions"] = deadlines_.size();
  return o.dump();
}

absl::Status Store::SaveState(const std::string& path) {
  std::string out;
  {
    StoreLock l(this);
    out = fmt::format(R"({{"resourceVersion":{},"objects":{{)", rv_);
    for (size_t i = 0; i < Resources().size(); ++i) {
      const ResourceInfo& r = Resources()[i];
      if (i > 0) {
        out += ',';
      }
      out += fmt::format(R"("{}":[)", r.group.empty() ? r.name : r.name + "." + r.group);
      bool first = true;
      for (const auto& [key, obj] : objects_[i]) {
        if (!first) {
          out += ',';
        }
        first = false;
        out += obj->json;
      }
      out += ']';
    }
    out += "}}\n";
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      return absl::UnavailableError(fmt::format("cannot write {}", tmp));
    }
    f << out;
    f.flush();
    if (!f) {
      return absl::UnavailableError(fmt::format("cannot write {}", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(fmt::format("cannot rename {} to {}", tmp, path));
  }
  return absl::OkStatus();
}

absl::Status Store::LoadState(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::NotFoundError(fmt::format("cannot read state file {}", path));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  Json state = Json::parse(ss.str(), nullptr, false);
  if (state.is_discarded() || !state.is_object() || !state.contains("resourceVersion") ||
      !state["resourceVersion"].is_number_unsigned() || !state.contains("objects") ||
      !state["objects"].is_object()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: not a state file (want {{\"resourceVersion\":N,\"objects\":{{...}}}})", path));
  }
  StoreLock l(this);
  uint64_t max_rv = state["resourceVersion"].get<uint64_t>();
  std::vector<std::map<std::string, ObjectPtr, std::less<>>> loaded(Resources().size());
  std::set<std::pair<absl::Time, std::string>> deadlines;
  for (size_t i = 0; i < Resources().size(); ++i) {
    const ResourceInfo& r = Resources()[i];
    std::string key = r.group.empty() ? r.name : r.name + "." + r.group;
    if (!state["objects"].contains(key)) {
      continue;
    }
    Json& list = state["objects"][key];
    if (!list.is_array()) {
      return absl::InvalidArgumentError(fmt::format("{}: objects.{} is not a list", path, key));
    }
    for (Json& doc : list) {
      if (!doc.is_object() || !doc.contains("metadata") || !doc["metadata"].is_object() ||
          !doc["metadata"].contains("name") || !doc["metadata"]["name"].is_string()) {
        return absl::InvalidArgumentError(
            fmt::format("{}: an object in {} has no metadata.name", path, key));
      }
      uint64_t rv = 0;
      if (!ParseRv(doc["metadata"].value("resourceVersion", ""), &rv)) {
        rv = max_rv;
      }
      max_rv = std::max(max_rv, rv);
      ObjectPtr obj = MakeObject(r, doc, rv);
      if (i == kPods && obj->has_deletion) {
        absl::Time t;
        if (ParseRfc3339(doc["metadata"].value("deletionTimestamp", ""), &t)) {
          deadlines.emplace(t, obj->key);
        }
      }
      loaded[i][obj->key] = std::move(obj);
    }
  }
  objects_ = std::move(loaded);
  deadlines_ = std::move(deadlines);
  rv_ = std::max(rv_, max_rv);
  ForgetHistoryLocked();
  // What happened before the saved state is unknown: every earlier revision is gone for every
  // resource.
  std::fill(trimmed_rv_by_resource_.begin(), trimmed_rv_by_resource_.end(), rv_);
  WakeEveryWatcherLocked();
  return absl::OkStatus();
}

// ---- watch --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<WatchStream>> Store::Watch(const ResourceInfo& r,
                                                          std::string_view ns,
                                                          const WatchOptions& o) {
  if (o.send_initial_events_set) {
    if (o.resource_version_match != "NotOlderThan") {
      return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                                "sendInitialEvents requires setting resourceVersionMatch to "
                                "NotOlderThan");
    }
  } else if (!o.resource_version_match.empty()) {
    return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                              "resourceVersionMatch is forbidden for watch unless "
                              "sendInitialEvents is provided");
  }
  TESSERA_ASSIGN_OR_RETURN(auto selectors, ParseSelectors(r, o.label_selector, o.field_selector));
  auto w = std::unique_ptr<WatchStream>(new WatchStream());
  w->store_ = this;
  w->resource_ = &r;
  w->resource_index_ = IndexOf(r);
  w->ns_ = std::string(ns);
  w->labels_ = std::move(selectors.first);
  w->fields_ = std::move(selectors.second);
  w->bookmarks_ = o.allow_bookmarks;
  const absl::Time now = absl::Now();
  double timeout = o.timeout_seconds;
  if (timeout <= 0) {
    std::uniform_real_distribution<double> u(1.0, 2.0);
    std::random_device rd;
    std::mt19937 g(rd());
    timeout = 1800.0 * u(g);
  }
  w->deadline_ = now + absl::Seconds(timeout);
  w->next_bookmark_ = std::min(now + options_.bookmark_interval, w->deadline_ - absl::Seconds(2));
  if (w->next_bookmark_ <= now) {
    // As kube-apiserver's watch cache: a watch that ends within 2 s gets no bookmark.
    w->final_bookmark_sent_ = true;
    w->next_bookmark_ = absl::InfiniteFuture();
  }
  const bool legacy_initial =
      !o.send_initial_events_set && (o.resource_version.empty() || o.resource_version == "0");
  const bool initial = legacy_initial || o.send_initial_events;

  StoreLock l(this);
  w->sever_generation_ = sever_generation_;
  uint64_t want = 0;
  if (!o.resource_version.empty() && o.resource_version != "0") {
    if (!ParseRv(o.resource_version, &want)) {
      return ApiError(400, "BadRequest",
                      fmt::format("Invalid value: \"{}\": resourceVersion must be an integer",
                                  o.resource_version));
    }
    if (want > rv_ && !WaitForRevision(want)) {
      return TooLarge(want, rv_);
    }
  }
  if (initial) {
    w->cursor_ = rv_;
    ForEachAt(w->resource_index_, ns, rv_, "", [&](const ObjectPtr& obj) {
      if (Matches(*obj, w->labels_, w->fields_)) {
        w->initial_.push_back(obj);
      }
      return true;
    });
    w->send_initial_end_ = o.send_initial_events;
  } else if (want < trimmed_rv_by_resource_[w->resource_index_]) {
    // An event of this resource after `want` is gone (events of other resources do not count:
    // the watch cache is per resource).
    expired_answers_.fetch_add(1);
    w->pending_error_ = ErrorEventLine(ExpiredWatch(want, oldest_rv_));
    w->cursor_ = rv_;
  } else {
    w->cursor_ = want;
  }
  watches_open_.fetch_add(1);
  watches_started_.fetch_add(1);
  return w;
}

WatchStream::~WatchStream() {
  if (store_ != nullptr) {
    store_->watches_open_.fetch_sub(1);
  }
}

WatchStream::Step WatchStream::Next(std::string* out, absl::Duration max_wait) {
  out->clear();
  if (ended_) {
    return Step::kEnd;
  }
  if (!pending_error_.empty()) {
    *out = std::move(pending_error_);
    pending_error_.clear();
    ended_ = true;
    return Step::kData;
  }
  if (initial_pos_ < initial_.size() || send_initial_end_) {
    size_t end = std::min(initial_.size(), initial_pos_ + 256);
    for (; initial_pos_ < end; ++initial_pos_) {
      *out += EventLine("ADDED", initial_[initial_pos_]->json);
    }
    if (initial_pos_ == initial_.size()) {
      initial_.clear();
      initial_.shrink_to_fit();
      initial_pos_ = 0;
      if (send_initial_end_) {
        *out += BookmarkLine(*resource_, cursor_, true);
        send_initial_end_ = false;
      }
    }
    store_->watch_events_sent_.fetch_add(1);
    return Step::kData;
  }
  Store& s = *store_;
  const absl::Time give_up = absl::Now() + max_wait;
  std::vector<Store::Event> batch;
  while (true) {
    {
      MutexLock l(&s.mu_);
      while (true) {
        if (s.shutdown_) {
          return Step::kAbort;
        }
        if (s.sever_generation_ != sever_generation_) {
          ++s.watches_severed_;
          return Step::kAbort;
        }
        const absl::Time now = absl::Now();
        if (now >= deadline_) {
          ended_ = true;
          return Step::kEnd;
        }
        const size_t r = resource_index_;
        if (!s.faults_.pause_watches && s.trimmed_rv_by_resource_[r] > cursor_) {
          // An event of this watch's resource that it has not sent is gone: like the watch
          // cache, end it with 410.
          *out = ErrorEventLine(ExpiredWatch(cursor_, s.oldest_rv_));
          s.expired_answers_.fetch_add(1);
          ended_ = true;
          return Step::kData;
        }
        if (!s.faults_.pause_watches && s.newest_rv_by_resource_[r] > cursor_) {
          // The newest event of this resource is in the history (else it was trimmed, checked
          // above), and everything between the cursor and the oldest event kept belongs to
          // other resources: skip it.
          cursor_ = std::max(cursor_, s.history_.front().rv - 1);
          size_t i = cursor_ + 1 - s.history_.front().rv;
          size_t end = std::min(s.history_.size(), i + 1024);
          batch.assign(s.history_.begin() + static_cast<std::ptrdiff_t>(i),
                       s.history_.begin() + static_cast<std::ptrdiff_t>(end));
          cursor_ = batch.back().rv;
          break;
        }
        if (!s.faults_.pause_watches) {
          // Nothing of this resource after the cursor: the watch has seen everything up to the
          // store's revision (so its bookmarks carry a current one, as the watch cache's do).
          cursor_ = std::max(cursor_, s.rv_);
        }
        if (bookmarks_ && now >= next_bookmark_) {
          *out = BookmarkLine(*resource_, cursor_, false);
          if (!final_bookmark_sent_ && next_bookmark_ >= deadline_ - absl::Seconds(2)) {
            final_bookmark_sent_ = true;
          }
          next_bookmark_ = now + s.options_.bookmark_interval;
          if (!final_bookmark_sent_) {
            next_bookmark_ = std::min(next_bookmark_, deadline_ - absl::Seconds(2));
          }
          return Step::kData;
        }
        absl::Time wake = std::min(deadline_, give_up);
        if (bookmarks_) {
          wake = std::min(wake, next_bookmark_);
        }
        if (now >= give_up) {
          return Step::kIdle;
        }
        s.changed_by_resource_[r].WaitFor(
            &s.mu_, absl::ToChronoMicroseconds(wake - now) + std::chrono::microseconds(100));
      }
    }
    uint64_t sent = 0;
    for (const Store::Event& e : batch) {
      if (e.resource != resource_index_ || e.dropped) {
        continue;
      }
      if (!ns_.empty() && e.obj->ns != ns_) {
        continue;
      }
      const bool now_match = Matches(*e.obj, labels_, fields_);
      switch (e.type) {
        case EventType::kAdded:
          if (now_match) {
            *out += EventLine("ADDED", e.obj->json);
            ++sent;
          }
          break;
        case EventType::kDeleted:
          if (now_match) {
            *out += EventLine("DELETED", e.obj->json);
            ++sent;
          }
          break;
        case EventType::kModified: {
          const bool was_match = e.prev != nullptr && Matches(*e.prev, labels_, fields_);
          if (was_match && now_match) {
            *out += EventLine("MODIFIED", e.obj->json);
            ++sent;
          } else if (!was_match && now_match) {
            *out += EventLine("ADDED", e.obj->json);
            ++sent;
          } else if (was_match) {
            *out += EventLine("DELETED", e.prev->JsonWithRv(e.rv));
            ++sent;
          }
          break;
        }
      }
    }
    batch.clear();
    if (sent > 0) {
      s.watch_events_sent_.fetch_add(sent);
      return Step::kData;
    }
    if (absl::Now() >= give_up) {
      return Step::kIdle;
    }
  }
}

}  // namespace tessera::apisim

#include <algorithm>
#include <string>

#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"
#include "tessera/base/status_macros.h"
#include "tessera/json/text.h"

namespace tessera::apisim {

using internal::SelectableFields;

namespace {

absl::Status CheckFieldSelector(const ResourceInfo& r, const FieldSelector& f) {
  const std::vector<std::string>& ok = SelectableFields(r);
  for (const FieldSelector::Term& t : f.terms()) {
    if (std::find(ok.begin(), ok.end(), t.field) == ok.end()) {
      return ApiError(400, "BadRequest", fmt::format("field label not supported: {}", t.field));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

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

bool Matches(const StoredObject& o, const LabelSelector& l, const FieldSelector& f) {
  return l.Matches(o.labels) && f.Matches(o.fields);
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

}  // namespace internal

}  // namespace tessera::apisim

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"

namespace tessera::apisim {

using internal::Json;

namespace {

constexpr char kRvSentinel[] = "\\u0001";  // how "\x01" is serialised

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

}  // namespace

namespace internal {

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

std::string Key(const ResourceInfo& r, std::string_view ns, std::string_view name) {
  if (!r.namespaced) {
    return std::string(name);
  }
  std::string k(ns);
  k += '/';
  k += name;
  return k;
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

bool ParseRv(const std::string& s, uint64_t* out) { return absl::SimpleAtoi(s, out); }

}  // namespace internal

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
      {"policy",
       "v1",
       "poddisruptionbudgets",
       "poddisruptionbudget",
       "PodDisruptionBudget",
       true,
       true,
       {"pdb"}},
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

}  // namespace tessera::apisim

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"
#include "tessera/base/status_macros.h"
#include "tessera/kube/objects.h"

namespace tessera::apisim {

using internal::CheckOptionalType;
using internal::CheckStringMap;
using internal::Conflict;
using internal::FormatTimeRfc;
using internal::Invalid;
using internal::Json;
using internal::Key;
using internal::kNamespaces;
using internal::kPods;
using internal::MakeObject;
using internal::ParseBody;
using internal::ParseRfc3339;
using internal::Qualified;
using internal::TypeError;
using internal::ValidateDocument;

namespace {

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

// Whether two stored objects serialise the same apart from their revision digits.
bool SameButRevision(const StoredObject& a, const StoredObject& b) {
  if (a.rv_len == 0 || b.rv_len == 0) {
    return a.json == b.json;
  }
  const std::string_view x = a.json, y = b.json;
  return x.substr(0, a.rv_pos) == y.substr(0, b.rv_pos) &&
         x.substr(a.rv_pos + a.rv_len) == y.substr(b.rv_pos + b.rv_len);
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

}  // namespace

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

}  // namespace tessera::apisim

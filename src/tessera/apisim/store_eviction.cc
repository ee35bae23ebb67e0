// POST pods/{name}/eviction: the pod's PodDisruptionBudget consulted and spent, then a graceful
// delete (docs/apisim.md "Eviction").
#include <optional>
#include <string>
#include <vector>

#include "fmt/core.h"

#include "tessera/apisim/selector.h"
#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"
#include "tessera/base/status_macros.h"

namespace tessera::apisim {

using internal::FormatTimeRfc;
using internal::Json;
using internal::ParseBody;
using internal::TypeError;

namespace {

// A policy/v1 LabelSelector object in the labelSelector query form; nullopt for an empty or
// absent one (it selects no pod for eviction, as the API server reads it).
std::optional<LabelSelector> SelectorOf(const Json& spec) {
  if (!spec.is_object() || !spec.contains("selector") || !spec["selector"].is_object()) {
    return std::nullopt;
  }
  const Json& sel = spec["selector"];
  std::vector<std::string> terms;
  if (sel.contains("matchLabels") && sel["matchLabels"].is_object()) {
    for (auto it = sel["matchLabels"].begin(); it != sel["matchLabels"].end(); ++it) {
      if (it.value().is_string()) {
        terms.push_back(fmt::format("{}={}", it.key(), it.value().get<std::string>()));
      }
    }
  }
  if (sel.contains("matchExpressions") && sel["matchExpressions"].is_array()) {
    for (const Json& e : sel["matchExpressions"]) {
      const std::string key = e.value("key", "");
      const std::string op = e.value("operator", "");
      std::vector<std::string> values;
      if (e.contains("values") && e["values"].is_array()) {
        for (const Json& v : e["values"]) {
          if (v.is_string()) {
            values.push_back(v.get<std::string>());
          }
        }
      }
      std::string joined;
      for (const std::string& v : values) {
        joined += (joined.empty() ? "" : ",") + v;
      }
      if (op == "In" || op == "NotIn") {
        terms.push_back(fmt::format("{} {} ({})", key, op == "In" ? "in" : "notin", joined));
      } else if (op == "Exists") {
        terms.push_back(key);
      } else if (op == "DoesNotExist") {
        terms.push_back("!" + key);
      }
    }
  }
  if (terms.empty()) {
    return std::nullopt;
  }
  std::string text;
  for (const std::string& t : terms) {
    text += (text.empty() ? "" : ",") + t;
  }
  absl::StatusOr<LabelSelector> parsed = LabelSelector::Parse(text);
  return parsed.ok() ? std::optional<LabelSelector>(*parsed) : std::nullopt;
}

Fields LabelsOf(const Json& doc) {
  Fields out;
  const Json& md = doc["metadata"];
  if (md.contains("labels") && md["labels"].is_object()) {
    for (auto it = md["labels"].begin(); it != md["labels"].end(); ++it) {
      if (it.value().is_string()) {
        out.emplace(it.key(), it.value().get<std::string>());
      }
    }
  }
  return out;
}

// Unbound pods that a scheduler reserved on a node name it in an annotation.
bool NamesNode(const StoredObject& pod, const std::string& node) {
  const Json doc = Json::parse(pod.json, nullptr, false);
  if (!doc.is_object() || !doc["metadata"].contains("annotations") ||
      !doc["metadata"]["annotations"].is_object()) {
    return false;
  }
  for (const auto& [key, value] : doc["metadata"]["annotations"].items()) {
    if (value.is_string() && value.get<std::string>() == node) {
      return true;
    }
  }
  return false;
}

constexpr size_t kEvictionsKept = 10000;

}  // namespace

Json Store::NodeSnapshot(const std::string& node) {
  StoreLock l(this);
  Json out = Json::object();
  out["node"] = node;
  out["at"] = internal::FormatMicroTime(clock_->Now());
  out["resourceVersion"] = std::to_string(rv_);
  Json items = Json::array();
  for (const auto& [key, obj] : objects_[internal::kPods]) {
    const std::string& bound = obj->fields.at("spec.nodeName");
    if (bound == node || (bound.empty() && !obj->terminal && NamesNode(*obj, node))) {
      items.push_back(Json::parse(obj->json));
    }
  }
  out["nodePods"] = std::move(items);
  return out;
}

std::string Store::EvictionsJson() {
  StoreLock l(this);
  std::string out = R"({"evictions":[)";
  for (size_t i = 0; i < evictions_.size(); ++i) {
    out += (i == 0 ? "" : ",") + evictions_[i];
  }
  return out + "]}";
}

absl::StatusOr<std::string> Store::Evict(std::string_view ns, std::string_view name,
                                         std::string_view body, const WriteOptions& w) {
  const ResourceInfo& pods = *FindResource("", "v1", "pods");
  const ResourceInfo& budgets = *FindResource("policy", "v1", "poddisruptionbudgets");
  TESSERA_ASSIGN_OR_RETURN(Json eviction, ParseBody(body));
  if (!eviction.is_object()) {
    return TypeError(eviction, "v1.Eviction", "Eviction");
  }
  const std::string named = eviction.contains("metadata") && eviction["metadata"].is_object()
                                ? eviction["metadata"].value("name", "")
                                : "";
  if (named != name) {
    return ApiError(400, "BadRequest",
                    fmt::format("name in URL does not match name in Eviction object"));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string pod_json, Get(pods, ns, name));
  const Json pod = Json::parse(pod_json);
  std::string options = "{}";
  if (eviction.contains("deleteOptions") && eviction["deleteOptions"].is_object()) {
    const Json& del = eviction["deleteOptions"];
    options = del.dump();
    // The preconditions hold before any budget is spent.
    const std::string want_uid = del.contains("preconditions") && del["preconditions"].is_object()
                                     ? del["preconditions"].value("uid", "")
                                     : "";
    const std::string uid = pod["metadata"].value("uid", "");
    if (!want_uid.empty() && want_uid != uid) {
      return internal::Conflict(pods, name,
                                fmt::format("Precondition failed: UID in precondition: {}, UID in "
                                            "object meta: {}",
                                            want_uid, uid));
    }
  }
  const std::string phase =
      pod.contains("status") && pod["status"].is_object() ? pod["status"].value("phase", "") : "";
  // A finished pod, or one already being deleted, goes without consulting a budget.
  const bool check =
      phase != "Succeeded" && phase != "Failed" && !pod["metadata"].contains("deletionTimestamp");
  if (check) {
    TESSERA_ASSIGN_OR_RETURN(std::string list, List(budgets, ns, {}));
    const Json items = Json::parse(list)["items"];
    const Fields labels = LabelsOf(pod);
    std::vector<Json> matching;
    for (const Json& pdb : items) {
      std::optional<LabelSelector> sel = SelectorOf(pdb["spec"]);
      if (sel && sel->Matches(labels)) {
        matching.push_back(pdb);
      }
    }
    if (matching.size() > 1) {
      return ApiError(500, "InternalError",
                      "This pod has more than one PodDisruptionBudget, which the eviction "
                      "subresource does not support.");
    }
    if (matching.size() == 1) {
      Json pdb = matching[0];
      Json& status = pdb["status"];
      if (!status.is_object()) {
        status = Json::object();
      }
      const int64_t allowed = status.value("disruptionsAllowed", int64_t{0});
      if (allowed < 1) {
        ApiErrorDetails d;
        d.cause_reason = "DisruptionBudget";
        d.cause_message = fmt::format(
            "The disruption budget {} needs {} healthy pods and has {} currently",
            pdb["metadata"].value("name", ""), status.value("desiredHealthy", int64_t{0}),
            status.value("currentHealthy", int64_t{0}));
        return ApiError(429, "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.", d);
      }
      // The budget is spent before the pod goes, as the API server does (status.disruptedPods
      // keeps it from being counted twice until the controller sees it gone).
      status["disruptionsAllowed"] = allowed - 1;
      if (!status.contains("disruptedPods") || !status["disruptedPods"].is_object()) {
        status["disruptedPods"] = Json::object();
      }
      status["disruptedPods"][std::string(name)] = FormatTimeRfc(clock_->Now());
      TESSERA_RETURN_IF_ERROR(
          Update(budgets, ns, pdb["metadata"].value("name", ""), "status", pdb.dump(), w).status());
    }
  }
  const std::string node =
      pod.contains("spec") && pod["spec"].is_object() ? pod["spec"].value("nodeName", "") : "";
  std::optional<Json> record;
  if (!node.empty() && !w.dry_run) {
    record = NodeSnapshot(node);
    (*record)["namespace"] = std::string(ns);
    (*record)["name"] = std::string(name);
    (*record)["uid"] = pod["metadata"].value("uid", "");
  }
  TESSERA_RETURN_IF_ERROR(Delete(pods, ns, name, options, w).status());
  if (record.has_value()) {
    StoreLock l(this);
    evictions_.push_back(record->dump());
    while (evictions_.size() > kEvictionsKept) {
      evictions_.pop_front();
    }
  }
  Json s = Json::object();
  s["kind"] = "Status";
  s["apiVersion"] = "v1";
  s["metadata"] = Json::object();
  s["status"] = "Success";
  return s.dump();
}

}  // namespace tessera::apisim

#include "tessera/apisim/patch.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "fmt/core.h"
#include "nlohmann/json.hpp"

#include "tessera/json/text.h"

namespace tessera::apisim {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxJsonPatchOps = 10000;

std::string_view StripParams(std::string_view ct) {
  size_t semi = ct.find(';');
  if (semi != std::string_view::npos) {
    ct = ct.substr(0, semi);
  }
  while (!ct.empty() && ct.back() == ' ') {
    ct.remove_suffix(1);
  }
  while (!ct.empty() && ct.front() == ' ') {
    ct.remove_prefix(1);
  }
  return ct;
}

// The merge key of the lists that strategic merge patch merges instead of replacing, keyed by
// the field name (the built-in types use the same key wherever the field appears). An empty
// key marks a list of primitives merged as a set.
const char* MergeKeyFor(std::string_view field) {
  struct Entry {
    const char* field;
    const char* key;
  };
  static constexpr Entry kKeys[] = {
      {"containers", "name"},
      {"initContainers", "name"},
      {"ephemeralContainers", "name"},
      {"env", "name"},
      {"ports", "containerPort"},
      {"volumeMounts", "mountPath"},
      {"volumes", "name"},
      {"conditions", "type"},
      {"imagePullSecrets", "name"},
      {"ownerReferences", "uid"},
      {"taints", "key"},
      {"addresses", "type"},
      {"hostAliases", "ip"},
      {"resourceClaims", "name"},
      {"finalizers", ""},
  };
  for (const Entry& e : kKeys) {
    if (field == e.field) {
      return e.key;
    }
  }
  return nullptr;
}

absl::Status StrategicMerge(Json& target, const Json& patch);

absl::Status MergeList(Json& target, const Json& patch, const char* key) {
  if (!target.is_array()) {
    target = Json::array();
  }
  // A list-level {"$patch":"replace"} element replaces the whole list with the others.
  bool replace = false;
  for (const Json& e : patch) {
    if (e.is_object() && e.contains("$patch") && e["$patch"] == "replace") {
      replace = true;
    }
  }
  if (replace) {
    Json out = Json::array();
    for (const Json& e : patch) {
      if (!(e.is_object() && e.contains("$patch"))) {
        out.push_back(e);
      }
    }
    target = std::move(out);
    return absl::OkStatus();
  }
  if (*key == '\0') {  // primitive set
    for (const Json& e : patch) {
      if (std::find(target.begin(), target.end(), e) == target.end()) {
        target.push_back(e);
      }
    }
    return absl::OkStatus();
  }
  for (const Json& e : patch) {
    if (!e.is_object() || !e.contains(key)) {
      return absl::InvalidArgumentError(
          fmt::format("strategic merge patch: list element lacks merge key \"{}\"", key));
    }
    const Json& kv = e[key];
    auto it = std::find_if(target.begin(), target.end(), [&](const Json& t) {
      return t.is_object() && t.contains(key) && t[key] == kv;
    });
    if (e.contains("$patch") && e["$patch"] == "delete") {
      if (it != target.end()) {
        target.erase(it);
      }
      continue;
    }
    if (it == target.end()) {
      Json fresh = Json::object();
      if (absl::Status s = StrategicMerge(fresh, e); !s.ok()) {
        return s;
      }
      target.push_back(std::move(fresh));
    } else {
      if (absl::Status s = StrategicMerge(*it, e); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StrategicMerge(Json& target, const Json& patch) {
  if (!patch.is_object()) {
    target = patch;
    return absl::OkStatus();
  }
  if (patch.contains("$patch")) {
    const Json& d = patch["$patch"];
    if (d == "replace") {
      Json copy = patch;
      copy.erase("$patch");
      target = std::move(copy);
      return absl::OkStatus();
    }
    if (d == "delete") {
      target = Json::object();
      return absl::OkStatus();
    }
    if (d != "merge") {
      return absl::InvalidArgumentError(
          fmt::format("strategic merge patch: unknown $patch directive {}", d.dump()));
    }
  }
  if (!target.is_object()) {
    target = Json::object();
  }
  std::vector<std::string> retain;
  bool has_retain = false;
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    if (k == "$patch") {
      continue;
    }
    if (k == "$retainKeys") {
      if (!v.is_array()) {
        return absl::InvalidArgumentError("strategic merge patch: $retainKeys must be a list");
      }
      has_retain = true;
      for (const Json& r : v) {
        if (r.is_string()) {
          retain.push_back(r.get<std::string>());
        }
      }
      continue;
    }
    if (k.rfind("$setElementOrder/", 0) == 0) {
      continue;  // ordering hint only
    }
    if (k.rfind("$deleteFromPrimitiveList/", 0) == 0) {
      std::string field = k.substr(sizeof("$deleteFromPrimitiveList/") - 1);
      if (!v.is_array()) {
        return absl::InvalidArgumentError(
            "strategic merge patch: $deleteFromPrimitiveList needs a list");
      }
      if (target.contains(field) && target[field].is_array()) {
        Json& list = target[field];
        Json out = Json::array();
        for (const Json& e : list) {
          if (std::find(v.begin(), v.end(), e) == v.end()) {
            out.push_back(e);
          }
        }
        list = std::move(out);
      }
      continue;
    }
    if (v.is_null()) {
      target.erase(k);
      continue;
    }
    if (v.is_object()) {
      if (v.contains("$patch") && v["$patch"] == "delete") {
        target.erase(k);
        continue;
      }
      Json& sub = target[k];
      if (absl::Status s = StrategicMerge(sub, v); !s.ok()) {
        return s;
      }
      continue;
    }
    if (v.is_array()) {
      const char* key = MergeKeyFor(k);
      if (key != nullptr) {
        Json& sub = target[k];
        if (absl::Status s = MergeList(sub, v, key); !s.ok()) {
          return s;
        }
        continue;
      }
    }
    target[k] = v;
  }
  if (has_retain) {
    for (auto it = target.begin(); it != target.end();) {
      if (std::find(retain.begin(), retain.end(), it.key()) == retain.end()) {
        it = target.erase(it);
      } else {
        ++it;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<PatchType> PatchTypeFromContentType(std::string_view content_type) {
  std::string_view ct = StripParams(content_type);
  if (ct == "application/json-patch+json") {
    return PatchType::kJson;
  }
  if (ct == "application/merge-patch+json") {
    return PatchType::kMerge;
  }
  if (ct == "application/strategic-merge-patch+json") {
    return PatchType::kStrategic;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ApplyPatch(PatchType type, std::string_view original,
                                       std::string_view patch) {
  // A parse failure is "discarded", not an object: ApplyPatchToDocument refuses it.
  absl::StatusOr<Json> patched =
      ApplyPatchToDocument(type, Json::parse(original, nullptr, /*allow_exceptions=*/false), patch);
  if (!patched.ok()) {
    return patched.status();
  }
  return patched->dump();
}

absl::StatusOr<Json> ApplyPatchToDocument(PatchType type, Json doc, std::string_view patch) {
  if (!doc.is_object()) {
    return absl::InternalError("stored object is not a JSON object");
  }
  if (json::ExceedsDepth(patch, kMaxJsonDepth)) {
    return absl::InvalidArgumentError("the patch nests deeper than 1000 levels");
  }
  Json p = Json::parse(patch, nullptr, /*allow_exceptions=*/false);
  if (p.is_discarded()) {
    return absl::InvalidArgumentError("the patch is not valid JSON");
  }
  switch (type) {
    case PatchType::kJson: {
      if (!p.is_array()) {
        return absl::InvalidArgumentError(
            "json: cannot unmarshal the patch into a list of operations");
      }
      if (p.size() > kMaxJsonPatchOps) {
        return absl::ResourceExhaustedError(
            fmt::format("The allowed maximum operations in a JSON patch is {}, got {}",
                        kMaxJsonPatchOps, p.size()));
      }
      for (const Json& op : p) {
        if (!op.is_object() || !op.contains("op") || !op["op"].is_string() ||
            !op.contains("path") || !op["path"].is_string()) {
          return absl::InvalidArgumentError(
              "json patch: every operation needs string \"op\" and \"path\"");
        }
      }
      try {
        doc = doc.patch(p);
      } catch (const nlohmann::json::exception& e) {
        return absl::FailedPreconditionError(
            fmt::format("the patch cannot be applied: {}", e.what()));
      }
      break;
    }
    case PatchType::kMerge:
      if (!p.is_object()) {
        return absl::InvalidArgumentError("a merge patch must be a JSON object");
      }
      doc.merge_patch(p);
      break;
    case PatchType::kStrategic: {
      if (!p.is_object()) {
        return absl::InvalidArgumentError("a strategic merge patch must be a JSON object");
      }
      if (absl::Status s = StrategicMerge(doc, p); !s.ok()) {
        return s;
      }
      break;
    }
  }
  if (!doc.is_object()) {
    return absl::FailedPreconditionError("the patched document is not an object");
  }
  return doc;
}

}  // namespace tessera::apisim

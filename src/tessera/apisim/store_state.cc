#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"

namespace tessera::apisim {

using internal::Json;
using internal::kPods;
using internal::MakeObject;
using internal::ParseRfc3339;
using internal::ParseRv;

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

}  // namespace tessera::apisim

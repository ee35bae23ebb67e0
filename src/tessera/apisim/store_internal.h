// File: tessera/apisim/store_internal.h
//
// Helpers shared by the files that implement Store (store.cc: commits, locking and faults;
// store_objects.cc: the stored form; store_errors.cc: kube-apiserver's error bodies;
// store_validation.cc: body and selector checks; store_list.cc: paged lists;
// store_writes.cc: create, update, patch, delete, binding; store_state.cc: snapshot and state
// file; store_watch.cc: watches). Not part of the public API.
//
// Errors: the checks return ApiError statuses, with kube-apiserver's codes and wording.
// Thread safety: pure functions; ForEachAt needs the store's lock, as annotated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

#include "tessera/apisim/selector.h"
#include "tessera/apisim/store.h"

namespace tessera::apisim::internal {

using Json = nlohmann::ordered_json;

inline constexpr size_t kPods = 0;  // index of pods in Resources()
inline constexpr size_t kNamespaces = 2;

// ---- store_objects.cc: times, keys and the stored form ---------------------------------------

std::string FormatTimeRfc(absl::Time t);
// MicroTime: always six fractional digits.
std::string FormatMicroTime(absl::Time t);
bool ParseRfc3339(const std::string& s, absl::Time* t);
bool ParseRv(const std::string& s, uint64_t* out);
// "namespace/name", or "name" for a cluster-scoped resource.
std::string Key(const ResourceInfo& r, std::string_view ns, std::string_view name);
// Field paths (dotted) that each resource supports in field selectors.
const std::vector<std::string>& SelectableFields(const ResourceInfo& r);
// Builds the stored form of `doc`, stamping `rv` into metadata.resourceVersion.
ObjectPtr MakeObject(const ResourceInfo& r, Json& doc, uint64_t rv);

// ---- store_errors.cc: errors as kube-apiserver words them ------------------------------------

// "object", "string", ... as Go's json package names a JSON value's type.
const char* JsonTypeName(const Json& j);
absl::Status TypeError(const Json& got, std::string_view want, std::string_view field);
// A resource or kind as kube-apiserver names it in messages: "pods", "leases.coordination.k8s.io",
// "Lease.coordination.k8s.io".
std::string Qualified(std::string_view name, std::string_view group);
absl::Status Invalid(const ResourceInfo& r, std::string_view name, std::string_view field,
                     std::string_view what, std::string_view detail);
absl::Status NotFound(const ResourceInfo& r, std::string_view name);
absl::Status Conflict(const ResourceInfo& r, std::string_view name, std::string_view why);
absl::Status TooLarge(uint64_t want, uint64_t have);
absl::Status ListOptionsInvalid(std::string_view field, std::string_view what,
                                std::string_view detail);

// ---- store_validation.cc: bodies and selectors ------------------------------------------------

// A request body as a JSON object (400 otherwise).
absl::StatusOr<Json> ParseBody(std::string_view body);
absl::Status CheckStringMap(const Json& md, const char* field, std::string_view path);
absl::Status CheckOptionalType(const Json& parent, const char* field, Json::value_t want,
                               std::string_view path);
// Shape checks shared by create and update: kind/apiVersion, metadata types (400) and the
// resource's own required fields (422). Puts kind, apiVersion and metadata first.
absl::Status ValidateDocument(const ResourceInfo& r, Json& doc);
bool Matches(const StoredObject& o, const LabelSelector& l, const FieldSelector& f);
absl::StatusOr<std::pair<LabelSelector, FieldSelector>> ParseSelectors(const ResourceInfo& r,
                                                                       const std::string& label,
                                                                       const std::string& field);

}  // namespace tessera::apisim::internal

namespace tessera::apisim {

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

}  // namespace tessera::apisim

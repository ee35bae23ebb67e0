#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/escaping.h"
#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"
#include "tessera/base/status_macros.h"

namespace tessera::apisim {

using internal::Json;
using internal::ListOptionsInvalid;
using internal::Matches;
using internal::ParseRv;
using internal::ParseSelectors;
using internal::TooLarge;

namespace {

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

}  // namespace

bool Store::WaitForRevision(uint64_t rv) {
  absl::Time until = clock_->Now() + options_.too_large_rv_wait;
  while (rv_ < rv && !shutdown_) {
    absl::Duration left = until - clock_->Now();
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

}  // namespace tessera::apisim

// File: tessera/kube/decode.h
//
// Typed decoders from the API server's JSON to the projections of objects.h and lease.h: single
// objects, LIST pages, watch events and Status errors, with simdjson On-Demand (one copy of the
// input into a padded buffer; only the kept strings are allocated). Unknown fields are skipped,
// null is absent, fields may come in any order; only the labels and annotations objects.h lists
// are kept. The rules in full: docs/kube-client.md "The decoders".
//
// Errors: a decode returns the whole value or an error, never a partial value: InvalidArgument
// naming the object and the field path, e.g. "Pod default/x: spec.containers[1].resources.limits:
// expected object"; FieldError(status) gives the part after the object label.
//
// Thread safety: a Decoder is thread-compatible (one per thread; it reuses its parser's buffers).
// The free functions use a thread-local Decoder and are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "tessera/kube/lease.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/pod_disruption_budget.h"
#include "tessera/kube/resource_quota.h"

namespace tessera::kube {

// A metav1.Status: the body of an API error, and the object of a watch ERROR event.
struct ApiStatus {
  std::string status;               // "Success" or "Failure"
  std::string reason;               // e.g. "Expired", "Conflict", "NotFound"; empty when absent
  std::string message;              // human-readable
  int32_t code = 0;                 // HTTP status code, e.g. 410, 409
  int32_t retry_after_seconds = 0;  // details.retryAfterSeconds; 0 when absent

  friend bool operator==(const ApiStatus&, const ApiStatus&) = default;
};

// metadata of a list response.
struct ListMeta {
  std::string resource_version;
  std::string continue_token;  // metadata.continue; empty on the last page
  std::optional<int64_t> remaining_item_count;

  friend bool operator==(const ListMeta&, const ListMeta&) = default;
};

struct PodList {
  ListMeta meta;
  std::vector<Pod> items;
};

struct NodeList {
  ListMeta meta;
  std::vector<Node> items;
};

struct ResourceQuotaList {
  ListMeta meta;
  std::vector<ResourceQuota> items;
};

struct PodDisruptionBudgetList {
  ListMeta meta;
  std::vector<PodDisruptionBudget> items;
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

// "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR".
std::string_view WatchEventTypeName(WatchEventType type);

// One event of a watch stream on objects of type T (Pod, Node, ResourceQuota or Lease).
template <typename T>
struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  // ADDED, MODIFIED, DELETED: the decoded object (DELETED carries the last state).
  // BOOKMARK: only object.meta.resource_version and object.meta.annotations are set (a watch-list
  //           bookmark carries "k8s.io/initial-events-end"); the rest of the object is skipped.
  // ERROR: default-constructed.
  T object;
  ApiStatus status;  // ERROR only: the Status object, e.g. code 410 reason "Expired".
};

// The field path and problem of a decode error ("spec.containers: expected array"), without the
// object label; empty for statuses that do not come from a decoder.
std::string FieldError(const absl::Status& status);

// Reusable decoder. Each call parses one complete JSON document; the input is copied, so it
// need not outlive the call and needs no padding.
class Decoder {
 public:
  // Buffers grown past `retain_bytes` by one call (the input copy and the parser's indexes, about
  // twice the input) are released after that call, so that one huge body does not pin its memory
  // for the life of the thread. Paged LISTs (a few MB) stay well below the default.
  static constexpr size_t kDefaultRetainBytes = size_t{32} << 20;

  explicit Decoder(size_t retain_bytes = kDefaultRetainBytes);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // A single object. `kind`, when present, must match ("Pod", "Node", "Lease", "ResourceQuota",
  // "Status").
  absl::StatusOr<Pod> DecodePod(std::string_view json);
  absl::StatusOr<Node> DecodeNode(std::string_view json);
  absl::StatusOr<Lease> DecodeLease(std::string_view json);
  absl::StatusOr<ResourceQuota> DecodeResourceQuota(std::string_view json);
  absl::StatusOr<ApiStatus> DecodeStatus(std::string_view json);
  absl::StatusOr<PodDisruptionBudget> DecodePodDisruptionBudget(std::string_view json);
  absl::StatusOr<PodDisruptionBudgetList> DecodePodDisruptionBudgetList(std::string_view json);

  // A list response (one page). `kind`, when present, must be "PodList"/"NodeList" or "List";
  // items need not carry a kind (the API server omits it), but one that does must match.
  // `items` absent or null decodes to an empty list.
  absl::StatusOr<PodList> DecodePodList(std::string_view json);
  absl::StatusOr<NodeList> DecodeNodeList(std::string_view json);
  absl::StatusOr<ResourceQuotaList> DecodeResourceQuotaList(std::string_view json);

  // The same, parsing `*body` in place instead of copying it: the body's capacity is grown by
  // the parser's padding (64 bytes) when it lacks it, which reallocates at most once, and the
  // bytes past size() are overwritten. For multi-megabyte LIST bodies held in a std::string.
  absl::StatusOr<PodList> DecodePodListInPlace(std::string* body);
  absl::StatusOr<NodeList> DecodeNodeListInPlace(std::string* body);
  absl::StatusOr<ResourceQuotaList> DecodeResourceQuotaListInPlace(std::string* body);

  // One watch event {"type": ..., "object": ...}. T is Pod, Node, ResourceQuota or Lease. The
  // object's kind, when present, must be T's kind (or "Status" for ERROR); an unknown type is an
  // error.
  template <typename T>
  absl::StatusOr<WatchEvent<T>> DecodeWatchEvent(std::string_view json);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience wrappers over a thread-local Decoder.
absl::StatusOr<Pod> DecodePod(std::string_view json);
absl::StatusOr<Node> DecodeNode(std::string_view json);
absl::StatusOr<Lease> DecodeLease(std::string_view json);
absl::StatusOr<ApiStatus> DecodeStatus(std::string_view json);
absl::StatusOr<PodList> DecodePodList(std::string_view json);
absl::StatusOr<NodeList> DecodeNodeList(std::string_view json);
absl::StatusOr<ResourceQuota> DecodeResourceQuota(std::string_view json);
absl::StatusOr<ResourceQuotaList> DecodeResourceQuotaList(std::string_view json);
absl::StatusOr<PodDisruptionBudget> DecodePodDisruptionBudget(std::string_view json);
absl::StatusOr<PodDisruptionBudgetList> DecodePodDisruptionBudgetList(std::string_view json);
template <typename T>
absl::StatusOr<WatchEvent<T>> DecodeWatchEvent(std::string_view json);

}  // namespace tessera::kube

// File: tessera/kube/client.h
//
// ApiClient: the typed Kubernetes API client over a Transport: it builds paths, query strings and
// JSON bodies, decodes responses into the projections of objects.h / lease.h, and turns every
// non-2xx response into an absl::Status carrying the server's Status message (and the HTTP code,
// body and reason as payloads: HttpStatusCodeOf, HttpBodyOf, ReasonOf). Blocking calls retry
// idempotent requests per RetryPolicy (POST and PATCH only on 429) and must not run on the
// transport's I/O thread. Details: docs/kube-client.md "The API client".
//
//   absl::StatusOr<PodList> page = client.ListPods(opts);   // opts.limit, opts.resource_version
//
// Errors: kNotFound 404; kAborted 409 (conflict, already exists, binding refused: see ReasonOf);
// kOutOfRange 410 (expired); kInvalidArgument 400/422 and undecodable bodies; kResourceExhausted
// 429; kUnavailable 502/503/504 and transport failures; kInternal other 5xx; kUnauthenticated 401;
// kPermissionDenied 403.
//
// Thread safety: stateless apart from its options; every method from any thread concurrently. The
// Transport must outlive the client and every watch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/kube/decode.h"
#include "tessera/kube/lease.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"

namespace tessera::kube {

// Query of one LIST page. Empty strings and zero are omitted from the query.
struct ListOptions {
  std::string ns;  // restrict to one namespace (pods, leases); empty: all namespaces
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;
  std::string continue_token;
  std::string resource_version;
  std::string resource_version_match;  // "Exact" or "NotOlderThan"
};

struct WatchOptions {
  std::string ns;
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;
  bool allow_bookmarks = true;
  // timeoutSeconds sent to the server; zero: omitted (server default).
  absl::Duration timeout = absl::ZeroDuration();
  // Transport stall watchdog (Request::stall_timeout); zero: none.
  absl::Duration stall_timeout = absl::ZeroDuration();
};

// Callbacks of one watch. Both run on the transport's I/O thread, one at a time.
template <typename T>
struct WatchCallbacks {
  // Every decoded event in stream order: ADDED, MODIFIED, DELETED, BOOKMARK and ERROR (an ERROR
  // is followed by the end of the stream; the client cancels it).
  absl::AnyInvocable<void(WatchEvent<T> event)> on_event;
  // Optional: when set, it is called instead of on_event, once per chunk of bytes received,
  // with every event that chunk completed (never empty), in stream order.
  absl::AnyInvocable<void(std::vector<WatchEvent<T>> events)> on_batch;
  // Exactly once, last. OK: the server closed the stream normally. kCancelled: Cancel() (unless
  // an error below came first). kInvalidArgument / kResourceExhausted: an event could not be
  // framed or decoded (the stream is cancelled; events before it were delivered). A stream cut
  // mid-object is kUnavailable. A non-2xx response to the watch request: the error described in
  // the file comment. Transport errors as in transport.h.
  absl::AnyInvocable<void(absl::Status status)> on_end;
};

// An open watch. Destroying or Cancel()ing it ends the stream; on_end still runs once
// (asynchronously, possibly after Cancel returns). Movable, not copyable.
class WatchHandle {
 public:
  WatchHandle() = default;
  WatchHandle(Transport* transport, StreamId id) : transport_(transport), id_(id) {}
  WatchHandle(WatchHandle&& other) noexcept;
  WatchHandle& operator=(WatchHandle&& other) noexcept;
  ~WatchHandle() { Cancel(); }
  WatchHandle(const WatchHandle&) = delete;
  WatchHandle& operator=(const WatchHandle&) = delete;

  // Idempotent.
  void Cancel();
  bool active() const { return transport_ != nullptr; }
  StreamId id() const { return id_; }

 private:
  Transport* transport_ = nullptr;
  StreamId id_ = 0;
};

// A merge patch of metadata.labels / metadata.annotations. A value of std::nullopt removes
// the key. `resource_version`, when set, is written into the patch as an optimistic lock: the
// server answers 409 (kAborted, reason "Conflict") when the object has changed since. `uid`,
// when set, is written as metadata.uid: the object must be that one, not another of the same
// name (the API server answers 422, kInvalidArgument "metadata.uid: ... field is immutable",
// when the stored object's uid differs, and writes nothing).
struct MetadataPatch {
  std::vector<std::pair<std::string, std::optional<std::string>>> labels;
  std::vector<std::pair<std::string, std::optional<std::string>>> annotations;
  std::optional<std::string> resource_version;
  std::optional<std::string> uid;
};

// One RFC 6902 operation. `value_json` is the JSON text of the value ("\"x\"", "3", "{}") for
// add/replace/test; `from` for move/copy. `path` is a JSON pointer; escape keys with
// json::PointerEscape (tessera/json/text.h).
struct JsonPatchOp {
  std::string op;
  std::string path;
  std::string value_json;
  std::string from;
};

// A core/v1 Event about an object (the involvedObject). Times are RFC 3339 ("...Z").
struct CoreEvent {
  std::string ns;    // the event's namespace (the object's, or "default" for cluster objects)
  std::string name;  // usually "<object>.<unix nanos in hex>"; see EventName()
  std::string involved_kind;         // "Pod", "Node"
  std::string involved_api_version;  // "v1"
  std::string involved_ns;
  std::string involved_name;
  std::string involved_uid;
  std::string reason;           // "FilteringSucceed", "FilteringFailed", ...
  std::string message;          // at most 1024 bytes are sent
  std::string type = "Normal";  // "Normal" or "Warning"
  std::string source_component;
  std::string source_host;
  std::string first_timestamp;
  std::string last_timestamp;
  int32_t count = 1;
};

// "<object_name>.<unix nanoseconds of `at`, lower-case hex>".
std::string EventName(std::string_view object_name, absl::Time at);

// The Kubernetes `reason` of an error made by this client ("Conflict", "Expired", ...), or of a
// non-2xx answer from kube::Do whose body is a Status; else an empty string.
std::string ReasonOf(const absl::Status& status);

// HttpStatusToStatus, with the message of the Status body (when there is one) in front.
absl::Status ApiError(const Request& request, const Response& response);

// The query string (with the leading '?', or empty) of a LIST, keys sorted as client-go does.
std::string ListQuery(const ListOptions& options);
// The query string of a WATCH (watch=true, ...).
std::string WatchQuery(const WatchOptions& options);

class ApiClient {
 public:
  struct Options {
    RetryPolicy retry;
    // Sleeps between retries of blocking calls; tests inject a recorder.
    absl::AnyInvocable<void(absl::Duration) const> sleep;
  };

  explicit ApiClient(Transport* transport);
  ApiClient(Transport* transport, Options options);

  Transport* transport() const { return transport_; }

  // --- reads (blocking) ---------------------------------------------------------------------
  absl::StatusOr<Pod> GetPod(std::string_view ns, std::string_view name);
  absl::StatusOr<Node> GetNode(std::string_view name);
  // One page.
  absl::StatusOr<PodList> ListPods(const ListOptions& options);
  absl::StatusOr<NodeList> ListNodes(const ListOptions& options);
  absl::StatusOr<ResourceQuotaList> ListResourceQuotas(const ListOptions& options);
  absl::StatusOr<PodDisruptionBudgetList> ListPodDisruptionBudgets(const ListOptions& options);

  // --- async reads (for the reflector) -------------------------------------------------------
  // Sends one LIST page of T (Pod, Node or ResourceQuota) without retrying; `done` runs on the
  // transport thread with the decoded page (PodList / NodeList / ResourceQuotaList) or the error.
  template <typename T>
  using ListOf =
      std::conditional_t<std::is_same_v<T, Pod>, PodList,
                         std::conditional_t<std::is_same_v<T, Node>, NodeList, ResourceQuotaList>>;
  template <typename T>
  void ListAsync(const ListOptions& options,
                 absl::AnyInvocable<void(absl::StatusOr<ListOf<T>>)> done);

  // --- watch ---------------------------------------------------------------------------------
  template <typename T>
  WatchHandle Watch(const WatchOptions& options, WatchCallbacks<T> callbacks);
  WatchHandle WatchPods(const WatchOptions& o, WatchCallbacks<Pod> c) {
    return Watch<Pod>(o, std::move(c));
  }
  WatchHandle WatchNodes(const WatchOptions& o, WatchCallbacks<Node> c) {
    return Watch<Node>(o, std::move(c));
  }

  // --- writes (blocking) ---------------------------------------------------------------------
  // Merge patch (application/merge-patch+json) of metadata; returns the patched object.
  absl::StatusOr<Pod> PatchPodMetadata(std::string_view ns, std::string_view name,
                                       const MetadataPatch& patch);
  absl::StatusOr<Node> PatchNodeMetadata(std::string_view name, const MetadataPatch& patch);
  // JSON patch (application/json-patch+json). A failed "test" op is 422 → kInvalidArgument.
  absl::StatusOr<Pod> JsonPatchPod(std::string_view ns, std::string_view name,
                                   const std::vector<JsonPatchOp>& ops);
  absl::StatusOr<Node> JsonPatchNode(std::string_view name, const std::vector<JsonPatchOp>& ops);
  // POST .../pods/{name}/binding. `uid` and `resource_version`, when non-empty, are
  // preconditions (409 when the pod is another or has changed since). 409 kAborted also when the
  // pod is already bound or being deleted; 404 when it is gone. `annotations` go into the
  // Binding's metadata: the API server merges them into the pod's in the same write that sets
  // spec.nodeName (docs/k8s-protocol.md §4.1), or not at all.
  using Annotations = std::vector<std::pair<std::string, std::string>>;
  absl::Status BindPod(std::string_view ns, std::string_view name, std::string_view uid,
                       std::string_view node, const Annotations& annotations = {},
                       std::string_view resource_version = {});

  // POST .../pods/{name}/eviction (a policy/v1 Eviction; `uid`, when non-empty, is the
  // deletion's precondition). The API server deletes the pod gracefully unless that would take
  // a PodDisruptionBudget below its minimum: then 429, kResourceExhausted, which is not retried
  // here (the caller decides). 404 kNotFound when the pod is gone; 409 kAborted when `uid` is no
  // longer the pod's.
  absl::Status EvictPod(std::string_view ns, std::string_view name, std::string_view uid);

  // Leases (coordination.k8s.io/v1).
  absl::StatusOr<Lease> GetLease(std::string_view ns, std::string_view name);
  // POST; 409 (reason AlreadyExists) when it exists.
  absl::StatusOr<Lease> CreateLease(const Lease& lease);
  // PUT with lease.meta.resource_version as the precondition (409 "Conflict" when stale).
  absl::StatusOr<Lease> UpdateLease(const Lease& lease);

  // POST /api/v1/namespaces/{ns}/events.
  absl::Status CreateEvent(const CoreEvent& event);

  // The JSON bodies, exposed for tests and for callers that send them some other way.
  static std::string BindingBody(std::string_view ns, std::string_view name, std::string_view uid,
                                 std::string_view resource_version, std::string_view node,
                                 const Annotations& annotations = {});
  static std::string MetadataPatchBody(const MetadataPatch& patch);
  static std::string JsonPatchBody(const std::vector<JsonPatchOp>& ops);
  static std::string LeaseBody(const Lease& lease);
  static std::string EvictionBody(std::string_view ns, std::string_view name, std::string_view uid);
  static std::string EventBody(const CoreEvent& event);

 private:
  // `retry`: false sends the request once, whatever it answers.
  absl::StatusOr<Response> Call(const Request& request, bool retry = true);

  Transport* const transport_;
  Options options_;
};

}  // namespace tessera::kube

#include "tessera/kube/client.h"

#include <atomic>
#include <cinttypes>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/base/status_macros.h"
#include "tessera/json/frame_splitter.h"

namespace tessera::kube {
namespace {

constexpr absl::string_view kReasonPayload = "tessera.dev/kube-reason";

bool Unreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

std::string Escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (Unreserved(c)) {
      out.push_back(c);
    } else {
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    }
  }
  return out;
}

// Appends key=value pairs in the order given (callers pass them sorted by key).
class Query {
 public:
  void Add(std::string_view key, std::string_view value) {
    if (value.empty()) {
      return;
    }
    out_ += out_.empty() ? '?' : '&';
    out_ += key;
    out_ += '=';
    out_ += Escape(value);
  }
  std::string str() && { return std::move(out_); }

 private:
  std::string out_;
};

std::string PodsPath(std::string_view ns) {
  if (ns.empty()) {
    return "/api/v1/pods";
  }
  return fmt::format("/api/v1/namespaces/{}/pods", Escape(ns));
}
std::string PodPath(std::string_view ns, std::string_view name) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", Escape(ns), Escape(name));
}
std::string NodesPath() { return "/api/v1/nodes"; }
std::string NodePath(std::string_view name) {
  return fmt::format("/api/v1/nodes/{}", Escape(name));
}
std::string ResourceQuotasPath(std::string_view ns) {
  if (ns.empty()) {
    return "/api/v1/resourcequotas";
  }
  return fmt::format("/api/v1/namespaces/{}/resourcequotas", Escape(ns));
}
std::string PodDisruptionBudgetsPath(std::string_view ns) {
  if (ns.empty()) {
    return "/apis/policy/v1/poddisruptionbudgets";
  }
  return fmt::format("/apis/policy/v1/namespaces/{}/poddisruptionbudgets", Escape(ns));
}
std::string LeasesPath(std::string_view ns) {
  return fmt::format("/apis/coordination.k8s.io/v1/namespaces/{}/leases", Escape(ns));
}

template <typename T>
std::string CollectionPath(std::string_view ns) {
  if constexpr (std::is_same_v<T, Pod>) {
    return PodsPath(ns);
  } else if constexpr (std::is_same_v<T, Node>) {
    return NodesPath();
  } else if constexpr (std::is_same_v<T, ResourceQuota>) {
    return ResourceQuotasPath(ns);
  } else {
    return LeasesPath(ns);
  }
}

// The status of a watch ERROR event.
absl::Status WatchErrorStatus(const ApiStatus& s) {
  absl::Status status(StatusCodeForHttp(s.code),
                      fmt::format("watch ERROR {} {}: {}", s.code, s.reason, s.message));
  if (!s.reason.empty()) {
    status.SetPayload(kReasonPayload, absl::Cord(s.reason));
  }
  return status;
}

nlohmann::json PatchMap(const std::vector<std::pair<std::string, std::optional<std::string>>>& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : m) {
    if (value.has_value()) {
      out[key] = *value;
    } else {
      out[key] = nullptr;
    }
  }
  return out;
}

std::string Dump(const nlohmann::json& j) {
  // Replace invalid UTF-8 instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

template <typename T>
absl::StatusOr<ApiClient::ListOf<T>> DecodeList(std::string* body) {
  if constexpr (std::is_same_v<T, Pod>) {
    thread_local Decoder decoder;
    return decoder.DecodePodListInPlace(body);
  } else if constexpr (std::is_same_v<T, Node>) {
    thread_local Decoder decoder;
    return decoder.DecodeNodeListInPlace(body);
  } else {
    thread_local Decoder decoder;
    return decoder.DecodeResourceQuotaListInPlace(body);
  }
}

}  // namespace

namespace internal_client {
// Shared by the stream callbacks of one watch (all run on the transport thread) and the
// caller of Watch(), which stores the stream id.
template <typename T>
struct WatchState {
  Transport* transport = nullptr;
  Request request;
  WatchCallbacks<T> callbacks;
  json::FrameSplitter splitter;
  Decoder decoder;
  std::vector<std::string> frames;
  std::vector<WatchEvent<T>> batch;
  absl::Status error;  // first framing/decoding error or ERROR event
  std::atomic<StreamId> id{0};
  std::atomic<bool> cancel_wanted{false};

  void Fail(absl::Status status) {
    if (error.ok()) {
      error = std::move(status);
    }
    cancel_wanted.store(true);
    StreamId sid = id.load();
    if (sid != 0) {
      transport->Cancel(sid);
    }
  }

  void Deliver(WatchEvent<T> event) {
    if (callbacks.on_batch) {
      batch.push_back(std::move(event));
    } else {
      callbacks.on_event(std::move(event));
    }
  }

  void Flush() {
    if (!batch.empty()) {
      std::vector<WatchEvent<T>> out = std::move(batch);
      batch.clear();
      callbacks.on_batch(std::move(out));
    }
  }

  void OnData(std::string_view bytes) {
    if (!error.ok()) {
      return;
    }
    frames.clear();
    absl::Status split = splitter.Feed(bytes, &frames);
    for (const std::string& frame : frames) {
      absl::StatusOr<WatchEvent<T>> event = decoder.DecodeWatchEvent<T>(frame);
      if (!event.ok()) {
        Flush();
        Fail(Annotate(event.status(), "watch event"));
        return;
      }
      const bool is_error = event->type == WatchEventType::kError;
      absl::Status error_status;
      if (is_error) {
        error_status = WatchErrorStatus(event->status);
      }
      Deliver(*std::move(event));
      if (is_error) {
        Flush();
        Fail(std::move(error_status));
        return;
      }
    }
    Flush();
    if (!split.ok()) {
      Fail(Annotate(split, "watch stream"));
    }
  }

  void OnEnd(StreamEnd end) {
    absl::Status status;
    if (!error.ok()) {
      status = error;
    } else if (end.error_response.has_value()) {
      status = ApiError(request, *end.error_response);
    } else if (end.status.ok() && splitter.InFrame()) {
      status = absl::UnavailableError(fmt::format(
          "watch stream ended inside an object ({} bytes buffered)", splitter.buffered_bytes()));
    } else {
      status = end.status;
    }
    callbacks.on_end(std::move(status));
  }
};

}  // namespace internal_client

WatchHandle::WatchHandle(WatchHandle&& other) noexcept
    : transport_(std::exchange(other.transport_, nullptr)), id_(std::exchange(other.id_, 0)) {}

WatchHandle& WatchHandle::operator=(WatchHandle&& other) noexcept {
  if (this != &other) {
    Cancel();
    transport_ = std::exchange(other.transport_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void WatchHandle::Cancel() {
  if (transport_ != nullptr) {
    transport_->Cancel(id_);
    transport_ = nullptr;
  }
}

std::string EventName(std::string_view object_name, absl::Time at) {
  return fmt::format("{}.{:x}", object_name, static_cast<uint64_t>(absl::ToUnixNanos(at)));
}

namespace {

// The Status object of an error response's body; nullopt when the body is not one (a proxy's
// text page, an empty body).
std::optional<ApiStatus> StatusBody(std::string_view body) {
  const size_t first = body.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || body[first] != '{') {
    return std::nullopt;
  }
  absl::StatusOr<ApiStatus> api = DecodeStatus(body);
  return api.ok() ? std::optional<ApiStatus>(*std::move(api)) : std::nullopt;
}

}  // namespace

std::string ReasonOf(const absl::Status& status) {
  if (auto reason = status.GetPayload(kReasonPayload); reason.has_value()) {
    return std::string(*reason);
  }
  // A raw kube::Do error carries only the body: read the reason from its Status.
  std::optional<std::string> body = HttpBodyOf(status);
  std::optional<ApiStatus> api = body ? StatusBody(*body) : std::nullopt;
  return api ? api->reason : std::string();
}

absl::Status ApiError(const Request& request, const Response& response) {
  absl::Status base = HttpStatusToStatus(request, response);
  if (base.ok()) {
    return base;
  }
  std::optional<ApiStatus> api = StatusBody(response.body);
  if (!api || api->message.empty()) {
    return base;
  }
  absl::Status status(base.code(),
                      fmt::format("{} (HTTP {} {}: {} {})", api->message, response.status_code,
                                  api->reason, request.method, request.path));
  base.ForEachPayload([&status](absl::string_view url, const absl::Cord& payload) {
    status.SetPayload(url, payload);
  });
  if (!api->reason.empty()) {
    status.SetPayload(kReasonPayload, absl::Cord(api->reason));
  }
  return status;
}

std::string ListQuery(const ListOptions& o) {
  Query q;
  q.Add("continue", o.continue_token);
  q.Add("fieldSelector", o.field_selector);
  q.Add("labelSelector", o.label_selector);
  q.Add("limit", o.limit > 0 ? std::to_string(o.limit) : std::string());
  q.Add("resourceVersion", o.resource_version);
  q.Add("resourceVersionMatch", o.resource_version_match);
  return std::move(q).str();
}

std::string WatchQuery(const WatchOptions& o) {
  Query q;
  q.Add("allowWatchBookmarks", o.allow_bookmarks ? "true" : "");
  q.Add("fieldSelector", o.field_selector);
  q.Add("labelSelector", o.label_selector);
  q.Add("resourceVersion", o.resource_version);
  const int64_t seconds = absl::ToInt64Seconds(o.timeout);
  q.Add("timeoutSeconds", seconds > 0 ? std::to_string(seconds) : std::string());
  q.Add("watch", "true");
  return std::move(q).str();
}

ApiClient::ApiClient(Transport* transport) : ApiClient(transport, Options()) {}

ApiClient::ApiClient(Transport* transport, Options options)
    : transport_(transport), options_(std::move(options)) {}

absl::StatusOr<Response> ApiClient::Call(const Request& request, bool retry) {
  DoOptions opts;
  opts.retry = options_.retry;
  if (!retry) {
    opts.retry.max_attempts = 1;
  }
  if (options_.sleep) {
    opts.sleep = [this](absl::Duration d) { options_.sleep(d); };
  }
  absl::StatusOr<Response> r = Do(*transport_, request, std::move(opts));
  if (!r.ok()) {
    std::optional<std::string> body = HttpBodyOf(r.status());
    std::optional<int> code = HttpStatusCodeOf(r.status());
    if (body.has_value() && code.has_value()) {
      Response resp;
      resp.status_code = *code;
      resp.body = *std::move(body);
      return ApiError(request, resp);
    }
  }
  return r;
}

namespace {
Request Get(std::string path) {
  Request r;
  r.method = "GET";
  r.path = std::move(path);
  return r;
}
Request WithBody(std::string method, std::string path, std::string body, std::string content_type) {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}
}  // namespace

// RBAC: api_calls.cc "get pods".
absl::StatusOr<Pod> ApiClient::GetPod(std::string_view ns, std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(Get(PodPath(ns, name))));
  return DecodePod(r.body);
}

// RBAC: api_calls.cc "get nodes".
absl::StatusOr<Node> ApiClient::GetNode(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(Get(NodePath(name))));
  return DecodeNode(r.body);
}

// RBAC: api_calls.cc "list pods".
absl::StatusOr<PodList> ApiClient::ListPods(const ListOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(Get(PodsPath(options.ns) + ListQuery(options))));
  return DecodeList<Pod>(&r.body);
}

// RBAC: api_calls.cc "list nodes".
absl::StatusOr<NodeList> ApiClient::ListNodes(const ListOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(Get(NodesPath() + ListQuery(options))));
  return DecodeList<Node>(&r.body);
}

// Not `tessera serve`'s (its informer lists with ListAsync): `tessera explain` on a live cluster.
absl::StatusOr<ResourceQuotaList> ApiClient::ListResourceQuotas(const ListOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Response r,
                           Call(Get(ResourceQuotasPath(options.ns) + ListQuery(options))));
  return DecodeList<ResourceQuota>(&r.body);
}

// RBAC: api_calls.cc "list poddisruptionbudgets". Preemption reads the budgets of the victims'
// namespaces when it is asked (extender/preempt.h).
absl::StatusOr<PodDisruptionBudgetList> ApiClient::ListPodDisruptionBudgets(
    const ListOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Response r,
                           Call(Get(PodDisruptionBudgetsPath(options.ns) + ListQuery(options))));
  thread_local Decoder decoder;
  return decoder.DecodePodDisruptionBudgetList(r.body);
}

// RBAC: api_calls.cc "list pods", "list nodes", "list resourcequotas" (per T; Tessera lists no
// Leases).
template <typename T>
void ApiClient::ListAsync(const ListOptions& options,
                          absl::AnyInvocable<void(absl::StatusOr<ListOf<T>>)> done) {
  Request request = Get(CollectionPath<T>(options.ns) + ListQuery(options));
  Request copy = request;
  transport_->Send(std::move(request), [copy = std::move(copy), done = std::move(done)](
                                           absl::StatusOr<Response> r) mutable {
    if (!r.ok()) {
      done(r.status());
      return;
    }
    if (r->status_code < 200 || r->status_code > 299) {
      done(ApiError(copy, *r));
      return;
    }
    done(DecodeList<T>(&r->body));
  });
}

// RBAC: api_calls.cc "watch pods", "watch nodes", "watch resourcequotas" (per T; Tessera watches
// no Leases).
template <typename T>
WatchHandle ApiClient::Watch(const WatchOptions& options, WatchCallbacks<T> callbacks) {
  auto state = std::make_shared<internal_client::WatchState<T>>();
  state->transport = transport_;
  state->callbacks = std::move(callbacks);
  Request request = Get(CollectionPath<T>(options.ns) + WatchQuery(options));
  if (options.timeout > absl::ZeroDuration()) {
    // A margin over the server's own timeout, so that a server that never closes is caught.
    request.timeout = options.timeout + absl::Seconds(30);
  }
  request.stall_timeout = options.stall_timeout;
  state->request = request;
  StreamHandlers handlers;
  handlers.on_open = [](const Response&) {};
  handlers.on_data = [state](std::string_view bytes) { state->OnData(bytes); };
  handlers.on_end = [state](StreamEnd end) mutable {
    state->OnEnd(std::move(end));
    state.reset();
  };
  StreamId id = transport_->Stream(std::move(request), std::move(handlers));
  state->id.store(id);
  if (state->cancel_wanted.load()) {
    transport_->Cancel(id);
  }
  return WatchHandle(transport_, id);
}

template void ApiClient::ListAsync<Pod>(const ListOptions&,
                                        absl::AnyInvocable<void(absl::StatusOr<PodList>)>);
template void ApiClient::ListAsync<Node>(const ListOptions&,
                                         absl::AnyInvocable<void(absl::StatusOr<NodeList>)>);
template void ApiClient::ListAsync<ResourceQuota>(
    const ListOptions&, absl::AnyInvocable<void(absl::StatusOr<ResourceQuotaList>)>);
template WatchHandle ApiClient::Watch<Pod>(const WatchOptions&, WatchCallbacks<Pod>);
template WatchHandle ApiClient::Watch<ResourceQuota>(const WatchOptions&,
                                                     WatchCallbacks<ResourceQuota>);
template WatchHandle ApiClient::Watch<Node>(const WatchOptions&, WatchCallbacks<Node>);
template WatchHandle ApiClient::Watch<Lease>(const WatchOptions&, WatchCallbacks<Lease>);

// --- bodies -------------------------------------------------------------------------------------

std::string ApiClient::BindingBody(std::string_view ns, std::string_view name, std::string_view uid,
                                   std::string_view resource_version, std::string_view node,
                                   const Annotations& annotations) {
  nlohmann::json meta = {{"name", std::string(name)}, {"namespace", std::string(ns)}};
  if (!uid.empty()) {
    meta["uid"] = std::string(uid);
  }
  if (!resource_version.empty()) {
    meta["resourceVersion"] = std::string(resource_version);
  }
  if (!annotations.empty()) {
    nlohmann::json a = nlohmann::json::object();
    for (const auto& [key, value] : annotations) {
      a[key] = value;
    }
    meta["annotations"] = std::move(a);
  }
  nlohmann::json body = {
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", std::move(meta)},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", std::string(node)}}}};
  return Dump(body);
}

std::string ApiClient::EvictionBody(std::string_view ns, std::string_view name,
                                    std::string_view uid) {
  nlohmann::json body = {
      {"apiVersion", "policy/v1"},
      {"kind", "Eviction"},
      {"metadata", {{"name", std::string(name)}, {"namespace", std::string(ns)}}}};
  if (!uid.empty()) {
    body["deleteOptions"] = {{"preconditions", {{"uid", std::string(uid)}}}};
  }
  return Dump(body);
}

std::string ApiClient::MetadataPatchBody(const MetadataPatch& patch) {
  nlohmann::json meta = nlohmann::json::object();
  if (!patch.labels.empty()) {
    meta["labels"] = PatchMap(patch.labels);
  }
  if (!patch.annotations.empty()) {
    meta["annotations"] = PatchMap(patch.annotations);
  }
  if (patch.resource_version.has_value()) {
    meta["resourceVersion"] = *patch.resource_version;
  }
  if (patch.uid.has_value()) {
    meta["uid"] = *patch.uid;
  }
  return Dump(nlohmann::json{{"metadata", std::move(meta)}});
}

std::string ApiClient::JsonPatchBody(const std::vector<JsonPatchOp>& ops) {
  nlohmann::json out = nlohmann::json::array();
  for (const JsonPatchOp& op : ops) {
    nlohmann::json o = {{"op", op.op}, {"path", op.path}};
    if (!op.from.empty()) {
      o["from"] = op.from;
    }
    if (!op.value_json.empty()) {
      nlohmann::json value = nlohmann::json::parse(op.value_json, nullptr, false);
      if (value.is_discarded()) {
        value = op.value_json;  // not JSON: send it as a string
      }
      o["value"] = std::move(value);
    }
    out.push_back(std::move(o));
  }
  return Dump(out);
}

std::string ApiClient::LeaseBody(const Lease& lease) {
  nlohmann::json meta = {{"name", lease.meta.name}, {"namespace", lease.meta.ns}};
  if (!lease.meta.resource_version.empty()) {
    meta["resourceVersion"] = lease.meta.resource_version;
  }
  if (!lease.meta.uid.empty()) {
    meta["uid"] = lease.meta.uid;
  }
  nlohmann::json spec = nlohmann::json::object();
  if (lease.holder_identity) {
    spec["holderIdentity"] = *lease.holder_identity;
  }
  if (lease.lease_duration_seconds) {
    spec["leaseDurationSeconds"] = *lease.lease_duration_seconds;
  }
  if (lease.acquire_time) {
    spec["acquireTime"] = *lease.acquire_time;
  }
  if (lease.renew_time) {
    spec["renewTime"] = *lease.renew_time;
  }
  if (lease.lease_transitions) {
    spec["leaseTransitions"] = *lease.lease_transitions;
  }
  return Dump(nlohmann::json{{"apiVersion", "coordination.k8s.io/v1"},
                             {"kind", "Lease"},
                             {"metadata", std::move(meta)},
                             {"spec", std::move(spec)}});
}

std::string ApiClient::EventBody(const CoreEvent& e) {
  nlohmann::json involved = {
      {"apiVersion", e.involved_api_version}, {"kind", e.involved_kind}, {"name", e.involved_name}};
  if (!e.involved_ns.empty()) {
    involved["namespace"] = e.involved_ns;
  }
  if (!e.involved_uid.empty()) {
    involved["uid"] = e.involved_uid;
  }
  nlohmann::json source = {{"component", e.source_component}};
  if (!e.source_host.empty()) {
    source["host"] = e.source_host;
  }
  std::string message = e.message.substr(0, std::min<size_t>(e.message.size(), 1024));
  nlohmann::json body = {{"apiVersion", "v1"},
                         {"kind", "Event"},
                         {"metadata", {{"name", e.name}, {"namespace", e.ns}}},
                         {"involvedObject", std::move(involved)},
                         {"reason", e.reason},
                         {"message", std::move(message)},
                         {"type", e.type},
                         {"source", std::move(source)},
                         {"count", e.count}};
  if (!e.first_timestamp.empty()) {
    body["firstTimestamp"] = e.first_timestamp;
  }
  if (!e.last_timestamp.empty()) {
    body["lastTimestamp"] = e.last_timestamp;
  }
  return Dump(body);
}

// --- writes -------------------------------------------------------------------------------------

// RBAC: api_calls.cc "patch pods".
absl::StatusOr<Pod> ApiClient::PatchPodMetadata(std::string_view ns, std::string_view name,
                                                const MetadataPatch& patch) {
  TESSERA_ASSIGN_OR_RETURN(Response r,
                           Call(WithBody("PATCH", PodPath(ns, name), MetadataPatchBody(patch),
                                         "application/merge-patch+json")));
  return DecodePod(r.body);
}

// RBAC: api_calls.cc "patch nodes".
absl::StatusOr<Node> ApiClient::PatchNodeMetadata(std::string_view name,
                                                  const MetadataPatch& patch) {
  TESSERA_ASSIGN_OR_RETURN(Response r,
                           Call(WithBody("PATCH", NodePath(name), MetadataPatchBody(patch),
                                         "application/merge-patch+json")));
  return DecodeNode(r.body);
}

// RBAC: api_calls.cc "patch pods".
absl::StatusOr<Pod> ApiClient::JsonPatchPod(std::string_view ns, std::string_view name,
                                            const std::vector<JsonPatchOp>& ops) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(WithBody("PATCH", PodPath(ns, name), JsonPatchBody(ops),
                                                     "application/json-patch+json")));
  return DecodePod(r.body);
}

// RBAC: api_calls.cc "patch nodes".
absl::StatusOr<Node> ApiClient::JsonPatchNode(std::string_view name,
                                              const std::vector<JsonPatchOp>& ops) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(WithBody("PATCH", NodePath(name), JsonPatchBody(ops),
                                                     "application/json-patch+json")));
  return DecodeNode(r.body);
}

// RBAC: api_calls.cc "create pods/binding".
absl::Status ApiClient::BindPod(std::string_view ns, std::string_view name, std::string_view uid,
                                std::string_view node, const Annotations& annotations,
                                std::string_view resource_version) {
  return Call(WithBody("POST", PodPath(ns, name) + "/binding",
                       BindingBody(ns, name, uid, resource_version, node, annotations),
                       "application/json"))
      .status();
}

// RBAC: api_calls.cc "create pods/eviction".
absl::Status ApiClient::EvictPod(std::string_view ns, std::string_view name, std::string_view uid) {
  return Call(WithBody("POST", PodPath(ns, name) + "/eviction", EvictionBody(ns, name, uid),
                       "application/json"),
              /*retry=*/false)
      .status();
}

// RBAC: api_calls.cc "get leases".
absl::StatusOr<Lease> ApiClient::GetLease(std::string_view ns, std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(Response r,
                           Call(Get(fmt::format("{}/{}", LeasesPath(ns), Escape(name)))));
  return DecodeLease(r.body);
}

// RBAC: api_calls.cc "create leases".
absl::StatusOr<Lease> ApiClient::CreateLease(const Lease& lease) {
  TESSERA_ASSIGN_OR_RETURN(Response r, Call(WithBody("POST", LeasesPath(lease.meta.ns),
                                                     LeaseBody(lease), "application/json")));
  return DecodeLease(r.body);
}

// RBAC: api_calls.cc "update leases".
absl::StatusOr<Lease> ApiClient::UpdateLease(const Lease& lease) {
  TESSERA_ASSIGN_OR_RETURN(
      Response r,
      Call(WithBody("PUT", fmt::format("{}/{}", LeasesPath(lease.meta.ns), Escape(lease.meta.name)),
                    LeaseBody(lease), "application/json")));
  return DecodeLease(r.body);
}

// RBAC: api_calls.cc "create events".
absl::Status ApiClient::CreateEvent(const CoreEvent& event) {
  return Call(WithBody("POST", fmt::format("/api/v1/namespaces/{}/events", Escape(event.ns)),
                       EventBody(event), "application/json"))
      .status();
}

}  // namespace tessera::kube

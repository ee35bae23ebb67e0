#include "tessera/kube/client.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/json/text.h"
#include "tessera/testing/fake_transport.h"

namespace tessera::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

Response Http(int code, std::string body) {
  Response r;
  r.status_code = code;
  r.body = std::move(body);
  return r;
}

constexpr char kPod[] =
    R"({"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","uid":"u1",)"
    R"("resourceVersion":"7","annotations":{"a":"b"}},"spec":{"nodeName":"n1"}})";

class ClientTest : public ::testing::Test {
 protected:
  // Answers every send with `reply` and records the requests.
  void Answer(Response reply) {
    fake_.SetHandler([reply](const Request&) -> absl::StatusOr<Response> { return reply; });
  }
  Request Last() { return fake_.requests().back(); }

  FakeTransport fake_;
  ApiClient client_{&fake_, ApiClient::Options{RetryPolicy{.max_attempts = 1}, nullptr}};
};

TEST(QueryTest, ListAndWatchQueriesAreSortedAndEscaped) {
  ListOptions list;
  list.limit = 500;
  list.resource_version = "0";
  list.label_selector = "app in (a,b)";
  list.field_selector = "spec.nodeName=n1";
  EXPECT_EQ(ListQuery(list),
            "?fieldSelector=spec.nodeName%3Dn1&labelSelector=app%20in%20%28a%2Cb%29&limit=500"
            "&resourceVersion=0");
  list = ListOptions();
  list.continue_token = "abc=";
  EXPECT_EQ(ListQuery(list), "?continue=abc%3D");
  EXPECT_EQ(ListQuery(ListOptions()), "");
  WatchOptions watch;
  watch.resource_version = "104";
  watch.field_selector = "metadata.name=nginx";
  watch.timeout = absl::Seconds(527);
  EXPECT_EQ(WatchQuery(watch),
            "?allowWatchBookmarks=true&fieldSelector=metadata.name%3Dnginx&resourceVersion=104"
            "&timeoutSeconds=527&watch=true");
}

TEST_F(ClientTest, GetDecodesAndErrorsCarryTheStatusMessage) {
  Answer(Http(200, kPod));
  absl::StatusOr<Pod> pod = client_.GetPod("ns", "p");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->node_name, "n1");
  EXPECT_EQ(Last().path, "/api/v1/namespaces/ns/pods/p");

  Answer(Http(404, R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",)"
                   R"("message":"nodes \"x\" not found","reason":"NotFound","code":404})"));
  absl::StatusOr<Node> node = client_.GetNode("x");
  ASSERT_EQ(node.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(node.status().message()),
              StartsWith("nodes \"x\" not found (HTTP 404 NotFound: GET /api/v1/nodes/x)"));
  EXPECT_EQ(ReasonOf(node.status()), "NotFound");
  EXPECT_EQ(HttpStatusCodeOf(node.status()), 404);

  // A body that is not a Status keeps the transport's message.
  Answer(Http(429, "Too many requests, please try again later."));
  EXPECT_EQ(client_.GetNode("x").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(client_.GetNode("x").status()), "");

  Answer(Http(200, "{not json"));
  EXPECT_EQ(client_.GetNode("x").status().code(), absl::StatusCode::kInvalidArgument);
}

// Callers of the raw kube::Do (the simulator's emulators) read the reason too: it used to be
// empty there, so a retried create that had succeeded read as a failure, not AlreadyExists.
TEST(ReasonOfTest, ReadsTheStatusBodyOfARawError) {
  Request get;
  get.method = "POST";
  get.path = "/api/v1/namespaces/ns/pods";
  Response exists;
  exists.status_code = 409;
  exists.body = R"({"kind":"Status","apiVersion":"v1","status":"Failure",)"
                R"("message":"pods \"p\" already exists","reason":"AlreadyExists","code":409})";
  EXPECT_EQ(ReasonOf(HttpStatusToStatus(get, exists)), "AlreadyExists");
  Response text;
  text.status_code = 409;
  text.body = "conflict";
  EXPECT_EQ(ReasonOf(HttpStatusToStatus(get, text)), "");
  EXPECT_EQ(ReasonOf(absl::AbortedError("no payload")), "");
}

TEST_F(ClientTest, ListPagesCarryOptions) {
  Answer(Http(200, R"({"kind":"NodeList","metadata":{"resourceVersion":"9","continue":"c"},)"
                   R"("items":[{"metadata":{"name":"a"}}]})"));
  ListOptions opts;
  opts.limit = 1;
  absl::StatusOr<NodeList> nodes = client_.ListNodes(opts);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->meta.continue_token, "c");
  ASSERT_EQ(nodes->items.size(), 1u);
  EXPECT_EQ(Last().path, "/api/v1/nodes?limit=1");
  opts.ns = "kube-system";
  Answer(Http(200, R"({"kind":"PodList","metadata":{"resourceVersion":"9"},"items":[]})"));
  ASSERT_TRUE(client_.ListPods(opts).ok());
  EXPECT_EQ(Last().path, "/api/v1/namespaces/kube-system/pods?limit=1");
}

TEST_F(ClientTest, MergePatchWithResourceVersionPrecondition) {
  Answer(Http(200, kPod));
  MetadataPatch patch;
  patch.annotations = {{"hami.io/vgpu-node", "n1"}, {"gone", std::nullopt}};
  patch.labels = {{"l", "v"}};
  patch.resource_version = "7";
  ASSERT_TRUE(client_.PatchPodMetadata("ns", "p", patch).ok());
  const Request r = Last();
  EXPECT_EQ(r.method, "PATCH");
  EXPECT_EQ(r.path, "/api/v1/namespaces/ns/pods/p");
  EXPECT_EQ(r.content_type, "application/merge-patch+json");
  EXPECT_EQ(r.body, R"({"metadata":{"annotations":{"gone":null,"hami.io/vgpu-node":"n1"},)"
                    R"("labels":{"l":"v"},"resourceVersion":"7"}})");

  // The race: 409 Conflict → kAborted.
  Answer(Http(409, R"({"kind":"Status","status":"Failure","reason":"Conflict","code":409,)"
                   R"("message":"Operation cannot be fulfilled on nodes \"n1\": the object has )"
                   R"(been modified; please apply your changes to the latest version and try )"
                   R"(again"})"));
  absl::StatusOr<Node> node = client_.PatchNodeMetadata("n1", patch);
  EXPECT_EQ(node.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(node.status()), "Conflict");
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("the object has been modified"));
  EXPECT_EQ(fake_.requests().size(), 2u);  // a PATCH is not retried on 409
}

TEST_F(ClientTest, MergePatchWithUidPrecondition) {
  Answer(Http(200, kPod));
  MetadataPatch patch;
  patch.annotations = {{"a", "b"}};
  patch.uid = "u-1";
  ASSERT_TRUE(client_.PatchPodMetadata("ns", "p", patch).ok());
  EXPECT_EQ(Last().body, R"({"metadata":{"annotations":{"a":"b"},"uid":"u-1"}})");
}

TEST_F(ClientTest, JsonPatchEscapesPointers) {
  Answer(Http(200, R"({"kind":"Node","metadata":{"name":"n1"}})"));
  const std::string path = "/metadata/annotations/" + json::PointerEscape("hami.io/mutex~lock");
  EXPECT_EQ(path, "/metadata/annotations/hami.io~1mutex~0lock");
  ASSERT_TRUE(client_
                  .JsonPatchNode("n1", {JsonPatchOp{"test", path, "\"old\"", ""},
                                        JsonPatchOp{"remove", path, "", ""}})
                  .ok());
  EXPECT_EQ(Last().content_type, "application/json-patch+json");
  EXPECT_EQ(Last().body, R"([{"op":"test","path":")" + path +
                             R"(","value":"old"},{"op":"remove","path":")" + path + R"("}])");
}

TEST_F(ClientTest, BindPostsABinding) {
  Answer(Http(201, R"({"kind":"Status","status":"Success","code":201})"));
  ASSERT_TRUE(client_.BindPod("default", "p", "uid-1", "node-a").ok());
  const Request r = Last();
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/api/v1/namespaces/default/pods/p/binding");
  EXPECT_EQ(r.body,
            R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"p","namespace":"default",)"
            R"("uid":"uid-1"},"target":{"apiVersion":"v1","kind":"Node","name":"node-a"}})");
  Answer(Http(409, R"({"kind":"Status","status":"Failure","reason":"Conflict","code":409,)"
                   R"("message":"pod p is already assigned to node \"node-a\""})"));
  absl::Status st = client_.BindPod("default", "p", "uid-1", "node-a");
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("already assigned"));
}

TEST_F(ClientTest, LeaseGetCreateUpdate) {
  constexpr char kLease[] =
      R"({"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"tessera",)"
      R"("namespace":"kube-system","resourceVersion":"8812"},"spec":{"holderIdentity":"a",)"
      R"("leaseDurationSeconds":15}})";
  Answer(Http(200, kLease));
  absl::StatusOr<Lease> lease = client_.GetLease("kube-system", "tessera");
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(Last().path, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera");
  lease->holder_identity = "";
  lease->renew_time = "2025-01-01T00:01:10.123456Z";
  ASSERT_TRUE(client_.UpdateLease(*lease).ok());
  EXPECT_EQ(Last().method, "PUT");
  EXPECT_EQ(Last().body,
            R"({"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":)"
            R"("tessera","namespace":"kube-system","resourceVersion":"8812"},"spec":{)"
            R"("holderIdentity":"","leaseDurationSeconds":15,)"
            R"("renewTime":"2025-01-01T00:01:10.123456Z"}})");
  Answer(Http(201, kLease));
  Lease fresh;
  fresh.meta.name = "tessera";
  fresh.meta.ns = "kube-system";
  ASSERT_TRUE(client_.CreateLease(fresh).ok());
  EXPECT_EQ(Last().method, "POST");
  EXPECT_EQ(Last().path, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases");
}

TEST_F(ClientTest, EventBody) {
  Answer(Http(201, "{}"));
  CoreEvent e;
  e.ns = "default";
  e.name = EventName("p", absl::FromUnixNanos(0x181a2b3c4d5e6f70));
  e.involved_kind = "Pod";
  e.involved_api_version = "v1";
  e.involved_ns = "default";
  e.involved_name = "p";
  e.involved_uid = "u";
  e.reason = "FilteringFailed";
  e.message = "no node fits";
  e.type = "Warning";
  e.source_component = "tessera";
  e.first_timestamp = e.last_timestamp = "2025-01-01T00:00:00Z";
  ASSERT_TRUE(client_.CreateEvent(e).ok());
  EXPECT_EQ(Last().path, "/api/v1/namespaces/default/events");
  EXPECT_EQ(Last().body,
            R"({"apiVersion":"v1","count":1,"firstTimestamp":"2025-01-01T00:00:00Z",)"
            R"("involvedObject":{"apiVersion":"v1","kind":"Pod","name":"p","namespace":)"
            R"("default","uid":"u"},"kind":"Event","lastTimestamp":"2025-01-01T00:00:00Z",)"
            R"("message":"no node fits","metadata":{"name":"p.181a2b3c4d5e6f70","namespace":)"
            R"("default"},"reason":"FilteringFailed","source":{"component":"tessera"},)"
            R"("type":"Warning"})");
}

TEST_F(ClientTest, ListAsyncRunsOnTheReplyingThread) {
  absl::StatusOr<PodList> got = absl::UnknownError("not called");
  client_.ListAsync<Pod>(ListOptions(), [&](absl::StatusOr<PodList> r) { got = std::move(r); });
  ASSERT_EQ(fake_.pending().size(), 1u);
  fake_.Reply(Http(410, R"({"kind":"Status","reason":"Expired","code":410,"message":"old"})"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(got.status()), "Expired");
}

struct Seen {
  std::vector<std::string> events;
  std::optional<absl::Status> end;
};

WatchCallbacks<Pod> Record(Seen* seen) {
  WatchCallbacks<Pod> cb;
  cb.on_event = [seen](WatchEvent<Pod> e) {
    seen->events.push_back(std::string(WatchEventTypeName(e.type)) + " " +
                           e.object.meta.resource_version);
  };
  cb.on_end = [seen](absl::Status s) { seen->end = std::move(s); };
  return cb;
}

TEST_F(ClientTest, WatchDecodesFramesAcrossChunks) {
  Seen seen;
  WatchOptions opts;
  opts.resource_version = "5";
  WatchHandle h = client_.WatchPods(opts, Record(&seen));
  ASSERT_TRUE(h.active());
  EXPECT_EQ(fake_.stream_request(h.id())->path,
            "/api/v1/pods?allowWatchBookmarks=true&resourceVersion=5&watch=true");
  ASSERT_TRUE(fake_.StreamOpen(h.id()));
  const std::string stream =
      std::string(R"({"type":"ADDED","object":)") + kPod + "}\n" +
      R"({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}})";
  ASSERT_TRUE(fake_.StreamData(h.id(), stream.substr(0, 30)));
  ASSERT_TRUE(fake_.StreamData(h.id(), stream.substr(30)));
  ASSERT_TRUE(fake_.StreamData(h.id(), R"({"type":"MODIFIED","object":{"kind":"Pod")"));
  ASSERT_TRUE(fake_.StreamClose(h.id(), absl::OkStatus()));
  EXPECT_THAT(seen.events, ElementsAre("ADDED 7", "BOOKMARK 9"));
  ASSERT_TRUE(seen.end.has_value());
  EXPECT_EQ(seen.end->code(), absl::StatusCode::kUnavailable);  // cut mid-object
}

TEST_F(ClientTest, WatchBatchesEventsPerChunk) {
  std::vector<size_t> sizes;
  std::optional<absl::Status> end;
  WatchCallbacks<Pod> cb;
  cb.on_batch = [&](std::vector<WatchEvent<Pod>> events) { sizes.push_back(events.size()); };
  cb.on_end = [&](absl::Status s) { end = std::move(s); };
  WatchHandle h = client_.WatchPods(WatchOptions(), std::move(cb));
  ASSERT_TRUE(fake_.StreamOpen(h.id()));
  const std::string event = std::string(R"({"type":"MODIFIED","object":)") + kPod + "}\n";
  ASSERT_TRUE(fake_.StreamData(h.id(), event + event + event.substr(0, 10)));
  ASSERT_TRUE(fake_.StreamData(h.id(), event.substr(10)));
  ASSERT_TRUE(fake_.StreamData(h.id(), "\n"));  // completes nothing: no call
  ASSERT_TRUE(fake_.StreamClose(h.id(), absl::OkStatus()));
  EXPECT_THAT(sizes, ElementsAre(2u, 1u));
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->ok());
}

TEST_F(ClientTest, WatchErrorEventEndsTheStreamWithItsCode) {
  Seen seen;
  WatchHandle h = client_.WatchPods(WatchOptions(), Record(&seen));
  ASSERT_TRUE(fake_.StreamOpen(h.id()));
  ASSERT_TRUE(fake_.StreamData(
      h.id(), R"({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",)"
              R"js("message":"too old resource version: 1 (5)"}})js"
              "\n"
              R"({"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"x"}}})"));
  EXPECT_TRUE(fake_.cancel_requested(h.id()));
  fake_.DeliverCancellations();
  EXPECT_THAT(seen.events, ElementsAre("ERROR "));
  ASSERT_TRUE(seen.end.has_value());
  EXPECT_EQ(seen.end->code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(*seen.end), "Expired");
}

TEST_F(ClientTest, WatchHttpErrorAndDecodeErrorAndCancel) {
  Seen a;
  WatchHandle ha = client_.WatchPods(WatchOptions(), Record(&a));
  ASSERT_TRUE(
      fake_.StreamFailHttp(ha.id(), Http(403, R"({"kind":"Status","reason":"Forbidden","code":403,)"
                                              R"("message":"pods is forbidden"})")));
  ASSERT_TRUE(a.end.has_value());
  EXPECT_EQ(a.end->code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(a.end->message()), StartsWith("pods is forbidden"));

  Seen b;
  WatchHandle hb = client_.WatchPods(WatchOptions(), Record(&b));
  ASSERT_TRUE(fake_.StreamOpen(hb.id()));
  ASSERT_TRUE(fake_.StreamData(hb.id(), R"({"type":"NOPE","object":{}})"));
  fake_.DeliverCancellations();
  ASSERT_TRUE(b.end.has_value());
  EXPECT_EQ(b.end->code(), absl::StatusCode::kInvalidArgument);

  Seen c;
  {
    WatchHandle hc = client_.WatchPods(WatchOptions(), Record(&c));
    ASSERT_TRUE(fake_.StreamOpen(hc.id()));
  }  // destroyed: cancelled
  fake_.DeliverCancellations();
  ASSERT_TRUE(c.end.has_value());
  EXPECT_EQ(c.end->code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace tessera::kube

#include "tessera/kube/decode.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/json/frame_splitter.h"

namespace tessera::kube {
namespace {

using ::testing::HasSubstr;

std::string Fixture(const std::string& name) {
  const char* root = std::getenv("TESSERA_SOURCE_DIR");
  std::string path = std::string(root != nullptr ? root : ".") + "/test/testdata/kube/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void ExpectFixturePod(const Pod& pod) {
  EXPECT_EQ(pod.meta.name, "trainer-7d9f8c6b5-x2k4q");
  EXPECT_EQ(pod.meta.ns, "ml-team");
  EXPECT_EQ(pod.meta.uid, "5f0c7a52-3e1b-4c0e-9d8a-2b7e4f1a6c93");
  // The projection keeps pod labels and annotations under hami.io/ and nvidia.com/ only
  // (objects.h): the fixture's app labels, prometheus.io/scrape, ml.example.com/retries and
  // kubectl's last-applied-configuration are dropped.
  EXPECT_TRUE(pod.meta.labels.empty());
  EXPECT_EQ(pod.meta.annotations,
            (StringMap{{"hami.io/vgpu-node", "gpu-node-03"},
                       {"hami.io/vgpu-devices-allocated",
                        "GPU-8d3f7e1a-2b4c-4f6e-9a1b-3c5d7e9f0a2b,NVIDIA,16384,50:;"},
                       {"hami.io/bind-phase", "success"}}));
  EXPECT_EQ(pod.node_name, "gpu-node-03");
  EXPECT_EQ(pod.scheduler_name, "hami-scheduler");
  ASSERT_EQ(pod.init_containers.size(), 1u);
  EXPECT_EQ(pod.init_containers[0].name, "fetch");
  EXPECT_EQ(pod.init_containers[0].requests, (ResourceList{{"cpu", "100m"}, {"memory", "64Mi"}}));
  EXPECT_TRUE(pod.init_containers[0].limits.empty());
  ASSERT_EQ(pod.containers.size(), 2u);
  const Container& main = pod.containers[0];
  EXPECT_EQ(main.name, "main");
  // Numbers keep their literal text; strings stay strings.
  EXPECT_EQ(main.limits, (ResourceList{{"nvidia.com/gpu", "1"},
                                       {"nvidia.com/gpumem", "16384"},
                                       {"nvidia.com/gpucores", "50"},
                                       {"cpu", "4"},
                                       {"memory", "16Gi"}}));
  EXPECT_EQ(main.requests.Get("nvidia.com/gpu"), "1");
  EXPECT_FALSE(main.privileged);
  EXPECT_EQ(pod.containers[1].name, "sidecar");
  EXPECT_TRUE(pod.containers[1].privileged);
  EXPECT_TRUE(pod.containers[1].limits.empty());
}

TEST(DecodePodTest, RecordedShapeFixture) {
  absl::StatusOr<Pod> pod = DecodePod(Fixture("pod.json"));
  ASSERT_TRUE(pod.ok()) << pod.status();
  ExpectFixturePod(*pod);
  EXPECT_EQ(pod->meta.resource_version, "48213377");
  EXPECT_EQ(pod->phase, PodPhase::kRunning);
  EXPECT_FALSE(pod->Deleting());
}

TEST(DecodePodTest, FieldOrderDoesNotMatter) {
  absl::StatusOr<Pod> pod =
      DecodePod(R"({"status":{"phase":"Failed"},"spec":{"containers":[{"resources":{"limits":)"
                R"({"nvidia.com/gpu":"2"}},"name":"c"}],"priority":-7,"nodeName":"n1"},)"
                R"("metadata":{"resourceVersion":"9","name":"p","namespace":"d"},"kind":"Pod"})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->Key(), "d/p");
  EXPECT_EQ(pod->node_name, "n1");
  EXPECT_EQ(pod->containers.at(0).limits.Get("nvidia.com/gpu"), "2");
  EXPECT_EQ(pod->phase, PodPhase::kFailed);
  EXPECT_EQ(pod->priority, -7);
}

TEST(DecodePodTest, PreemptionPolicyAndStartTime) {
  absl::StatusOr<Pod> pod =
      DecodePod(R"({"metadata":{"name":"p"},"spec":{"preemptionPolicy":"Never"},)"
                R"("status":{"startTime":"2026-12-07T12:00:01Z"}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(pod->preempt_never);
  EXPECT_EQ(pod->start_unix, 1796644801);
  pod = DecodePod(R"({"spec":{"preemptionPolicy":"PreemptLowerPriority"},)"
                  R"("status":{"startTime":"2026-12-07T13:00:01.5+01:00"}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_FALSE(pod->preempt_never);
  EXPECT_EQ(pod->start_unix, 1796644801);
  // The API server's form and the same instant written otherwise agree; a month 13 is refused.
  pod = DecodePod(R"({"status":{"startTime":"1970-01-01T00:00:00Z"}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->start_unix, 0);
  pod = DecodePod(R"({"status":{"startTime":"2024-02-29T23:59:59Z"}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->start_unix, 1709251199);
  EXPECT_FALSE(DecodePod(R"({"status":{"startTime":"2026-13-07T12:00:01Z"}})").ok());
  EXPECT_FALSE(DecodePod(R"({"status":{"startTime":"2026-02-30T12:00:01Z"}})").ok());
  pod = DecodePod(R"({"spec":{"preemptionPolicy":null},"status":{"startTime":null}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_FALSE(pod->preempt_never);
  EXPECT_EQ(pod->start_unix, 0);
}

TEST(DecodePodTest, NullsAreAbsentAndMinimalPodDecodes) {
  absl::StatusOr<Pod> pod = DecodePod(
      R"({"metadata":{"name":"p","labels":null,"creationTimestamp":null,"annotations":{"a":null}},)"
      R"("spec":{"nodeName":null,"priority":null,"containers":[{"name":"c","resources":{"limits":null}}]},)"
      R"("status":{"phase":null}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(pod->meta.labels.empty());
  EXPECT_TRUE(pod->meta.annotations.empty());
  EXPECT_EQ(pod->node_name, "");
  EXPECT_EQ(pod->phase, PodPhase::kPending);
  EXPECT_EQ(pod->priority, 0);
  EXPECT_TRUE(DecodePod("{}").ok());
}

// Only whether deletionTimestamp is set is kept; a wrong type is still an error.
TEST(DecodePodTest, DeletionTimestampMarksDeleting) {
  auto pod = [](std::string_view ts) {
    return DecodePod(std::string(R"({"metadata":{"name":"p","deletionTimestamp":)") +
                     std::string(ts) + "}}");
  };
  ASSERT_TRUE(pod(R"("2026-12-03T10:00:00Z")").ok());
  EXPECT_TRUE(pod(R"("2026-12-03T10:00:00Z")")->Deleting());
  EXPECT_FALSE(pod("null")->Deleting());
  EXPECT_FALSE(pod(R"("")")->Deleting());
  EXPECT_FALSE(DecodePod(R"({"metadata":{"name":"p"}})")->Deleting());
  absl::StatusOr<Pod> bad = pod("17");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Message(bad.status()), HasSubstr("metadata.deletionTimestamp: expected string"));
}

TEST(DecodePodTest, DuplicateKeysLastWins) {
  absl::StatusOr<Pod> pod = DecodePod(
      R"({"metadata":{"annotations":{"hami.io/a":"1","hami.io/b":"2","hami.io/a":"3"}}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->meta.annotations, (StringMap{{"hami.io/a", "3"}, {"hami.io/b", "2"}}));
  absl::StatusOr<Node> node = DecodeNode(R"({"metadata":{"labels":{"a":"1","b":"2","a":"3"}}})");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->meta.labels, (StringMap{{"a", "3"}, {"b", "2"}}));
}

TEST(DecodePodTest, UntrackedKeysAreDroppedButTheirValuesChecked) {
  absl::StatusOr<Pod> pod = DecodePod(
      R"({"metadata":{"labels":{"app":"web","hami.io/vgpu-node":"n1"},"annotations":{)"
      R"("hami.io/bind-phase":"success","hami.io.evil/x":"1","nvidia.com/use-gputype":"A100",)"
      R"("xnvidia.com/a":"2","nvidia.com":"3"}}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->meta.labels, (StringMap{{"hami.io/vgpu-node", "n1"}}));
  EXPECT_EQ(pod->meta.annotations,
            (StringMap{{"hami.io/bind-phase", "success"}, {"nvidia.com/use-gputype", "A100"}}));
  // A dropped key with a value of the wrong type still fails the decode, as before.
  absl::StatusOr<Pod> bad = DecodePod(R"({"metadata":{"annotations":{"other":7}}})");
  EXPECT_EQ(FieldError(bad.status()), "metadata.annotations.other: expected string");
  // Keys are interned: equal keys of two decoded pods share their bytes.
  absl::StatusOr<Pod> again = DecodePod(R"({"metadata":{"labels":{"hami.io/vgpu-node":"n2"}}})");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->meta.labels.begin()->first.data(), pod->meta.labels.begin()->first.data());
  // Leases keep their metadata whole.
  absl::StatusOr<Lease> lease =
      DecodeLease(R"({"metadata":{"name":"l","labels":{"a":"1"},"annotations":{"b":"2"}}})");
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->meta.labels.Get("a"), "1");
  EXPECT_EQ(lease->meta.annotations.Get("b"), "2");
}

TEST(DecodePodTest, EscapedKeysAndValuesAreUnescaped) {
  // Go's encoder writes <, > and & as \u003c, \u003e, \u0026, in keys too; plain strings are
  // read from the input directly and escaped ones unescaped, with the same result.
  absl::StatusOr<Pod> pod =
      DecodePod(R"({"metadata":{"na\u006de":"web\u002d1","namespace":"d\"q","uid":"u",)"
                R"("labels":{"hami.io/a\u0026b":"x\u003cy","hami.io/plain":"v","hami.io/tab":"\t",)"
                R"("hami.io/empty":"","hami\u002eio/esc":"e","other":"dropped"},)"
                R"("annotations":{"nvidia.com/k":"{\"a\":\"b\\\"c\"}\n"}},)"
                R"("spec":{"nodeName":"n\u00e9","containers":[{"name":"c","resources":)"
                R"({"limits":{"nvidia.com/gpu":"1","gpu\u002fmem":"2"}}}]}})");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->meta.name, "web-1");
  EXPECT_EQ(pod->meta.ns, "d\"q");
  // The prefix test sees the unescaped key.
  EXPECT_EQ(pod->meta.labels, (StringMap{{"hami.io/a&b", "x<y"},
                                         {"hami.io/empty", ""},
                                         {"hami.io/esc", "e"},
                                         {"hami.io/plain", "v"},
                                         {"hami.io/tab", "\t"}}));
  EXPECT_EQ(pod->meta.annotations.Get("nvidia.com/k"), "{\"a\":\"b\\\"c\"}\n");
  EXPECT_EQ(pod->node_name, "n\xc3\xa9");
  ASSERT_EQ(pod->containers.size(), 1u);
  EXPECT_EQ(pod->containers[0].limits, (ResourceList{{"gpu/mem", "2"}, {"nvidia.com/gpu", "1"}}));
}

TEST(DecodePodTest, WrongTypesNameTheFieldPath) {
  struct Case {
    std::string json;
    std::string message;
    std::string field;
  };
  const Case cases[] = {
      {R"({"metadata":{"name":"x","namespace":"default"},"spec":{"containers":[{"name":"a"},)"
       R"({"name":"b","resources":{"limits":[1]}}]}})",
       "Pod default/x: spec.containers[1].resources.limits: expected object",
       "spec.containers[1].resources.limits: expected object"},
      {R"({"metadata":{"name":"x","namespace":"default"},"spec":{"containers":{}}})",
       "Pod default/x: spec.containers: expected array", "spec.containers: expected array"},
      {R"({"metadata":{"name":"x","labels":{"app.kubernetes.io/name":7}}})",
       "Pod x: metadata.labels[\"app.kubernetes.io/name\"]: expected string",
       "metadata.labels[\"app.kubernetes.io/name\"]: expected string"},
      {R"({"spec":{"containers":[{"securityContext":{"privileged":"yes"}}]}})",
       "Pod: spec.containers[0].securityContext.privileged: expected boolean",
       "spec.containers[0].securityContext.privileged: expected boolean"},
      {R"({"spec":{"initContainers":[{"resources":{"requests":{"cpu":true}}}]}})",
       "Pod: spec.initContainers[0].resources.requests.cpu: expected string or number",
       "spec.initContainers[0].resources.requests.cpu: expected string or number"},
      {R"({"spec":{"priority":"high"}})", "Pod: spec.priority: expected integer",
       "spec.priority: expected integer"},
      {R"({"spec":{"priority":2147483648}})", "Pod: spec.priority: integer out of range",
       "spec.priority: integer out of range"},
      {R"({"status":{"startTime":"yesterday"}})",
       "Pod: status.startTime: expected an RFC 3339 time",
       "status.startTime: expected an RFC 3339 time"},
      {R"({"spec":{"preemptionPolicy":1}})", "Pod: spec.preemptionPolicy: expected string",
       "spec.preemptionPolicy: expected string"},
      {R"({"kind":"Node","metadata":{"name":"x"}})", "Pod: kind: kind Node, expected Pod",
       "kind: kind Node, expected Pod"},
      {R"([1,2])", "Pod: expected object", "expected object"},
      {R"("pod")", "Pod: expected object", "expected object"},
      {R"({"metadata":{"name":"x"}} {"a":1})", "Pod x: trailing content at offset 26",
       "trailing content at offset 26"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Pod> pod = DecodePod(c.json);
    ASSERT_FALSE(pod.ok()) << c.json;
    EXPECT_EQ(pod.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(pod.status()), c.message) << c.json;
    EXPECT_EQ(FieldError(pod.status()), c.field) << c.json;
  }
}

TEST(DecodePodTest, MalformedJsonIsAnError) {
  for (std::string_view bad :
       {"", "{", "{\"metadata\":", "{\"metadata\":{\"name\":\"x}}",
        "{\"spec\":{\"containers\":[{]}}", "nul", "{\"metadata\":{\"name\":tru}}",
        "{\"metadata\":{\"name\":\"x\"}}}"}) {
    absl::StatusOr<Pod> pod = DecodePod(bad);
    EXPECT_FALSE(pod.ok()) << bad;
    EXPECT_EQ(pod.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DecodeNodeTest, RecordedShapeFixture) {
  absl::StatusOr<Node> node = DecodeNode(Fixture("node.json"));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->meta.name, "gpu-node-03");
  EXPECT_EQ(node->meta.ns, "");
  EXPECT_EQ(node->meta.uid, "c3a9e0f4-1d2b-4e5f-8a7b-6c5d4e3f2a1b");
  EXPECT_EQ(node->meta.resource_version, "48210012");
  // Node labels are all kept (--node-label-selector may name any key); annotations only under
  // hami.io/ and nvidia.com/.
  EXPECT_EQ(node->meta.labels.size(), 4u);
  EXPECT_EQ(node->meta.labels.Get("gpu"), "on");
  EXPECT_EQ(node->meta.labels.Get("kubernetes.io/hostname"), "gpu-node-03");
  EXPECT_THAT(std::string(node->meta.annotations.Get("hami.io/node-nvidia-register")),
              HasSubstr("NVIDIA-NVIDIA A100-SXM4-80GB"));
  EXPECT_EQ(node->meta.annotations.size(), 2u);
  EXPECT_TRUE(node->meta.annotations.Contains("hami.io/node-handshake"));
  EXPECT_FALSE(node->meta.annotations.Contains("node.alpha.kubernetes.io/ttl"));
  EXPECT_TRUE(node->unschedulable);
  EXPECT_EQ(node->ready, ConditionStatus::kTrue);  // "status" before "type" in the fixture
  EXPECT_EQ(node->allocatable.Get("nvidia.com/gpu"), "20");
  EXPECT_EQ(node->allocatable.Get("cpu"), "63500m");
  EXPECT_EQ(node->allocatable.size(), 6u);
}

TEST(DecodeNodeTest, ReadyDefaultsToUnknown) {
  absl::StatusOr<Node> node =
      DecodeNode(R"({"metadata":{"name":"n"},"status":{"conditions":[{"type":"DiskPressure",)"
                 R"("status":"False"}]}})");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->ready, ConditionStatus::kUnknown);
  EXPECT_FALSE(node->unschedulable);
  node = DecodeNode(R"({"status":{"conditions":[{"type":"Ready","status":"False"}]}})");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->ready, ConditionStatus::kFalse);
  node = DecodeNode(R"({"metadata":{"name":"n"},"status":{"conditions":[{"type":1}]}})");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(Message(node.status()), "Node n: status.conditions[0].type: expected string");
}

TEST(DecodeListTest, PodListWithContinue) {
  absl::StatusOr<PodList> list = DecodePodList(Fixture("podlist.json"));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->meta.resource_version, "48213400");
  EXPECT_EQ(
      list->meta.continue_token,
      "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDgyMTM0MDAsInN0YXJ0IjoiYmF0Y2gvd29ya2VyLTNcdTAwMDAifQ");
  EXPECT_EQ(list->meta.remaining_item_count, 1297);
  ASSERT_EQ(list->items.size(), 3u);
  EXPECT_EQ(list->items[0].Key(), "batch/worker-1");
  EXPECT_EQ(list->items[0].phase, PodPhase::kRunning);
  EXPECT_EQ(list->items[1].node_name, "");
  EXPECT_EQ(list->items[1].phase, PodPhase::kPending);
  EXPECT_EQ(list->items[2].phase, PodPhase::kSucceeded);
  EXPECT_EQ(list->items[2].node_name, "gpu-node-01");
  EXPECT_EQ(list->items[2].containers.at(0).limits.Get("nvidia.com/gpu"), "1");
}

TEST(DecodeListTest, NodeListAndEmptyLists) {
  absl::StatusOr<NodeList> nodes = DecodeNodeList(Fixture("nodelist.json"));
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->meta.resource_version, "48213401");
  EXPECT_EQ(nodes->meta.continue_token, "");
  EXPECT_FALSE(nodes->meta.remaining_item_count.has_value());
  ASSERT_EQ(nodes->items.size(), 2u);
  EXPECT_EQ(nodes->items[1].meta.name, "cpu-node-01");
  EXPECT_EQ(nodes->items[1].ready, ConditionStatus::kFalse);
  EXPECT_FALSE(nodes->items[1].unschedulable);

  absl::StatusOr<PodList> empty =
      DecodePodList(R"({"kind":"PodList","metadata":{"resourceVersion":"5"},"items":[]})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->items.empty());
  EXPECT_TRUE(DecodePodList(R"({"kind":"List","items":null})").ok());
}

TEST(DecodeListTest, ItemErrorsNameTheItem) {
  absl::StatusOr<PodList> list =
      DecodePodList(R"({"kind":"PodList","items":[{"metadata":{"name":"a","namespace":"d"}},)"
                    R"({"metadata":{"name":"x","namespace":"default","labels":{"app":1}}}]})");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(Message(list.status()),
            "PodList items[1] (Pod default/x): metadata.labels.app: expected string");
  EXPECT_EQ(FieldError(list.status()), "metadata.labels.app: expected string");

  list = DecodePodList(R"({"kind":"NodeList","items":[]})");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(Message(list.status()), "PodList: kind: kind NodeList, expected PodList");
  list = DecodePodList(R"({"items":[{"kind":"Node"}]})");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(Message(list.status()), "PodList items[0] (Pod): kind: kind Node, expected Pod");
  list = DecodePodList(R"({"metadata":{"remainingItemCount":"7"},"items":[]})");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(Message(list.status()), "PodList: metadata.remainingItemCount: expected integer");
}

TEST(DecodeWatchEventTest, EachEventType) {
  auto added = DecodeWatchEvent<Pod>(Fixture("watch-added.json"));
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(added->type, WatchEventType::kAdded);
  ExpectFixturePod(added->object);
  EXPECT_EQ(added->object.meta.resource_version, "48213378");

  // The fixture puts "object" before "type".
  auto modified = DecodeWatchEvent<Pod>(Fixture("watch-modified.json"));
  ASSERT_TRUE(modified.ok()) << modified.status();
  EXPECT_EQ(modified->type, WatchEventType::kModified);
  ExpectFixturePod(modified->object);
  EXPECT_EQ(modified->object.phase, PodPhase::kFailed);

  auto deleted = DecodeWatchEvent<Pod>(Fixture("watch-deleted.json"));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->type, WatchEventType::kDeleted);
  EXPECT_EQ(deleted->object.meta.resource_version, "48213399");
  EXPECT_TRUE(deleted->object.Deleting());

  auto bookmark = DecodeWatchEvent<Pod>(Fixture("watch-bookmark.json"));
  ASSERT_TRUE(bookmark.ok()) << bookmark.status();
  EXPECT_EQ(bookmark->type, WatchEventType::kBookmark);
  EXPECT_EQ(bookmark->object.meta.resource_version, "48213500");
  EXPECT_EQ(bookmark->object.meta.annotations.Get("k8s.io/initial-events-end"), "true");
  EXPECT_FALSE(bookmark->object.Deleting());

  auto error = DecodeWatchEvent<Pod>(Fixture("watch-error-410.json"));
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->type, WatchEventType::kError);
  EXPECT_EQ(error->status.code, 410);
  EXPECT_EQ(error->status.reason, "Expired");
  EXPECT_EQ(error->status.status, "Failure");
  EXPECT_EQ(error->status.message, "too old resource version: 48213377 (48219999)");
}

TEST(DecodeWatchEventTest, BookmarkSkipsEverythingButRvAndAnnotations) {
  auto event = DecodeWatchEvent<Node>(
      R"({"type":"BOOKMARK","object":{"kind":"Node","metadata":{"resourceVersion":"7",)"
      R"("name":"ignored"},"status":{"allocatable":[]}}})");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->object.meta.resource_version, "7");
  EXPECT_EQ(event->object.meta.name, "");
}

TEST(DecodeWatchEventTest, Errors) {
  struct Case {
    std::string json;
    std::string message;
  };
  const Case cases[] = {
      {R"({"type":"SYNC","object":{}})", "watch event: type: unknown watch event type \"SYNC\""},
      {R"({"object":{}})", "watch event: missing type"},
      {R"({"type":"ADDED"})", "watch ADDED event (Pod): missing object"},
      {R"({"type":"ADDED","object":{"kind":"Node","metadata":{"name":"n"}}})",
       "watch ADDED event (Pod): object.kind: kind Node, expected Pod"},
      {R"({"type":"MODIFIED","object":{"metadata":{"name":"p","namespace":"d"},)"
       R"("spec":{"containers":7}}})",
       "watch MODIFIED event (Pod d/p): object.spec.containers: expected array"},
      {R"({"object":{"metadata":{"name":"p","namespace":"d"},"spec":{"containers":7}},)"
       R"("type":"DELETED"})",
       "watch DELETED event (Pod d/p): object.spec.containers: expected array"},
      {R"({"type":"ERROR","object":{"kind":"Status","code":"410"}})",
       "watch ERROR event: object.code: expected integer"},
      {R"({"type":"ADDED","object":[]})", "watch ADDED event (Pod): object: expected object"},
      {R"({"object":5,"type":"ADDED"})", "watch event: object: expected object"},
  };
  for (const Case& c : cases) {
    auto event = DecodeWatchEvent<Pod>(c.json);
    ASSERT_FALSE(event.ok()) << c.json;
    EXPECT_EQ(Message(event.status()), c.message) << c.json;
  }
}

TEST(DecodeWatchEventTest, StreamThroughFrameSplitter) {
  const std::string stream = Fixture("watch-stream.ndjson");
  json::FrameSplitter splitter;
  std::vector<std::string> frames;
  // Feed in awkward 7-byte chunks.
  for (size_t i = 0; i < stream.size(); i += 7) {
    ASSERT_TRUE(splitter.Feed(std::string_view(stream).substr(i, 7), &frames).ok());
  }
  ASSERT_EQ(frames.size(), 5u);
  Decoder decoder;
  std::vector<WatchEventType> types;
  for (const std::string& frame : frames) {
    auto event = decoder.DecodeWatchEvent<Pod>(frame);
    ASSERT_TRUE(event.ok()) << event.status();
    types.push_back(event->type);
  }
  EXPECT_EQ(types, (std::vector<WatchEventType>{WatchEventType::kAdded, WatchEventType::kModified,
                                                WatchEventType::kBookmark, WatchEventType::kDeleted,
                                                WatchEventType::kError}));
}

TEST(DecodeLeaseTest, FixtureAndReleasedLease) {
  absl::StatusOr<Lease> lease = DecodeLease(Fixture("lease.json"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->meta.ns, "kube-system");
  EXPECT_EQ(lease->meta.name, "tessera");
  EXPECT_EQ(lease->meta.resource_version, "8812");
  EXPECT_EQ(lease->holder_identity, "host-a_3f2c9d");
  EXPECT_EQ(lease->lease_duration_seconds, 15);
  EXPECT_EQ(lease->acquire_time, "2026-11-30T08:00:00.000000Z");
  EXPECT_EQ(lease->renew_time, "2026-11-30T08:01:10.123456Z");
  EXPECT_EQ(lease->lease_transitions, 2);

  const std::string stream = Fixture("watch-lease.ndjson");
  json::FrameSplitter splitter;
  std::vector<std::string> frames;
  ASSERT_TRUE(splitter.Feed(stream, &frames).ok());
  ASSERT_EQ(frames.size(), 2u);
  auto released = DecodeWatchEvent<Lease>(frames[1]);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->type, WatchEventType::kModified);
  EXPECT_EQ(released->object.holder_identity, "");  // present but empty
  EXPECT_EQ(released->object.lease_duration_seconds, 1);
  EXPECT_FALSE(released->object.acquire_time.has_value());  // null

  absl::StatusOr<Lease> empty = DecodeLease(R"({"kind":"Lease","spec":{}})");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->holder_identity.has_value());
  EXPECT_FALSE(empty->lease_transitions.has_value());
  absl::StatusOr<Lease> big = DecodeLease(R"({"spec":{"leaseTransitions":4294967296}})");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(Message(big.status()), "Lease: spec.leaseTransitions: integer out of range");
}

TEST(DecodeResourceQuotaTest, KeepsOnlyLimitsKeysOfSpecHard) {
  // The shape kubectl shows for HAMi's quota example: limits.* keys, others, status.used.
  absl::StatusOr<ResourceQuota> q = DecodeResourceQuota(R"({
    "kind":"ResourceQuota","apiVersion":"v1",
    "metadata":{"name":"gpu","namespace":"ml","uid":"u1","resourceVersion":"12",
                "labels":{"team":"ml"},"annotations":{"x":"y"}},
    "spec":{"hard":{"limits.nvidia.com/gpumem":"40000","limits.nvidia.com/gpucores":200,
                    "requests.nvidia.com/gpumem":"100","pods":"10"},
            "scopes":["NotBestEffort"]},
    "status":{"used":{"limits.nvidia.com/gpumem":"36000"}}})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->meta.ns, "ml");
  EXPECT_EQ(q->meta.name, "gpu");
  EXPECT_EQ(q->meta.resource_version, "12");
  EXPECT_TRUE(q->meta.labels.empty());
  EXPECT_TRUE(q->meta.annotations.empty());
  ASSERT_EQ(q->hard.size(), 2u);
  EXPECT_EQ(q->hard.Get("limits.nvidia.com/gpumem"), "40000");
  EXPECT_EQ(q->hard.Get("limits.nvidia.com/gpucores"), "200");  // a number, as a quantity

  absl::StatusOr<ResourceQuota> bad =
      DecodeResourceQuota(R"({"metadata":{"name":"q","namespace":"n"},"spec":{"hard":[1]}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Message(bad.status()), "ResourceQuota n/q: spec.hard: expected object");
  // A dropped key's value is still checked.
  absl::StatusOr<ResourceQuota> bad_value = DecodeResourceQuota(R"({"spec":{"hard":{"pods":{}}}})");
  ASSERT_FALSE(bad_value.ok());
  EXPECT_THAT(Message(bad_value.status()), HasSubstr("spec.hard.pods"));
  EXPECT_FALSE(DecodeResourceQuota(R"({"kind":"Pod"})").ok());
}

TEST(DecodeResourceQuotaTest, ListAndWatchEvent) {
  std::string body = R"({"kind":"ResourceQuotaList","metadata":{"resourceVersion":"40"},
    "items":[{"metadata":{"name":"a","namespace":"n1"},"spec":{"hard":{"limits.nvidia.com/gpumem":"1k"}}},
             {"metadata":{"name":"b","namespace":"n2"},"spec":{}}]})";
  absl::StatusOr<ResourceQuotaList> list = DecodeResourceQuotaList(body);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->meta.resource_version, "40");
  ASSERT_EQ(list->items.size(), 2u);
  EXPECT_EQ(list->items[0].hard.Get("limits.nvidia.com/gpumem"), "1k");
  EXPECT_TRUE(list->items[1].hard.empty());
  Decoder decoder;
  absl::StatusOr<ResourceQuotaList> in_place = decoder.DecodeResourceQuotaListInPlace(&body);
  ASSERT_TRUE(in_place.ok());
  EXPECT_EQ(in_place->items, list->items);

  auto deleted = DecodeWatchEvent<ResourceQuota>(
      R"({"type":"DELETED","object":{"kind":"ResourceQuota","metadata":{"name":"a","namespace":"n1"}}})");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->type, WatchEventType::kDeleted);
  EXPECT_EQ(deleted->object.meta.name, "a");
  EXPECT_FALSE(
      DecodeWatchEvent<ResourceQuota>(R"({"type":"ADDED","object":{"kind":"Node"}})").ok());
}

TEST(DecodeStatusTest, ConflictAndTimeout) {
  absl::StatusOr<ApiStatus> conflict = DecodeStatus(Fixture("status-409.json"));
  ASSERT_TRUE(conflict.ok()) << conflict.status();
  EXPECT_EQ(conflict->code, 409);
  EXPECT_EQ(conflict->reason, "Conflict");
  EXPECT_THAT(conflict->message, HasSubstr("the object has been modified"));
  EXPECT_EQ(conflict->retry_after_seconds, 0);
  absl::StatusOr<ApiStatus> timeout = DecodeStatus(Fixture("status-504.json"));
  ASSERT_TRUE(timeout.ok()) << timeout.status();
  EXPECT_EQ(timeout->code, 504);
  EXPECT_EQ(timeout->retry_after_seconds, 1);
  EXPECT_FALSE(DecodeStatus(R"({"kind":"Pod"})").ok());
}

TEST(DecoderTest, ReusableAcrossCallsAndErrors) {
  Decoder decoder;
  const std::string pod = Fixture("pod.json");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(decoder.DecodePod(pod).ok());
    ASSERT_FALSE(decoder.DecodePod("{\"spec\":[").ok());
    ASSERT_TRUE(decoder.DecodeNode(Fixture("node.json")).ok());
    ASSERT_TRUE(decoder.DecodePodList(Fixture("podlist.json")).ok());
  }
  // The input is copied: the decoded strings do not point into it.
  std::string mutable_json = R"({"metadata":{"name":"abcdefghijklmnopqrstuvwxyz"}})";
  absl::StatusOr<Pod> p = decoder.DecodePod(mutable_json);
  mutable_json.assign(mutable_json.size(), 'x');
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->meta.name, "abcdefghijklmnopqrstuvwxyz");
}

TEST(DecoderTest, ThreadLocalFreeFunctions) {
  const std::string pod = Fixture("pod.json");
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (DecodePod(pod).ok()) {
          ok.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(ok.load(), 200);
}

}  // namespace
}  // namespace tessera::kube

namespace tessera::kube {
namespace {

TEST(DecodePodDisruptionBudgetTest, SelectorAllowedAndDisruptedPods) {
  absl::StatusOr<PodDisruptionBudget> pdb = DecodePodDisruptionBudget(
      R"({"apiVersion":"policy/v1","kind":"PodDisruptionBudget",)"
      R"("metadata":{"name":"web","namespace":"ml","labels":{"x":"y"}},)"
      R"("spec":{"minAvailable":1,"selector":{"matchLabels":{"app":"web"},)"
      R"("matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}},)"
      R"("status":{"disruptionsAllowed":2,"disruptedPods":{"web-2":"t","web-1":"t"}}})");
  ASSERT_TRUE(pdb.ok()) << pdb.status();
  EXPECT_EQ(pdb->meta.ns, "ml");
  EXPECT_EQ(pdb->meta.labels.size(), 0u);
  ASSERT_TRUE(pdb->selector.has_value());
  EXPECT_EQ(pdb->selector->match_labels.Get("app"), "web");
  ASSERT_EQ(pdb->selector->match_expressions.size(), 1u);
  EXPECT_EQ(pdb->selector->match_expressions[0],
            (LabelSelectorRequirement{"tier", "In", {"a", "b"}}));
  EXPECT_EQ(pdb->disruptions_allowed, 2);
  EXPECT_EQ(pdb->disrupted_pods, (std::vector<std::string>{"web-1", "web-2"}));

  pdb = DecodePodDisruptionBudget(R"({"spec":{"selector":null},"status":null})");
  ASSERT_TRUE(pdb.ok()) << pdb.status();
  EXPECT_FALSE(pdb->selector.has_value());
  EXPECT_EQ(pdb->disruptions_allowed, 0);
  pdb = DecodePodDisruptionBudget(R"({"spec":{"selector":{}}})");
  ASSERT_TRUE(pdb.ok()) << pdb.status();
  ASSERT_TRUE(pdb->selector.has_value());
  EXPECT_TRUE(pdb->selector->Empty());
}

TEST(DecodePodDisruptionBudgetTest, ErrorsNameTheField) {
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"status":{"disruptionsAllowed":"2"}})", "status.disruptionsAllowed"},
           {R"({"spec":{"selector":{"matchExpressions":[{"values":[1]}]}}})",
            "spec.selector.matchExpressions[0].values[0]"},
           {R"({"spec":{"selector":[]}})", "spec.selector"},
           {R"({"kind":"Pod"})", "kind"},
       }) {
    absl::StatusOr<PodDisruptionBudget> pdb = DecodePodDisruptionBudget(json);
    ASSERT_FALSE(pdb.ok()) << json;
    EXPECT_EQ(pdb.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(FieldError(pdb.status()), ::testing::StartsWith(field)) << json;
  }
  absl::StatusOr<PodDisruptionBudgetList> list = DecodePodDisruptionBudgetList(
      R"({"kind":"PodDisruptionBudgetList","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]})");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items.size(), 2u);
}

}  // namespace
}  // namespace tessera::kube

#include "tessera/sim/emulators.h"

#include <memory>
#include <random>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/apisim/server.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"
#include "tessera/testing/fake_transport.h"
#include "tessera/testing/objects.h"

namespace tessera::sim {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kA[] = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
constexpr char kB[] = "GPU-bbbbbbbb-0000-0000-0000-000000000002";
constexpr char kC[] = "GPU-cccccccc-0000-0000-0000-000000000003";

std::string Dev(const char* uuid, int mem, int cores) {
  return std::string(uuid) + ",NVIDIA," + std::to_string(mem) + "," + std::to_string(cores) + ":";
}

TEST(EraseNextEntryTest, FollowsBothPluginGenerations) {
  // docs/hami-device-plugin.md §2.5 case 1: [c0 no GPU, c1 A, c2 B+C].
  const std::string v = ";" + Dev(kA, 3000, 30) + ";" + Dev(kB, 4000, 50) + Dev(kC, 4000, 50) + ";";
  int n = 0;
  // G1/G2 compact: ;A:;B:C:; -> ;B:C:; -> ;  (the string shrinks)
  absl::StatusOr<std::string> g1 = EraseNextEntry(v, /*compact=*/true, &n);
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_EQ(n, 1);
  EXPECT_EQ(*g1, ";" + Dev(kB, 4000, 50) + Dev(kC, 4000, 50) + ";");
  g1 = EraseNextEntry(*g1, true, &n);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(*g1, ";");
  EXPECT_FALSE(AllocationPending(*g1));
  EXPECT_TRUE(absl::IsNotFound(EraseNextEntry(*g1, true).status()));
  // G3 keeps indices: ;A:;B:C:; -> ;;B:C:;; -> ;;;;;
  absl::StatusOr<std::string> g3 = EraseNextEntry(v, /*compact=*/false);
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(*g3, ";;" + Dev(kB, 4000, 50) + Dev(kC, 4000, 50) + ";;");
  EXPECT_TRUE(AllocationPending(*g3));
  g3 = EraseNextEntry(*g3, false);
  EXPECT_EQ(*g3, ";;;;;");
  EXPECT_FALSE(AllocationPending(*g3));
}

TEST(WorkloadTest, ShapesAskForWhatTheirNameSays) {
  Workload w({{Shape::kMultiContainer, 1}}, "hami-scheduler", "NVIDIA-A100");
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(w.Pick(rng), Shape::kMultiContainer);
  json mc = json::parse(w.PodJson(Shape::kMultiContainer, "ns", "p", rng));
  EXPECT_EQ(mc["spec"]["schedulerName"], "hami-scheduler");
  ASSERT_EQ(mc["spec"]["containers"].size(), 3u);
  EXPECT_FALSE(mc["spec"]["containers"][0].contains("resources"));
  EXPECT_EQ(mc["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpu"], "1");
  json numa = json::parse(w.PodJson(Shape::kNuma, "ns", "p", rng));
  EXPECT_EQ(numa["metadata"]["annotations"]["nvidia.com/numa-bind"], "true");
  EXPECT_EQ(numa["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
  json typed = json::parse(w.PodJson(Shape::kTyped, "ns", "p", rng));
  EXPECT_EQ(typed["metadata"]["annotations"]["nvidia.com/use-gputype"], "NVIDIA-A100");
  json pct = json::parse(w.PodJson(Shape::kPercent, "ns", "p", rng));
  EXPECT_TRUE(
      pct["spec"]["containers"][0]["resources"]["limits"].contains("nvidia.com/gpumem-percentage"));
  json cores = json::parse(w.PodJson(Shape::kCores, "ns", "p", rng));
  EXPECT_TRUE(
      cores["spec"]["containers"][0]["resources"]["limits"].contains("nvidia.com/gpucores"));
  json whole = json::parse(w.PodJson(Shape::kWhole, "ns", "p", rng));
  EXPECT_EQ(whole["spec"]["containers"][0]["resources"]["limits"].size(), 1u);
  json multi = json::parse(w.PodJson(Shape::kMultiGpu, "ns", "p", rng));
  EXPECT_NE(multi["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");
  json mig = json::parse(w.PodJson(Shape::kMig, "ns", "p", rng));
  EXPECT_EQ(mig["metadata"]["annotations"]["nvidia.com/vgpu-mode"], "mig");
  EXPECT_TRUE(mig["spec"]["containers"][0]["resources"]["limits"].contains("nvidia.com/gpumem"));
  EXPECT_EQ(ParseShape("multi_gpu"), Shape::kMultiGpu);
  EXPECT_EQ(ParseShape("mig"), Shape::kMig);
  EXPECT_FALSE(ParseShape("huge").has_value());
}

// With priorities every pod names its class and carries its value, in the weights' proportion;
// without them no pod has one, and the shapes and sizes drawn are the same either way.
TEST(WorkloadTest, PrioritiesAreDrawnAfterTheShapeByWeight) {
  const Workload plain({{Shape::kMemory, 1}}, "hami-scheduler", "A");
  const Workload ranked({{Shape::kMemory, 1}}, "hami-scheduler", "A", {{0, 3}, {1000, 1}});
  std::mt19937_64 a(7), b(7);
  int high = 0;
  for (int i = 0; i < 400; ++i) {
    json p = json::parse(plain.PodJson(plain.Pick(a), "default", "p", a));
    json r = json::parse(ranked.PodJson(ranked.Pick(b), "default", "p", b));
    EXPECT_FALSE(p["spec"].contains("priority"));
    EXPECT_FALSE(p["spec"].contains("priorityClassName"));
    EXPECT_EQ(p["spec"]["containers"], r["spec"]["containers"]) << "pod " << i;
    const int v = r["spec"]["priority"].get<int>();
    ASSERT_TRUE(v == 0 || v == 1000) << v;
    EXPECT_EQ(r["spec"]["priorityClassName"], PriorityClassName(v));
    high += v == 1000 ? 1 : 0;
    a.discard(1);  // the priority's draw, which only `b` made
  }
  EXPECT_EQ(PriorityClassName(1000), "sim-priority-1000");
  EXPECT_GT(high, 60);  // a quarter of 400, with room for chance
  EXPECT_LT(high, 140);
}

TEST(SchedulingQueueTest, BacksOffLikeKubeScheduler) {
  SchedulingQueue q;
  const absl::Time t = absl::FromUnixSeconds(1000);
  for (absl::Duration want : {absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                              absl::Seconds(8), absl::Seconds(10), absl::Seconds(10)}) {
    q.Attempt("a", t);
    EXPECT_EQ(q.Backoff("a"), want);
  }
  q.Attempt("b", t);
  EXPECT_EQ(q.Backoff("b"), absl::Seconds(1));
  q.Forget("a");
  EXPECT_EQ(q.attempts("a"), 0);
  q.Attempt("a", t);
  EXPECT_EQ(q.Backoff("a"), absl::Seconds(1));
}

using Names = SchedulingQueue::Now;

// A refused pod is not retried by a timer: it waits until an event, and then runs when its
// backoff, counted from its attempt, has passed, while other pods are ready.
TEST(SchedulingQueueTest, ARefusedPodWaitsForAnEventThenItsBackoff) {
  SchedulingQueue q;
  const absl::Time t = absl::FromUnixSeconds(1000);
  q.Attempt("a", t);
  q.Attempt("a", t);
  uint64_t token = q.Attempt("a", t);  // the third attempt: backoff 4 s
  EXPECT_EQ(q.Refused("a", token, t + absl::Milliseconds(5)), Names{});
  EXPECT_EQ(q.waiting(), 1u);
  EXPECT_EQ(q.Pump(t + absl::Minutes(1)), Names{}) << "waiting is not backing off";
  EXPECT_EQ(q.PodUpdated("b", t), Names{}) << "not a waiting pod";
  q.Ready("busy");  // the active queue is not empty
  EXPECT_EQ(q.ClusterEvent(t + absl::Seconds(1)), Names{});
  EXPECT_EQ(q.waiting(), 0u);
  EXPECT_EQ(q.Pump(t + absl::Seconds(3)), Names{});
  EXPECT_EQ(q.Pump(t + absl::Seconds(4)), Names{"a"}) << "its backoff ended";
  EXPECT_EQ(q.Pump(t + absl::Seconds(5)), Names{}) << "taken once";
  // Long after the backoff, an update of the pod itself makes it ready at once.
  token = q.Attempt("a", t + absl::Seconds(60));
  EXPECT_EQ(q.Refused("a", token, t + absl::Seconds(60)), Names{});
  EXPECT_EQ(q.PodUpdated("a", t + absl::Seconds(100)), Names{"a"});
}

// SchedulerPopFromBackoffQ: as soon as no pod is ready, the backing-off pods are taken.
TEST(SchedulingQueueTest, WithNothingReadyTheBackingOffPodsRunAtOnce) {
  SchedulingQueue q;
  const absl::Time t = absl::FromUnixSeconds(1000);
  for (const char* pod : {"a", "b"}) {
    for (int i = 0; i < 5; ++i) {
      q.Attempt(pod, t);  // backoff 10 s
    }
    EXPECT_EQ(q.Refused(pod, q.Attempt(pod, t), t), Names{});
  }
  EXPECT_EQ(q.ClusterEvent(t + absl::Seconds(1)), (Names{"a", "b"}));
  // Both are ready: the update of a third waiting pod waits for its backoff, or for both to be
  // tried.
  EXPECT_EQ(q.Refused("c", q.Attempt("c", t + absl::Seconds(1)), t + absl::Seconds(1)), Names{});
  EXPECT_EQ(q.PodUpdated("c", t + absl::Milliseconds(1200)), Names{});
  q.Attempt("a", t + absl::Milliseconds(1300));
  EXPECT_EQ(q.Pump(t + absl::Milliseconds(1300)), Names{}) << "b is still ready";
  q.Forget("b");  // bound
  EXPECT_EQ(q.Pump(t + absl::Milliseconds(1400)), Names{"c"});
}

// An event during the attempt may have freed what the pod needs: it backs off at once.
TEST(SchedulingQueueTest, AnEventDuringTheAttemptSendsThePodToTheBackoff) {
  SchedulingQueue q;
  const absl::Time t = absl::FromUnixSeconds(1000);
  q.Ready("busy");
  const uint64_t token = q.Attempt("a", t);
  EXPECT_EQ(q.ClusterEvent(t), Names{});
  EXPECT_EQ(q.Refused("a", token, t + absl::Milliseconds(10)), Names{});
  EXPECT_EQ(q.waiting(), 0u);
  EXPECT_EQ(q.Pump(t + absl::Seconds(1)), Names{"a"});
}

TEST(SchedulingQueueTest, TheFlushRetriesPodsThatWaitedFiveMinutes) {
  SchedulingQueue q;
  const absl::Time t = absl::FromUnixSeconds(1000);
  EXPECT_EQ(q.Refused("a", q.Attempt("a", t), t), Names{});
  EXPECT_EQ(q.Refused("b", q.Attempt("b", t + absl::Minutes(1)), t + absl::Minutes(1)), Names{});
  EXPECT_EQ(q.Flush(t + absl::Minutes(4)), Names{});
  EXPECT_EQ(q.Flush(t + absl::Minutes(5)), Names{"a"});
  EXPECT_EQ(q.waiting(), 1u);
}

TEST(ExtenderClientTest, SpeaksTheExtenderProtocol) {
  kube::FakeTransport t;
  std::vector<kube::Request> seen;
  t.SetHandler([&](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    seen.push_back(r);
    kube::Response resp;
    resp.status_code = 200;
    json body = json::parse(r.body);
    if (r.path == "/bind") {
      resp.body = body["Node"] == "n1" ? R"({"Error":""})" : R"({"Error":"node lock held"})";
    } else if (body.contains("Nodes")) {
      resp.body = json{{"Nodes", {{"items", {body["Nodes"]["items"][1]}}}}}.dump();
    } else if (body["NodeNames"].size() == 2) {
      resp.body = R"({"NodeNames":["n2"],"FailedNodes":{},"Error":""})";
    } else {
      resp.body = R"({"NodeNames":[],"FailedNodes":{"n1":"CardInsufficientMemory"},"Error":""})";
    }
    return resp;
  });
  ExtenderClient c(&t);
  const std::string pod = R"({"metadata":{"name":"p","namespace":"default","uid":"u"}})";
  absl::StatusOr<FilterOutcome> f = c.Filter(pod, {"n1", "n2"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->node, "n2");
  json sent = json::parse(seen.back().body);
  EXPECT_EQ(sent["Pod"]["metadata"]["uid"], "u");
  EXPECT_EQ(sent["NodeNames"], json({"n1", "n2"}));
  f = c.Filter(pod, {"n1"});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->node, "");
  EXPECT_EQ(f->failed_reason, "CardInsufficientMemory");
  f = c.FilterNodes(pod, {R"({"metadata":{"name":"n1"}})", R"({"metadata":{"name":"n2"}})"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->node, "n2");
  EXPECT_TRUE(c.Bind("default", "p", "u", "n1").ok());
  json bind = json::parse(seen.back().body);
  EXPECT_EQ(bind["PodUID"], "u");
  EXPECT_EQ(bind["PodNamespace"], "default");
  absl::Status refused = c.Bind("default", "p", "u", "n2");
  EXPECT_TRUE(absl::IsAborted(refused));
  EXPECT_THAT(refused.message(), HasSubstr("node lock held"));
}

// The plugin and the kubelet against a real (in-process) apisim.
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<apisim::Server>> s = apisim::Server::Start({});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    kube::RestConfig c;
    c.server = server_->url();
    c.qps = 0;
    absl::StatusOr<std::unique_ptr<kube::CurlTransport>> t =
        kube::CurlTransport::Create(c, nullptr);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    client_ = std::make_unique<kube::ApiClient>(transport_.get());
  }

  std::vector<device::DeviceInfo> Devices() {
    std::vector<device::DeviceInfo> out;
    for (const char* id : {kA, kB, kC}) {
      out.push_back(::tessera::testing::GpuDevice(id, static_cast<int32_t>(out.size()), 40960,
                                                  "NVIDIA-A100"));
    }
    return out;
  }

  void MakeNode(const std::string& name, const std::string& lock = "") {
    json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}};
    if (!lock.empty()) node["metadata"]["annotations"] = {{"hami.io/mutex.lock", lock}};
    ASSERT_TRUE(CreateNode(*transport_, node.dump()).ok());
  }

  // A pod Tessera has bound: annotated, bind-phase allocating, spec.nodeName set; `mig` its
  // hami.io/vgpu-mig-allocations when not empty.
  void MakeBoundPod(const std::string& name, const std::string& node, const std::string& alloc,
                    const std::string& mig = "") {
    json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata",
         {{"name", name},
          {"namespace", "default"},
          {"annotations",
           {{"hami.io/vgpu-node", node},
            {"hami.io/vgpu-devices-allocated", alloc},
            {"hami.io/vgpu-devices-to-allocate", alloc},
            {"hami.io/bind-phase", "allocating"},
            {"hami.io/bind-time", "1800000000"}}}}},
        {"spec",
         {{"nodeName", node},
          {"containers", {{{"name", "a"}, {"image", "x"}}, {{"name", "b"}, {"image", "x"}}}}}},
        {"status", {{"phase", "Pending"}}}};
    if (!mig.empty()) pod["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = mig;
    ASSERT_TRUE(CreatePod(*transport_, "default", name, pod.dump()).ok());
  }

  std::unique_ptr<apisim::Server> server_;
  std::unique_ptr<kube::CurlTransport> transport_;
  std::unique_ptr<kube::ApiClient> client_;
};

TEST_F(ClusterTest, PluginRegistersInItsGenerationsFormat) {
  MakeNode("old");
  MakeNode("new");
  DevicePlugin v25("old", device::RegisterFormat::kDelimited, Devices());
  DevicePlugin v28("new", device::RegisterFormat::kJson, Devices());
  ASSERT_TRUE(v25.Register(*client_, absl::FromUnixSeconds(1800000000)).ok());
  ASSERT_TRUE(v28.Register(*client_, absl::FromUnixSeconds(1800000000)).ok());
  absl::StatusOr<kube::Node> old = client_->GetNode("old");
  ASSERT_TRUE(old.ok());
  absl::StatusOr<device::DecodedRegister> r =
      device::DecodeNodeRegister(old->meta.annotations.Get("hami.io/node-nvidia-register"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, device::RegisterFormat::kDelimited);
  EXPECT_EQ(r->devices, Devices());
  EXPECT_THAT(std::string(old->meta.annotations.Get("hami.io/node-handshake")),
              HasSubstr("Reported 2027-01-15 08:00:00"));
  absl::StatusOr<kube::Node> fresh = client_->GetNode("new");
  ASSERT_TRUE(fresh.ok());
  r = device::DecodeNodeRegister(fresh->meta.annotations.Get("hami.io/node-nvidia-register"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->format, device::RegisterFormat::kJson);
  EXPECT_FALSE(fresh->meta.annotations.Contains("hami.io/node-handshake"));
}

TEST_F(ClusterTest, PluginConsumesTheLockedPodContainerByContainer) {
  MakeNode("n1", "2026-12-03T08:00:00Z,default,p1");
  const std::string alloc = Dev(kA, 3000, 30) + ";" + Dev(kB, 2000, 0) + Dev(kC, 2000, 0) + ";";
  MakeBoundPod("p1", "n1", alloc);
  MakeBoundPod("p2", "n1", alloc);
  DevicePlugin plugin("n1", device::RegisterFormat::kJson, Devices());
  // The kubelet admits p2, but the lock names p1: the plugin serves p1 (as HAMi's does).
  absl::StatusOr<AllocateResult> a = plugin.Allocate(*client_, "default", "p2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->name, "p1");
  EXPECT_EQ(a->calls, 2);
  EXPECT_TRUE(a->success);
  absl::StatusOr<kube::Pod> p1 = client_->GetPod("default", "p1");
  ASSERT_TRUE(p1.ok());
  EXPECT_EQ(p1->meta.annotations.Get("hami.io/bind-phase"), "success");
  EXPECT_EQ(p1->meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), ";;;;");  // G3
  EXPECT_EQ(p1->meta.annotations.Get("hami.io/vgpu-devices-allocated"), alloc);
  absl::StatusOr<kube::Node> n1 = client_->GetNode("n1");
  ASSERT_TRUE(n1.ok());
  EXPECT_FALSE(n1->meta.annotations.Contains("hami.io/mutex.lock"));
  // No lock now: the fallback finds p2 itself.
  a = plugin.Allocate(*client_, "default", "p2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->name, "p2");
  EXPECT_TRUE(a->success);
}

// HAMi v2.10's plugin in `mig` mode: each Allocate call realises the container's reservations
// (runtime identity written back into hami.io/vgpu-mig-allocations) before its entry is erased;
// a reservation it cannot realise fails the pod and releases the lock.
TEST_F(ClusterTest, PluginRealisesMigReservationsContainerByContainer) {
  const std::shared_ptr<const device::NodeDevices> cards =
      ::tessera::testing::MigNodeDevices("m1", {kA, kB});
  DevicePlugin plugin("m1", device::RegisterFormat::kJson, cards->devices);
  MakeNode("m1", "2026-12-03T08:00:00Z,default,mp");
  // Container a: 1g on A at 6; container b: 2g on A at 0 and 1g on B at 6.
  const std::string reserved = std::string(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":")") +
                               kA + R"(","profile":"1g.5gb","placement":{"start":6,"size":1}},)" +
                               R"({"containerIndex":1,"deviceIndex":1,"gpuUUID":")" + kB +
                               R"(","profile":"1g.5gb","placement":{"start":6,"size":1}},)" +
                               R"({"containerIndex":1,"deviceIndex":0,"gpuUUID":")" + kA +
                               R"(","profile":"2g.10gb","placement":{"start":0,"size":2}}])";
  const std::string alloc = Dev(kA, 4864, 15) + ";" + Dev(kA, 9856, 29) + Dev(kB, 4864, 15) + ";";
  MakeBoundPod("mp", "m1", alloc, reserved);
  absl::StatusOr<AllocateResult> a = plugin.Allocate(*client_, "default", "mp");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->calls, 2);
  EXPECT_EQ(a->mig_instances, 3);
  EXPECT_TRUE(a->success);
  EXPECT_EQ(a->failure, "");
  absl::StatusOr<kube::Pod> mp = client_->GetPod("default", "mp");
  ASSERT_TRUE(mp.ok());
  absl::StatusOr<std::vector<device::MigAllocation>> realised =
      device::DecodeMigAllocations(mp->meta.annotations.Get("hami.io/vgpu-mig-allocations"));
  ASSERT_TRUE(realised.ok()) << realised.status();
  ASSERT_EQ(realised->size(), 3u);
  std::set<std::string> mig_uuids;
  for (const device::MigAllocation& m : *realised) {
    EXPECT_TRUE(m.RuntimeReady()) << m.gpu_uuid << " " << m.profile;
    EXPECT_EQ(m.compute_instance_id, 0u);
    EXPECT_THAT(m.mig_uuid, ::testing::StartsWith("MIG-"));
    mig_uuids.insert(m.mig_uuid);
  }
  EXPECT_EQ(mig_uuids.size(), 3u);
  // The placements are the scheduler's, unchanged; ids count per card, in call order.
  EXPECT_EQ((*realised)[0].placement, (device::MigPlacement{6, 1}));
  EXPECT_EQ((*realised)[0].gpu_instance_id, 1u);
  EXPECT_EQ((*realised)[2].placement, (device::MigPlacement{0, 2}));
  EXPECT_EQ((*realised)[2].gpu_instance_id, 2u);
  EXPECT_EQ((*realised)[1].gpu_instance_id, 1u);
  EXPECT_EQ(mp->meta.annotations.Get("hami.io/bind-phase"), "success");
  EXPECT_EQ(mp->meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), ";;;;");

  // A placement the card does not register (2g at 1): the pod fails, the lock is released.
  MakeNode("m2", "2026-12-03T08:00:00Z,default,bad");
  DevicePlugin plugin2("m2", device::RegisterFormat::kJson, cards->devices);
  MakeBoundPod("bad", "m2", Dev(kA, 9856, 29) + ";",
               std::string(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":")") + kA +
                   R"(","profile":"2g.10gb","placement":{"start":1,"size":2}}])");
  a = plugin2.Allocate(*client_, "default", "bad");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->success);
  EXPECT_THAT(a->failure, HasSubstr("invalid placement {start:1, size:2} for profile 2g.10gb"));
  EXPECT_EQ(client_->GetPod("default", "bad")->meta.annotations.Get("hami.io/bind-phase"),
            "failed");
  EXPECT_FALSE(client_->GetNode("m2")->meta.annotations.Contains("hami.io/mutex.lock"));
  // A device without a reservation (no annotation at all): HAMi's count check.
  MakeBoundPod("none", "m2", Dev(kA, 4864, 15) + ";");
  a = plugin2.Allocate(*client_, "default", "none");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->failure, "container 0 has 0 MIG reservations, requested 1 devices");
}

TEST_F(ClusterTest, PluginFallbackRefusesAPodThatIsNotBindingHere) {
  MakeNode("n1");
  MakeNode("n2");
  MakeBoundPod("p1", "n2", Dev(kA, 1000, 0) + ";");
  DevicePlugin plugin("n1", device::RegisterFormat::kDelimited, Devices());
  absl::StatusOr<AllocateResult> a = plugin.Allocate(*client_, "default", "p1");
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr("no binding pod found on node n1"));
  // On its own node, a delimited (G1) plugin compacts the string as it consumes.
  DevicePlugin right("n2", device::RegisterFormat::kDelimited, Devices());
  a = right.Allocate(*client_, "default", "p1");
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<kube::Pod> p1 = client_->GetPod("default", "p1");
  EXPECT_EQ(p1->meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), ";");
}

TEST_F(ClusterTest, KubeletRunsFinishesAndDeletesGracefully) {
  MakeNode("n1");
  MakeBoundPod("p1", "n1", Dev(kA, 1000, 0) + ";");
  ASSERT_TRUE(Kubelet::Start(*transport_, "default", "p1").ok());
  EXPECT_EQ(client_->GetPod("default", "p1")->phase, kube::PodPhase::kRunning);
  // A graceful delete leaves the running pod in place with a deletionTimestamp ...
  ASSERT_TRUE(DeletePod(*transport_, "default", "p1").ok());
  absl::StatusOr<kube::Pod> deleting = client_->GetPod("default", "p1");
  ASSERT_TRUE(deleting.ok());
  EXPECT_TRUE(deleting->Deleting());
  // ... until the kubelet reports it terminal.
  ASSERT_TRUE(Kubelet::Finish(*transport_, "default", "p1").ok());
  EXPECT_TRUE(absl::IsNotFound(client_->GetPod("default", "p1").status()));
  // A forced delete (grace 0) removes a running pod at once.
  MakeBoundPod("p2", "n1", Dev(kA, 1000, 0) + ";");
  ASSERT_TRUE(Kubelet::Start(*transport_, "default", "p2").ok());
  ASSERT_TRUE(DeletePod(*transport_, "default", "p2", 0).ok());
  EXPECT_TRUE(absl::IsNotFound(client_->GetPod("default", "p2").status()));
  // Deleting or finishing a pod that is gone is not an error.
  EXPECT_TRUE(DeletePod(*transport_, "default", "p1").ok());
  EXPECT_TRUE(Kubelet::Finish(*transport_, "default", "p1").ok());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10; ++i) {
    const absl::Duration d = Kubelet::Lifetime(absl::Seconds(2), absl::Seconds(4), rng);
    EXPECT_GE(d, absl::Seconds(2));
    EXPECT_LE(d, absl::Seconds(4));
  }
}

}  // namespace
}  // namespace tessera::sim

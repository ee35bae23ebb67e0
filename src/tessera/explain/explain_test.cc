#include "tessera/explain/explain.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/device/codec.h"
#include "tessera/testing/objects.h"

namespace tessera::explain {
namespace {

using ::tessera::testing::AllocatedPod;
using ::tessera::testing::GpuContainer;
using ::tessera::testing::GpuNode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kBig[] =
    R"([{"id":"GPU-A","count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-Tesla T4","health":true},)"
    R"({"id":"GPU-B","index":1,"count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-Tesla T4","health":true}])";
constexpr char kSmall[] = "GPU-S,10,4000,100,NVIDIA-Tesla P4,0,true,0,hami-core:";

class ExplainTest : public ::testing::Test {
 protected:
  ExplainTest() {
    input_.nodes = {GpuNode("big", kBig), GpuNode("small", kSmall)};
    kube::Node cpu;
    cpu.meta.name = "cpu";
    input_.nodes.push_back(cpu);
    input_.pods = {AllocatedPod("busy", "big", "GPU-A,NVIDIA,6000,10:;")};
    input_.now = absl::FromUnixSeconds(1700000000);
    Want("3000", "20");
  }

  void Want(std::string mem, std::string cores) {
    input_.pod = kube::Pod();
    input_.pod.meta.ns = "ml";
    input_.pod.meta.name = "new";
    input_.pod.meta.uid = "uid-new";
    input_.pod.containers = {GpuContainer("main", "1", mem, cores)};
  }

  ExplainResult Run() {
    absl::StatusOr<ExplainResult> r = Explain(*vendor_, input_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ExplainResult();
  }

  const ExplainNode& NodeOf(const ExplainResult& r, std::string_view name) {
    for (const ExplainNode& n : r.nodes) {
      if (n.name == name) {
        return n;
      }
    }
    ADD_FAILURE() << "no node " << name;
    return r.nodes.front();
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ExplainInput input_;
};

TEST_F(ExplainTest, TheNamespaceQuotaIsCheckedAndNamed) {
  kube::ResourceQuota q;
  q.meta.ns = "ml";
  q.meta.name = "gpu";
  q.hard.Set("limits.nvidia.com/gpumem", kube::ShortString("8000"));
  input_.quotas = {q};
  ExplainResult r = Run();
  EXPECT_FALSE(r.node.has_value());
  EXPECT_THAT(NodeOf(r, "big").reasons, ElementsAre("2/2 ResourceQuotaNotFit"));
  EXPECT_THAT(NodeOf(r, "small").reasons, ElementsAre("1/1 ResourceQuotaNotFit"));
  EXPECT_EQ(r.quota, "namespace ml: limits.nvidia.com/gpumem 8000, used 6000 + 3000 asked");
  EXPECT_THAT(RenderExplainText(r),
              HasSubstr("quota: namespace ml: limits.nvidia.com/gpumem 8000, used 6000 + 3000 "
                        "asked\n"));
  EXPECT_EQ(nlohmann::json::parse(RenderExplainJson(r))["quota"], r.quota);
  // 9000 takes it; another namespace is unlimited.
  q.hard.Set("limits.nvidia.com/gpumem", kube::ShortString("9000"));
  input_.quotas = {q};
  EXPECT_EQ(Run().node, "big");
  input_.pod.meta.ns = "other";
  q.hard.Set("limits.nvidia.com/gpumem", kube::ShortString("0"));
  input_.quotas = {q};
  EXPECT_EQ(Run().node, "big");
}

TEST_F(ExplainTest, BinpackPicksTheBusierNodeAndSpreadTheEmptyDevice) {
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(*r.node, "big");
  // GPU policy spread (the default) tries the least used device first: GPU-B.
  ASSERT_EQ(r.containers.size(), 1u);
  ASSERT_EQ(r.containers[0].size(), 1u);
  EXPECT_EQ(r.containers[0][0].uuid, "GPU-B");
  EXPECT_EQ(r.containers[0][0].type, "NVIDIA-Tesla T4");
  EXPECT_EQ(r.containers[0][0].index, 1);
  EXPECT_EQ(r.containers[0][0].mem_mib, 3000);
  EXPECT_EQ(r.containers[0][0].cores, 20);
  EXPECT_EQ(r.annotations, (kube::StringMap{
                               {"hami.io/vgpu-node", "big"},
                               {"hami.io/vgpu-time", "1700000000"},
                               {"hami.io/vgpu-devices-to-allocate", "GPU-B,NVIDIA,3000,20:;"},
                               {"hami.io/vgpu-devices-allocated", "GPU-B,NVIDIA,3000,20:;"},
                           }));
  EXPECT_EQ(r.labels, (kube::StringMap{{"hami.io/vgpu-node", "big"}}));
  EXPECT_THAT(NodeOf(r, "cpu").reasons, ElementsAre("node unregistered"));
  EXPECT_TRUE(NodeOf(r, "small").fit);
  EXPECT_GT(NodeOf(r, "big").score, NodeOf(r, "small").score);

  input_.node_policy = device::NodePolicy::kSpread;
  r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(*r.node, "small");
}

TEST_F(ExplainTest, PodAnnotationOverridesPolicies) {
  Want("1000", "20");
  input_.pod.meta.annotations.Set("hami.io/node-scheduler-policy", "spread");
  input_.pod.meta.annotations.Set("hami.io/gpu-scheduler-policy", "binpack");
  input_.nodes.pop_back();
  input_.nodes.erase(input_.nodes.begin() + 1);  // only "big"
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(r.node_policy, "spread");
  EXPECT_EQ(r.gpu_policy, "binpack");
  EXPECT_EQ(r.containers[0][0].uuid, "GPU-A");  // binpack: the fuller device first
}

TEST_F(ExplainTest, TopologyAwarePodsAreExplainedWithTheirPolicyAndScores) {
  // Three cards with the pair scores of HAMi v2.10 device_test.go, TestFit_TopologyWorstSingleCard
  // (0-1: 100, 0-2: 200, 1-2: 150): one GPU goes to the worst-connected card, GPU-1.
  kube::Node node = GpuNode(
      "topo",
      R"([{"id":"GPU-0","count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-A100","health":true},)"
      R"({"id":"GPU-1","index":1,"count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-A100","health":true},)"
      R"({"id":"GPU-2","index":2,"count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-A100","health":true}])");
  node.meta.annotations.Set("hami.io/node-nvidia-score",
                            R"([{"uuid":"GPU-0","score":{"GPU-1":100,"GPU-2":200}},)"
                            R"({"uuid":"GPU-1","score":{"GPU-0":100,"GPU-2":150}},)"
                            R"({"uuid":"GPU-2","score":{"GPU-0":200,"GPU-1":150}}])");
  input_.nodes = {node};
  input_.pods.clear();
  Want("1000", "10");
  input_.pod.meta.annotations.Set("hami.io/gpu-scheduler-policy", "topology-aware");
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(r.gpu_policy, "topology-aware");
  EXPECT_EQ(r.containers[0][0].uuid, "GPU-1");
  EXPECT_THAT(RenderExplainText(r), HasSubstr("topology-aware"));
  EXPECT_THAT(RenderExplainJson(r), HasSubstr(R"("gpu": "topology-aware")"));
  // Scores that do not decode: the node is unregistered for NVIDIA, as in HAMi.
  input_.nodes[0].meta.annotations.Set("hami.io/node-nvidia-score", "not-valid-json");
  r = Run();
  EXPECT_FALSE(r.node.has_value());
  EXPECT_THAT(NodeOf(r, "topo").reasons, ElementsAre("node unregistered"));
}

TEST_F(ExplainTest, ReasonsForEveryNodeThatDoesNotFit) {
  Want("9000", "");
  ExplainResult r = Run();
  EXPECT_FALSE(r.node.has_value());
  EXPECT_THAT(NodeOf(r, "big").reasons, ElementsAre("2/2 CardInsufficientMemory"));
  EXPECT_THAT(NodeOf(r, "small").reasons, ElementsAre("1/1 CardInsufficientMemory"));
  EXPECT_THAT(NodeOf(r, "cpu").reasons, ElementsAre("node unregistered"));
  EXPECT_TRUE(r.annotations.empty());
  EXPECT_THAT(RenderExplainText(r), HasSubstr("fits no node"));
}

TEST_F(ExplainTest, TerminalAndFailedPodsHoldNothing) {
  Want("7000", "");
  // GPU-A is busy (6000 of 8000), so 7000 only fits GPU-B.
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(r.containers[0][0].uuid, "GPU-B");
  input_.pods.push_back(AllocatedPod("done", "big", "GPU-B,NVIDIA,8000,100:;"));
  input_.pods.back().phase = kube::PodPhase::kSucceeded;
  input_.pods.push_back(AllocatedPod("failed", "big", "GPU-B,NVIDIA,8000,100:;"));
  input_.pods.back().meta.annotations.Set("hami.io/bind-phase", "failed");
  r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(*r.node, "big");
  // A running pod on GPU-B fills the node.
  input_.pods.push_back(AllocatedPod("full", "big", "GPU-B,NVIDIA,8000,100:;"));
  r = Run();
  EXPECT_FALSE(r.node.has_value()) << RenderExplainText(r);
  EXPECT_THAT(NodeOf(r, "big").reasons, ElementsAre("2/2 CardInsufficientMemory"));
}

TEST_F(ExplainTest, InFlightPodsCountOnlyWithinTheReservationTtl) {
  Want("5000", "");
  kube::Pod inflight = AllocatedPod("inflight", "big", "GPU-B,NVIDIA,8000,100:;");
  inflight.node_name.clear();
  inflight.meta.annotations.Erase("hami.io/bind-phase");
  inflight.meta.annotations.Set("hami.io/vgpu-time", "1699999940");  // 60 s ago
  input_.pods.push_back(inflight);
  input_.nodes.pop_back();
  input_.nodes.pop_back();  // only "big"
  ExplainResult r = Run();
  EXPECT_FALSE(r.node.has_value()) << RenderExplainText(r);
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("not bound yet")));

  input_.pods.back().meta.annotations.Set("hami.io/vgpu-time", "1699990000");  // hours ago
  r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("holds nothing")));
}

TEST_F(ExplainTest, InitAndAppContainerOnOneGpuCountTheMaxNotTheSum) {
  // One 8000 MiB GPU. "staged" has an init container and an app container, 6000 MiB each, on
  // it (init containers first in the allocation): it occupies max(6000, 6000) = 6000 MiB, not
  // 12000, so 2000 MiB are left — exactly what the fit computed when it placed "staged".
  input_.nodes = {GpuNode("one", "GPU-O,10,8000,100,NVIDIA-Tesla T4,0,true,0,hami-core:")};
  kube::Pod staged = AllocatedPod("staged", "one", "GPU-O,NVIDIA,6000,10:;GPU-O,NVIDIA,6000,30:;");
  staged.init_containers.push_back(GpuContainer("warmup", "1", "6000", "10"));
  input_.pods = {staged};
  Want("2000", "60");
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value()) << RenderExplainText(r);
  EXPECT_EQ(*r.node, "one");
  EXPECT_EQ(r.containers[0][0].uuid, "GPU-O");
  // One MiB more does not fit: the 6000 MiB are really held. Cores are max(10, 30) = 30, so
  // 71% does not fit either.
  Want("2001", "");
  r = Run();
  EXPECT_FALSE(r.node.has_value()) << RenderExplainText(r);
  EXPECT_THAT(NodeOf(r, "one").reasons, ElementsAre("1/1 CardInsufficientMemory"));
  Want("1000", "71");
  r = Run();
  EXPECT_THAT(NodeOf(r, "one").reasons, ElementsAre("1/1 CardInsufficientCore"));

  // The same pod in flight (annotated, unbound, filtered 60 s ago) is a reservation that
  // collapses the same way.
  input_.pods[0].node_name.clear();
  input_.pods[0].meta.annotations.Erase("hami.io/bind-phase");
  input_.pods[0].meta.annotations.Set("hami.io/vgpu-time", "1699999940");
  Want("2000", "");
  r = Run();
  ASSERT_TRUE(r.node.has_value()) << RenderExplainText(r);
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("not bound yet")));
  Want("2001", "");
  r = Run();
  EXPECT_FALSE(r.node.has_value()) << RenderExplainText(r);

  // Without the init container both entries are app containers and add up: 12000 MiB on an
  // 8000 MiB GPU, so nothing else fits.
  input_.pods = {AllocatedPod("staged", "one", "GPU-O,NVIDIA,6000,10:;GPU-O,NVIDIA,6000,30:;")};
  input_.pods[0].containers.push_back(GpuContainer("second", "1", "6000", "30"));
  Want("1", "");
  r = Run();
  EXPECT_FALSE(r.node.has_value()) << RenderExplainText(r);
}

TEST_F(ExplainTest, PodWithoutRequestPassesThrough) {
  input_.pod.containers = {kube::Container()};
  ExplainResult r = Run();
  EXPECT_TRUE(r.no_request);
  EXPECT_FALSE(r.node.has_value());
  EXPECT_THAT(RenderExplainText(r), HasSubstr("requests no GPU"));
}

TEST_F(ExplainTest, MalformedRequestIsAnError) {
  Want("lots", "");
  absl::StatusOr<ExplainResult> r = Explain(*vendor_, input_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("nvidia.com/gpumem"));
}

TEST_F(ExplainTest, BrokenClusterObjectsBecomeWarnings) {
  input_.nodes.push_back(GpuNode("broken", "GPU-X,1,2:"));
  input_.pods.push_back(AllocatedPod("garbled", "big", "GPU-A,NVIDIA;"));
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_THAT(NodeOf(r, "broken").reasons, ElementsAre("node unregistered"));
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("node broken")));
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("pod ml/garbled")));
}

TEST_F(ExplainTest, ARunningPodWithAnUnreadableAllocationBlocksItsNode) {
  // HAMi #2958: which GPU of "big" the pod uses is unknown, so none is offered.
  input_.pods.push_back(AllocatedPod("garbled", "big", "GPU-A,NVIDIA,lots,10:;"));
  ExplainResult r = Run();
  ASSERT_TRUE(r.node.has_value());
  EXPECT_EQ(*r.node, "small");
  EXPECT_FALSE(NodeOf(r, "big").fit);
  EXPECT_THAT(NodeOf(r, "big").reasons,
              ElementsAre("node has an allocation Tessera cannot read (pod ml/garbled)"));
  EXPECT_THAT(r.warnings, ::testing::Contains(HasSubstr("pod ml/garbled")));
  EXPECT_THAT(r.warnings,
              ::testing::Contains(HasSubstr("keeps node big unavailable until it is fixed")));
  EXPECT_THAT(RenderExplainText(r), HasSubstr("cannot read (pod ml/garbled)"));
  // Once it has finished, the node is offered again.
  input_.pods.back().phase = kube::PodPhase::kSucceeded;
  r = Run();
  EXPECT_TRUE(NodeOf(r, "big").fit);
}

TEST_F(ExplainTest, JsonFollowsTheDocumentedSchema) {
  ExplainResult r = Run();
  nlohmann::json doc = nlohmann::json::parse(RenderExplainJson(r));
  EXPECT_EQ(doc["pod"], "ml/new");
  EXPECT_EQ(doc["node"], "big");
  ASSERT_EQ(doc["containers"].size(), 1u);
  EXPECT_EQ(doc["containers"][0][0]["uuid"], "GPU-B");
  EXPECT_EQ(doc["containers"][0][0]["type"], "NVIDIA-Tesla T4");
  EXPECT_EQ(doc["containers"][0][0]["memMiB"], 3000);
  EXPECT_EQ(doc["containers"][0][0]["cores"], 20);
  EXPECT_EQ(doc["annotations"]["hami.io/vgpu-devices-allocated"], "GPU-B,NVIDIA,3000,20:;");
  EXPECT_EQ(doc["nodes"]["cpu"]["fit"], false);
  EXPECT_EQ(doc["nodes"]["cpu"]["reasons"][0], "node unregistered");
  EXPECT_TRUE(doc["nodes"]["big"]["score"].is_number());
  Want("9000", "");
  doc = nlohmann::json::parse(RenderExplainJson(Run()));
  EXPECT_TRUE(doc["node"].is_null());
  EXPECT_TRUE(doc["containers"].empty());
}

}  // namespace
}  // namespace tessera::explain

namespace tessera::explain {
namespace {

// A MIG pod that fits nowhere names, per MIG card, the smallest adequate profile, the placement
// the fewest instances block and those instances (docs/mig.md; the worked example's 15000 MiB
// pod on an A100-40GB holding 1g at 6 and 5 and 2g at 0: HAMi v2.10 CardMigTopologyInfeasible).
TEST(ExplainMigTest, AMigPodThatFitsNowhereNamesTheBlockingInstances) {
  auto devices = ::tessera::testing::MigNodeDevices("a100", {"GPU-m0"});
  ExplainInput input;
  input.nodes = {
      ::tessera::testing::GpuNode("a100", device::EncodeNodeRegisterJson(devices->devices))};
  auto holder = [](const std::string& name, const std::string& allocated, int start, int size,
                   const std::string& profile) {
    kube::Pod p = ::tessera::testing::AllocatedPod(name, "a100", allocated);
    p.meta.annotations.Set(
        "hami.io/vgpu-mig-allocations",
        R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m0","profile":")" + profile +
            R"(","placement":{"start":)" + std::to_string(start) + R"(,"size":)" +
            std::to_string(size) + "}}]");
    return p;
  };
  input.pods = {holder("a", "GPU-m0,NVIDIA,4864,15:;", 6, 1, "1g.5gb"),
                holder("b", "GPU-m0,NVIDIA,4864,15:;", 5, 1, "1g.5gb"),
                holder("c", "GPU-m0,NVIDIA,9856,29:;", 0, 2, "2g.10gb")};
  input.now = absl::FromUnixSeconds(1700000000);
  input.pod.meta.ns = "ml";
  input.pod.meta.name = "big";
  input.pod.meta.uid = "uid-big";
  input.pod.containers = {::tessera::testing::GpuContainer("main", "1", "15000", "0")};
  auto vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  absl::StatusOr<ExplainResult> r = Explain(*vendor, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->node.has_value());
  ASSERT_EQ(r->nodes.size(), 1U);
  EXPECT_THAT(r->nodes[0].reasons, ElementsAre("1/1 CardMigTopologyInfeasible"));
  constexpr char kWhy[] =
      "GPU-m0: 3g.20gb (19968 MiB): no free placement; slices 0-3 would be free without the "
      "instance at slices 0-1";
  EXPECT_THAT(r->nodes[0].mig, ElementsAre(kWhy));
  EXPECT_THAT(RenderExplainText(*r), HasSubstr(std::string("mig: node a100, card ") + kWhy));
  EXPECT_EQ(nlohmann::json::parse(RenderExplainJson(*r))["nodes"]["a100"]["mig"][0], kWhy);
  // 8000 MiB fits (2g at 2): no MIG lines.
  input.pod.containers = {::tessera::testing::GpuContainer("main", "1", "8000", "0")};
  r = Explain(*vendor, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node, "a100");
  EXPECT_TRUE(r->nodes[0].mig.empty());
  EXPECT_THAT(std::string(r->annotations.Get("hami.io/vgpu-mig-allocations")),
              HasSubstr(R"("profile":"2g.10gb","placement":{"start":2,"size":2}})"));
}

}  // namespace
}  // namespace tessera::explain

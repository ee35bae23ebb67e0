#include "tessera/schedule/score.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::DeviceInfo;
using device::DeviceUsage;
using device::GpuPolicy;
using device::GpuPolicyKey;
using device::NodeDevices;
using device::NodePolicy;
using device::NodeSnapshot;
using device::PodConstraints;
using device::PodRequest;
using ::testing::ElementsAre;

const GpuPolicy kSpread{{GpuPolicyKey::kSpread}};
const GpuPolicy kBinpack{{GpuPolicyKey::kBinpack}};

DeviceInfo Gpu(const std::string& node, int index, int32_t mem = 8000) {
  DeviceInfo d;
  d.id = "GPU-" + node + "-" + std::to_string(index);
  d.index = index;
  d.count = 10;
  d.devmem = mem;
  d.devcore = 100;
  d.type = "NVIDIA-Tesla V100";
  return d;
}

Candidate Registered(const std::string& name, std::vector<DeviceUsage> usage, int gpus = 2) {
  auto nd = std::make_shared<NodeDevices>();
  nd->node = name;
  for (int i = 0; i < gpus; ++i) {
    nd->devices.push_back(Gpu(name, i));
  }
  usage.resize(nd->devices.size());
  NodeSnapshot s;
  s.devices = std::move(nd);
  s.usage.assign(usage.begin(), usage.end());
  return Candidate{name, std::move(s)};
}

PodRequest OneGpu(int32_t mem, int32_t cores) {
  ContainerRequest r;
  r.nums = 1;
  r.memreq = mem;
  r.coresreq = cores;
  PodRequest p;
  p.containers = {r};
  return p;
}

// HAMi's Test_Filter cluster: two nodes with two 8000 MiB GPUs each; node1 holds a
// 2000 MiB / 25 % allocation on GPU 0, node2 a 6000 MiB / 75 % one.
std::vector<Candidate> FilterCluster() {
  return {Registered("node1", {{1, 2000, 25}}), Registered("node2", {{1, 6000, 75}})};
}

TEST(NodeScoreTest, TestFilterWorkedExample) {
  auto c = FilterCluster();
  EXPECT_NEAR(ComputeNodeScore(*c[0].snapshot), 3.0, 1e-9);
  EXPECT_NEAR(ComputeNodeScore(*c[1].snapshot), 8.0, 1e-9);
}

TEST(NodeScoreTest, ZeroTotalsScoreZero) {
  auto c = Registered("n", {{1, 100, 10}}, 1);
  auto nd = std::make_shared<NodeDevices>(*c.snapshot->devices);
  nd->devices[0].devcore = 0;
  c.snapshot->devices = nd;
  EXPECT_EQ(ComputeNodeScore(*c.snapshot), 0);
  EXPECT_EQ(ComputeNodeScore(NodeSnapshot{}), 0);
}

struct PolicyCase {
  NodePolicy node_policy;
  GpuPolicy gpu_policy;
  std::string winner;
  std::string uuid;
};

TEST(DecideTest, FourPolicyCombinations) {
  // The pod fits the busy GPU on both nodes (node2: 2000 MiB and 25 % left).
  const std::vector<PolicyCase> cases = {
      {NodePolicy::kBinpack, kBinpack, "node2", "GPU-node2-0"},
      {NodePolicy::kBinpack, kSpread, "node2", "GPU-node2-1"},
      {NodePolicy::kSpread, kBinpack, "node1", "GPU-node1-0"},
      {NodePolicy::kSpread, kSpread, "node1", "GPU-node1-1"},
  };
  auto cluster = FilterCluster();
  for (const auto& tc : cases) {
    Decision d = Decide(cluster, OneGpu(1000, 20), {}, tc.node_policy, tc.gpu_policy);
    ASSERT_TRUE(d.winner.has_value());
    EXPECT_EQ(cluster[*d.winner].name, tc.winner);
    ASSERT_EQ(d.devices.size(), 1u);
    EXPECT_THAT(d.devices[0], ElementsAre(device::ContainerDevice{tc.uuid, "NVIDIA", 1000, 20}));
    ASSERT_EQ(d.nodes.size(), 2u);
    EXPECT_TRUE(d.nodes[0].fit);
    EXPECT_TRUE(d.nodes[1].fit);
    EXPECT_NEAR(d.nodes[0].score, 3.0, 1e-9);
    EXPECT_NEAR(d.nodes[1].score, 8.0, 1e-9);
    EXPECT_EQ(d.nodes[0].score, ComputeNodeScore(*cluster[0].snapshot));
    EXPECT_EQ(d.nodes[1].score, ComputeNodeScore(*cluster[1].snapshot));
    EXPECT_EQ(d.nodes[0].node, "node1");
  }
}

TEST(DecideTest, PodAnnotationsOverrideDefaults) {
  auto cluster = FilterCluster();
  PodConstraints c;
  c.node_policy = NodePolicy::kSpread;
  c.gpu_policy = kBinpack;
  Decision d = Decide(cluster, OneGpu(1000, 20), c, NodePolicy::kBinpack, kSpread);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 0u);
  EXPECT_EQ(d.devices[0][0].uuid, "GPU-node1-0");
}

TEST(DecideTest, FailingNodesCarryReasons) {
  auto cluster = FilterCluster();
  cluster.push_back(Candidate{"ghost", std::nullopt});
  // 3000 MiB and 30 % only fit node1 (node2's busy card has 2000 MiB / 25 % left and its idle
  // card would do, so make the request 2 GPUs to exclude node2).
  ContainerRequest r;
  r.nums = 2;
  r.memreq = 3000;
  r.coresreq = 30;
  PodRequest pod;
  pod.containers = {r};
  Decision d = Decide(cluster, pod, {}, NodePolicy::kBinpack, kSpread);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 0u);
  ASSERT_EQ(d.nodes.size(), 3u);
  EXPECT_TRUE(d.nodes[0].fit);
  EXPECT_TRUE(d.nodes[0].reason.empty());
  EXPECT_FALSE(d.nodes[1].fit);
  EXPECT_EQ(d.nodes[1].failed_container, 0);
  EXPECT_EQ(d.nodes[1].reason, "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory");
  EXPECT_THAT(d.nodes[1].reasons.Strings(),
              ElementsAre("1/2 AllocatedCardsInsufficientRequest", "1/2 CardInsufficientMemory"));
  EXPECT_FALSE(d.nodes[2].fit);
  EXPECT_EQ(d.nodes[2].reason, "node unregistered");
  EXPECT_TRUE(d.nodes[2].reasons.empty());
  EXPECT_EQ(d.nodes[2].node, "ghost");
  // The winner's devices: two GPUs of node1.
  ASSERT_EQ(d.devices.size(), 1u);
  EXPECT_EQ(d.devices[0].size(), 2u);
}

TEST(DecideTest, NoFittingNode) {
  auto cluster = FilterCluster();
  Decision d = Decide(cluster, OneGpu(9000, 0), {}, NodePolicy::kBinpack, kSpread);
  EXPECT_FALSE(d.winner.has_value());
  EXPECT_TRUE(d.devices.empty());
  for (const auto& n : d.nodes) {
    EXPECT_FALSE(n.fit);
    EXPECT_EQ(n.reason, "2/2 CardInsufficientMemory");
  }
}

TEST(DecideTest, BlockedNodeIsRefusedWithTheBlockingPod) {
  auto cluster = FilterCluster();
  // node2 (score 8) would win under binpack; blocked, node1 wins.
  cluster[1].snapshot->blocked_by = "ml/broken";
  Decision d = Decide(cluster, OneGpu(1000, 0), {}, NodePolicy::kBinpack, kSpread);
  EXPECT_FALSE(d.nodes[1].fit);
  EXPECT_EQ(d.nodes[1].reason, "node has an allocation Tessera cannot read (pod ml/broken)");
  EXPECT_TRUE(d.nodes[1].reasons.empty());
  EXPECT_EQ(d.nodes[1].failed_container, -1);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 0u);
  // FitPod says the same.
  schedule::FitResult fit = FitPod(*cluster[1].snapshot, OneGpu(1000, 0), {}, kSpread);
  EXPECT_FALSE(fit.fit);
  EXPECT_EQ(fit.reason, d.nodes[1].reason);
  // As a metric label the pod name is dropped.
  EXPECT_EQ(ReasonLabel(fit.reason), "node has an allocation Tessera cannot read");
  EXPECT_EQ(ReasonLabel("CardInsufficientMemory"), "CardInsufficientMemory");
}

TEST(DecideTest, MalformedSnapshotIsUsageUnavailable) {
  auto cluster = FilterCluster();
  cluster[1].snapshot->usage.clear();
  Decision d = Decide(cluster, OneGpu(1000, 0), {}, NodePolicy::kBinpack, kSpread);
  EXPECT_EQ(d.nodes[1].reason, "node usage unavailable");
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 0u);
}

TEST(DecideTest, TiesGoToTheSmallestNodeName) {
  std::vector<Candidate> cluster = {Registered("node-c", {}), Registered("node-a", {}),
                                    Registered("node-b", {})};
  for (NodePolicy p : {NodePolicy::kBinpack, NodePolicy::kSpread}) {
    Decision d = Decide(cluster, OneGpu(1000, 0), {}, p, kSpread);
    ASSERT_TRUE(d.winner.has_value());
    EXPECT_EQ(cluster[*d.winner].name, "node-a");
  }
}

// A node whose lock another pod's bind holds loses to any fitting node that is free to bind,
// whatever the policy prefers; busy nodes are still chosen when nothing else fits, and among
// them (or among free ones) the policy decides as before.
TEST(DecideTest, AFittingNodeFreeToBindBeatsBusyOnes) {
  for (NodePolicy p : {NodePolicy::kBinpack, NodePolicy::kSpread}) {
    SCOPED_TRACE(p == NodePolicy::kBinpack ? "binpack" : "spread");
    auto cluster = FilterCluster();  // binpack prefers node2, spread node1
    const size_t preferred = p == NodePolicy::kBinpack ? 1 : 0;
    cluster[preferred].busy = true;
    Decision d = Decide(cluster, OneGpu(1000, 20), {}, p, kSpread);
    ASSERT_TRUE(d.winner.has_value());
    EXPECT_EQ(*d.winner, 1 - preferred);
    EXPECT_TRUE(d.nodes[preferred].fit);  // busy is no failure: no reason, still scored
    EXPECT_TRUE(d.nodes[preferred].reason.empty());

    cluster[1 - preferred].busy = true;  // every node busy: the policy's choice again
    d = Decide(cluster, OneGpu(1000, 20), {}, p, kSpread);
    ASSERT_TRUE(d.winner.has_value());
    EXPECT_EQ(*d.winner, preferred);
  }
  // A free node that does not fit is no alternative.
  std::vector<Candidate> cluster = {Registered("full", {{1, 8000, 0}, {1, 8000, 0}}),
                                    Registered("busy", {})};
  cluster[1].busy = true;
  Decision d = Decide(cluster, OneGpu(1000, 0), {}, NodePolicy::kSpread, kSpread);
  EXPECT_FALSE(d.nodes[0].fit);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 1u);
}

TEST(DecideTest, PodWithoutRequestPassesEveryNode) {
  auto cluster = FilterCluster();
  cluster.push_back(Candidate{"ghost", std::nullopt});
  PodRequest pod;
  pod.containers = {std::nullopt, ContainerRequest{}};  // nums 0
  Decision d = Decide(cluster, pod, {}, NodePolicy::kBinpack, kSpread);
  EXPECT_TRUE(d.no_request);
  EXPECT_FALSE(d.winner.has_value());
  for (const auto& n : d.nodes) {
    EXPECT_TRUE(n.fit);
  }
}

TEST(DecideTest, ScoreIsBeforePlacementAndConstraintsApply) {
  // Type filter: only node2 has an A100.
  auto cluster = FilterCluster();
  auto nd = std::make_shared<NodeDevices>(*cluster[1].snapshot->devices);
  nd->devices[1].type = "NVIDIA A100-PCIE-40GB";
  cluster[1].snapshot->devices = nd;
  PodConstraints c;
  c.use_types = {"A100"};
  Decision d = Decide(cluster, OneGpu(1000, 0), c, NodePolicy::kSpread, kSpread);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 1u);
  EXPECT_EQ(d.devices[0][0].uuid, "GPU-node2-1");
  EXPECT_EQ(d.nodes[0].reason, "2/2 CardTypeMismatch");
  EXPECT_NEAR(d.nodes[1].score, 8.0, 1e-9);
}

TEST(DecideTest, MultiContainerPodOnWinner) {
  auto cluster = FilterCluster();
  ContainerRequest a;
  a.nums = 1;
  a.memreq = 1000;
  a.coresreq = 10;
  PodRequest pod;
  pod.containers = {std::nullopt, a, a};
  pod.init_count = 1;
  Decision d = Decide(cluster, pod, {}, NodePolicy::kSpread, kSpread);
  ASSERT_TRUE(d.winner.has_value());
  EXPECT_EQ(*d.winner, 0u);
  ASSERT_EQ(d.devices.size(), 3u);
  EXPECT_TRUE(d.devices[0].empty());
  ASSERT_EQ(d.devices[1].size(), 1u);
  ASSERT_EQ(d.devices[2].size(), 1u);
  // Spread goes by score, not by distinctness: after the first container GPU 1 of node1 scores
  // 3.25 against GPU 0's 6.0, so the second container joins it.
  EXPECT_EQ(d.devices[1][0].uuid, "GPU-node1-1");
  EXPECT_EQ(d.devices[2][0].uuid, "GPU-node1-1");
}

}  // namespace
}  // namespace tessera::schedule

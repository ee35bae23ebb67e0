// Tests of the Ascend fit rules (vendors/ascend_fit.h) through FitPod: HAMi v2.10.0's
// pkg/device/ascend Fit, check by check; the generated differential against HAMi's own code is
// ascend_hami_test.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/schedule/fit.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::DeviceInfo;
using device::DeviceUsage;
using device::GpuPolicy;
using device::GpuPolicyKey;
using device::NetworkKey;
using device::NodeDevices;
using device::NodeSnapshot;
using device::PodConstraints;
using device::PodRequest;

const GpuPolicy kSpread{{GpuPolicyKey::kSpread}};

DeviceInfo Npu(int index, std::string type = "Ascend910B3", std::optional<int64_t> network = {}) {
  DeviceInfo d;
  d.id = "npu-" + std::to_string(index);
  d.index = index;
  d.count = 4;
  d.devmem = 65536;
  d.devcore = 20;
  d.type = std::move(type);
  if (network.has_value()) {
    d.network_key = NetworkKey::kNumber;
    d.network_id = *network;
  }
  return d;
}

NodeSnapshot Node(std::vector<DeviceInfo> devices, std::vector<DeviceUsage> usage = {},
                  bool hami_core_allowed = false) {
  auto nd = std::make_shared<NodeDevices>();
  nd->node = "npu-node";
  nd->devices = std::move(devices);
  nd->hami_core_allowed = hami_core_allowed;
  usage.resize(nd->devices.size());
  NodeSnapshot s;
  s.usage.assign(usage.begin(), usage.end());
  s.devices = std::move(nd);
  return s;
}

ContainerRequest Req(int32_t nums, int32_t mem, int32_t cores = 0,
                     std::string type = "Ascend910B3") {
  ContainerRequest r;
  r.nums = nums;
  r.type = std::move(type);
  r.family = device::DeviceFamily::kAscend;
  r.memreq = mem;
  r.mem_percentage = mem == 0 ? 100 : device::kPercentageUnset;
  r.coresreq = cores;
  return r;
}

FitResult Fit(const NodeSnapshot& node, const ContainerRequest& req, PodConstraints c = {}) {
  PodRequest pod;
  pod.containers = {req};
  return FitPod(node, pod, c, kSpread);
}

std::vector<std::string> Uuids(const FitResult& r) {
  std::vector<std::string> out;
  for (const auto& container : r.devices) {
    for (const auto& d : container) {
      out.push_back(d.uuid);
    }
  }
  return out;
}

// A card fully used by time slicing.
const DeviceUsage kFull{4, 0, 0};

TEST(AscendFitTest, TakesFromTheEndWithTheChipAsType) {
  FitResult r = Fit(Node({Npu(0), Npu(1)}), Req(1, 16384));
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices.size(), 1U);
  ASSERT_EQ(r.devices[0].size(), 1U);
  EXPECT_EQ(r.devices[0][0].uuid, "npu-1");
  EXPECT_EQ(r.devices[0][0].type, "Ascend910B3");
  EXPECT_EQ(r.devices[0][0].usedmem, 16384);
}

TEST(AscendFitTest, WithoutMemoryTheWholeCard) {
  FitResult r = Fit(Node({Npu(0)}), Req(1, 0));
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.devices[0][0].usedmem, 65536);
  r = Fit(Node({Npu(0)}, {DeviceUsage{1, 1, 0}}), Req(1, 0));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/1 CardInsufficientMemory");
}

TEST(AscendFitTest, TypesCompareExactlyNotAsSubstrings) {
  // HAMi's candidate list takes the Ascend910B4-1 card for an Ascend910B4 request (substring);
  // Tessera's rule refuses it as a card of another type.
  NodeSnapshot node = Node({Npu(0, "Ascend910B4"), Npu(1, "Ascend910B4-1")});
  FitResult r = Fit(node, Req(1, 8192, 0, "Ascend910B4"));
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r), ::testing::ElementsAre("npu-0"));
  r = Fit(node, Req(2, 32768, 0, "Ascend910B4"));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/2 AllocatedCardsInsufficientRequest, 1/2 CardTypeMismatch");
}

TEST(AscendFitTest, HamiCoreNeedsTheNodesConsent) {
  PodConstraints core;
  core.vgpu_mode = "hami-core";
  FitResult r = Fit(Node({Npu(0), Npu(1)}), Req(1, 1000, 50), core);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/2 ModeNotFit");
  // Allowed: a card counts 100 cores whatever it registered (devcore 20 here).
  r = Fit(Node({Npu(0)}, {}, true), Req(1, 1000, 50), core);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.devices[0][0].usedcores, 50);
  r = Fit(Node({Npu(0)}, {DeviceUsage{1, 1000, 60}}, true), Req(1, 1000, 50), core);
  EXPECT_EQ(r.reason, "1/1 CardInsufficientCore");
  // 100 cores asks for the card alone.
  r = Fit(Node({Npu(0)}, {DeviceUsage{1, 1000, 0}}, true), Req(1, 1000, 100), core);
  EXPECT_EQ(r.reason, "1/1 ExclusiveDeviceAllocateConflict");
  // Outside hami-core the registered cores count: 20 used of 20 leaves no room for a 0-core pod.
  r = Fit(Node({Npu(0)}, {DeviceUsage{1, 1000, 20}}), Req(1, 1000, 0));
  EXPECT_EQ(r.reason, "1/1 CardComputeUnitsExhausted");
}

TEST(AscendFitTest, UuidSelectorsAndHealthAndSlicing) {
  NodeSnapshot node = Node({Npu(0), Npu(1), Npu(2)}, {{}, kFull, {}});
  auto nd = std::make_shared<NodeDevices>(*node.devices);
  nd->devices[0].health = false;
  node.devices = nd;
  PodConstraints c;
  c.nouse_uuids = {"npu-2"};
  FitResult r = Fit(node, Req(1, 1000), c);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted, 1/3 CardUuidMismatch");
  // A selector of blank tokens matches no card.
  PodConstraints blank;
  blank.use_uuids = {"", ""};
  r = Fit(Node({Npu(0)}), Req(1, 1000), blank);
  EXPECT_EQ(r.reason, "1/1 CardUuidMismatch");
}

TEST(AscendFitTest, Ascend910TakesTheLargestNetworkGroup) {
  // Networks as the plugin registers them: index 0-3 on 0, 4-7 on 1; three of network 1 full.
  std::vector<DeviceInfo> cards;
  for (int i = 0; i < 8; ++i) {
    cards.push_back(Npu(i, "Ascend910A", i > 3 ? 1 : 0));
  }
  NodeSnapshot node = Node(cards, {{}, {}, {}, {}, kFull, kFull, kFull, {}});
  FitResult r = Fit(node, Req(2, 1000, 0, "Ascend910A"));
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r), ::testing::ElementsAre("npu-3", "npu-2"));
  // One card: the first passing one in visiting order, whatever its network.
  r = Fit(node, Req(1, 1000, 0, "Ascend910A"));
  EXPECT_THAT(Uuids(r), ::testing::ElementsAre("npu-7"));
  // Without a NetworkID on every candidate there is no grouping: the first two passing.
  cards[0].network_key = NetworkKey::kNone;
  r = Fit(Node(cards, {{}, {}, {}, {}, kFull, kFull, kFull, {}}), Req(2, 1000, 0, "Ascend910A"));
  EXPECT_THAT(Uuids(r), ::testing::ElementsAre("npu-7", "npu-3"));
}

TEST(AscendFitTest, Ascend910CTakesWholeModulePairs) {
  std::vector<DeviceInfo> cards;
  for (int i = 0; i < 4; ++i) {
    cards.push_back(Npu(i, "Ascend910C", 0));
  }
  // Module 0 (index 0, 1) has a full NPU: module 1 is taken.
  FitResult r = Fit(Node(cards, {{}, kFull, {}, {}}), Req(2, 0, 0, "Ascend910C"));
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r), ::testing::ElementsAre("npu-3", "npu-2"));
  // Four NPUs: one whole module only. HAMi counts against the request.
  r = Fit(Node(cards, {{}, kFull, {}, {}}), Req(4, 0, 0, "Ascend910C"));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/4 CardTimeSlicingExhausted, 2/4 AllocatedCardsInsufficientRequest");
  // No whole module: HAMi still names AllocatedCardsInsufficientRequest, with 0.
  r = Fit(Node(cards, {{}, kFull, kFull, {}}), Req(2, 0, 0, "Ascend910C"));
  EXPECT_EQ(r.reason, "0/2 AllocatedCardsInsufficientRequest, 2/2 CardTimeSlicingExhausted");
  // An odd request past the webhook takes more NPUs than asked, which fails.
  r = Fit(Node(cards), Req(3, 0, 0, "Ascend910C"));
  EXPECT_EQ(r.reason, "4/3 AllocatedCardsInsufficientRequest");
}

}  // namespace
}  // namespace tessera::schedule

// The MIG fit inside the pod fit (fit.h with mig_fit.h): vectors from HAMi v2.10.0
// pkg/device/nvidia/device.go (Fit, CustomFilterRule, AddResourceUsage, selectMigCandidate),
// pkg/scheduler/score.go (fitInDevices, isMIGRequest) and the protocol reference's worked
// A100-40GB example (§2.4); the comment above each test names its source.
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::MigCardUsage;
using device::MigPlacement;
using device::MigReservation;
using device::NodeSnapshot;
using device::PodConstraints;
using device::PodRequest;

const device::GpuPolicy kSpread{{device::GpuPolicyKey::kSpread}};

NodeSnapshot MigNode(size_t cards, std::vector<MigCardUsage> mig = {}) {
  std::vector<std::string> uuids;
  for (size_t i = 0; i < cards; ++i) {
    uuids.push_back("GPU-m" + std::to_string(i));
  }
  NodeSnapshot s;
  s.devices = ::tessera::testing::MigNodeDevices("m1", uuids);
  s.usage.resize(cards);
  s.mig = std::move(mig);
  return s;
}

ContainerRequest Mem(int32_t nums, int32_t mem) {
  ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  return r;
}

FitResult Fit(const NodeSnapshot& node, std::vector<std::optional<ContainerRequest>> containers,
              size_t init_count = 0, const PodConstraints& constraints = {}) {
  PodRequest pod;
  pod.containers = std::move(containers);
  pod.init_count = init_count;
  return FitPod(node, pod, constraints, kSpread);
}

// The placement each instance of a successful fit got, in pod order.
std::vector<MigPlacement> Placements(const FitResult& r) {
  std::vector<MigPlacement> out;
  for (const auto& c : r.mig) {
    for (const auto& d : c) {
      if (d.has_value()) {
        out.push_back(d->placement);
      }
    }
  }
  return out;
}

// Worked example (reference §2.4): 4000 MiB gets 1g.5gb at start 6, booked at the profile's
// 4864 MiB / 15 cores (AddResourceUsage); then 1g at 5, 2g.10gb at 0, and 15000 MiB fits nowhere.
TEST(MigPodFitTest, TheWorkedExampleSequence) {
  FitResult r = Fit(MigNode(1), {Mem(1, 4000)});
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices[0].size(), 1U);
  EXPECT_EQ(r.devices[0][0].uuid, "GPU-m0");
  EXPECT_EQ(r.devices[0][0].usedmem, 4864);
  EXPECT_EQ(r.devices[0][0].usedcores, 15);
  ASSERT_EQ(r.mig.size(), 1U);
  EXPECT_EQ(r.mig[0][0], (MigReservation{"1g.5gb", {6, 1}}));
  EXPECT_EQ(r.usage_after[0].usedmem, 4864);
  EXPECT_EQ(r.usage_after[0].used, 1);

  std::vector<MigCardUsage> held = {{{{6, 1}}, false}};
  r = Fit(MigNode(1, held), {Mem(1, 4000)});
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.mig[0][0], (MigReservation{"1g.5gb", {5, 1}}));

  held[0].occupied.push_back({5, 1});
  r = Fit(MigNode(1, held), {Mem(1, 8000)});
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.mig[0][0], (MigReservation{"2g.10gb", {0, 2}}));
  EXPECT_EQ(r.devices[0][0].usedmem, 9856);

  held[0].occupied.push_back({0, 2});
  r = Fit(MigNode(1, held), {Mem(1, 15000)});
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/1 CardMigTopologyInfeasible");
}

// score.go isMIGRequest: Nums may exceed the cards on a node with a mig card, and device.go Fit
// visits a MIG card again after taking it, so one container gets several instances of one card,
// each at its own placement (CustomFilterRule replays the container's earlier picks).
TEST(MigPodFitTest, OneContainerTakesSeveralInstancesOfOneCard) {
  FitResult r = Fit(MigNode(1), {Mem(3, 4000)});
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices[0].size(), 3U);
  EXPECT_THAT(Placements(r),
              ::testing::ElementsAre(MigPlacement{6, 1}, MigPlacement{5, 1}, MigPlacement{4, 1}));
  EXPECT_EQ(r.usage_after[0].used, 3);
  EXPECT_EQ(r.usage_after[0].usedmem, 3 * 4864);
  // Eight 1g instances do not exist on a card of seven placements: the eighth visit fails with
  // HAMi's reason, and the seven taken count against one card (GenReason's "7/1").
  r = Fit(MigNode(1), {Mem(8, 4000)});
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/1 CardMigTopologyInfeasible, 7/1 AllocatedCardsInsufficientRequest");
}

// With a vgpu-mode that excludes mig the request is not a MIG request: Nums > cards fails
// before any card is looked at (score.go fitInDevices: NodeInsufficientDevice).
TEST(MigPodFitTest, NumsAboveTheCardsNeedsAMigRequest) {
  PodConstraints hami_core;
  hami_core.vgpu_mode = "hami-core";
  FitResult r = Fit(MigNode(1), {Mem(2, 4000)}, 0, hami_core);
  EXPECT_EQ(r.reason, "2/1 NodeInsufficientDevice");
  PodConstraints mig;
  mig.vgpu_mode = "mig";
  EXPECT_TRUE(Fit(MigNode(1), {Mem(2, 4000)}, 0, mig).fit);
}

// Two containers of one pod never share a placement: the second sees the first's instance.
// (HAMi fits each init container on a fresh copy of the node, so an init and an app container
// could get the same placement there; Tessera counts every earlier container: docs/mig.md.)
TEST(MigPodFitTest, ContainersOfOnePodNeverSharePlacements) {
  FitResult r = Fit(MigNode(1), {Mem(1, 4000), Mem(1, 4000), Mem(1, 8000)}, /*init_count=*/1);
  ASSERT_TRUE(r.fit) << r.reason;
  const std::vector<MigPlacement> p = Placements(r);
  ASSERT_EQ(p.size(), 3U);
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t j = i + 1; j < p.size(); ++j) {
      EXPECT_FALSE(p[i].Overlaps(p[j])) << i << " " << j;
    }
  }
}

// scheduler.go getNodesUsage marks a card whose books disagree unhealthy: CardNotHealth.
TEST(MigPodFitTest, AnUnusableCardFailsClosed) {
  FitResult r = Fit(MigNode(2, {{{}, true}, {}}), {Mem(1, 4000)});
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.devices[0][0].uuid, "GPU-m1");
  r = Fit(MigNode(1, {{{}, true}}), {Mem(1, 4000)});
  EXPECT_EQ(r.reason, "1/1 CardNotHealth");
}

// A MIG card still passes the ordinary checks first (device.go Fit): a request larger than the
// card's free memory is CardInsufficientMemory, not a placement failure; the largest profile
// (7g.40gb, 40192 MiB) is smaller than the card's 40960, so 40960 fits no profile.
TEST(MigPodFitTest, OrdinaryChecksComeFirst) {
  NodeSnapshot node = MigNode(1, {{{{0, 4}}, false}});
  node.usage[0] = {1, 19968, 43};
  EXPECT_EQ(Fit(node, {Mem(1, 30000)}).reason, "1/1 CardInsufficientMemory");
  EXPECT_EQ(Fit(MigNode(1), {Mem(1, 40960)}).reason, "1/1 CardMigTopologyInfeasible");
  FitResult r = Fit(node, {Mem(1, 15000)});
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.mig[0][0], (MigReservation{"3g.20gb", {4, 4}}));
}

// A registered placement of size 0 is never taken (it occupies nothing, so the walk, which visits
// a MIG card again after each take, would never end under topology-aware).
TEST(MigPodFitTest, AZeroSizePlacementIsNeverTaken) {
  auto devices =
      std::make_shared<device::NodeDevices>(*::tessera::testing::MigNodeDevices("m1", {"GPU-m0"}));
  devices->devices[0].mig_profiles = {{"1g.5gb", 4864, 15, 1, {{3, 0}}}};
  NodeSnapshot node;
  node.devices = devices;
  node.usage.resize(1);
  PodRequest pod;
  pod.containers = {Mem(1, 4000)};
  const device::GpuPolicy topology{{device::GpuPolicyKey::kTopologyAware}};
  EXPECT_EQ(FitPod(node, pod, {}, topology).reason, "1/1 CardMigTopologyInfeasible");
  EXPECT_EQ(FitPod(node, pod, {}, kSpread).reason, "1/1 CardMigTopologyInfeasible");
}

// A pod on a node with no MIG instance gets no reservations (the patch writes none).
TEST(MigPodFitTest, NoMigNoReservations) {
  NodeSnapshot node;
  node.devices = ::tessera::testing::GpuNodeDevices("n", {"GPU-a"});
  node.usage.resize(1);
  FitResult r = Fit(node, {Mem(1, 1000)});
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_TRUE(r.mig.empty());
}

}  // namespace
}  // namespace tessera::schedule

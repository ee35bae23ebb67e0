#include "tessera/schedule/fit.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
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
using device::NodeSnapshot;
using device::PodConstraints;
using device::PodRequest;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

const GpuPolicy kSpread{{GpuPolicyKey::kSpread}};
const GpuPolicy kBinpack{{GpuPolicyKey::kBinpack}};
const GpuPolicy kMutex{{GpuPolicyKey::kMutex}};

DeviceInfo Gpu(int index, int32_t mem = 8000, int numa = 0) {
  DeviceInfo d;
  d.id = "GPU-" + std::to_string(index);
  d.index = index;
  d.count = 10;
  d.devmem = mem;
  d.devcore = 100;
  d.type = "NVIDIA-Tesla T4";
  d.numa = numa;
  return d;
}

// A snapshot over `devices` with the given usage (idle where not given).
NodeSnapshot Node(std::vector<DeviceInfo> devices, std::vector<DeviceUsage> usage = {},
                  std::vector<std::string> cordoned = {}) {
  auto nd = std::make_shared<NodeDevices>();
  nd->node = "node1";
  nd->devices = std::move(devices);
  nd->cordoned = std::move(cordoned);
  usage.resize(nd->devices.size());
  NodeSnapshot s;
  s.usage.assign(usage.begin(), usage.end());
  s.devices = std::move(nd);
  return s;
}

ContainerRequest Req(int32_t nums, int32_t mem, int32_t cores,
                     int32_t pct = device::kPercentageUnset) {
  ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  r.coresreq = cores;
  r.mem_percentage = pct;
  return r;
}

PodRequest Pod(std::vector<std::optional<ContainerRequest>> containers, size_t init_count = 0) {
  PodRequest p;
  p.containers = std::move(containers);
  p.init_count = init_count;
  return p;
}

FitResult FitOne(const NodeSnapshot& node, const ContainerRequest& req,
                 const PodConstraints& constraints = {}, const GpuPolicy& policy = kSpread) {
  return FitPod(node, Pod({req}), constraints, policy);
}

const GpuPolicy kTopology{{GpuPolicyKey::kTopologyAware}};

// `node` with pair scores: scores[{i, j}] is device i's score towards device j (positions).
NodeSnapshot WithScores(NodeSnapshot node, const std::map<std::pair<int, int>, int64_t>& scores) {
  auto nd = std::make_shared<NodeDevices>(*node.devices);
  const size_t n = nd->devices.size();
  nd->pair_scores.assign(n * n, 0);
  for (const auto& [ij, v] : scores) {
    nd->pair_scores[static_cast<size_t>(ij.first) * n + static_cast<size_t>(ij.second)] = v;
  }
  node.devices = std::move(nd);
  return node;
}

// Symmetric scores: each pair given once.
NodeSnapshot WithPairs(NodeSnapshot node, const std::map<std::pair<int, int>, int64_t>& pairs) {
  std::map<std::pair<int, int>, int64_t> both;
  for (const auto& [ij, v] : pairs) {
    both[ij] = v;
    both[{ij.second, ij.first}] = v;
  }
  return WithScores(std::move(node), both);
}

std::vector<std::string> Uuids(const device::ContainerDevices& devs) {
  std::vector<std::string> out;
  for (const auto& d : devs) {
    out.push_back(d.uuid);
  }
  return out;
}

TEST(ReasonTest, NamesAreHamis) {
  EXPECT_EQ(ReasonName(Reason::kCardNotHealth), "CardNotHealth");
  EXPECT_EQ(ReasonName(Reason::kCardCordoned), "CardCordoned");
  EXPECT_EQ(ReasonName(Reason::kCardTypeMismatch), "CardTypeMismatch");
  EXPECT_EQ(ReasonName(Reason::kNumaNotFit), "NumaNotFit");
  EXPECT_EQ(ReasonName(Reason::kCardUuidMismatch), "CardUuidMismatch");
  EXPECT_EQ(ReasonName(Reason::kCardTimeSlicingExhausted), "CardTimeSlicingExhausted");
  EXPECT_EQ(ReasonName(Reason::kExclusiveDeviceAllocateConflict),
            "ExclusiveDeviceAllocateConflict");
  EXPECT_EQ(ReasonName(Reason::kCardInsufficientMemory), "CardInsufficientMemory");
  EXPECT_EQ(ReasonName(Reason::kCardInsufficientCore), "CardInsufficientCore");
  EXPECT_EQ(ReasonName(Reason::kCardComputeUnitsExhausted), "CardComputeUnitsExhausted");
  EXPECT_EQ(ReasonName(Reason::kAllocatedCardsInsufficientRequest),
            "AllocatedCardsInsufficientRequest");
  EXPECT_EQ(ReasonName(Reason::kNodeInsufficientDevice), "NodeInsufficientDevice");
}

TEST(ReasonTest, PartsSortByRenderedStringNotByReason) {
  std::array<int32_t, kReasonCount> counts{};
  counts[static_cast<size_t>(Reason::kCardNotHealth)] = 2;
  counts[static_cast<size_t>(Reason::kCardInsufficientMemory)] = 10;
  ReasonParts parts;
  parts.Assign(counts, 12);
  // "10/…" sorts before "2/…" byte-wise even though CardNotHealth comes first in the enum.
  EXPECT_THAT(parts.Strings(), ElementsAre("10/12 CardInsufficientMemory", "2/12 CardNotHealth"));
  EXPECT_EQ(parts.Joined(), "10/12 CardInsufficientMemory, 2/12 CardNotHealth");
}

// Assign sorts without rendering the parts; the order must still be the rendered strings'.
TEST(ReasonTest, PartsAreInTheOrderOfTheirRenderedStringsForAnyCounts) {
  std::mt19937 rng(34);
  std::uniform_int_distribution<int32_t> count(0, 120);
  std::uniform_int_distribution<int> present(0, 2);
  for (int round = 0; round < 2000; ++round) {
    std::array<int32_t, kReasonCount> counts{};
    for (int32_t& c : counts) {
      c = present(rng) == 0 ? count(rng) : 0;
    }
    ReasonParts parts;
    parts.Assign(counts, 1 + count(rng));
    const std::vector<std::string> strings = parts.Strings();
    EXPECT_TRUE(std::is_sorted(strings.begin(), strings.end())) << parts.Joined();
    EXPECT_EQ(strings.size(), static_cast<size_t>(std::count_if(counts.begin(), counts.end(),
                                                                [](int32_t c) { return c != 0; })));
  }
}

TEST(FitTest, SingleGpuFitsAndReportsNvidiaType) {
  FitResult r = FitOne(Node({Gpu(0)}), Req(1, 1000, 30));
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_THAT(r.devices[0], ElementsAre(device::ContainerDevice{"GPU-0", "NVIDIA", 1000, 30}));
  EXPECT_THAT(r.usage_after, ElementsAre(DeviceUsage{1, 1000, 30}));
  EXPECT_TRUE(r.reason.empty());
}

TEST(FitTest, InsufficientMemoryAndTimeSlicing) {
  // The brief's example: one card without memory, one without slots.
  FitResult r = FitOne(Node({Gpu(0), Gpu(1)}, {{1, 7500, 0}, {10, 0, 0}}), Req(1, 1000, 0));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.failed_container, 0);
  EXPECT_EQ(r.reason, "1/2 CardInsufficientMemory, 1/2 CardTimeSlicingExhausted");
  EXPECT_THAT(r.reasons.Strings(),
              ElementsAre("1/2 CardInsufficientMemory", "1/2 CardTimeSlicingExhausted"));
}

TEST(FitTest, OnlyCardInsufficientMemory) {
  FitResult r = FitOne(Node({Gpu(0)}, {{1, 7500, 0}}), Req(1, 1000, 0));
  EXPECT_EQ(r.reason, "1/1 CardInsufficientMemory");
}

TEST(FitTest, CardNotHealthAndAllocatedCardsInsufficientRequest) {
  auto sick = Gpu(1);
  sick.health = false;
  FitResult r = FitOne(Node({Gpu(0), sick}), Req(2, 1000, 0));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth");
}

TEST(FitTest, CardCordoned) {
  FitResult r = FitOne(Node({Gpu(0), Gpu(1)}, {}, {"GPU-0", "GPU-1"}), Req(1, 1000, 0));
  EXPECT_EQ(r.reason, "2/2 CardCordoned");
  // Cordon is per UUID: the other card still serves.
  FitResult ok = FitOne(Node({Gpu(0), Gpu(1)}, {}, {"GPU-1"}), Req(1, 1000, 0));
  ASSERT_TRUE(ok.fit);
  EXPECT_THAT(Uuids(ok.devices[0]), ElementsAre("GPU-0"));
}

TEST(FitTest, HealthIsCheckedBeforeCordon) {
  auto sick = Gpu(0);
  sick.health = false;
  FitResult r = FitOne(Node({sick}, {}, {"GPU-0"}), Req(1, 1000, 0));
  EXPECT_EQ(r.reason, "1/1 CardNotHealth");
}

TEST(FitTest, UseGpuTypeIsCaseInsensitiveSubstring) {
  auto a100 = Gpu(0);
  a100.type = "NVIDIA A100-SXM4-40GB";
  auto t4 = Gpu(1);
  PodConstraints c;
  c.use_types = {"a100"};
  FitResult r = FitOne(Node({a100, t4}), Req(1, 1000, 0), c);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-0"));
  c.use_types = {"v100", "h100"};
  EXPECT_EQ(FitOne(Node({a100, t4}), Req(1, 1000, 0), c).reason, "2/2 CardTypeMismatch");
}

TEST(FitTest, NoUseGpuTypeRejectsMatches) {
  auto a100 = Gpu(0);
  a100.type = "NVIDIA A100-SXM4-40GB";
  PodConstraints c;
  c.nouse_types = {"tesla"};
  FitResult r = FitOne(Node({a100, Gpu(1)}), Req(1, 1000, 0), c, kBinpack);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-0"));
  c.nouse_types = {"NVIDIA"};
  EXPECT_EQ(FitOne(Node({a100, Gpu(1)}), Req(1, 1000, 0), c).reason, "2/2 CardTypeMismatch");
}

TEST(FitTest, VgpuModeMustContainTheDeviceMode) {
  auto mps = Gpu(0);
  mps.mode = "mps";
  PodConstraints c;
  c.vgpu_mode = "mps";
  FitResult r = FitOne(Node({mps, Gpu(1)}), Req(1, 1000, 0), c);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-0"));
  c.vgpu_mode = "hami-core,mps";
  EXPECT_TRUE(FitOne(Node({mps, Gpu(1)}), Req(2, 1000, 0), c).fit);
  c.vgpu_mode = "mig";
  EXPECT_EQ(FitOne(Node({mps, Gpu(1)}), Req(1, 1000, 0), c).reason, "2/2 CardTypeMismatch");
}

TEST(FitTest, DevicesOfAnotherVendorAreNotConsidered) {
  auto other = Gpu(1);
  other.type = "Ascend910B";
  FitResult r = FitOne(Node({Gpu(0), other}), Req(2, 1000, 0));
  EXPECT_EQ(r.reason, "2/1 NodeInsufficientDevice");
  // The denominator counts only devices of the request's type.
  FitResult r2 = FitOne(Node({Gpu(0), other}, {{10, 0, 0}}), Req(1, 1000, 0));
  EXPECT_EQ(r2.reason, "1/1 CardTimeSlicingExhausted");
}

TEST(FitTest, NodeInsufficientDevice) {
  FitResult r = FitOne(Node({Gpu(0), Gpu(1)}), Req(3, 1000, 0));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "3/2 NodeInsufficientDevice");
}

TEST(FitTest, UuidFiltersBothApply) {
  PodConstraints c;
  c.use_uuids = {"GPU-1", "GPU-2"};
  c.nouse_uuids = {"GPU-2"};
  FitResult r = FitOne(Node({Gpu(0), Gpu(1), Gpu(2)}), Req(1, 1000, 0), c);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-1"));
  EXPECT_EQ(FitOne(Node({Gpu(0), Gpu(1), Gpu(2)}), Req(2, 1000, 0), c).reason,
            "1/3 AllocatedCardsInsufficientRequest, 2/3 CardUuidMismatch");
}

TEST(FitTest, TypeMismatchComesBeforeUuidMismatch) {
  PodConstraints c;
  c.use_types = {"A100"};
  c.use_uuids = {"GPU-9"};
  EXPECT_EQ(FitOne(Node({Gpu(0)}), Req(1, 1000, 0), c).reason, "1/1 CardTypeMismatch");
}

TEST(FitTest, CardInsufficientCore) {
  FitResult r = FitOne(Node({Gpu(0)}, {{1, 1000, 80}}), Req(1, 1000, 30));
  EXPECT_EQ(r.reason, "1/1 CardInsufficientCore");
}

TEST(FitTest, ExclusiveRequestConflictsWithAnyUse) {
  // Coresreq 100 on a card with a 0-core allocation: cores fit, but exclusivity fails.
  FitResult r = FitOne(Node({Gpu(0)}, {{1, 1000, 0}}), Req(1, 1000, 100));
  EXPECT_EQ(r.reason, "1/1 ExclusiveDeviceAllocateConflict");
  ASSERT_TRUE(FitOne(Node({Gpu(0)}), Req(1, 1000, 100)).fit);
  // With deviceCoreScaling != 1 (Totalcore 200) the rule does not apply.
  auto scaled = Gpu(0);
  scaled.devcore = 200;
  EXPECT_TRUE(FitOne(Node({scaled}, {{1, 1000, 0}}), Req(1, 1000, 100)).fit);
}

TEST(FitTest, CoresClampAt100) {
  FitResult r = FitOne(Node({Gpu(0)}), Req(1, 1000, 150));
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_EQ(r.devices[0][0].usedcores, 100);
  // A clamped request is exclusive too.
  EXPECT_EQ(FitOne(Node({Gpu(0)}, {{1, 1000, 0}}), Req(1, 1000, 150)).reason,
            "1/1 ExclusiveDeviceAllocateConflict");
}

TEST(FitTest, CardComputeUnitsExhausted) {
  FitResult r = FitOne(Node({Gpu(0)}, {{2, 1000, 100}}), Req(1, 1000, 0));
  EXPECT_EQ(r.reason, "1/1 CardComputeUnitsExhausted");
}

// A mig card without profiles (a v2.5.2 plugin's static MIG) has no placement: HAMi v2.10's
// selectMigCandidate finds none (device.go Fit: CardMigTopologyInfeasible).
TEST(FitTest, MigDevicesWithoutProfilesNeverFit) {
  auto mig = Gpu(0);
  mig.mode = "mig";
  EXPECT_EQ(FitOne(Node({mig}), Req(1, 1000, 0)).reason, "1/1 CardMigTopologyInfeasible");
}

TEST(FitTest, PercentageIsRelativeToEachDevice) {
  FitResult r = FitOne(Node({Gpu(0, 8000), Gpu(1, 16000)}), Req(2, 0, 0, 25));
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices[0].size(), 2u);
  for (const auto& d : r.devices[0]) {
    EXPECT_EQ(d.usedmem, d.uuid == "GPU-0" ? 2000 : 4000) << d.uuid;
  }
  // 100 % of an 8000 MiB card with 1 MiB used does not fit.
  EXPECT_EQ(FitOne(Node({Gpu(0)}, {{1, 1, 0}}), Req(1, 0, 0, 100)).reason,
            "1/1 CardInsufficientMemory");
}

TEST(FitTest, MemreqWinsOverPercentage) {
  FitResult r = FitOne(Node({Gpu(0)}), Req(1, 1000, 0, 50));
  ASSERT_TRUE(r.fit);
  EXPECT_EQ(r.devices[0][0].usedmem, 1000);
}

TEST(FitTest, MultiGpuRequestTakesDistinctDevices) {
  FitResult r = FitOne(Node({Gpu(0), Gpu(1), Gpu(2), Gpu(3)}), Req(2, 1000, 30));
  ASSERT_TRUE(r.fit);
  ASSERT_EQ(r.devices[0].size(), 2u);
  EXPECT_NE(r.devices[0][0].uuid, r.devices[0][1].uuid);
  int used = 0;
  for (const auto& u : r.usage_after) {
    used += u.used;
  }
  EXPECT_EQ(used, 2);
}

TEST(FitTest, IdleTiesTryTheHighestIndexFirst) {
  // Equal score and NUMA: index ascending in the sorted list, walked from the end.
  FitResult r = FitOne(Node({Gpu(0), Gpu(1), Gpu(2)}), Req(1, 1000, 0));
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2"));
}

TEST(FitTest, BinpackPrefersTheBusiestCardSpreadTheIdlest) {
  auto node = Node({Gpu(0), Gpu(1), Gpu(2)}, {{1, 1000, 10}, {2, 4000, 40}, {0, 0, 0}});
  FitResult b = FitOne(node, Req(1, 1000, 10), {}, kBinpack);
  ASSERT_TRUE(b.fit);
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-1"));
  FitResult s = FitOne(node, Req(1, 1000, 10), {}, kSpread);
  ASSERT_TRUE(s.fit);
  EXPECT_THAT(Uuids(s.devices[0]), ElementsAre("GPU-2"));
}

TEST(FitTest, BinpackFallsBackWhenTheBusiestCardIsFull) {
  auto node = Node({Gpu(0), Gpu(1)}, {{1, 7800, 10}, {1, 1000, 10}});
  FitResult b = FitOne(node, Req(1, 1000, 10), {}, kBinpack);
  ASSERT_TRUE(b.fit);
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-1"));
}

TEST(FitTest, ScoreIsPrimaryAndNumaBreaksTiesWithoutNumaBind) {
  // GPU-0 on NUMA 1 is busier; binpack without numa-bind takes it although NUMA 0 comes first
  // in v2.5.2's order.
  auto node = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0)}, {{1, 2000, 0}, {0, 0, 0}});
  FitResult b = FitOne(node, Req(1, 1000, 0), {}, kBinpack);
  ASSERT_TRUE(b.fit);
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-0"));
  // Equal scores: NUMA ascending in the sorted list, so the highest NUMA id is tried first.
  auto idle = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0)});
  FitResult t = FitOne(idle, Req(1, 1000, 0), {}, kSpread);
  ASSERT_TRUE(t.fit);
  EXPECT_THAT(Uuids(t.devices[0]), ElementsAre("GPU-0"));
}

TEST(FitTest, NumaBindKeepsOneContainersGpusOnOneNode) {
  // NUMA 0: GPU-0, GPU-1 (GPU-1 full); NUMA 1: GPU-2, GPU-3. Two GPUs must come from NUMA 1.
  auto node = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 0), Gpu(2, 8000, 1), Gpu(3, 8000, 1)},
                   {{0, 0, 0}, {10, 0, 0}, {0, 0, 0}, {0, 0, 0}});
  PodConstraints c;
  c.numa_bind = true;
  for (const GpuPolicy& p : {kSpread, kBinpack}) {
    FitResult r = FitOne(node, Req(2, 1000, 0), c, p);
    ASSERT_TRUE(r.fit) << r.reason;
    EXPECT_THAT(Uuids(r.devices[0]), ::testing::UnorderedElementsAre("GPU-2", "GPU-3"));
  }
  // Without numa-bind, spread would happily mix NUMA nodes.
  FitResult mixed = FitOne(Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1)}), Req(2, 1000, 0));
  EXPECT_TRUE(mixed.fit);
}

TEST(FitTest, NumaNotFitWhenNoNumaNodeHoldsTheRequest) {
  PodConstraints c;
  c.numa_bind = true;
  FitResult r = FitOne(Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1)}), Req(2, 1000, 0), c);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit");
}

TEST(FitTest, NumaResetHappensBeforeTheLaterChecks) {
  // Binpack + numa-bind walks NUMA 0 first. GPU-0 (NUMA 0) is taken; GPU-1 (NUMA 1, full) then
  // resets the walk although it fails the memory check itself; GPU-2 is taken; one GPU short.
  auto node = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1), Gpu(2, 8000, 1)},
                   {{0, 0, 0}, {1, 8000, 0}, {0, 0, 0}});
  PodConstraints c;
  c.numa_bind = true;
  FitResult r = FitOne(node, Req(2, 1000, 0), c, kBinpack);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason,
            "1/3 AllocatedCardsInsufficientRequest, 1/3 CardInsufficientMemory, 1/3 NumaNotFit");
}

TEST(FitTest, NumaBindGroupOrderFollowsV252) {
  // Binpack + numa-bind: the lowest NUMA id is tried first even if NUMA 1 holds a busier card.
  auto node = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1)}, {{0, 0, 0}, {1, 4000, 0}});
  PodConstraints c;
  c.numa_bind = true;
  FitResult b = FitOne(node, Req(1, 1000, 0), c, kBinpack);
  ASSERT_TRUE(b.fit);
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-0"));
  // Spread + numa-bind: the highest NUMA id first.
  auto idle = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1), Gpu(2, 8000, 0)});
  FitResult s = FitOne(idle, Req(1, 1000, 0), c, kSpread);
  ASSERT_TRUE(s.fit);
  EXPECT_THAT(Uuids(s.devices[0]), ElementsAre("GPU-1"));
}

TEST(FitTest, MutexRejectsUsedCardsAndTriesIdleOnesFirst) {
  auto node = Node({Gpu(0), Gpu(1), Gpu(2)}, {{1, 1000, 0}, {0, 0, 0}, {2, 1000, 0}});
  FitResult r = FitOne(node, Req(1, 1000, 0), {}, kMutex);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-1"));
  FitResult two = FitOne(node, Req(2, 1000, 0), {}, kMutex);
  EXPECT_EQ(two.reason,
            "1/3 AllocatedCardsInsufficientRequest, 2/3 ExclusiveDeviceAllocateConflict");
  // Inside a chain, mutex still enforces exclusivity.
  FitResult chain =
      FitOne(node, Req(2, 1000, 0), {}, GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kMutex}});
  EXPECT_FALSE(chain.fit);
}

TEST(FitTest, MutexBreaksUsedTiesByNumaAscending) {
  // HAMi v2.10 pkg/scheduler/policy/gpu_policy.go, DeviceUsageList.Less: a single `mutex` policy
  // sorts by Used descending, then NUMA ascending; pkg/device/nvidia/device.go,
  // NvidiaGPUDevices.Fit, walks the list from the end. GPU 0 on NUMA 1 and GPU 1 on NUMA 0, both
  // idle: the list is [GPU-1, GPU-0], so GPU-0 is tried first (the index would pick GPU-1).
  auto node = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0)});
  FitResult r = FitOne(node, Req(1, 1000, 0), {}, kMutex);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-0"));
  // Used still comes first: an idle GPU on NUMA 0 beats a busy one on NUMA 1.
  auto busy = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0)}, {{1, 1000, 0}, {0, 0, 0}});
  FitResult b = FitOne(busy, Req(1, 1000, 0), {}, kMutex);
  ASSERT_TRUE(b.fit) << b.reason;
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-1"));
}

TEST(FitTest, MutexWithNumaBindKeepsTheMutexOrder) {
  // HAMi v2.10 pkg/scheduler/policy/gpu_policy.go, DeviceUsageList.Less: the single `mutex` branch
  // (Used descending, NUMA ascending) comes before the numa-bind one, and only lessByChain forces
  // NUMA first; pkg/device/nvidia/device.go, NvidiaGPUDevices.Fit, still resets its collection at
  // every NUMA change. GPU-0: NUMA 1, busy; GPU-1: NUMA 0, idle; GPU-2: NUMA 1, idle; 2 GPUs.
  // HAMi's list is [GPU-0, GPU-1, GPU-2]; the walk takes GPU-2, drops it at GPU-1 (NUMA 0), takes
  // GPU-1, drops it at GPU-0 (NUMA 1), which is busy: nothing collected at the end.
  auto node = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0), Gpu(2, 8000, 1)},
                   {{1, 1000, 0}, {0, 0, 0}, {0, 0, 0}});
  PodConstraints c;
  c.numa_bind = true;
  FitResult r = FitOne(node, Req(2, 1000, 0), c, kMutex);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.reason, "1/3 ExclusiveDeviceAllocateConflict, 2/3 NumaNotFit");
  // A fitting pod gets the same GPUs either way: both idle GPUs of NUMA 1.
  auto two = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0), Gpu(2, 8000, 1)});
  FitResult f = FitOne(two, Req(2, 1000, 0), c, kMutex);
  ASSERT_TRUE(f.fit) << f.reason;
  EXPECT_THAT(Uuids(f.devices[0]), ::testing::UnorderedElementsAre("GPU-0", "GPU-2"));
}

TEST(FitTest, DeviceTiesGoToTheHighestIndexWhateverEarlierContainersDid) {
  // A declared difference (docs/compatibility.md 17). HAMi v2.10 pkg/scheduler/score.go,
  // fitInDevices, re-sorts the node's list in place for every app container with sort.Sort
  // (stable for <= 12 devices) under pkg/scheduler/policy/gpu_policy.go, DeviceUsageList.Less,
  // which has no index key for a single policy. Three identical 1-GPU containers, spread, an
  // idle two-GPU node: [0,1] -> GPU 1; [1,0] -> GPU 0; [1,0] again (a tie, kept) -> GPU 0.
  // Tessera breaks the third container's tie by index: GPU 1.
  auto pod = Pod({Req(1, 1000, 0), Req(1, 1000, 0), Req(1, 1000, 0)});
  FitResult r = FitPod(Node({Gpu(0), Gpu(1)}), pod, {}, kSpread);
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices.size(), 3u);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-1"));
  EXPECT_THAT(Uuids(r.devices[1]), ElementsAre("GPU-0"));
  EXPECT_THAT(Uuids(r.devices[2]), ElementsAre("GPU-1"));  // HAMi v2.10: GPU-0
}

TEST(FitTest, MutexBetweenContainersOfOnePod) {
  // The second container sees the first one's card as used.
  auto pod = Pod({Req(1, 1000, 0), Req(1, 1000, 0)});
  FitResult r = FitPod(Node({Gpu(0), Gpu(1)}), pod, {}, kMutex);
  ASSERT_TRUE(r.fit);
  EXPECT_NE(r.devices[0][0].uuid, r.devices[1][0].uuid);
  EXPECT_EQ(FitPod(Node({Gpu(0)}), pod, {}, kMutex).reason, "1/1 ExclusiveDeviceAllocateConflict");
}

TEST(FitTest, ChainBinpackNumaUsesNumaAsSecondKey) {
  // Equal scores: numa ascending, so NUMA 1 is tried first; the busier card wins over NUMA.
  auto idle = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0), Gpu(2, 8000, 1)});
  GpuPolicy chain{{GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}};
  FitResult r = FitOne(idle, Req(1, 1000, 0), {}, chain);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2"));
  auto busy = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0)}, {{0, 0, 0}, {1, 1000, 0}});
  FitResult b = FitOne(busy, Req(1, 1000, 0), {}, chain);
  ASSERT_TRUE(b.fit);
  EXPECT_THAT(Uuids(b.devices[0]), ElementsAre("GPU-1"));
  // numa,binpack: NUMA first.
  GpuPolicy numa_first{{GpuPolicyKey::kNuma, GpuPolicyKey::kBinpack}};
  FitResult n = FitOne(busy, Req(1, 1000, 0), {}, numa_first);
  ASSERT_TRUE(n.fit);
  EXPECT_THAT(Uuids(n.devices[0]), ElementsAre("GPU-0"));
}

TEST(FitTest, SortOrders) {
  auto keys = [](const SortOrder& o) {
    return std::vector<SortKey>(o.keys.begin(), o.keys.begin() + static_cast<long>(o.size));
  };
  EXPECT_THAT(keys(SortOrderFor(kBinpack, false)),
              ElementsAre(SortKey::kScoreAscending, SortKey::kNumaAscending));
  EXPECT_THAT(keys(SortOrderFor(kBinpack, true)),
              ElementsAre(SortKey::kNumaDescending, SortKey::kScoreAscending));
  EXPECT_THAT(keys(SortOrderFor(kSpread, false)),
              ElementsAre(SortKey::kScoreDescending, SortKey::kNumaAscending));
  EXPECT_THAT(keys(SortOrderFor(kSpread, true)),
              ElementsAre(SortKey::kNumaAscending, SortKey::kScoreDescending));
  EXPECT_THAT(keys(SortOrderFor(kMutex, false)),
              ElementsAre(SortKey::kUsedDescending, SortKey::kNumaAscending));
  EXPECT_THAT(keys(SortOrderFor(kMutex, true)),
              ElementsAre(SortKey::kUsedDescending, SortKey::kNumaAscending));
  // HAMi v2.10 pkg/scheduler/policy/gpu_policy.go, gpuSortKeyChain/lessByChain: mutex and
  // topology-aware are no keys in a chain (Tessera used to sort mutex chains by Used first);
  // a chain without a key sorts as spread, NUMA first with numa-bind.
  EXPECT_THAT(keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kMutex, GpuPolicyKey::kBinpack}}, true)),
              ElementsAre(SortKey::kNumaAscending, SortKey::kScoreAscending));
  EXPECT_THAT(keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kMutex}}, false)),
              ElementsAre(SortKey::kScoreAscending));
  EXPECT_THAT(
      keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kMutex, GpuPolicyKey::kTopologyAware}}, false)),
      ElementsAre(SortKey::kScoreDescending));
  EXPECT_THAT(
      keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kTopologyAware, GpuPolicyKey::kMutex}}, true)),
      ElementsAre(SortKey::kNumaAscending, SortKey::kScoreDescending));
  // A single topology-aware sorts as a single spread (DeviceUsageList.Less: not binpack, not
  // mutex), with or without numa-bind.
  EXPECT_THAT(keys(SortOrderFor(kTopology, false)),
              ElementsAre(SortKey::kScoreDescending, SortKey::kNumaAscending));
  EXPECT_THAT(keys(SortOrderFor(kTopology, true)),
              ElementsAre(SortKey::kNumaAscending, SortKey::kScoreDescending));
  EXPECT_THAT(
      keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kTopologyAware}}, false)),
      ElementsAre(SortKey::kScoreAscending));
  EXPECT_TRUE(HasTopology(GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kTopologyAware}}));
  EXPECT_FALSE(HasTopology(kSpread));
  EXPECT_THAT(keys(SortOrderFor(GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}}, true)),
              ElementsAre(SortKey::kNumaAscending, SortKey::kScoreAscending));
  EXPECT_TRUE(HasMutex(GpuPolicy{{GpuPolicyKey::kSpread, GpuPolicyKey::kMutex}}));
  EXPECT_FALSE(HasMutex(kBinpack));
}

TEST(FitTest, MutexInAChainIsAFilterNotASortKey) {
  // HAMi v2.10 gpu_policy.go, lessByChain: "mutex,numa" sorts by NUMA, then index; mutex only
  // rejects used GPUs (device.go, Fit). Tessera's former order (Used first) chose the same: it
  // only moved GPUs that mutex rejects anyway. GPU-0 (NUMA 1) busy, GPU-1 and GPU-2 idle on NUMA 0
  // and 1: the walk from the end tries GPU-2 (NUMA 1, higher index), then GPU-0 (busy), then GPU-1.
  auto node = Node({Gpu(0, 8000, 1), Gpu(1, 8000, 0), Gpu(2, 8000, 1)},
                   {{1, 1000, 0}, {0, 0, 0}, {0, 0, 0}});
  GpuPolicy chain{{GpuPolicyKey::kMutex, GpuPolicyKey::kNuma}};
  FitResult r = FitOne(node, Req(2, 1000, 0), {}, chain);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2", "GPU-1"));
  FitResult three = FitOne(node, Req(3, 1000, 0), {}, chain);
  EXPECT_EQ(three.reason,
            "1/3 ExclusiveDeviceAllocateConflict, 2/3 AllocatedCardsInsufficientRequest");
}

// HAMi v2.10 pkg/device/nvidia/device_test.go, TestFit_TopologyExactMatch: as many passing cards
// as requested are taken without looking at scores.
TEST(FitTopologyTest, ExactlyNPassingCardsAreTaken) {
  auto node =
      WithPairs(Node({Gpu(0), Gpu(1), Gpu(2)}, {{10, 0, 0}, {0, 0, 0}, {0, 0, 0}}), {{{1, 2}, 5}});
  FitResult r = FitOne(node, Req(2, 100, 10), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2", "GPU-1"));
}

// The scores of HAMi v2.10 pkg/device/nvidia/device_test.go, TestFit_TopologyWorstSingleCard,
// TestFit_TopologyBestCombination and TestComputeWorstSingleCard/TestComputeBestCombination:
// 0-1: 100, 0-2: 200, 1-2: 150.
NodeSnapshot HamiThreeCards() {
  return WithPairs(Node({Gpu(0), Gpu(1), Gpu(2)}), {{{0, 1}, 100}, {{0, 2}, 200}, {{1, 2}, 150}});
}

TEST(FitTopologyTest, OneGpuTakesTheWorstConnectedCard) {
  // Sums: GPU-0 300, GPU-1 250, GPU-2 350 (TestFit_TopologyWorstSingleCard: dev-1).
  FitResult r = FitOne(HamiThreeCards(), Req(1, 100, 10), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-1"));
}

TEST(FitTopologyTest, SeveralGpusTakeTheBestSubsetInVisitingOrder) {
  // TestFit_TopologyBestCombination: {dev-0, dev-2} (200). The visiting order of the idle spread
  // list is GPU-2, GPU-1, GPU-0, so the subset is written as [GPU-2, GPU-0].
  FitResult r = FitOne(HamiThreeCards(), Req(2, 100, 10), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2", "GPU-0"));
}

TEST(FitTopologyTest, NegativeScores) {
  // HAMi v2.10 device_test.go, TestFit_TopologyNegativeScores: 0-1: -5, 0-2: -3, 1-2: -1.
  // One GPU: sums -8, -6, -4 -> dev-0. Two GPUs: the best pair is {dev-1, dev-2} (-1).
  auto node = WithPairs(Node({Gpu(0), Gpu(1), Gpu(2)}), {{{0, 1}, -5}, {{0, 2}, -3}, {{1, 2}, -1}});
  FitResult one = FitOne(node, Req(1, 100, 10), {}, kTopology);
  ASSERT_TRUE(one.fit) << one.reason;
  EXPECT_THAT(Uuids(one.devices[0]), ElementsAre("GPU-0"));
  FitResult two = FitOne(node, Req(2, 100, 10), {}, kTopology);
  ASSERT_TRUE(two.fit) << two.reason;
  EXPECT_THAT(Uuids(two.devices[0]), ElementsAre("GPU-2", "GPU-1"));
}

TEST(FitTopologyTest, ZeroScoresTakeTheFirstCardsVisited) {
  // TestFit_TopologyBestCombinationZeroScores fits; with every score 0 (or no scores at all) the
  // first subset in visiting order wins: GPU-3, GPU-2; one GPU: GPU-3.
  for (const NodeSnapshot& node :
       {Node({Gpu(0), Gpu(1), Gpu(2), Gpu(3)}),
        WithPairs(Node({Gpu(0), Gpu(1), Gpu(2), Gpu(3)}), {{{0, 1}, 0}})}) {
    FitResult two = FitOne(node, Req(2, 100, 10), {}, kTopology);
    ASSERT_TRUE(two.fit) << two.reason;
    EXPECT_THAT(Uuids(two.devices[0]), ElementsAre("GPU-3", "GPU-2"));
    FitResult one = FitOne(node, Req(1, 100, 10), {}, kTopology);
    EXPECT_THAT(Uuids(one.devices[0]), ElementsAre("GPU-3"));
  }
}

TEST(FitTopologyTest, TiesGoToTheFirstInVisitingOrder) {
  // Hand-computed. Every pair 100: each subset of 2 scores 100, the first visited wins (strict >
  // in computeBestCombination); each card sums 300, the first visited is the worst (strict <).
  auto node = WithPairs(
      Node({Gpu(0), Gpu(1), Gpu(2), Gpu(3)}),
      {{{0, 1}, 100}, {{0, 2}, 100}, {{0, 3}, 100}, {{1, 2}, 100}, {{1, 3}, 100}, {{2, 3}, 100}});
  EXPECT_THAT(Uuids(FitOne(node, Req(2, 100, 10), {}, kTopology).devices[0]),
              ElementsAre("GPU-3", "GPU-2"));
  EXPECT_THAT(Uuids(FitOne(node, Req(1, 100, 10), {}, kTopology).devices[0]), ElementsAre("GPU-3"));
  // Binpack first visits the busiest card: GPU-1 (used 2), then GPU-0 (used 1).
  auto busy = WithPairs(Node({Gpu(0), Gpu(1), Gpu(2)}, {{1, 0, 0}, {2, 0, 0}, {0, 0, 0}}),
                        {{{0, 1}, 100}, {{0, 2}, 100}, {{1, 2}, 100}});
  GpuPolicy binpack{{GpuPolicyKey::kBinpack, GpuPolicyKey::kTopologyAware}};
  EXPECT_THAT(Uuids(FitOne(busy, Req(2, 100, 10), {}, binpack).devices[0]),
              ElementsAre("GPU-1", "GPU-0"));
}

TEST(FitTopologyTest, ScoresAreReadFromTheEarlierVisitedCard) {
  // Hand-computed, asymmetric: computeBestCombination adds score[c_i][c_j] for i < j in visiting
  // order (GPU-2, GPU-1, GPU-0). 2->1: 10 (1->2: 1000), 2->0: 50, 1->0: 20: the best is [2, 0].
  auto node = WithScores(Node({Gpu(0), Gpu(1), Gpu(2)}),
                         {{{2, 1}, 10}, {{1, 2}, 1000}, {{2, 0}, 50}, {{1, 0}, 20}});
  FitResult r = FitOne(node, Req(2, 100, 10), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-2", "GPU-0"));
  // One GPU sums c's own row over the other candidates: GPU-0 0, GPU-1 1020, GPU-2 60.
  EXPECT_THAT(Uuids(FitOne(node, Req(1, 100, 10), {}, kTopology).devices[0]), ElementsAre("GPU-0"));
}

TEST(FitTopologyTest, OnlyPassingCardsAreCandidates) {
  // GPU-2 (the best connected) is full; among GPU-0, GPU-1, GPU-3 the pair 0-3 is best.
  auto node =
      WithPairs(Node({Gpu(0), Gpu(1), Gpu(2), Gpu(3)}, {{0, 0, 0}, {0, 0, 0}, {1, 8000, 0}}),
                {{{0, 2}, 900}, {{1, 2}, 900}, {{0, 3}, 300}, {{1, 3}, 200}});
  FitResult r = FitOne(node, Req(2, 1000, 10), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-3", "GPU-0"));
  // Fewer passing cards than requested: HAMi's reasons, the collected cards counted.
  FitResult short_of = FitOne(node, Req(4, 1000, 10), {}, kTopology);
  EXPECT_FALSE(short_of.fit);
  EXPECT_EQ(short_of.reason, "1/4 CardInsufficientMemory, 3/4 AllocatedCardsInsufficientRequest");
}

TEST(FitTopologyTest, NumaBindKeepsOnlyTheLastNumaGroupVisited) {
  // HAMi v2.10 device.go, Fit: under topology-aware the countdown never moves, so a NUMA change
  // drops what was collected without counting NumaNotFit, and the walk goes on to the end. The
  // spread + numa-bind list is NUMA ascending, walked from the end: NUMA 1 (GPU-3, GPU-2), then
  // NUMA 0 (GPU-1, GPU-0), which is what remains.
  PodConstraints c;
  c.numa_bind = true;
  auto node = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 0), Gpu(2, 8000, 1), Gpu(3, 8000, 1)});
  FitResult r = FitOne(node, Req(2, 1000, 0), c, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-1", "GPU-0"));
  // NUMA 0 holds one card: the pod fails there although NUMA 1 held two.
  auto uneven = Node({Gpu(0, 8000, 0), Gpu(1, 8000, 1), Gpu(2, 8000, 1)});
  FitResult u = FitOne(uneven, Req(2, 1000, 0), c, kTopology);
  EXPECT_FALSE(u.fit);
  EXPECT_EQ(u.reason, "1/3 AllocatedCardsInsufficientRequest");
  // Plain spread stops at two cards on NUMA 1.
  EXPECT_THAT(Uuids(FitOne(uneven, Req(2, 1000, 0), c, kSpread).devices[0]),
              ElementsAre("GPU-2", "GPU-1"));
}

TEST(FitTopologyTest, BeyondTheSubsetBoundTheChoiceIsGreedy) {
  // 20 candidates, 10 GPUs: C(20, 10) = 184,756 subsets > kMaxTopologySubsets. Cards 5..14 form
  // a clique (pair score 100), everything else scores 1: the greedy choice is the clique.
  std::vector<DeviceInfo> devs;
  for (int i = 0; i < 20; ++i) {
    devs.push_back(Gpu(i));
  }
  std::map<std::pair<int, int>, int64_t> pairs;
  for (int i = 0; i < 20; ++i) {
    for (int j = i + 1; j < 20; ++j) {
      pairs[{i, j}] = (i >= 5 && i < 15 && j >= 5 && j < 15) ? 100 : 1;
    }
  }
  auto node = WithPairs(Node(devs), pairs);
  FitResult r = FitOne(node, Req(10, 100, 0), {}, kTopology);
  ASSERT_TRUE(r.fit) << r.reason;
  EXPECT_THAT(Uuids(r.devices[0]), ElementsAre("GPU-14", "GPU-13", "GPU-12", "GPU-11", "GPU-10",
                                               "GPU-9", "GPU-8", "GPU-7", "GPU-6", "GPU-5"));
  // 16 candidates, 8 GPUs: C(16, 8) = 12,870, enumerated exactly.
  std::vector<DeviceInfo> sixteen(devs.begin(), devs.begin() + 16);
  std::map<std::pair<int, int>, int64_t> best;
  for (int i = 0; i < 16; ++i) {
    for (int j = i + 1; j < 16; ++j) {
      best[{i, j}] = (i % 2 == 0 && j % 2 == 0) ? 50 : 10;
    }
  }
  FitResult even = FitOne(WithPairs(Node(sixteen), best), Req(8, 100, 0), {}, kTopology);
  ASSERT_TRUE(even.fit) << even.reason;
  EXPECT_THAT(Uuids(even.devices[0]), ElementsAre("GPU-14", "GPU-12", "GPU-10", "GPU-8", "GPU-6",
                                                  "GPU-4", "GPU-2", "GPU-0"));
}

TEST(FitTest, DeviceScore) {
  auto d = Gpu(0);  // count 10, 100 cores, 8000 MiB
  DeviceUsage u{2, 2000, 25};
  // Real type "NVIDIA-Tesla T4" != request type "NVIDIA": existing usage only.
  EXPECT_DOUBLE_EQ(ComputeDeviceScore(d, u, Req(1, 2000, 25)), 10.0 * (0.2 + 0.25 + 0.25));
  d.type = "NVIDIA";
  EXPECT_DOUBLE_EQ(ComputeDeviceScore(d, u, Req(1, 2000, 25)), 10.0 * (0.3 + 0.5 + 0.5));
  // The percentage counts against this device's total.
  EXPECT_DOUBLE_EQ(ComputeDeviceScore(d, u, Req(1, 0, 25, 50)), 10.0 * (0.3 + 0.5 + 0.75));
  d.devmem = 0;
  EXPECT_EQ(ComputeDeviceScore(d, u, Req(1, 2000, 25)), 0);
}

TEST(FitTest, LaterContainersSeeEarlierUsage) {
  auto pod = Pod({Req(1, 5000, 0), Req(1, 5000, 0)});
  FitResult r = FitPod(Node({Gpu(0)}), pod, {}, kSpread);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.failed_container, 1);
  EXPECT_EQ(r.reason, "1/1 CardInsufficientMemory");
  FitResult two = FitPod(Node({Gpu(0), Gpu(1)}), pod, {}, kBinpack);
  ASSERT_TRUE(two.fit);
  EXPECT_NE(two.devices[0][0].uuid, two.devices[1][0].uuid);
}

TEST(FitTest, SpreadKeepsTwoContainersOnDifferentDevicesBinpackShares) {
  auto pod = Pod({Req(1, 1000, 10), Req(1, 1000, 10)});
  FitResult s = FitPod(Node({Gpu(0), Gpu(1)}), pod, {}, kSpread);
  ASSERT_TRUE(s.fit);
  EXPECT_NE(s.devices[0][0].uuid, s.devices[1][0].uuid);
  FitResult b = FitPod(Node({Gpu(0), Gpu(1)}), pod, {}, kBinpack);
  ASSERT_TRUE(b.fit);
  EXPECT_EQ(b.devices[0][0].uuid, b.devices[1][0].uuid);
  EXPECT_EQ(b.usage_after[1], (DeviceUsage{2, 2000, 20}));
}

TEST(FitTest, ThreeContainersOnlyTheMiddleRequests) {
  auto pod = Pod({std::nullopt, Req(1, 1000, 30), std::nullopt});
  FitResult r = FitPod(Node({Gpu(0)}), pod, {}, kSpread);
  ASSERT_TRUE(r.fit);
  ASSERT_EQ(r.devices.size(), 3u);
  EXPECT_THAT(r.devices[0], IsEmpty());
  EXPECT_THAT(r.devices[1], ElementsAre(device::ContainerDevice{"GPU-0", "NVIDIA", 1000, 30}));
  EXPECT_THAT(r.devices[2], IsEmpty());
}

TEST(FitTest, ZeroCountRequestIsNoRequest) {
  auto pod = Pod({Req(0, 1000, 30), Req(1, 1000, 30)});
  FitResult r = FitPod(Node({Gpu(0)}), pod, {}, kSpread);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(r.devices[0], IsEmpty());
  EXPECT_EQ(r.devices[1].size(), 1u);
}

TEST(FitTest, InitContainersFitOnFreshCopiesAndKeepThePeak) {
  // Two init containers of 5000 MiB and an app container of 6000 MiB on one 8000 MiB card: each
  // runs alone, so all fit; usage after is the per-field maximum.
  auto pod = Pod({Req(1, 5000, 20), Req(1, 5000, 40), Req(1, 6000, 10)}, 2);
  FitResult r = FitPod(Node({Gpu(0)}), pod, {}, kSpread);
  ASSERT_TRUE(r.fit) << r.reason;
  ASSERT_EQ(r.devices.size(), 3u);
  EXPECT_THAT(r.devices[0], ElementsAre(device::ContainerDevice{"GPU-0", "NVIDIA", 5000, 20}));
  EXPECT_THAT(r.devices[1], ElementsAre(device::ContainerDevice{"GPU-0", "NVIDIA", 5000, 40}));
  EXPECT_THAT(r.devices[2], ElementsAre(device::ContainerDevice{"GPU-0", "NVIDIA", 6000, 10}));
  EXPECT_THAT(r.usage_after, ElementsAre(DeviceUsage{1, 6000, 40}));
}

TEST(FitTest, InitContainersSeeExistingUsage) {
  auto pod = Pod({Req(1, 5000, 0), Req(1, 1000, 0)}, 1);
  FitResult r = FitPod(Node({Gpu(0)}, {{1, 4000, 0}}), pod, {}, kSpread);
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.failed_container, 0);
  EXPECT_EQ(r.reason, "1/1 CardInsufficientMemory");
}

TEST(FitTest, InitPeakAcrossDevices) {
  auto pod = Pod({Req(1, 3000, 0), Req(1, 1000, 0)}, 1);
  // Binpack: the init container and the app container both go to the busier GPU-1.
  FitResult r = FitPod(Node({Gpu(0), Gpu(1)}, {{0, 0, 0}, {1, 1000, 0}}), pod, {}, kBinpack);
  ASSERT_TRUE(r.fit);
  EXPECT_THAT(r.usage_after, ElementsAre(DeviceUsage{0, 0, 0}, DeviceUsage{2, 4000, 0}));
}

TEST(FitTest, NonNvidiaRequestTypeIsATypeMismatch) {
  auto d = Gpu(0);
  d.type = "NVIDIA";
  ContainerRequest r = Req(1, 1000, 0);
  r.type = "nvidia";  // matches the device type case-insensitively, but is not the vendor key
  EXPECT_EQ(FitOne(Node({d}), r).reason, "1/1 CardTypeMismatch");
}

TEST(FitTest, MalformedSnapshotIsUnavailable) {
  NodeSnapshot s = Node({Gpu(0), Gpu(1)});
  s.usage.pop_back();
  FitResult r = FitOne(s, Req(1, 1000, 0));
  EXPECT_FALSE(r.fit);
  EXPECT_EQ(r.failed_container, -1);
  EXPECT_EQ(r.reason, "node usage unavailable");
  NodeSnapshot empty;
  EXPECT_EQ(FitOne(empty, Req(1, 1000, 0)).reason, "node usage unavailable");
}

TEST(FitTest, FitterIsReusableAcrossNodes) {
  Fitter fitter;
  auto pod = Pod({Req(1, 6000, 0)});
  PodConstraints c;
  fitter.Prepare(pod, c, kSpread);
  auto full = Node({Gpu(0)}, {{1, 4000, 0}});
  auto idle = Node({Gpu(0), Gpu(1)});
  EXPECT_FALSE(fitter.Fit(full));
  EXPECT_EQ(fitter.reasons().Joined(), "1/1 CardInsufficientMemory");
  ASSERT_TRUE(fitter.Fit(idle));
  EXPECT_TRUE(fitter.reasons().empty());
  auto devs = fitter.BuildPodDevices(idle);
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_THAT(Uuids(devs[0]), ElementsAre("GPU-1"));
  EXPECT_FALSE(fitter.Fit(full));
}

// ---------------------------------------------------------------------------------------------
// A straightforward model of the spec (sort every container's candidates, walk from the end),
// checked against the optimised Fitter on random nodes and pods.

bool RefContains(std::string hay, std::string needle) {
  for (auto& c : hay) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (auto& c : needle) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return hay.find(needle) != std::string::npos;
}

struct RefOutcome {
  bool fit = false;
  device::PodDevices devices;
  int failed = -1;
  std::string reason;
};

bool RefContainer(const NodeSnapshot& node, int c, const ContainerRequest& req,
                  const PodConstraints& pc, const GpuPolicy& policy,
                  std::vector<DeviceUsage>* usage, RefOutcome* out) {
  const auto& devs = node.devices->devices;
  std::vector<int> cand;
  for (size_t i = 0; i < devs.size(); ++i) {
    if (RefContains(devs[i].type, req.type)) {
      cand.push_back(static_cast<int>(i));
    }
  }
  const int total = static_cast<int>(cand.size());
  // score.go isMIGRequest: an NVIDIA request whose vgpu-mode (if any) allows mig, on a node with
  // a mig card of the type, may ask for more devices than there are cards.
  const bool mig_request =
      req.type == "NVIDIA" &&
      (!pc.vgpu_mode.has_value() || pc.vgpu_mode->find("mig") != std::string::npos) &&
      std::any_of(cand.begin(), cand.end(), [&](int i) { return devs[i].mode == "mig"; });
  if (req.nums > total && !mig_request) {
    out->failed = c;
    out->reason =
        std::to_string(req.nums) + "/" + std::to_string(total) + " NodeInsufficientDevice";
    return false;
  }
  SortOrder order = SortOrderFor(policy, pc.numa_bind);
  std::vector<double> score(devs.size());
  for (int i : cand) {
    score[i] = ComputeDeviceScore(devs[i], (*usage)[i], req);
  }
  std::sort(cand.begin(), cand.end(), [&](int a, int b) {
    for (size_t k = 0; k < order.size; ++k) {
      switch (order.keys[k]) {
        case SortKey::kScoreAscending:
          if (score[a] != score[b]) return score[a] < score[b];
          break;
        case SortKey::kScoreDescending:
          if (score[a] != score[b]) return score[a] > score[b];
          break;
        case SortKey::kNumaAscending:
          if (devs[a].numa != devs[b].numa) return devs[a].numa < devs[b].numa;
          break;
        case SortKey::kNumaDescending:
          if (devs[a].numa != devs[b].numa) return devs[a].numa > devs[b].numa;
          break;
        case SortKey::kUsedDescending:
          if ((*usage)[a].used != (*usage)[b].used) return (*usage)[a].used > (*usage)[b].used;
          break;
      }
    }
    if (devs[a].index != devs[b].index) return devs[a].index < devs[b].index;
    return a < b;
  });
  std::map<std::string, int> reasons;
  const bool mutex = HasMutex(policy);
  const bool topology = HasTopology(policy);
  int remaining = req.nums;
  int prevnuma = -1;
  int cores = req.coresreq;
  std::vector<device::ContainerDevice> tmp;
  std::vector<int> tmp_idx;
  for (int k = total - 1; k >= 0; --k) {
    const auto& d = devs[cand[k]];
    const auto& u = (*usage)[cand[k]];
    auto has = [](const std::vector<std::string>& l, const std::string& v) {
      return std::find(l.begin(), l.end(), v) != l.end();
    };
    if (!d.health) {
      reasons["CardNotHealth"]++;
      continue;
    }
    if (node.devices->IsCordoned(d.id)) {
      reasons["CardCordoned"]++;
      continue;
    }
    bool type_ok = req.type == "NVIDIA";
    if (!pc.use_types.empty()) {
      bool any = false;
      for (const auto& t : pc.use_types) any |= RefContains(d.type, t);
      type_ok &= any;
    }
    for (const auto& t : pc.nouse_types) type_ok &= !RefContains(d.type, t);
    if (pc.vgpu_mode && pc.vgpu_mode->find(d.mode) == std::string::npos) type_ok = false;
    if (!type_ok) {
      reasons["CardTypeMismatch"]++;
      continue;
    }
    if (pc.numa_bind && d.numa != prevnuma) {
      if (!tmp.empty() && !topology) reasons["NumaNotFit"] += static_cast<int>(tmp.size());
      remaining = req.nums;
      tmp.clear();
      tmp_idx.clear();
      prevnuma = d.numa;
    }
    if ((!pc.use_uuids.empty() && !has(pc.use_uuids, d.id)) || has(pc.nouse_uuids, d.id)) {
      reasons["CardUuidMismatch"]++;
      continue;
    }
    if (u.used >= d.count) {
      reasons["CardTimeSlicingExhausted"]++;
      continue;
    }
    if (mutex && u.used > 0) {
      reasons["ExclusiveDeviceAllocateConflict"]++;
      continue;
    }
    cores = std::min(cores, 100);
    int64_t mem = req.memreq > 0 ? req.memreq
                  : req.mem_percentage != device::kPercentageUnset
                      ? int64_t{d.devmem} * req.mem_percentage / 100
                      : 0;
    if (d.devmem - u.usedmem < mem) {
      reasons["CardInsufficientMemory"]++;
      continue;
    }
    if (d.devcore - u.usedcores < cores) {
      reasons["CardInsufficientCore"]++;
      continue;
    }
    if (d.devcore == 100 && cores == 100 && u.used > 0) {
      reasons["ExclusiveDeviceAllocateConflict"]++;
      continue;
    }
    if (d.devcore != 0 && u.usedcores == d.devcore && cores == 0) {
      reasons["CardComputeUnitsExhausted"]++;
      continue;
    }
    if (d.mode == "mig") {
      reasons["CardMigTopologyInfeasible"]++;  // the model's mig cards have no profiles
      continue;
    }
    tmp.push_back({d.id, "NVIDIA", static_cast<int32_t>(mem), cores});
    tmp_idx.push_back(cand[k]);
    if (!topology && --remaining == 0) break;
  }
  if (topology) {
    // HAMi v2.10 device.go: computeWorstSingleCard, generateCombinations, computeBestCombination.
    auto pair_score = [&](size_t a, size_t b) {
      return node.devices->PairScore(static_cast<size_t>(tmp_idx[a]),
                                     static_cast<size_t>(tmp_idx[b]));
    };
    std::vector<size_t> pick;
    if (tmp.size() > static_cast<size_t>(req.nums) && req.nums == 1) {
      int64_t worst = 0;
      for (size_t a = 0; a < tmp.size(); ++a) {
        int64_t sum = 0;
        for (size_t b = 0; b < tmp.size(); ++b) {
          if (a != b) sum += pair_score(a, b);
        }
        if (pick.empty() || sum < worst) {
          pick = {a};
          worst = sum;
        }
      }
    } else if (tmp.size() > static_cast<size_t>(req.nums)) {
      std::vector<std::vector<size_t>> combos;
      std::vector<size_t> cur;
      std::function<void(size_t, size_t)> gen = [&](size_t start, size_t left) {
        if (left == 0) {
          combos.push_back(cur);
          return;
        }
        for (size_t i = start; i + left <= tmp.size(); ++i) {
          cur.push_back(i);
          gen(i + 1, left - 1);
          cur.pop_back();
        }
      };
      gen(0, static_cast<size_t>(req.nums));
      int64_t best = 0;
      for (const auto& combo : combos) {
        int64_t sum = 0;
        for (size_t i = 0; i + 1 < combo.size(); ++i) {
          for (size_t j = i + 1; j < combo.size(); ++j) sum += pair_score(combo[i], combo[j]);
        }
        if (pick.empty() || sum > best) {
          pick = combo;
          best = sum;
        }
      }
    }
    if (!pick.empty()) {
      std::vector<device::ContainerDevice> t2;
      std::vector<int> i2;
      for (size_t p : pick) {
        t2.push_back(tmp[p]);
        i2.push_back(tmp_idx[p]);
      }
      tmp = t2;
      tmp_idx = i2;
    }
    remaining = req.nums - static_cast<int>(tmp.size());
  }
  if (remaining > 0) {
    if (!tmp.empty()) reasons["AllocatedCardsInsufficientRequest"] = static_cast<int>(tmp.size());
    std::vector<std::string> parts;
    for (const auto& [r, n] : reasons) {
      if (n > 0) parts.push_back(std::to_string(n) + "/" + std::to_string(total) + " " + r);
    }
    std::sort(parts.begin(), parts.end());
    out->failed = c;
    out->reason.clear();
    for (size_t i = 0; i < parts.size(); ++i) {
      out->reason += (i ? ", " : "") + parts[i];
    }
    return false;
  }
  for (size_t j = 0; j < tmp.size(); ++j) {
    auto& u = (*usage)[tmp_idx[j]];
    u.used += 1;
    u.usedmem += tmp[j].usedmem;
    u.usedcores += tmp[j].usedcores;
  }
  out->devices[c] = tmp;
  return true;
}

RefOutcome RefFit(const NodeSnapshot& node, const PodRequest& pod, const PodConstraints& pc,
                  const GpuPolicy& policy) {
  RefOutcome out;
  out.devices.resize(pod.containers.size());
  std::vector<DeviceUsage> app(node.usage.begin(), node.usage.end());  // cumulative
  for (size_t c = 0; c < pod.containers.size(); ++c) {
    const auto& r = pod.containers[c];
    if (!r || r->nums <= 0) continue;
    // Init containers: each on a fresh copy.
    std::vector<DeviceUsage> copy(node.usage.begin(), node.usage.end());
    auto* usage = c < pod.init_count ? &copy : &app;
    if (!RefContainer(node, static_cast<int>(c), *r, pc, policy, usage, &out)) {
      return out;
    }
  }
  out.fit = true;
  return out;
}

TEST(FitModelTest, MatchesTheStraightforwardModel) {
  std::mt19937 rng(12345);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const std::vector<std::string> types = {"NVIDIA-Tesla T4", "NVIDIA A100-SXM4-40GB", "NVIDIA",
                                          "Ascend910B", "nvidia-h100"};
  const std::vector<GpuPolicy> policies = {
      kSpread,
      kBinpack,
      kMutex,
      GpuPolicy{{GpuPolicyKey::kNuma}},
      GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}},
      GpuPolicy{{GpuPolicyKey::kNuma, GpuPolicyKey::kSpread}},
      GpuPolicy{{GpuPolicyKey::kMutex, GpuPolicyKey::kBinpack}},
      GpuPolicy{{GpuPolicyKey::kSpread, GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}},
      kTopology,
      GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kTopologyAware}},
      GpuPolicy{{GpuPolicyKey::kMutex, GpuPolicyKey::kTopologyAware}}};
  Fitter fitter;
  int fits = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const int ndev = pick(10) == 0 ? 17 + pick(8) : 1 + pick(8);  // some above kSelectMax
    std::vector<DeviceInfo> devs;
    std::vector<DeviceUsage> usage;
    std::vector<std::string> cordon;
    const std::string node_type = types[static_cast<size_t>(pick(3))];
    for (int i = 0; i < ndev; ++i) {
      DeviceInfo d = Gpu(i, pick(2) ? 8000 : 16000, pick(2));
      d.count = 1 + pick(4);
      d.type = pick(6) == 0 ? types[static_cast<size_t>(pick(5))] : node_type;
      d.health = pick(12) != 0;
      d.mode = pick(15) == 0 ? "mig" : (pick(8) == 0 ? "mps" : "hami-core");
      if (pick(20) == 0) cordon.push_back(d.id);
      DeviceUsage u;
      u.used = pick(d.count + 1);
      u.usedmem = u.used == 0 ? 0 : pick(d.devmem + 1);
      u.usedcores =
          u.used == 0 ? 0 : std::vector<int>{0, 25, 50, 100}[static_cast<size_t>(pick(4))];
      devs.push_back(d);
      usage.push_back(u);
    }
    std::sort(cordon.begin(), cordon.end());
    NodeSnapshot node = Node(devs, usage, cordon);
    if (pick(2) == 0) {  // pair scores, asymmetric, some negative
      std::map<std::pair<int, int>, int64_t> scores;
      for (int i = 0; i < ndev; ++i) {
        for (int j = 0; j < ndev; ++j) {
          if (i != j && pick(4) != 0) scores[{i, j}] = pick(6) - 1 + 10 * pick(3);
        }
      }
      node = WithScores(std::move(node), scores);
    }
    PodRequest pod;
    const int ncont = 1 + pick(4);
    pod.init_count = static_cast<size_t>(pick(2) ? 0 : pick(ncont + 1));
    for (int c = 0; c < ncont; ++c) {
      if (pick(4) == 0) {
        pod.containers.push_back(std::nullopt);
        continue;
      }
      ContainerRequest r =
          Req(1 + pick(3), pick(3) ? 500 * pick(12) : 0,
              std::vector<int>{0, 10, 25, 50, 100, 130}[static_cast<size_t>(pick(6))],
              pick(3) == 0 ? 1 + pick(100) : device::kPercentageUnset);
      pod.containers.push_back(r);
    }
    PodConstraints pc;
    pc.numa_bind = pick(3) == 0;
    if (pick(6) == 0) pc.use_types = {pick(2) ? "a100" : "T4"};
    if (pick(8) == 0) pc.nouse_types = {"tesla"};
    if (pick(8) == 0) pc.vgpu_mode = pick(2) ? "hami-core" : "mps,mig";
    if (pick(8) == 0) pc.use_uuids = {"GPU-0", "GPU-2", "GPU-3"};
    if (pick(8) == 0) pc.nouse_uuids = {"GPU-1"};
    const GpuPolicy& policy =
        policies[static_cast<size_t>(pick(static_cast<int>(policies.size())))];

    RefOutcome want = RefFit(node, pod, pc, policy);
    fitter.Prepare(pod, pc, policy);
    const bool got = fitter.Fit(node);
    ASSERT_EQ(got, want.fit) << "iteration " << iter << ": " << want.reason;
    if (got) {
      ++fits;
      EXPECT_EQ(fitter.BuildPodDevices(node), want.devices) << "iteration " << iter;
    } else {
      EXPECT_EQ(fitter.failed_container(), want.failed) << "iteration " << iter;
      EXPECT_EQ(fitter.reasons().Joined(), want.reason) << "iteration " << iter;
    }
    // The allocating wrapper agrees with the engine.
    FitResult r = FitPod(node, pod, pc, policy);
    EXPECT_EQ(r.fit, got);
  }
  // Both outcomes are exercised.
  EXPECT_GT(fits, 400);
  EXPECT_LT(fits, 3600);
}

}  // namespace
}  // namespace tessera::schedule

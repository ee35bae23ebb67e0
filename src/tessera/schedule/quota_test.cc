// Unit vectors for namespace quota, from HAMi v2.10 pkg/device/quota_test.go and the NVIDIA
// Fit's per-card check (pkg/device/nvidia/device.go fitQuota), run through Tessera's Fitter.
#include "tessera/schedule/quota.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"
#include "tessera/testing/objects.h"

namespace tessera::schedule {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

NamespaceQuota Quota(std::optional<int64_t> mem, std::optional<int64_t> cores, int64_t usedmem,
                     int64_t usedcores) {
  NamespaceQuota q;
  q.ns = "testns";
  q.memory_name = "nvidia.com/gpumem";
  q.cores_name = "nvidia.com/gpucores";
  if (mem) {
    q.memory = QuotaLimit{*mem, "q"};
  }
  if (cores) {
    q.cores = QuotaLimit{*cores, "q"};
  }
  q.usedmem = usedmem;
  q.usedcores = usedcores;
  return q;
}

// quota_test.go TestFitQuota: used 1000/2000 MiB and 200/400 cores.
TEST(NamespaceQuotaTest, FitsLikeHamisFitQuota) {
  NamespaceQuota q = Quota(2000, 400, 1000, 200);
  EXPECT_TRUE(q.Fits(500, 100));
  EXPECT_FALSE(q.Fits(1500, 100));  // memory over
  EXPECT_FALSE(q.Fits(500, 300));   // cores over
  EXPECT_TRUE(q.Fits(1000, 200));   // exactly at the limit fits (used + req > limit fails)
  q.memory_factor = 2;              // the limit is scaled like the recorded usage
  EXPECT_TRUE(q.Fits(1000, 100));
  EXPECT_FALSE(q.Fits(5000, 100));
  EXPECT_TRUE(Quota(std::nullopt, std::nullopt, 1'000'000, 1000).Fits(1'000'000, 1000));
}

// quota_test.go TestFitQuotaExplicitZeroBlocks: an explicit "0" blocks; no quota is unlimited.
TEST(NamespaceQuotaTest, ExplicitZeroBlocks) {
  NamespaceQuota q = Quota(std::nullopt, std::nullopt, 0, 0);
  CollectLimits({{"zero", "limits.nvidia.com/gpumem", "0"}}, &q, nullptr);
  ASSERT_TRUE(q.memory.has_value());
  EXPECT_EQ(q.memory->limit, 0);
  EXPECT_FALSE(q.Fits(500, 0));
  EXPECT_TRUE(q.Fits(0, 0));
}

// quota_test.go TestAddQuotaAndDelQuota / TestDelQuotaNonLimitsKey / TestIsManagedQuota:
// only "limits.<memory name>" and "limits.<cores name>" set limits.
TEST(NamespaceQuotaTest, CollectLimitsReadsOnlyManagedLimitsKeys) {
  NamespaceQuota q = Quota(std::nullopt, std::nullopt, 0, 0);
  std::vector<std::string> skipped;
  CollectLimits({{"a", "limits.nvidia.com/gpumem", "100"},
                 {"a", "limits.nvidia.com/gpucores", "10"},
                 {"b", "requests.nvidia.com/gpumem", "50"},
                 {"b", "0123456nvidia.com/gpumem", "50"},
                 {"b", "limits.nvidia.com/gpu", "1"},
                 {"b", "limits.other-resource", "1"}},
                &q, &skipped);
  EXPECT_EQ(q.memory, (QuotaLimit{100, "a"}));
  EXPECT_EQ(q.cores, (QuotaLimit{10, "a"}));
  EXPECT_THAT(skipped, IsEmpty());
}

// Quantities as HAMi reads them (resource.Quantity.AsInt64, in the resource's own unit):
// "20k" is 20000 MiB, "10Gi" 10737418240 "MiB"; "1.5" and "500m" are skipped (no limit).
TEST(NamespaceQuotaTest, CollectLimitsParsesLikeAsInt64) {
  NamespaceQuota q = Quota(std::nullopt, std::nullopt, 0, 0);
  CollectLimits({{"a", "limits.nvidia.com/gpumem", "20k"}}, &q, nullptr);
  EXPECT_EQ(q.memory->limit, 20000);
  q = Quota(std::nullopt, std::nullopt, 0, 0);
  CollectLimits({{"a", "limits.nvidia.com/gpumem", "10Gi"}}, &q, nullptr);
  EXPECT_EQ(q.memory->limit, int64_t{10} << 30);
  q = Quota(std::nullopt, std::nullopt, 0, 0);
  std::vector<std::string> skipped;
  CollectLimits({{"a", "limits.nvidia.com/gpumem", "1.5"},
                 {"a", "limits.nvidia.com/gpucores", "500m"},
                 {"b", "limits.nvidia.com/gpucores", "x"}},
                &q, &skipped);
  EXPECT_FALSE(q.Limited());
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_THAT(skipped[0], ::testing::StartsWith("testns/a: limits.nvidia.com/gpumem: "));
}

// Tessera: several ResourceQuotas in one namespace: the smallest limit holds (HAMi v2.10: the
// last written; master #3094: the minimum).
TEST(NamespaceQuotaTest, SmallestLimitOfSeveralObjectsWins) {
  NamespaceQuota q = Quota(std::nullopt, std::nullopt, 0, 0);
  CollectLimits({{"big", "limits.nvidia.com/gpumem", "40000"},
                 {"small", "limits.nvidia.com/gpumem", "30000"},
                 {"z", "limits.nvidia.com/gpumem", "30000"}},
                &q, nullptr);
  EXPECT_EQ(q.memory, (QuotaLimit{30000, "small"}));
}

TEST(NamespaceQuotaTest, MissTextNamesQuotaLimitUsageAndAsk) {
  NamespaceQuota q = Quota(40000, std::nullopt, 36000, 0);
  q.ns = "ml";
  EXPECT_EQ(QuotaMissText(q, QuotaMiss{true, 8000}),
            "namespace ml: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked");
  q.cores = QuotaLimit{100, "q"};
  q.usedcores = 80;
  EXPECT_EQ(QuotaMissText(q, QuotaMiss{false, 30}),
            "namespace ml: limits.nvidia.com/gpucores 100, used 80 + 30 asked");
  q.memory_factor = 2;
  q.usedmem = 72000;
  EXPECT_EQ(QuotaMissText(q, QuotaMiss{true, 16001}),
            "namespace ml: limits.nvidia.com/gpumem 40000, used 36000 + 8001 asked");
}

// ---- the per-card check in the fit ------------------------------------------------------

device::NodeSnapshot Node(int gpus, int32_t devmem) {
  std::vector<std::string> uuids;
  for (int i = 0; i < gpus; ++i) {
    uuids.push_back("GPU-" + std::to_string(i));
  }
  device::NodeSnapshot s;
  s.devices = ::tessera::testing::GpuNodeDevices("n1", uuids, devmem);
  s.usage.resize(static_cast<size_t>(gpus));
  return s;
}

device::ContainerRequest Req(int32_t nums, int32_t mem, int32_t cores = 0, int32_t pct = -1) {
  device::ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  r.coresreq = cores;
  if (pct >= 0) {
    r.mem_percentage = pct;
  }
  return r;
}

FitResult FitWith(const device::NodeSnapshot& node, const device::PodRequest& req,
                  const NamespaceQuota& quota, std::optional<QuotaMiss>* miss = nullptr) {
  device::PodConstraints constraints;
  device::GpuPolicy policy;
  Fitter f;
  f.Prepare(req, constraints, policy, &quota);
  FitResult r;
  r.fit = f.Fit(node);
  if (!r.fit) {
    r.reasons = f.reasons();
    r.reason = f.reasons().Joined();
  }
  if (miss != nullptr) {
    *miss = f.quota_miss();
  }
  return r;
}

TEST(FitQuotaTest, CountsPerCardTimesCount) {
  // 2 cards x 3000 MiB asks 6000 (#1393): 14000 used of 20000 fits, 14001 does not.
  device::PodRequest req;
  req.containers = {Req(2, 3000)};
  EXPECT_TRUE(FitWith(Node(2, 16000), req, Quota(20000, std::nullopt, 14000, 0)).fit);
  std::optional<QuotaMiss> miss;
  FitResult r = FitWith(Node(2, 16000), req, Quota(20000, std::nullopt, 14001, 0), &miss);
  EXPECT_FALSE(r.fit);
  // The first card passes (3000), the second is refused (6000), as HAMi's loop does.
  EXPECT_EQ(r.reason, "1/2 AllocatedCardsInsufficientRequest, 1/2 ResourceQuotaNotFit");
  ASSERT_TRUE(miss.has_value());
  EXPECT_EQ(*miss, (QuotaMiss{true, 6000}));
}

TEST(FitQuotaTest, PercentageIsResolvedAgainstTheCard) {
  // 50 % of a 16000 MiB card asks 8000 MiB of quota.
  device::PodRequest req;
  req.containers = {Req(1, 0, 0, 50)};
  EXPECT_TRUE(FitWith(Node(1, 16000), req, Quota(10000, std::nullopt, 2000, 0)).fit);
  FitResult r = FitWith(Node(1, 16000), req, Quota(10000, std::nullopt, 2001, 0));
  EXPECT_EQ(r.reason, "1/1 ResourceQuotaNotFit");
}

TEST(FitQuotaTest, CoresQuota) {
  device::PodRequest req;
  req.containers = {Req(1, 1000, 30)};
  EXPECT_TRUE(FitWith(Node(1, 16000), req, Quota(std::nullopt, 100, 0, 70)).fit);
  std::optional<QuotaMiss> miss;
  EXPECT_EQ(FitWith(Node(1, 16000), req, Quota(std::nullopt, 100, 0, 71), &miss).reason,
            "1/1 ResourceQuotaNotFit");
  EXPECT_EQ(*miss, (QuotaMiss{false, 30}));
}

TEST(FitQuotaTest, InitContainersCollapseOnTheirCard) {
  // Init 5000 then app 3000 on one card count max(5000, 3000) = 5000, not 8000.
  device::PodRequest req;
  req.init_count = 1;
  req.containers = {Req(1, 5000), Req(1, 3000)};
  EXPECT_TRUE(FitWith(Node(1, 16000), req, Quota(6000, std::nullopt, 1000, 0)).fit);
  EXPECT_FALSE(FitWith(Node(1, 16000), req, Quota(6000, std::nullopt, 1001, 0)).fit);
  // Two app containers on one card add up: 3000 + 3000.
  device::PodRequest apps;
  apps.containers = {Req(1, 3000), Req(1, 3000)};
  EXPECT_TRUE(FitWith(Node(1, 16000), apps, Quota(6000, std::nullopt, 0, 0)).fit);
  EXPECT_FALSE(FitWith(Node(1, 16000), apps, Quota(5999, std::nullopt, 0, 0)).fit);
}

TEST(FitQuotaTest, CheckedBeforeTheCardsFreeMemory) {
  // A card that is both full and over quota is counted once, as ResourceQuotaNotFit (HAMi's
  // order: the quota check comes before CardInsufficientMemory).
  device::NodeSnapshot node = Node(1, 4000);
  node.usage[0].usedmem = 3500;
  device::PodRequest req;
  req.containers = {Req(1, 1000)};
  EXPECT_EQ(FitWith(node, req, Quota(500, std::nullopt, 0, 0)).reason, "1/1 ResourceQuotaNotFit");
  EXPECT_EQ(FitWith(node, req, Quota(5000, std::nullopt, 0, 0)).reason,
            "1/1 CardInsufficientMemory");
}

TEST(FitQuotaTest, DecideWithoutQuotaIsUnlimited) {
  std::vector<Candidate> candidates(1);
  candidates[0].name = "n1";
  candidates[0].snapshot = Node(1, 16000);
  device::PodRequest req;
  req.containers = {Req(1, 8000)};
  NamespaceQuota limited = Quota(4000, std::nullopt, 0, 0);
  Decision with =
      Decide(candidates, req, {}, device::NodePolicy::kBinpack, device::GpuPolicy{}, &limited);
  EXPECT_FALSE(with.winner.has_value());
  EXPECT_EQ(with.nodes[0].reason, "1/1 ResourceQuotaNotFit");
  EXPECT_EQ(with.quota_miss, (QuotaMiss{true, 8000}));
  Decision without = Decide(candidates, req, {}, device::NodePolicy::kBinpack, device::GpuPolicy{});
  EXPECT_TRUE(without.winner.has_value());
  EXPECT_FALSE(without.quota_miss.has_value());
  NamespaceQuota none = Quota(std::nullopt, std::nullopt, 1'000'000, 0);
  EXPECT_TRUE(
      Decide(candidates, req, {}, device::NodePolicy::kBinpack, device::GpuPolicy{}, &none).winner);
}

}  // namespace
}  // namespace tessera::schedule

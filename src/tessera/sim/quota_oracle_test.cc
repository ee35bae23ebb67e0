#include "tessera/sim/quota_oracle.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"
#include "tessera/testing/objects.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

const std::string kMem(kQuotaMemoryResource);
const std::string kCores(kQuotaCoresResource);

// One node "n1" registering GPU-a and GPU-b (10000 MiB, 4 slots each).
Truth NodeTruth(const std::vector<kube::Pod>& pods) {
  kube::Node n;
  n.meta.name = "n1";
  n.meta.annotations.Set(
      "hami.io/node-nvidia-register",
      device::EncodeNodeRegisterJson({::tessera::testing::GpuDevice("GPU-a", 0, 10000, "A", 4),
                                      ::tessera::testing::GpuDevice("GPU-b", 1, 10000, "A", 4)}));
  return ComputeTruth({n}, pods);
}

kube::Pod Held(const std::string& ns, const std::string& name, const std::string& alloc,
               size_t init_containers = 0) {
  kube::Pod p;
  p.meta.ns = ns;
  p.meta.name = name;
  p.node_name = "n1";
  p.phase = kube::PodPhase::kRunning;
  p.init_containers.resize(init_containers);
  p.meta.annotations.Set("hami.io/vgpu-node", "n1");
  p.meta.annotations.Set("hami.io/vgpu-devices-allocated", alloc);
  return p;
}

kube::ResourceQuota Quota(const std::string& ns, const std::string& name,
                          std::vector<std::pair<std::string, std::string>> hard) {
  kube::ResourceQuota q;
  q.meta.ns = ns;
  q.meta.name = name;
  for (const auto& [k, v] : hard) {
    q.hard.Set(k, v);
  }
  return q;
}

TEST(QuotaTruthTest, CountsAsHamiDoes) {
  std::vector<kube::Pod> pods = {
      // 2 cards x 3000: 6000 (per-device memory x count).
      Held("ml", "two", "GPU-a,NVIDIA,3000,20:GPU-b,NVIDIA,3000,20:;"),
      // Init 5000 then app 2000 + 1000 on GPU-a: max(5000, 3000) = 5000; cores max(10, 60).
      Held("ml", "init", "GPU-a,NVIDIA,5000,10:;GPU-a,NVIDIA,2000,30:;GPU-a,NVIDIA,1000,30:;", 1),
      Held("free", "other", "GPU-b,NVIDIA,700,5:;"),
  };
  kube::Pod done = Held("ml", "done", "GPU-a,NVIDIA,9000,0:;");
  done.phase = kube::PodPhase::kSucceeded;
  kube::Pod unregistered = Held("ml", "elsewhere", "GPU-z,NVIDIA,9000,0:;");
  pods.insert(pods.end(), {done, unregistered});
  const QuotaTruth t = ComputeQuotaTruth(NodeTruth(pods), pods, {});
  EXPECT_EQ(t.at({"ml", kMem}).used, 11000);
  EXPECT_EQ(t.at({"ml", kCores}).used, 40 + 60);
  EXPECT_FALSE(t.at({"ml", kMem}).limit.has_value());
  EXPECT_EQ(t.at({"free", kMem}).used, 700);
  EXPECT_EQ(t.size(), 4u);
}

TEST(QuotaTruthTest, LimitsAreTheSmallestWholeNumberOfEveryQuota) {
  const std::vector<kube::ResourceQuota> quotas = {
      Quota("ml", "a",
            {{"limits.nvidia.com/gpumem", "20k"}, {"limits.nvidia.com/gpucores", "300"}}),
      Quota("ml", "b", {{"limits.nvidia.com/gpumem", "15000"}}),
      Quota("ml", "c", {{"limits.nvidia.com/gpumem", "1.5"}}),  // not a whole number: no limit
      Quota("idle", "d", {{"limits.nvidia.com/gpucores", "0"}}),
  };
  const QuotaTruth t = ComputeQuotaTruth(NodeTruth({}), {}, quotas);
  EXPECT_EQ(t.at({"ml", kMem}).limit, 15000);
  EXPECT_EQ(t.at({"ml", kCores}).limit, 300);
  EXPECT_EQ(t.at({"idle", kCores}).limit, 0);
  EXPECT_EQ(t.at({"idle", kCores}).used, 0);
  EXPECT_FALSE(t.contains({"idle", kMem}));
}

TEST(ParseQuotaUsedTest, ReadsNamespaceAndResource) {
  absl::StatusOr<QuotaUsed> u = ParseQuotaUsed(
      "# TYPE hami_resource_quota_used gauge\n"
      "hami_resource_quota_used{limit=\"40000\",namespace=\"ml\",quota_name=\"nvidia.com/gpumem\","
      "zone=\"vGPU\"} 36000\n"
      "hami_resource_quota_used{limit=\"0\",namespace=\"ml\",quota_name=\"nvidia.com/gpucores\","
      "zone=\"vGPU\"} 120\n"
      "hami_resource_quota_limit{namespace=\"ml\",quota_name=\"nvidia.com/gpumem\"} 40000\n");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(*u, (QuotaUsed{{{"ml", kMem}, 36000}, {{"ml", kCores}, 120}}));
  EXPECT_FALSE(ParseQuotaUsed("hami_resource_quota_used{namespace=\"ml\"} 1\n").ok());
  EXPECT_FALSE(
      ParseQuotaUsed("hami_resource_quota_used{namespace=\"ml\",quota_name=\"x\"} abc\n").ok());
}

TEST(QuotaOracleTest, ANamespaceOverItsLimitIsAViolationAtOnce) {
  const std::vector<kube::Pod> pods = {Held("ml", "p", "GPU-a,NVIDIA,6000,0:;")};
  const Truth truth = NodeTruth(pods);
  QuotaObservation q;
  q.truth =
      ComputeQuotaTruth(truth, pods, {Quota("ml", "gpu", {{"limits.nvidia.com/gpumem", "5000"}})});
  q.exported = QuotaUsed{{{"ml", kMem}, 6000}, {{"ml", kCores}, 0}};
  Oracle oracle(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  oracle.Observe(t0, truth, nullptr, "", &q);
  ASSERT_EQ(oracle.violations().size(), 1u);
  EXPECT_TRUE(oracle.violations()[0].overcommit);
  EXPECT_THAT(oracle.violations()[0].what,
              HasSubstr("namespace ml over its quota: limits.nvidia.com/gpumem 5000, used 6000"));
  oracle.Observe(t0 + absl::Seconds(1), truth, nullptr, "", &q);
  EXPECT_EQ(oracle.violations().size(), 1u);  // reported once while it lasts
}

TEST(QuotaOracleTest, ExportedUsageMustMatchWithinTheWindow) {
  const std::vector<kube::Pod> pods = {Held("ml", "p", "GPU-a,NVIDIA,3000,10:;")};
  const Truth truth = NodeTruth(pods);
  Exported devices;  // the device families agree
  devices.devices["GPU-a"] = {"n1", 3000, 1, 10};
  devices.shares[{"ml/p", "GPU-a"}] = {"n1", 3000, 10};
  QuotaObservation q;
  q.truth = ComputeQuotaTruth(truth, pods, {});
  q.exported = QuotaUsed{{{"ml", kMem}, 3000}, {{"ml", kCores}, 10}};
  Oracle oracle(absl::Seconds(5));
  absl::Time t = absl::FromUnixSeconds(1000);
  oracle.Observe(t, truth, &devices, "", &q);
  EXPECT_TRUE(oracle.divergences().empty());
  // A lost delete: the namespace's usage stays exported after the pod is gone.
  q.truth = ComputeQuotaTruth(NodeTruth({}), {}, {});
  devices = {};
  for (int i = 1; i <= 7; ++i) {
    oracle.Observe(t + absl::Seconds(i), NodeTruth({}), &devices, "drop_events", &q);
  }
  ASSERT_EQ(oracle.divergences().size(), 2u);  // memory and cores
  EXPECT_EQ(oracle.divergences()[0].device, "quota ml nvidia.com/gpucores");
  EXPECT_EQ(oracle.divergences()[0].cause, "drop_events");
  ASSERT_FALSE(oracle.violations().empty());
  EXPECT_THAT(oracle.violations()[0].what, HasSubstr("truth 0, exported 10"));
}

TEST(QuotaOracleTest, QuotaUsageIsJudgedInQuietSamplesOnly) {
  // A pod in flight: Tessera exports its device and namespace usage, the truth has neither yet.
  // The device differs, so the namespace's sum is not compared in that sample.
  const Truth truth = NodeTruth({});
  Exported exported;
  exported.devices["GPU-a"] = {"n1", 3000, 1, 10};
  QuotaObservation q;
  q.truth = ComputeQuotaTruth(truth, {}, {});
  q.exported = QuotaUsed{{{"ml", kMem}, 3000}};
  Oracle oracle(absl::Seconds(5));
  const absl::Time t = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 8; ++i) {
    oracle.Observe(t + absl::Seconds(i), truth, &exported, "", &q);
  }
  ASSERT_EQ(oracle.divergences().size(), 1u);
  EXPECT_EQ(oracle.divergences()[0].device, "GPU-a");
  // Once the devices agree, the stale namespace sum alone is a divergence.
  exported.devices.clear();
  for (int i = 8; i < 16; ++i) {
    oracle.Observe(t + absl::Seconds(i), truth, &exported, "", &q);
  }
  ASSERT_EQ(oracle.divergences().size(), 2u);
  EXPECT_EQ(oracle.divergences()[1].device, "quota ml nvidia.com/gpumem");
  EXPECT_TRUE(oracle.divergences()[1].violation);
}

}  // namespace
}  // namespace tessera::sim

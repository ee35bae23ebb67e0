#include "tessera/sim/mig_oracle.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"
#include "tessera/sim/oracle.h"
#include "tessera/testing/objects.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

// Node "m1" with two A100-40GB cards in mig mode (GPU-m0, GPU-m1) and node "s1" with one
// shared card (GPU-s0).
std::vector<kube::Node> Nodes() {
  return {::tessera::testing::GpuNode(
              "m1", device::EncodeNodeRegisterJson(
                        ::tessera::testing::MigNodeDevices("m1", {"GPU-m0", "GPU-m1"})->devices)),
          ::tessera::testing::GpuNode(
              "s1", device::EncodeNodeRegisterJson(
                        {::tessera::testing::GpuDevice("GPU-s0", 0, 40960, "NVIDIA A100", 10)}))};
}

device::MigAllocation Alloc(int container, const std::string& card, const std::string& profile,
                            uint32_t start, uint32_t size, uint32_t gi = 0) {
  device::MigAllocation a;
  a.container_index = container;
  a.gpu_uuid = card;
  a.profile = profile;
  a.placement = {start, size};
  if (gi > 0) {
    a.mig_uuid = "MIG-" + std::to_string(gi);
    a.gpu_instance_id = gi;
    a.compute_instance_id = 0;
  }
  return a;
}

// A pod bound to m1 holding `devices`, with `mig` as its hami.io/vgpu-mig-allocations.
kube::Pod MigPod(const std::string& name, const std::string& devices,
                 const std::vector<device::MigAllocation>& mig) {
  kube::Pod p = ::tessera::testing::AllocatedPod(name, "m1", devices);
  p.phase = kube::PodPhase::kRunning;
  p.meta.annotations.Set("hami.io/vgpu-mig-allocations", device::EncodeMigAllocations(mig));
  return p;
}

TEST(MigTruthTest, TheInstancesOfHoldingPodsOnMigCards) {
  kube::Pod done =
      MigPod("done", "GPU-m0,NVIDIA,4864,15:;", {Alloc(0, "GPU-m0", "1g.5gb", 6, 1, /*gi=*/9)});
  done.phase = kube::PodPhase::kSucceeded;
  const std::vector<kube::Pod> pods = {
      MigPod("a", "GPU-m0,NVIDIA,4864,15:;", {Alloc(0, "GPU-m0", "1g.5gb", 6, 1, /*gi=*/3)}),
      // Not realised yet: an instance, not exported.
      MigPod("b", "GPU-m0,NVIDIA,9856,29:;", {Alloc(0, "GPU-m0", "2g.10gb", 0, 2)}),
      // Terminal: holds nothing, its instance is free.
      done,
      // A shared pod without MIG.
      ::tessera::testing::AllocatedPod("s", "s1", "GPU-s0,NVIDIA,1000,0:;"),
  };
  const MigTruth t = ComputeMigTruth(Nodes(), pods);
  EXPECT_EQ(t.cards.size(), 2u);  // the mig cards only
  EXPECT_EQ(t.pods, 2);
  EXPECT_EQ(t.instances, 2);
  EXPECT_EQ(t.realised, 1);
  ASSERT_EQ(t.cards.at("GPU-m0").instances.size(), 2u);
  EXPECT_TRUE(t.cards.at("GPU-m0").instances[0].exported);
  EXPECT_FALSE(t.cards.at("GPU-m0").instances[1].exported);
  EXPECT_EQ(t.cards.at("GPU-m0").node, "m1");
  EXPECT_TRUE(FindMigOverlaps(t).empty());
  // A value that does not decode holds no instance.
  kube::Pod bad = pods[0];
  bad.meta.annotations.Set("hami.io/vgpu-mig-allocations", "[{");
  EXPECT_EQ(ComputeMigTruth(Nodes(), {bad}).instances, 0);
}

// Two live pods on one slice of GPU-m1: an overlap, a violation in the first sample (once while
// it lasts), and again if it comes back after clearing.
TEST(MigOracleTest, AnOverlapIsAViolationAtOnce) {
  const std::vector<kube::Pod> pods = {
      MigPod("x", "GPU-m1,NVIDIA,19968,43:;", {Alloc(0, "GPU-m1", "3g.20gb", 4, 4, 1)}),
      MigPod("y", "GPU-m1,NVIDIA,4864,15:;", {Alloc(0, "GPU-m1", "1g.5gb", 6, 1, 2)}),
      MigPod("z", "GPU-m1,NVIDIA,9856,29:;", {Alloc(0, "GPU-m1", "2g.10gb", 0, 2, 3)}),
  };
  const std::vector<MigOverlap> overlaps = FindMigOverlaps(ComputeMigTruth(Nodes(), pods));
  ASSERT_EQ(overlaps.size(), 1u);
  EXPECT_EQ(overlaps[0].card, "GPU-m1");
  EXPECT_THAT(overlaps[0].what, HasSubstr("ml/x container 0 device 0 (3g.20gb at 4+4)"));
  EXPECT_THAT(overlaps[0].what, HasSubstr("ml/y container 0 device 0 (1g.5gb at 6+1)"));

  Oracle oracle(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  MigObservation m;
  m.truth = ComputeMigTruth(Nodes(), pods);
  const Truth truth = ComputeTruth(Nodes(), pods);
  oracle.Observe(t0, truth, nullptr, "", nullptr, &m);
  ASSERT_EQ(oracle.violations().size(), 1u);
  EXPECT_TRUE(oracle.violations()[0].overcommit);
  EXPECT_THAT(oracle.violations()[0].what, HasSubstr("MIG placements overlap on GPU-m1 (m1)"));
  oracle.Observe(t0 + absl::Seconds(1), truth, nullptr, "", nullptr, &m);
  EXPECT_EQ(oracle.violations().size(), 1u);  // the same overlap: reported once
  MigObservation clear;
  clear.truth = ComputeMigTruth(Nodes(), {pods[0], pods[2]});
  oracle.Observe(t0 + absl::Seconds(2), truth, nullptr, "", nullptr, &clear);
  oracle.Observe(t0 + absl::Seconds(3), truth, nullptr, "", nullptr, &m);
  EXPECT_EQ(oracle.violations().size(), 2u);
}

// Seven 1g instances book 7 × 15 % cores on a mig card: not an over-commit (the profile's
// rounded core, as HAMi books it); the same cores on a shared card are one, and so is memory
// past devmem on a mig card.
TEST(MigOracleTest, AFullMigCardIsNoOverCommitOfCores) {
  std::vector<kube::Pod> pods;
  for (uint32_t i = 0; i < 7; ++i) {
    pods.push_back(MigPod("p" + std::to_string(i), "GPU-m0,NVIDIA,4864,15:;",
                          {Alloc(0, "GPU-m0", "1g.5gb", i, 1, i + 1)}));
  }
  MigObservation m;
  m.truth = ComputeMigTruth(Nodes(), pods);
  Oracle oracle(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  oracle.Observe(t0, ComputeTruth(Nodes(), pods), nullptr, "", nullptr, &m);
  EXPECT_TRUE(oracle.violations().empty());
  std::vector<kube::Pod> shared;
  for (int i = 0; i < 7; ++i) {
    shared.push_back(
        ::tessera::testing::AllocatedPod("s" + std::to_string(i), "s1", "GPU-s0,NVIDIA,100,15:;"));
  }
  oracle.Observe(t0 + absl::Seconds(1), ComputeTruth(Nodes(), shared), nullptr, "", nullptr, &m);
  ASSERT_EQ(oracle.violations().size(), 1u);
  EXPECT_THAT(oracle.violations()[0].what, HasSubstr("over-commit on GPU-s0"));
  pods.push_back(MigPod("big", "GPU-m0,NVIDIA,40192,100:;", {}));
  oracle.Observe(t0 + absl::Seconds(2), ComputeTruth(Nodes(), pods), nullptr, "", nullptr, &m);
  ASSERT_EQ(oracle.violations().size(), 2u);
  EXPECT_THAT(oracle.violations()[1].what, HasSubstr("over-commit on GPU-m0"));
}

constexpr char kSample[] =
    "hami_node_gpu_mig_instance_info{compute_instance_id=\"0\",device_index=\"0\","
    "device_uuid=\"GPU-m0\",gpu_instance_id=\"3\",mig_uuid=\"MIG-3\",node=\"m1\","
    "placement_size=\"1\",placement_start=\"6\",profile=\"1g.5gb\",zone=\"vGPU\"} 1\n";

TEST(MigOracleTest, ParsesTheExportedInstances) {
  absl::StatusOr<MigInstances> e =
      ParseMigInstances(std::string("# TYPE hami_node_gpu_mig_instance_info gauge\n") + kSample +
                        "hami_gpu_shared_count{device_uuid=\"GPU-m0\"} 1\n");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, (MigInstances{{"GPU-m0", {"6+1 1g.5gb MIG-3 3/0"}}}));
  EXPECT_FALSE(
      ParseMigInstances("hami_node_gpu_mig_instance_info{device_uuid=\"GPU-m0\"} 1\n").ok());
  absl::StatusOr<MigInstances> bad = ParseMigInstances(
      "hami_node_gpu_mig_instance_info{compute_instance_id=\"0\",device_uuid=\"GPU-m0\","
      "gpu_instance_id=\"x\",mig_uuid=\"MIG-3\",placement_size=\"1\",placement_start=\"6\","
      "profile=\"1g.5gb\"} 1\n");
  EXPECT_THAT(bad.status().message(), HasSubstr("bad gpu_instance_id"));
}

// An instance Tessera still exports after its pod is gone (a lost delete): a divergence, a
// violation once it outlives the window; healed within it, none.
TEST(MigOracleTest, ALeakedInstanceOutlivingTheWindowIsAViolation) {
  const kube::Pod a =
      MigPod("a", "GPU-m0,NVIDIA,4864,15:;", {Alloc(0, "GPU-m0", "1g.5gb", 6, 1, /*gi=*/3)});
  Oracle oracle(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // While a lives the exported instance is the truth's.
  MigObservation live;
  live.truth = ComputeMigTruth(Nodes(), {a});
  live.exported = *ParseMigInstances(kSample);
  EXPECT_TRUE(CompareMigInstances(live.truth, *live.exported).empty());
  Exported devices;  // the device families agree with the truth (not judged here)
  devices.devices["GPU-m0"] = {"m1", 4864, 1, 15};
  oracle.Observe(t0, ComputeTruth(Nodes(), {a}), &devices, "", nullptr, &live);
  EXPECT_EQ(oracle.open(), 0u);
  // a is gone; the sample stays exported.
  MigObservation gone;
  gone.truth = ComputeMigTruth(Nodes(), {});
  gone.exported = live.exported;
  const Truth empty = ComputeTruth(Nodes(), {});
  Exported none;
  const std::map<std::string, std::string> diff = CompareMigInstances(gone.truth, *gone.exported);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_EQ(diff.at("GPU-m0"), "MIG instances: truth [], exported [6+1 1g.5gb MIG-3 3/0]");
  for (int s = 1; s <= 7; ++s) {
    oracle.Observe(t0 + absl::Seconds(s), empty, &none, "drop_events", nullptr, &gone);
  }
  ASSERT_EQ(oracle.violations().size(), 1u);
  EXPECT_FALSE(oracle.violations()[0].overcommit);
  EXPECT_THAT(oracle.violations()[0].what,
              HasSubstr("divergence on mig GPU-m0 (m1) longer than 5s: MIG instances: truth []"));
  ASSERT_EQ(oracle.divergences().size(), 1u);
  EXPECT_EQ(oracle.divergences()[0].cause, "drop_events");

  // The same leak healed after 3 s: a divergence, no violation.
  Oracle healed(absl::Seconds(5));
  for (int s = 1; s <= 3; ++s) {
    healed.Observe(t0 + absl::Seconds(s), empty, &none, "", nullptr, &gone);
  }
  MigObservation fixed;
  fixed.truth = gone.truth;
  fixed.exported = MigInstances{};
  healed.Observe(t0 + absl::Seconds(4), empty, &none, "", nullptr, &fixed);
  healed.Finish(t0 + absl::Seconds(20));
  EXPECT_TRUE(healed.violations().empty());
  ASSERT_EQ(healed.divergences().size(), 1u);
  EXPECT_EQ(healed.divergences()[0].end, t0 + absl::Seconds(4));
}

}  // namespace
}  // namespace tessera::sim

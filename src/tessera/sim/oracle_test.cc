#include "tessera/sim/oracle.h"

#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"
#include "tessera/testing/objects.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

kube::Node GpuNode(const std::string& name, const std::vector<std::string>& uuids,
                   bool delimited = false) {
  std::vector<device::DeviceInfo> devices;
  for (size_t i = 0; i < uuids.size(); ++i) {
    devices.push_back(
        ::tessera::testing::GpuDevice(uuids[i], static_cast<int32_t>(i), 10000, "NVIDIA-A100", 2));
  }
  kube::Node n;
  n.meta.name = name;
  n.meta.annotations.Set("hami.io/node-nvidia-register",
                         delimited ? device::EncodeNodeRegisterDelimited(devices)
                                   : device::EncodeNodeRegisterJson(devices));
  return n;
}

kube::Pod GpuPod(const std::string& name, const std::string& node, const std::string& alloc) {
  kube::Pod p;
  p.meta.name = name;
  p.meta.ns = "default";
  p.node_name = node;
  p.phase = kube::PodPhase::kRunning;
  p.meta.annotations.Set("hami.io/vgpu-node", node);
  p.meta.annotations.Set("hami.io/vgpu-devices-allocated", alloc);
  return p;
}

TEST(ComputeTruthTest, SumsEveryContainerEntryOfBoundLivePods) {
  std::vector<kube::Node> nodes = {GpuNode("n1", {"GPU-a", "GPU-b"}),
                                   GpuNode("n2", {"GPU-c"}, /*delimited=*/true)};
  std::vector<kube::Pod> pods = {
      GpuPod("p1", "n1", "GPU-a,NVIDIA,3000,30:;GPU-a,NVIDIA,1000,0:;"),
      GpuPod("p2", "n1", "GPU-a,NVIDIA,2000,10:GPU-b,NVIDIA,2000,10:;"),
      GpuPod("p3", "n2", "GPU-c,NVIDIA,500,0:;"),
  };
  kube::Pod done = GpuPod("done", "n1", "GPU-b,NVIDIA,7000,0:;");
  done.phase = kube::PodPhase::kSucceeded;
  kube::Pod failed = GpuPod("failed", "n1", "GPU-b,NVIDIA,7000,0:;");
  failed.meta.annotations.Set("hami.io/bind-phase", "failed");
  kube::Pod unbound = GpuPod("unbound", "n1", "GPU-b,NVIDIA,7000,0:;");
  unbound.node_name.clear();
  kube::Pod elsewhere = GpuPod("elsewhere", "n2", "GPU-b,NVIDIA,7000,0:;");  // not n2's device
  pods.insert(pods.end(), {done, failed, unbound, elsewhere});

  const Truth t = ComputeTruth(nodes, pods);
  ASSERT_EQ(t.devices.size(), 3u);
  EXPECT_EQ(t.devices.at("GPU-a").used, 3);
  EXPECT_EQ(t.devices.at("GPU-a").usedmem, 6000);
  EXPECT_EQ(t.devices.at("GPU-a").usedcores, 40);
  EXPECT_EQ(t.devices.at("GPU-b").usedmem, 2000);
  EXPECT_EQ(t.devices.at("GPU-c").usedmem, 500);
  EXPECT_EQ(t.devices.at("GPU-c").node, "n2");
  EXPECT_EQ(t.devices.at("GPU-a").devmem, 10000);
  EXPECT_EQ(t.total_usedmem, 8500);
  EXPECT_EQ(t.holding_pods, 3);
  // Per pod and device, the containers' entries summed (HAMi HEAD's collapsed pod share).
  ASSERT_EQ(t.shares.size(), 4u);
  const PodShare& p1 = t.shares.at({"default/p1", "GPU-a"});
  EXPECT_EQ(p1.usedmem, 4000);
  EXPECT_EQ(p1.usedcores, 30);
  EXPECT_EQ(p1.node, "n1");
  EXPECT_EQ(t.shares.at({"default/p2", "GPU-a"}).usedmem, 2000);
  EXPECT_EQ(t.shares.at({"default/p2", "GPU-b"}).usedcores, 10);
  EXPECT_EQ(t.shares.at({"default/p3", "GPU-c"}).node, "n2");
  for (const char* holds_nothing : {"done", "failed", "unbound", "elsewhere"}) {
    EXPECT_EQ(t.shares.count({std::string("default/") + holds_nothing, "GPU-b"}), 0u)
        << holds_nothing;
  }
}

TEST(ParseMetricsTest, ReadsTheThreeDeviceFamiliesByUuid) {
  const std::string text =
      "# HELP hami_gpu_memory_allocated_bytes GPU device memory allocated to pods, in bytes.\n"
      "# TYPE hami_gpu_memory_allocated_bytes gauge\n"
      "hami_gpu_memory_allocated_bytes{device_cores=\"100\",device_index=\"0\",device_type="
      "\"NVIDIA-A100\",device_uuid=\"GPU-a\",node=\"n1\",zone=\"vGPU\"} 3145728000\n"
      "hami_gpu_memory_allocated_bytes{device_cores=\"100\",device_index=\"1\",device_type="
      "\"NVIDIA-A100\",device_uuid=\"GPU-b\",node=\"n1\",zone=\"vGPU\"} 0\n"
      "hami_gpu_shared_count{device_index=\"0\",device_type=\"NVIDIA-A100\",device_uuid=\"GPU-a\","
      "node=\"n1\",zone=\"vGPU\"} 2\n"
      "hami_gpu_core_allocated_ratio{device_index=\"0\",device_type=\"NVIDIA-A100\",device_uuid="
      "\"GPU-a\",node=\"n1\",zone=\"vGPU\"} 40\n"
      "hami_gpu_memory_limit_bytes{device_index=\"0\",device_uuid=\"GPU-a\",node=\"n1\"} 1e10\n"
      "GPUDeviceMemoryAllocated{deviceuuid=\"GPU-a\",nodeid=\"n1\"} 99\n";
  absl::StatusOr<Exported> e = ParseMetrics(text);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->devices.size(), 2u);
  EXPECT_EQ(e->devices.at("GPU-a").usedmem, 3000);
  EXPECT_EQ(e->devices.at("GPU-a").used, 2);
  EXPECT_EQ(e->devices.at("GPU-a").usedcores, 40);
  EXPECT_EQ(e->devices.at("GPU-a").node, "n1");
  EXPECT_EQ(e->devices.at("GPU-b").usedmem, 0);
  EXPECT_TRUE(e->shares.empty());

  EXPECT_FALSE(ParseMetrics("hami_gpu_shared_count{node=\"n1\"} 1\n").ok());
  EXPECT_FALSE(ParseMetrics("hami_gpu_shared_count{device_uuid=\"x\"} abc\n").ok());
}

TEST(ParseMetricsTest, ReadsHamiV25NamesWhenTheTextHasNoHamiFamily) {
  // HAMi v2.5.2's scheduler (cmd/scheduler/metrics.go): memory in bytes, per container.
  const std::string text =
      "GPUDeviceMemoryAllocated{devicecores=\"100\",deviceidx=\"0\",deviceuuid=\"GPU-a\","
      "nodeid=\"n1\"} 4.194304e+09\n"
      "GPUDeviceSharedNum{deviceidx=\"0\",deviceuuid=\"GPU-a\",nodeid=\"n1\"} 1\n"
      "GPUDeviceCoreAllocated{deviceidx=\"0\",deviceuuid=\"GPU-a\",nodeid=\"n1\"} 30\n"
      "GPUDeviceMemoryLimit{deviceidx=\"0\",deviceuuid=\"GPU-a\",nodeid=\"n1\"} 4e10\n"
      "vGPUPodsDeviceAllocated{containeridx=\"0\",deviceusedcore=\"30\",deviceuuid=\"GPU-a\","
      "nodename=\"n1\",podname=\"p1\",podnamespace=\"ns1\"} 4.194304e+09\n"
      "vGPUCorePercentage{containeridx=\"0\",deviceuuid=\"GPU-a\",nodename=\"n1\",podname="
      "\"p1\",podnamespace=\"ns1\"} 30\n";
  absl::StatusOr<Exported> e = ParseMetrics(text);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->devices.size(), 1u);
  EXPECT_EQ(e->devices.at("GPU-a").usedmem, 4000);
  EXPECT_EQ(e->devices.at("GPU-a").used, 1);
  EXPECT_EQ(e->devices.at("GPU-a").usedcores, 30);
  EXPECT_EQ(e->devices.at("GPU-a").node, "n1");
  ASSERT_EQ(e->shares.size(), 1u);
  EXPECT_EQ(e->shares.at({"ns1/p1", "GPU-a"}).usedmem, 4000);
  EXPECT_EQ(e->shares.at({"ns1/p1", "GPU-a"}).usedcores, 30);
  EXPECT_EQ(e->shares.at({"ns1/p1", "GPU-a"}).node, "n1");
  // With hami_* samples present (Tessera exports both), the legacy names are not read twice.
  absl::StatusOr<Exported> both = ParseMetrics(
      text + "hami_gpu_memory_allocated_bytes{device_uuid=\"GPU-a\",node=\"n1\"} 1048576000\n");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->devices.at("GPU-a").usedmem, 1000);
  EXPECT_TRUE(both->shares.empty());
}

TEST(ParseMetricsTest, ReadsThePodSharesByNamespacePodAndUuid) {
  // Tessera's rendering (src/tessera/metrics/device_families.cc), one share per pod and device.
  const std::string text =
      "# TYPE hami_vgpu_core_allocated_ratio gauge\n"
      "hami_vgpu_core_allocated_ratio{container_index=\"0\",device_uuid=\"GPU-a\",namespace="
      "\"ns1\",node=\"n1\",pod=\"p1\",zone=\"vGPU\"} 30\n"
      "# TYPE hami_vgpu_memory_allocated_bytes gauge\n"
      "hami_vgpu_memory_allocated_bytes{container_index=\"0\",device_uuid=\"GPU-a\",namespace="
      "\"ns1\",node=\"n1\",pod=\"p1\",zone=\"vGPU\"} 4194304000\n"
      "hami_vgpu_memory_allocated_bytes{container_index=\"0\",device_uuid=\"GPU-b\",namespace="
      "\"ns1\",node=\"n1\",pod=\"p1\",zone=\"vGPU\"} 1048576000\n"
      // Another namespace, same pod name: another share.
      "hami_vgpu_memory_allocated_bytes{container_index=\"0\",device_uuid=\"GPU-a\",namespace="
      "\"ns2\",node=\"n1\",pod=\"p1\",zone=\"vGPU\"} 1048576000\n"
      // Per container (HAMi before the collapse): added up.
      "hami_vgpu_memory_allocated_bytes{container_index=\"0\",device_uuid=\"GPU-c\",namespace="
      "\"ns1\",node=\"n2\",pod=\"p2\",zone=\"vGPU\"} 1048576000\n"
      "hami_vgpu_memory_allocated_bytes{container_index=\"1\",device_uuid=\"GPU-c\",namespace="
      "\"ns1\",node=\"n2\",pod=\"p2\",zone=\"vGPU\"} 2097152000\n"
      "vGPUMemoryAllocated{containeridx=\"0\",deviceuuid=\"GPU-a\",podname=\"p1\"} 7\n";
  absl::StatusOr<Exported> e = ParseMetrics(text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->devices.empty());
  ASSERT_EQ(e->shares.size(), 4u);
  const PodShare& a = e->shares.at({"ns1/p1", "GPU-a"});
  EXPECT_EQ(a.usedmem, 4000);
  EXPECT_EQ(a.usedcores, 30);
  EXPECT_EQ(a.node, "n1");
  EXPECT_EQ(e->shares.at({"ns1/p1", "GPU-b"}).usedmem, 1000);
  EXPECT_EQ(e->shares.at({"ns1/p1", "GPU-b"}).usedcores, 0);
  EXPECT_EQ(e->shares.at({"ns2/p1", "GPU-a"}).usedmem, 1000);
  EXPECT_EQ(e->shares.at({"ns1/p2", "GPU-c"}).usedmem, 3000);

  EXPECT_THAT(
      ParseMetrics("hami_vgpu_memory_allocated_bytes{device_uuid=\"x\",namespace=\"n\"} 1\n")
          .status()
          .message(),
      HasSubstr("without namespace or pod"));
  EXPECT_FALSE(ParseMetrics("hami_vgpu_core_allocated_ratio{namespace=\"n\",pod=\"p\"} 1\n").ok());
  EXPECT_FALSE(ParseMetrics("hami_vgpu_core_allocated_ratio{device_uuid=\"x\",namespace=\"n\","
                            "pod=\"p\"} NaN\n")
                   .ok());
}

Truth OneDevice(int64_t usedmem, int64_t used = 1) {
  Truth t;
  DeviceUsage& u = t.devices["GPU-a"];
  u.node = "n1";
  u.count = 2;
  u.devmem = 10000;
  u.devcore = 100;
  u.used = used;
  u.usedmem = usedmem;
  return t;
}

Exported Exports(int64_t usedmem, int64_t used = 1) {
  Exported e;
  e.devices["GPU-a"] = {"n1", usedmem, used, 0};
  return e;
}

// The oracle recorded one divergence, a violation, and `what` says why.
void ExpectOneViolatingDivergence(const Oracle& o, std::string_view what) {
  ASSERT_EQ(o.divergences().size(), 1u);
  EXPECT_TRUE(o.divergences()[0].violation);
  ASSERT_EQ(o.violations().size(), 1u);
  EXPECT_THAT(o.violations()[0].what, HasSubstr(what));
  EXPECT_FALSE(o.violations()[0].overcommit);
}

TEST(OracleTest, OneSampleDifferencesAreTransientAndRecordedOnlyFromTwo) {
  Oracle o(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported e = Exports(1000);
  o.Observe(t0, OneDevice(2000), &e, "");  // differs once
  Exported same = Exports(2000);
  o.Observe(t0 + absl::Seconds(1), OneDevice(2000), &same, "");
  EXPECT_EQ(o.transient(), 1);
  EXPECT_TRUE(o.divergences().empty());
  EXPECT_TRUE(o.transient_fault_spans().empty()) << "in flight, no fault's";
  o.Observe(t0 + absl::Milliseconds(1500), OneDevice(2500), &same, "drop_events");
  o.Observe(t0 + absl::Milliseconds(1700), OneDevice(2000), &same, "drop_events");
  EXPECT_EQ(o.transient(), 2);
  EXPECT_EQ(o.transient_fault_spans(),
            (std::vector<std::pair<absl::Time, absl::Time>>{
                {t0 + absl::Milliseconds(1500), t0 + absl::Milliseconds(1700)}}));

  o.Observe(t0 + absl::Seconds(2), OneDevice(3000), &same, "sever_watches");
  o.Observe(t0 + absl::Seconds(3), OneDevice(3000), &same, "");
  Exported caught_up = Exports(3000);
  o.Observe(t0 + absl::Seconds(6), OneDevice(3000), &caught_up, "");
  o.Finish(t0 + absl::Seconds(7));
  ASSERT_EQ(o.divergences().size(), 1u);
  const Divergence& d = o.divergences()[0];
  EXPECT_EQ(d.device, "GPU-a");
  EXPECT_EQ(d.cause, "sever_watches");
  EXPECT_EQ(d.start, t0 + absl::Seconds(2));
  EXPECT_EQ(d.end, t0 + absl::Seconds(6));
  EXPECT_THAT(d.detail, HasSubstr("truth 3000 MiB"));
  EXPECT_FALSE(d.violation);
  EXPECT_TRUE(o.violations().empty());
}

TEST(OracleTest, ADivergenceLongerThanTheWindowIsAViolation) {
  Oracle o(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported stale = Exports(4000);  // a deleted pod still exported
  for (int i = 0; i <= 7; ++i) {
    o.Observe(t0 + absl::Seconds(i), OneDevice(0, 0), &stale, "drop_events");
  }
  ExpectOneViolatingDivergence(o, "longer than 5s");
}

TEST(OracleTest, ADivergenceThatEndsAfterTheWindowBetweenSamplesIsAViolation) {
  Oracle o(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported stale = Exports(4000);
  Exported fixed = Exports(0, 0);
  o.Observe(t0, OneDevice(0, 0), &stale, "");
  o.Observe(t0 + absl::Seconds(4), OneDevice(0, 0), &stale, "");  // 4 s: within the window
  o.Observe(t0 + absl::Seconds(7), OneDevice(0, 0), &fixed, "");  // healed, but 7 s after
  ASSERT_EQ(o.violations().size(), 1u);
  EXPECT_THAT(o.violations()[0].what, HasSubstr("lasted 7s"));
  EXPECT_TRUE(o.divergences()[0].violation);
}

TEST(OracleTest, AnOpenDivergenceAtFinishOlderThanTheWindowIsAViolation) {
  Oracle o(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported stale = Exports(4000);
  o.Observe(t0, OneDevice(0, 0), &stale, "");
  o.Observe(t0 + absl::Seconds(1), OneDevice(0, 0), &stale, "");
  o.Finish(t0 + absl::Seconds(3));
  EXPECT_TRUE(o.violations().empty());
  o.Finish(t0 + absl::Seconds(9));
  ASSERT_EQ(o.violations().size(), 1u);
  EXPECT_THAT(o.violations()[0].what, HasSubstr("never healed"));
}

// The sample walk the oracles' metric parsers share: only `family{…}` samples (not comments, not
// a family whose name starts with it), labels with their braces, the value after them; an
// unclosed label block and an error of the callback end the walk.
TEST(ForEachSampleTest, VisitsTheFamilysSamplesAndStopsAtTheFirstError) {
  const std::string text = "# HELP fam x\nfam{a=\"1\"} 2\nfamily{a=\"9\"} 9\nfam{a=\"3\"} 4.5\n";
  std::vector<std::string> seen;
  const auto collect = [&](std::string_view, std::string_view labels, std::string_view value) {
    seen.push_back(std::string(labels) + "|" + std::string(value));
    return absl::OkStatus();
  };
  ASSERT_TRUE(ForEachSample(text, "fam", collect).ok());
  EXPECT_THAT(seen, ::testing::ElementsAre("{a=\"1\"}| 2", "{a=\"3\"}| 4.5"));
  const absl::Status unclosed = ForEachSample("fam{a=\"1\" 2\n", "fam", collect);
  EXPECT_TRUE(absl::IsInvalidArgument(unclosed)) << unclosed;
  EXPECT_THAT(std::string(unclosed.message()), ::testing::HasSubstr("unterminated labels"));
  int calls = 0;
  const absl::Status stopped =
      ForEachSample(text, "fam", [&](std::string_view, std::string_view, std::string_view) {
        ++calls;
        return absl::InvalidArgumentError("no");
      });
  EXPECT_EQ(stopped.message(), "no");
  EXPECT_EQ(calls, 1);
}

TEST(OracleTest, MissingMetricsAreNotCompared) {
  Oracle o(absl::Seconds(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 5; ++i) {
    o.Observe(t0 + absl::Seconds(i), OneDevice(3000), nullptr, "tessera_kill");
  }
  EXPECT_EQ(o.compared(), 0);
  EXPECT_EQ(o.observations(), 5);
  EXPECT_TRUE(o.divergences().empty());
  EXPECT_TRUE(o.violations().empty());
}

TEST(OracleTest, AnExportedDeviceMissingFromTheTruthMustBeZero) {
  Oracle o(absl::Seconds(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported e = Exports(0, 0);
  e.devices["GPU-gone"] = {"n9", 500, 1, 0};
  Truth t = OneDevice(0, 0);
  o.Observe(t0, t, &e, "node_delete");
  o.Observe(t0 + absl::Seconds(1), t, &e, "");
  ASSERT_EQ(o.divergences().size(), 1u);
  EXPECT_EQ(o.divergences()[0].device, "GPU-gone");
  EXPECT_EQ(o.divergences()[0].node, "n9");
}

// One pod "default/p" holding 3000 MiB and 20% of GPU-a, in the truth and as exported; the
// device figures agree, so only the pod shares are judged.
Truth OneShare() {
  Truth t = OneDevice(3000);
  t.devices["GPU-a"].usedcores = 20;
  t.shares[{"default/p", "GPU-a"}] = {"n1", 3000, 20};
  return t;
}
Exported ExportsShare(int64_t usedmem, int64_t usedcores) {
  Exported e = Exports(3000);
  e.devices["GPU-a"].usedcores = 20;
  e.shares[{"default/p", "GPU-a"}] = {"n1", usedmem, usedcores};
  return e;
}

TEST(OracleTest, AWrongPodShareIsADivergenceWithThePodsName) {
  Oracle o(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Exported right = ExportsShare(3000, 20);
  o.Observe(t0, OneShare(), &right, "");
  EXPECT_EQ(o.open(), 0u);
  EXPECT_EQ(o.open_shares(), 0u);

  Exported wrong_cores = ExportsShare(3000, 0);  // the device totals still agree
  for (int i = 1; i <= 7; ++i) {
    o.Observe(t0 + absl::Seconds(i), OneShare(), &wrong_cores, "sever_watches");
    EXPECT_EQ(o.open(), 0u);
    EXPECT_EQ(o.open_shares(), 1u);
  }
  const Divergence& d = o.divergences().at(0);
  EXPECT_EQ(d.pod, "default/p");
  EXPECT_EQ(d.device, "GPU-a");
  EXPECT_EQ(d.node, "n1");
  EXPECT_EQ(d.cause, "sever_watches");
  EXPECT_THAT(d.detail, HasSubstr("pod share: truth 3000 MiB / 20% cores, exported 3000 MiB / 0%"));
  ExpectOneViolatingDivergence(o, "divergence on pod default/p on GPU-a (n1) longer than 5s");
}

TEST(OracleTest, MissingAndStalePodSharesDiverge) {
  Oracle o(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Missing from /metrics: exported as zero.
  Exported missing = Exports(3000);
  missing.devices["GPU-a"].usedcores = 20;
  o.Observe(t0, OneShare(), &missing, "");
  o.Observe(t0 + absl::Seconds(1), OneShare(), &missing, "");
  // Exported for a pod that holds nothing (deleted, its DELETED event lost): must be zero.
  Truth truth = OneShare();
  truth.shares.clear();
  Exported stale = ExportsShare(3000, 20);
  stale.shares[{"default/gone", "GPU-a"}] = {"n1", 500, 0};
  stale.shares.erase({"default/p", "GPU-a"});
  truth.shares[{"default/p", "GPU-a"}] = {"n1", 3000, 20};
  stale.shares[{"default/p", "GPU-a"}] = {"n1", 3000, 20};
  o.Observe(t0 + absl::Seconds(2), truth, &stale, "drop_events");
  o.Observe(t0 + absl::Seconds(3), truth, &stale, "");
  o.Finish(t0 + absl::Seconds(4));
  ASSERT_EQ(o.divergences().size(), 2u);
  EXPECT_EQ(o.divergences()[0].pod, "default/p");
  EXPECT_EQ(o.divergences()[0].end, t0 + absl::Seconds(2));
  EXPECT_THAT(o.divergences()[0].detail, HasSubstr("exported 0 MiB / 0% cores"));
  EXPECT_EQ(o.divergences()[1].pod, "default/gone");
  EXPECT_EQ(o.divergences()[1].node, "n1");
  EXPECT_EQ(o.divergences()[1].cause, "drop_events");
  EXPECT_THAT(o.divergences()[1].detail, HasSubstr("truth 0 MiB / 0% cores, exported 500 MiB"));
  EXPECT_TRUE(o.violations().empty());  // both within the window
}

TEST(OracleTest, OverCommitIsAViolationOncePerEpisode) {
  Oracle o(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  o.Observe(t0, OneDevice(12000), nullptr, "");  // memory over devmem
  o.Observe(t0 + absl::Seconds(1), OneDevice(12000), nullptr, "");
  o.Observe(t0 + absl::Seconds(2), OneDevice(100, 3), nullptr, "");  // slots over count
  ASSERT_EQ(o.violations().size(), 1u);
  EXPECT_THAT(o.violations()[0].what, HasSubstr("over-commit on GPU-a"));
  EXPECT_TRUE(o.violations()[0].overcommit);
  o.Observe(t0 + absl::Seconds(3), OneDevice(100, 1), nullptr, "");
  o.Observe(t0 + absl::Seconds(4), OneDevice(100, 3), nullptr, "");
  EXPECT_EQ(o.violations().size(), 2u);
}

TEST(ParseRequeuedTotalTest, ReadsTheCounterOrSaysItIsAbsent) {
  EXPECT_EQ(ParseRequeuedTotal("# HELP x\ntessera_pending_pods_requeued_total 42\nother 1\n"), 42);
  EXPECT_EQ(ParseRequeuedTotal("tessera_pending_pods_requeued_total 7"), 7);
  EXPECT_EQ(ParseRequeuedTotal("tessera_pending_pods_requeued_total_other 7\n"), -1);
  EXPECT_EQ(ParseRequeuedTotal("hami_gpu_memory 1\n"), -1);
  EXPECT_EQ(ParseRequeuedTotal("tessera_pending_pods_requeued_total x\n"), -1);
  EXPECT_EQ(ParseRequeuedTotal("tessera_pending_pods_requeued_total -3\n"), -1);
  EXPECT_EQ(ParseRequeuedTotal("tessera_pending_pods_requeued_total NaN\n"), -1);
  EXPECT_EQ(ParseRequeuedTotal(""), -1);
}

}  // namespace
}  // namespace tessera::sim

// Tests of the /metrics body: HAMi's device families (exact golden text in both modes), the
// exposition format as the official Python parser reads it, label escaping, and Tessera's own
// families (histograms, counters, informer ages on a FakeClock).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/base/clock.h"
#include "tessera/device/model.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/device_families.h"
#include "tessera/metrics/registry.h"
#include "tessera/testing/objects.h"

namespace tessera::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::shared_ptr<const device::NodeDevices> Node(
    std::string name, std::vector<std::tuple<std::string, int, int, std::string>> devs) {
  auto n = std::make_shared<device::NodeDevices>();
  n->node = std::move(name);
  int index = 0;
  for (auto& [uuid, mem, cores, type] : devs) {
    n->devices.push_back(::tessera::testing::GpuDevice(uuid, index++, mem, type, 10, cores));
  }
  return n;
}

device::ContainerDevice Dev(std::string uuid, int32_t mem, int32_t cores) {
  return device::ContainerDevice{std::move(uuid), "NVIDIA", mem, cores};
}

ledger::PodAllocation Pod(std::string uid, std::string ns, std::string name, std::string node,
                          device::PodDevices devices, int32_t init_count = 0) {
  ledger::PodAllocation p;
  p.uid = std::move(uid);
  p.ns = std::move(ns);
  p.name = std::move(name);
  p.node = node;
  p.bound_node = node;
  p.devices = std::move(devices);
  p.init_count = init_count;
  return p;
}

// Two nodes. node-a: GPU-a0 shared by two single-container pods and by the second app
// container of a multi-container pod; GPU-a1 held by that pod's init container and both its app
// containers. node-b: GPU-b0 held by an in-flight reservation. Plus pods that hold nothing.
//   GPU-a0: 4096+2048+1024 MiB = 7168, 30+20+5 = 55 cores, 3 slots
//   GPU-a1: max(init 4000, apps 3000+2000) = 5000 MiB, max(init 40, apps 20+10) = 40 cores,
//           max(1, 2 apps) = 2 slots
//   GPU-b0: 10240 MiB, 25 cores, 1 slot (reserved)
class SmallCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_
                    .SetNode(Node("node-a", {{"GPU-a0", 16384, 100, "NVIDIA-Tesla T4"},
                                             {"GPU-a1", 16384, 100, "NVIDIA-Tesla T4"}}))
                    .ok());
    ASSERT_TRUE(
        ledger_.SetNode(Node("node-b", {{"GPU-b0", 40960, 100, "NVIDIA A100-SXM4-40GB"}})).ok());
    ASSERT_TRUE(
        ledger_.Apply(Pod("uid-1", "ns1", "shared-1", "node-a", {{Dev("GPU-a0", 4096, 30)}})).ok());
    ASSERT_TRUE(
        ledger_.Apply(Pod("uid-2", "ns1", "shared-2", "node-a", {{Dev("GPU-a0", 2048, 20)}})).ok());
    ASSERT_TRUE(ledger_
                    .Apply(Pod("uid-3", "ns2", "multi", "node-a",
                               {{Dev("GPU-a1", 4000, 40)},
                                {Dev("GPU-a1", 3000, 20)},
                                {Dev("GPU-a1", 2000, 10), Dev("GPU-a0", 1024, 5)}},
                               /*init_count=*/1))
                    .ok());
    ASSERT_TRUE(ledger_
                    .Reserve("uid-4", "ns3", "pending", "node-b", {{Dev("GPU-b0", 10240, 25)}},
                             absl::FromUnixSeconds(2000000000))
                    .ok());
    // Holds nothing: terminal; bound elsewhere (a conflict); an orphan UUID.
    auto done = Pod("uid-5", "ns1", "done", "node-a", {{Dev("GPU-a0", 8000, 50)}});
    done.terminal = true;
    ASSERT_TRUE(ledger_.Apply(done).ok());
    auto elsewhere = Pod("uid-6", "ns1", "elsewhere", "node-a", {{Dev("GPU-a0", 8000, 50)}});
    elsewhere.bound_node = "node-b";
    ASSERT_TRUE(ledger_.Apply(elsewhere).ok());
    ASSERT_TRUE(
        ledger_.Apply(Pod("uid-7", "ns1", "orphan", "node-b", {{Dev("GPU-zz", 8000, 50)}})).ok());
  }

  ledger::Ledger ledger_;
};

constexpr char kHeadGolden[] =
    R"(# HELP hami_gpu_core_allocated_ratio GPU device compute allocated to pods, in percent.
# TYPE hami_gpu_core_allocated_ratio gauge
hami_gpu_core_allocated_ratio{device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 55
hami_gpu_core_allocated_ratio{device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 40
hami_gpu_core_allocated_ratio{device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 25
# HELP hami_gpu_core_limit_ratio Total compute of the GPU device in percent of one GPU.
# TYPE hami_gpu_core_limit_ratio gauge
hami_gpu_core_limit_ratio{device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 100
hami_gpu_core_limit_ratio{device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 100
hami_gpu_core_limit_ratio{device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 100
# HELP hami_gpu_memory_allocated_bytes GPU device memory allocated to pods, in bytes.
# TYPE hami_gpu_memory_allocated_bytes gauge
hami_gpu_memory_allocated_bytes{device_cores="100",device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 7516192768
hami_gpu_memory_allocated_bytes{device_cores="100",device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 5242880000
hami_gpu_memory_allocated_bytes{device_cores="100",device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 10737418240
# HELP hami_gpu_memory_limit_bytes Total memory of the GPU device in bytes.
# TYPE hami_gpu_memory_limit_bytes gauge
hami_gpu_memory_limit_bytes{device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 17179869184
hami_gpu_memory_limit_bytes{device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 17179869184
hami_gpu_memory_limit_bytes{device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 42949672960
# HELP hami_gpu_shared_count Number of allocations sharing the GPU device.
# TYPE hami_gpu_shared_count gauge
hami_gpu_shared_count{device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 3
hami_gpu_shared_count{device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 2
hami_gpu_shared_count{device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 1
# HELP hami_node_gpu_memory_allocated_ratio Fraction of the GPU device memory allocated to pods (0 to 1).
# TYPE hami_node_gpu_memory_allocated_ratio gauge
hami_node_gpu_memory_allocated_ratio{device_index="0",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 0.4375
hami_node_gpu_memory_allocated_ratio{device_index="1",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 0.30517578125
hami_node_gpu_memory_allocated_ratio{device_index="0",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 0.25
# HELP hami_node_gpu_overview Per-device overview of a node: allocated memory in bytes.
# TYPE hami_node_gpu_overview gauge
hami_node_gpu_overview{device_cores="100",device_index="0",device_memory_limit="16384",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a0",node="node-a",zone="vGPU"} 7516192768
hami_node_gpu_overview{device_cores="100",device_index="1",device_memory_limit="16384",device_type="NVIDIA-Tesla T4",device_uuid="GPU-a1",node="node-a",zone="vGPU"} 5242880000
hami_node_gpu_overview{device_cores="100",device_index="0",device_memory_limit="40960",device_type="NVIDIA A100-SXM4-40GB",device_uuid="GPU-b0",node="node-b",zone="vGPU"} 10737418240
# HELP hami_vgpu_core_allocated_ratio GPU compute a pod holds on a device, in percent.
# TYPE hami_vgpu_core_allocated_ratio gauge
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="GPU-a0",namespace="ns1",node="node-a",pod="shared-1",zone="vGPU"} 30
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="GPU-a0",namespace="ns1",node="node-a",pod="shared-2",zone="vGPU"} 20
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="GPU-a0",namespace="ns2",node="node-a",pod="multi",zone="vGPU"} 5
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="GPU-a1",namespace="ns2",node="node-a",pod="multi",zone="vGPU"} 40
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="GPU-b0",namespace="ns3",node="node-b",pod="pending",zone="vGPU"} 25
# HELP hami_vgpu_memory_allocated_bytes GPU memory a pod holds on a device, in bytes.
# TYPE hami_vgpu_memory_allocated_bytes gauge
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-a0",namespace="ns1",node="node-a",pod="shared-1",zone="vGPU"} 4294967296
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-a0",namespace="ns1",node="node-a",pod="shared-2",zone="vGPU"} 2147483648
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-a0",namespace="ns2",node="node-a",pod="multi",zone="vGPU"} 1073741824
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-a1",namespace="ns2",node="node-a",pod="multi",zone="vGPU"} 5242880000
hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-b0",namespace="ns3",node="node-b",pod="pending",zone="vGPU"} 10737418240
)";

// The legacy families only (what --legacy-metrics adds to kHeadGolden).
constexpr char kLegacyGolden[] =
    R"(# HELP GPUDeviceCoreAllocated GPU device compute allocated to pods, in percent (legacy name).
# TYPE GPUDeviceCoreAllocated gauge
GPUDeviceCoreAllocated{deviceidx="0",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 55
GPUDeviceCoreAllocated{deviceidx="1",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 40
GPUDeviceCoreAllocated{deviceidx="0",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 25
# HELP GPUDeviceCoreLimit Total compute of the GPU device in percent (legacy name).
# TYPE GPUDeviceCoreLimit gauge
GPUDeviceCoreLimit{deviceidx="0",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 100
GPUDeviceCoreLimit{deviceidx="1",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 100
GPUDeviceCoreLimit{deviceidx="0",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 100
# HELP GPUDeviceMemoryAllocated GPU device memory allocated to pods, in bytes (legacy name).
# TYPE GPUDeviceMemoryAllocated gauge
GPUDeviceMemoryAllocated{devicecores="100",deviceidx="0",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 7516192768
GPUDeviceMemoryAllocated{devicecores="100",deviceidx="1",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 5242880000
GPUDeviceMemoryAllocated{devicecores="100",deviceidx="0",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 10737418240
# HELP GPUDeviceMemoryLimit Total memory of the GPU device in bytes (legacy name).
# TYPE GPUDeviceMemoryLimit gauge
GPUDeviceMemoryLimit{deviceidx="0",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 17179869184
GPUDeviceMemoryLimit{deviceidx="1",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 17179869184
GPUDeviceMemoryLimit{deviceidx="0",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 42949672960
# HELP GPUDeviceSharedNum Number of allocations sharing the GPU device (legacy name).
# TYPE GPUDeviceSharedNum gauge
GPUDeviceSharedNum{deviceidx="0",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 3
GPUDeviceSharedNum{deviceidx="1",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 2
GPUDeviceSharedNum{deviceidx="0",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 1
# HELP nodeGPUMemoryPercentage Fraction of the GPU device memory allocated to pods, 0 to 1 (legacy name).
# TYPE nodeGPUMemoryPercentage gauge
nodeGPUMemoryPercentage{deviceidx="0",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 0.4375
nodeGPUMemoryPercentage{deviceidx="1",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 0.30517578125
nodeGPUMemoryPercentage{deviceidx="0",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 0.25
# HELP nodeGPUOverview Per-device overview of a node: allocated memory in bytes (legacy name).
# TYPE nodeGPUOverview gauge
nodeGPUOverview{devicecores="100",deviceidx="0",devicememorylimit="16384",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a0",nodeid="node-a",zone="vGPU"} 7516192768
nodeGPUOverview{devicecores="100",deviceidx="1",devicememorylimit="16384",devicetype="NVIDIA-Tesla T4",deviceuuid="GPU-a1",nodeid="node-a",zone="vGPU"} 5242880000
nodeGPUOverview{devicecores="100",deviceidx="0",devicememorylimit="40960",devicetype="NVIDIA A100-SXM4-40GB",deviceuuid="GPU-b0",nodeid="node-b",zone="vGPU"} 10737418240
# HELP vGPUCoreAllocated GPU compute a pod holds on a device, in percent (legacy name).
# TYPE vGPUCoreAllocated gauge
vGPUCoreAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="shared-1",podnamespace="ns1",zone="vGPU"} 30
vGPUCoreAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="shared-2",podnamespace="ns1",zone="vGPU"} 20
vGPUCoreAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="multi",podnamespace="ns2",zone="vGPU"} 5
vGPUCoreAllocated{containeridx="0",deviceuuid="GPU-a1",nodename="node-a",podname="multi",podnamespace="ns2",zone="vGPU"} 40
vGPUCoreAllocated{containeridx="0",deviceuuid="GPU-b0",nodename="node-b",podname="pending",podnamespace="ns3",zone="vGPU"} 25
# HELP vGPUMemoryAllocated GPU memory a pod holds on a device, in bytes (legacy name).
# TYPE vGPUMemoryAllocated gauge
vGPUMemoryAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="shared-1",podnamespace="ns1",zone="vGPU"} 4294967296
vGPUMemoryAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="shared-2",podnamespace="ns1",zone="vGPU"} 2147483648
vGPUMemoryAllocated{containeridx="0",deviceuuid="GPU-a0",nodename="node-a",podname="multi",podnamespace="ns2",zone="vGPU"} 1073741824
vGPUMemoryAllocated{containeridx="0",deviceuuid="GPU-a1",nodename="node-a",podname="multi",podnamespace="ns2",zone="vGPU"} 5242880000
vGPUMemoryAllocated{containeridx="0",deviceuuid="GPU-b0",nodename="node-b",podname="pending",podnamespace="ns3",zone="vGPU"} 10737418240
)";

// Splits text into its families: "# HELP" starts one. Returns name -> block.
std::map<std::string, std::string> Families(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
    }
    out[current] += line + "\n";
  }
  return out;
}

// Every sample line belongs to a family announced by exactly one "# HELP" and one "# TYPE"
// line before it (histogram samples carry the _bucket/_sum/_count suffixes).
void ExpectEveryFamilyHasHelpAndType(const std::string& text) {
  std::map<std::string, int> help;
  std::map<std::string, std::string> type;
  std::istringstream in(text);
  int samples = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      ++help[line.substr(7, line.find(' ', 7) - 7)];
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const size_t end = line.find(' ', 7);
      const std::string name = line.substr(7, end - 7);
      EXPECT_EQ(type.count(name), 0u) << "second TYPE for " << name;
      type[name] = line.substr(end + 1);
      continue;
    }
    ++samples;
    std::string name = line.substr(0, line.find_first_of("{ "));
    if (type.count(name) == 0) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string sfx = suffix;
        if (name.size() > sfx.size() &&
            name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0 &&
            type.count(name.substr(0, name.size() - sfx.size())) == 1) {
          name = name.substr(0, name.size() - sfx.size());
          EXPECT_EQ(type[name], "histogram") << line;
          break;
        }
      }
    }
    EXPECT_EQ(type.count(name), 1u) << "no TYPE before: " << line;
    EXPECT_EQ(help[name], 1) << "no single HELP before: " << line;
  }
  EXPECT_GT(samples, 0);
  EXPECT_EQ(help.size(), type.size());
}

TEST_F(SmallCluster, HeadFamiliesMatchGoldenText) {
  EXPECT_EQ(RenderDeviceFamilies(ledger_.Full(), /*legacy=*/false), kHeadGolden);
}

TEST_F(SmallCluster, LegacyAddsTheOldNamesAndKeepsTheNewOnes) {
  const std::string text = RenderDeviceFamilies(ledger_.Full(), /*legacy=*/true);
  // Families come sorted by name, so the capitalised legacy names come first and the
  // camel-case ones after the hami_* names: compare family by family.
  std::map<std::string, std::string> want = Families(kHeadGolden);
  for (auto& [name, block] : Families(kLegacyGolden)) {
    want[name] = block;
  }
  std::map<std::string, std::string> got = Families(text);
  EXPECT_EQ(got, want);
  // And the order is by name (ASCII), as client_golang writes it.
  std::vector<std::string> order;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      order.push_back(line.substr(7, line.find(' ', 7) - 7));
    }
  }
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  EXPECT_EQ(order.size(), 18u);
}

// Sums the values of `family`'s samples by their device UUID label (`uuid_label`).
std::map<std::string, double> SumByDevice(const std::string& text, const std::string& family,
                                          const std::string& uuid_label) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(family + "{", 0) != 0) {
      continue;
    }
    const size_t at = line.find(uuid_label + "=\"");
    const size_t begin = at + uuid_label.size() + 2;
    const std::string uuid = line.substr(begin, line.find('"', begin) - begin);
    out[uuid] += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return out;
}

TEST_F(SmallCluster, PodSamplesSumToTheDeviceFigures) {
  // What a dashboard relies on: sum by (device_uuid) of the per-pod figures equals the device's
  // allocated figures, because both count the same holders (the reservation included).
  const std::string text = RenderDeviceFamilies(ledger_.Full(), true);
  const auto device_mem = SumByDevice(text, "hami_gpu_memory_allocated_bytes", "device_uuid");
  EXPECT_EQ(device_mem.size(), 3u);
  EXPECT_EQ(SumByDevice(text, "hami_vgpu_memory_allocated_bytes", "device_uuid"), device_mem);
  EXPECT_EQ(SumByDevice(text, "vGPUMemoryAllocated", "deviceuuid"), device_mem);
  EXPECT_EQ(SumByDevice(text, "hami_vgpu_core_allocated_ratio", "device_uuid"),
            SumByDevice(text, "hami_gpu_core_allocated_ratio", "device_uuid"));
  // Pods that hold nothing appear nowhere.
  for (const char* name : {"done", "elsewhere", "orphan"}) {
    EXPECT_THAT(text, Not(HasSubstr(std::string("\"") + name + "\"")));
  }
  EXPECT_THAT(text, Not(HasSubstr("GPU-zz")));
}

TEST(DeviceFamilies, EmptySnapshotRendersNothing) {
  EXPECT_EQ(RenderDeviceFamilies(ledger::FullSnapshot{}, true), "");
}

schedule::NamespaceQuota QuotaNames() {
  schedule::NamespaceQuota q;
  q.memory_name = "nvidia.com/gpumem";
  q.cores_name = "nvidia.com/gpucores";
  return q;
}

// HAMi v2.10 collectQuotaMetrics's names and labels (hami-v2.10-additions.md §1.6 examples).
TEST(QuotaFamilies, HamisNamesLabelsAndValues) {
  ledger::FullSnapshot snap;
  snap.namespaces = {{"team-a", {6000, 20, 2}}, {"team-b", {0, 30, 1}}};
  schedule::NamespaceQuota a = QuotaNames();
  a.ns = "team-a";
  a.memory = schedule::QuotaLimit{20000, "gpu"};
  schedule::NamespaceQuota c = QuotaNames();
  c.ns = "team-c";  // limited, holds nothing
  c.cores = schedule::QuotaLimit{0, "block"};
  const std::string text = RenderQuotaFamilies(snap, {a, c}, QuotaNames(), false);
  EXPECT_THAT(text, HasSubstr("hami_resource_quota_used{limit=\"20000\",namespace=\"team-a\","
                              "quota_name=\"nvidia.com/gpumem\",zone=\"vGPU\"} 6000\n"));
  EXPECT_THAT(text, HasSubstr("hami_resource_quota_used{limit=\"0\",namespace=\"team-a\","
                              "quota_name=\"nvidia.com/gpucores\",zone=\"vGPU\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("hami_resource_quota_limit{namespace=\"team-a\",quota_name=\"nvidia."
                              "com/gpumem\",zone=\"vGPU\"} 20000\n"));
  EXPECT_THAT(text, HasSubstr("hami_resource_quota_used{limit=\"0\",namespace=\"team-b\","
                              "quota_name=\"nvidia.com/gpucores\",zone=\"vGPU\"} 30\n"));
  // An explicit 0 is a limit (exported); a namespace holding nothing shows only its limited
  // resource.
  EXPECT_THAT(text, HasSubstr("hami_resource_quota_limit{namespace=\"team-c\",quota_name=\"nvidia."
                              "com/gpucores\",zone=\"vGPU\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("namespace=\"team-c\",quota_name=\"nvidia.com/gpumem\"")));
  EXPECT_THAT(text, Not(HasSubstr("hami_resource_quota_limit{namespace=\"team-b\"")));
  EXPECT_THAT(text, Not(HasSubstr("QuotaUsed")));
  const std::string legacy = RenderQuotaFamilies(snap, {a, c}, QuotaNames(), true);
  EXPECT_THAT(legacy, HasSubstr("QuotaUsed{limit=\"20000\",quotaName=\"nvidia.com/gpumem\","
                                "quotanamespace=\"team-a\",zone=\"vGPU\"} 6000\n"));
  EXPECT_EQ(RenderQuotaFamilies(ledger::FullSnapshot{}, {}, QuotaNames(), true), "");
}

TEST(DeviceFamilies, ZeroMemoryDeviceHasNoRatioAndAmdIsNormalised) {
  ledger::Ledger l;
  ASSERT_TRUE(
      l.SetNode(Node("n", {{"GPU-0", 0, 100, "NVIDIA"}, {"AMD-1", 1024, 300, "AMD-MI100"}})).ok());
  ASSERT_TRUE(l.Apply(Pod("u", "ns", "p", "n", {{Dev("AMD-1", 512, 100)}})).ok());
  const std::string text = RenderDeviceFamilies(l.Full(), true);
  EXPECT_THAT(text, Not(HasSubstr("memory_allocated_ratio{device_index=\"0\"")));
  EXPECT_THAT(text, Not(HasSubstr("nodeGPUMemoryPercentage{deviceidx=\"0\"")));
  EXPECT_THAT(text, HasSubstr("nodeGPUMemoryPercentage{deviceidx=\"1\",deviceuuid=\"AMD-1\","
                              "nodeid=\"n\",zone=\"vGPU\"} 0.5\n"));
  // HEAD names normalise AMD to percent of the device (100/300 -> ceil(33.3) = 34); legacy
  // names stay raw.
  EXPECT_THAT(text, HasSubstr("hami_gpu_core_limit_ratio{device_index=\"1\",device_type=\"AMD-"
                              "MI100\",device_uuid=\"AMD-1\",node=\"n\",zone=\"vGPU\"} 100\n"));
  EXPECT_THAT(text,
              HasSubstr("hami_gpu_core_allocated_ratio{device_index=\"1\",device_type="
                        "\"AMD-MI100\",device_uuid=\"AMD-1\",node=\"n\",zone=\"vGPU\"} 34\n"));
  EXPECT_THAT(text,
              HasSubstr("hami_vgpu_core_allocated_ratio{container_index=\"0\",device_uuid="
                        "\"AMD-1\",namespace=\"ns\",node=\"n\",pod=\"p\",zone=\"vGPU\"} 34\n"));
  EXPECT_THAT(text, HasSubstr("GPUDeviceCoreLimit{deviceidx=\"1\",devicetype=\"AMD-MI100\","
                              "deviceuuid=\"AMD-1\",nodeid=\"n\",zone=\"vGPU\"} 300\n"));
  EXPECT_THAT(text, HasSubstr("vGPUCoreAllocated{containeridx=\"0\",deviceuuid=\"AMD-1\","
                              "nodename=\"n\",podname=\"p\",podnamespace=\"ns\",zone=\"vGPU\"} "
                              "100\n"));
}

TEST(DeviceFamilies, LargeFamiliesAreChunkedWithOneHeader) {
  // More samples than one serialisation chunk: the text must still have one HELP and one TYPE
  // per family and every sample once.
  ledger::Ledger l;
  constexpr int kNodes = 700;  // 700 x 4 = 2,800 devices > one chunk
  for (int n = 0; n < kNodes; ++n) {
    std::vector<std::tuple<std::string, int, int, std::string>> devs;
    for (int g = 0; g < 4; ++g) {
      devs.emplace_back("GPU-" + std::to_string(n) + "-" + std::to_string(g), 1024, 100, "T");
    }
    ASSERT_TRUE(l.SetNode(Node("node-" + std::to_string(n), devs)).ok());
  }
  const std::string text = RenderDeviceFamilies(l.Full(), false);
  std::istringstream in(text);
  std::map<std::string, int> help, type, samples;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      ++help[line.substr(7, line.find(' ', 7) - 7)];
    } else if (line.rfind("# TYPE ", 0) == 0) {
      ++type[line.substr(7, line.find(' ', 7) - 7)];
    } else {
      ++samples[line.substr(0, line.find('{'))];
    }
  }
  EXPECT_EQ(help.size(), 7u);  // no pods: the two vgpu families are left out
  for (const auto& [name, count] : help) {
    EXPECT_EQ(count, 1) << name;
    EXPECT_EQ(type[name], 1) << name;
    EXPECT_EQ(samples[name], kNodes * 4) << name;
  }
}

// Runs the official Python parser (python3-prometheus-client) over `text`. Returns its stdout;
// sets *ok to whether it exited 0. The script prints one line per family ("F name type") and
// one per sample ("S name <labels as JSON> value"), and fails on any family without HELP or
// TYPE.
std::string ParseWithPython(const std::string& text, bool* ok) {
  *ok = false;
  const std::filesystem::path dir = ::testing::TempDir();
  const std::string stem = "metrics_test_" + std::to_string(::getpid());
  const std::filesystem::path body = dir / (stem + ".txt");
  const std::filesystem::path script = dir / (stem + ".py");
  std::ofstream(body, std::ios::binary) << text;
  std::ofstream(script) << R"PY(
import json, sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1], encoding="utf-8").read()
for fam in text_string_to_metric_families(text):
    if fam.type not in ("gauge", "counter", "histogram"):
        sys.exit("family %s has no TYPE (parsed as %s)" % (fam.name, fam.type))
    if not fam.documentation:
        sys.exit("family %s has no HELP" % fam.name)
    print("F", fam.name, fam.type)
    for s in fam.samples:
        print("S", s.name, json.dumps(s.labels, sort_keys=True), repr(s.value))
)PY";
  const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + body.string() + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return "popen failed";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    out.append(buf, n);
  }
  const int status = ::pclose(p);
  *ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::filesystem::remove(body);
  std::filesystem::remove(script);
  return out;
}

TEST(PythonParser, RejectsBrokenText) {
  // The check below can fail: a sample line with an unterminated label value is refused.
  bool ok = true;
  const std::string out = ParseWithPython("# HELP x h\n# TYPE x gauge\nx{a=\"b} 1\n", &ok);
  EXPECT_FALSE(ok) << out;
  ParseWithPython("# TYPE x gauge\nx 1\n", &ok);  // no HELP
  EXPECT_FALSE(ok);
}

TEST_F(SmallCluster, WholeBodyParsesWithThePythonParser) {
  FakeClock clock;
  Registry registry({"0.1.0", "abc123", "gcc 12.2.0"}, &clock);
  registry.RecordFilter(FilterOutcome::kScheduled, "", absl::Microseconds(120));
  registry.RecordBind(BindOutcome::kBound, absl::Milliseconds(3));
  registry.SetInformerSynced("pods", true);
  registry.RecordInformerEvents("pods", 5);
  for (bool legacy : {false, true}) {
    const std::string text = registry.Render(ledger_.Full(), legacy);
    ExpectEveryFamilyHasHelpAndType(text);
    bool ok = false;
    const std::string out = ParseWithPython(text, &ok);
    ASSERT_TRUE(ok) << out;
    // Every family of the body came through with its type.
    EXPECT_THAT(out, HasSubstr("F hami_vgpu_memory_allocated_bytes gauge\n"));
    EXPECT_THAT(out, HasSubstr("F tessera_filter_duration_seconds histogram\n"));
    EXPECT_THAT(out, HasSubstr("F tessera_filter_decisions counter\n"));
    EXPECT_THAT(out, HasSubstr("F tessera_build_info gauge\n"));
    EXPECT_THAT(out,
                HasSubstr("S hami_vgpu_memory_allocated_bytes {\"container_index\": \"0\", "
                          "\"device_uuid\": \"GPU-a1\", \"namespace\": \"ns2\", \"node\": "
                          "\"node-a\", \"pod\": \"multi\", \"zone\": \"vGPU\"} 5242880000.0\n"));
    EXPECT_EQ(out.find("F vGPUMemoryAllocated gauge") != std::string::npos, legacy);
  }
}

TEST(PythonParser, LabelValuesAreEscapedAndRoundTrip) {
  // Device types come from a node annotation: anything may be in them.
  const std::string nasty = "Odd \"quoted\" \\back\\slash\nsecond line";
  ledger::Ledger l;
  ASSERT_TRUE(l.SetNode(Node("node-x", {{"GPU-x", 1024, 100, nasty}})).ok());
  const std::string text = RenderDeviceFamilies(l.Full(), false);
  EXPECT_THAT(text, HasSubstr("device_type=\"Odd \\\"quoted\\\" \\\\back\\\\slash\\nsecond "
                              "line\",device_uuid=\"GPU-x\""));
  bool ok = false;
  const std::string out = ParseWithPython(text, &ok);
  ASSERT_TRUE(ok) << out;
  // json.dumps of the parsed value is the original string, JSON-escaped.
  EXPECT_THAT(out, HasSubstr("\"device_type\": \"Odd \\\"quoted\\\" \\\\back\\\\slash\\nsecond "
                             "line\""));
}

TEST(Registry, HistogramsAndCountersObserveCorrectly) {
  FakeClock clock;
  Registry registry({"0.1.0", "abc123", "gcc 12.2.0"}, &clock);
  registry.RecordFilter(FilterOutcome::kScheduled, "", absl::Microseconds(30));
  registry.RecordFilter(FilterOutcome::kUnschedulable, "insufficient_memory",
                        absl::Microseconds(2000));
  registry.RecordFilter(FilterOutcome::kUnschedulable, "insufficient_memory", absl::Seconds(10));
  registry.RecordFilter(FilterOutcome::kPassthrough, "", -absl::Seconds(1));  // counts as 0
  registry.RecordBind(BindOutcome::kRejected, absl::Milliseconds(40));
  registry.RecordReservationsExpired(2);
  registry.RecordRequeues(4);
  registry.RecordRequeues(0);
  registry.RecordAuditCorrections("stale", 3);
  registry.SetLedgerProblems("unreadable", 5);
  registry.SetLedgerProblems("unreadable", 2);  // a gauge: the last audit's count
  registry.SetLedgerProblems("foreign_allocation", 0);
  registry.RecordAllocationRewrites(2);
  registry.RecordAllocationRewrites(0);  // no-op
  registry.RecordResyncCorrections("missing", 1);
  registry.RecordResyncCorrections("missing", 0);  // no-op
  registry.SetLeader(true);
  registry.SetInformerSynced("nodes", false);
  registry.RecordInformerRelist("nodes");

  ledger::FullSnapshot snap;
  snap.reservations = 7;
  const std::string text = registry.Render(snap, false);
  for (const char* line : {
           // 30 µs and the negative one fall in the first bucket, 2 ms in 2.5 ms, 10 s in +Inf.
           "tessera_filter_duration_seconds_bucket{le=\"5e-05\"} 2\n",
           "tessera_filter_duration_seconds_bucket{le=\"0.001\"} 2\n",
           "tessera_filter_duration_seconds_bucket{le=\"0.0025\"} 3\n",
           "tessera_filter_duration_seconds_bucket{le=\"5\"} 3\n",
           "tessera_filter_duration_seconds_bucket{le=\"+Inf\"} 4\n",
           "tessera_filter_duration_seconds_count 4\n",
           "tessera_filter_duration_seconds_sum 10.00203\n",
           "tessera_bind_duration_seconds_bucket{le=\"0.025\"} 0\n",
           "tessera_bind_duration_seconds_bucket{le=\"0.05\"} 1\n",
           "tessera_filter_decisions_total{outcome=\"unschedulable\",reason=\"insufficient_"
           "memory\"} "
           "2\n",
           "tessera_filter_decisions_total{outcome=\"scheduled\",reason=\"\"} 1\n",
           "tessera_filter_decisions_total{outcome=\"passthrough\",reason=\"\"} 1\n",
           "tessera_bind_total{outcome=\"rejected\"} 1\n",
           "tessera_bind_total{outcome=\"bound\"} 0\n",
           "tessera_bind_total{outcome=\"error\"} 0\n",
           "tessera_reservations_in_flight 7\n",
           "tessera_reservations_expired_total 2\n",
           "tessera_pending_pods_requeued_total 4\n",
           "tessera_ledger_audit_corrections_total{cause=\"stale\"} 3\n",
           "tessera_ledger_problems{kind=\"unreadable\"} 2\n",
           "tessera_ledger_problems{kind=\"foreign_allocation\"} 0\n",
           "tessera_allocation_rewrites_total 2\n",
           "tessera_resync_corrections_total{kind=\"missing\"} 1\n",
           "tessera_leader 1\n",
           "tessera_informer_synced{resource=\"nodes\"} 0\n",
           "tessera_informer_relists_total{resource=\"nodes\"} 1\n",
           "tessera_build_info{compiler=\"gcc 12.2.0\",revision=\"abc123\",version=\"0.1.0\"} 1\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  // Nothing was delivered to "nodes" yet: no age.
  EXPECT_THAT(text, Not(HasSubstr("tessera_informer_last_event_age_seconds{")));
  // A family with no series yet is left out entirely (as client_golang does).
  EXPECT_THAT(text, Not(HasSubstr("tessera_informer_events_total")));
  ExpectEveryFamilyHasHelpAndType(text);
}

// Declared label values are series at 0 before any event (so rate() and increase() see the
// first one); a later event counts from there, and declaring again keeps the count.
TEST(Registry, KnownLabelValuesAreExportedAtZeroFromTheStart) {
  FakeClock clock;
  Registry registry({"0.1.0", "abc123", "gcc 12.2.0"}, &clock);
  KnownLabels known;
  known.filter_decisions = {{FilterOutcome::kScheduled, ""},
                            {FilterOutcome::kUnschedulable, "CardInsufficientMemory"}};
  known.informer_resources = {"pods"};
  known.audit_causes = {"usage"};
  known.ledger_problem_kinds = {"orphan"};
  known.resync_kinds = {"gone"};
  known.pending_reasons = {"CardInsufficientMemory", "no candidate nodes"};
  registry.DeclareKnownLabels(known);
  std::string text = registry.Render(ledger::FullSnapshot{}, false);
  for (const char* line : {
           "tessera_filter_decisions_total{outcome=\"scheduled\",reason=\"\"} 0\n",
           "tessera_filter_decisions_total{outcome=\"unschedulable\",reason="
           "\"CardInsufficientMemory\"} 0\n",
           "tessera_informer_synced{resource=\"pods\"} 0\n",
           "tessera_informer_relists_total{resource=\"pods\"} 0\n",
           "tessera_informer_events_total{resource=\"pods\"} 0\n",
           "tessera_ledger_audit_corrections_total{cause=\"usage\"} 0\n",
           "tessera_ledger_problems{kind=\"orphan\"} 0\n",
           "tessera_pending_pods{reason=\"CardInsufficientMemory\"} 0\n",
           "tessera_pending_pods{reason=\"no candidate nodes\"} 0\n",
           "tessera_resync_corrections_total{kind=\"gone\"} 0\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  registry.RecordResyncCorrections("gone", 2);
  registry.DeclareKnownLabels(known);
  text = registry.Render(ledger::FullSnapshot{}, false);
  EXPECT_THAT(text, HasSubstr("tessera_resync_corrections_total{kind=\"gone\"} 2\n"));
  ExpectEveryFamilyHasHelpAndType(text);
}

// A gauge: the count of the last housekeeping pass, not a sum of them.
TEST(Registry, PendingPodsIsTheLastCountPerReason) {
  Registry registry({"0.1.0", "abc123", "gcc 12.2.0"});
  registry.SetPendingPods("CardInsufficientMemory", 3);
  registry.SetPendingPods("CardInsufficientMemory", 2);
  registry.SetPendingPods("node unregistered", 1);
  const std::string text = registry.Render(ledger::FullSnapshot{}, false);
  EXPECT_THAT(text, HasSubstr("tessera_pending_pods{reason=\"CardInsufficientMemory\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tessera_pending_pods{reason=\"node unregistered\"} 1\n"));
}

TEST(Registry, InformerAgeFollowsTheClock) {
  FakeClock clock;
  Registry registry({"v", "r", "c"}, &clock);
  registry.RecordInformerEvents("pods", 3);
  clock.Advance(absl::Seconds(42));
  std::string text = registry.Render(ledger::FullSnapshot{}, false);
  EXPECT_THAT(text, HasSubstr("tessera_informer_last_event_age_seconds{resource=\"pods\"} 42\n"));
  EXPECT_THAT(text, HasSubstr("tessera_informer_events_total{resource=\"pods\"} 3\n"));
  registry.RecordInformerEvents("pods");
  clock.Advance(absl::Milliseconds(1500));
  text = registry.Render(ledger::FullSnapshot{}, false);
  EXPECT_THAT(text, HasSubstr("tessera_informer_last_event_age_seconds{resource=\"pods\"} 1.5\n"));
  EXPECT_THAT(text, HasSubstr("tessera_informer_events_total{resource=\"pods\"} 4\n"));
}

TEST(Registry, StreamingAndStringRenderAgree) {
  ledger::Ledger l;
  ASSERT_TRUE(l.SetNode(Node("n", {{"GPU-0", 1024, 100, "T"}})).ok());
  FakeClock clock;
  Registry registry({"v", "r", "c"}, &clock);
  std::string streamed;
  int pieces = 0;
  registry.Render(l.Full(), true, [&](std::string_view piece) {
    streamed.append(piece);
    ++pieces;
  });
  EXPECT_EQ(streamed, registry.Render(l.Full(), true));
  EXPECT_GT(pieces, 1);
  EXPECT_EQ(streamed.rfind(RenderDeviceFamilies(l.Full(), true), 0), 0u);  // devices first
}

TEST(Registry, OutcomeNames) {
  EXPECT_EQ(OutcomeName(FilterOutcome::kScheduled), "scheduled");
  EXPECT_EQ(OutcomeName(FilterOutcome::kUnschedulable), "unschedulable");
  EXPECT_EQ(OutcomeName(FilterOutcome::kError), "error");
  EXPECT_EQ(OutcomeName(FilterOutcome::kPassthrough), "passthrough");
  EXPECT_EQ(OutcomeName(BindOutcome::kBound), "bound");
  EXPECT_EQ(OutcomeName(BindOutcome::kRejected), "rejected");
  EXPECT_EQ(OutcomeName(BindOutcome::kError), "error");
}

}  // namespace
}  // namespace tessera::metrics

// HAMi v2.10's MIG metric families (cmd/scheduler/metrics.go collectNodeMetrics): one sample per
// realised instance, from the same ledger snapshot as the device families.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/ledger/ledger.h"
#include "tessera/metrics/device_families.h"
#include "tessera/testing/objects.h"

namespace tessera::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ledger::PodAllocation MigPod(const std::string& uid, bool realised) {
  ledger::PodAllocation p;
  p.uid = uid;
  p.ns = "ml";
  p.name = "infer-" + uid;
  p.node = "gpu-a100-1";
  p.bound_node = "gpu-a100-1";
  p.devices = {{device::ContainerDevice{"GPU-m0", "NVIDIA", 4864, 15}}};
  device::MigAllocation a;
  a.gpu_uuid = "GPU-m0";
  a.profile = "1g.5gb";
  a.placement = {uid == "0" ? 6U : 5U, 1};
  if (realised) {
    a.mig_uuid = "MIG-9b0e";
    a.gpu_instance_id = 13;
    a.compute_instance_id = 0;
  }
  p.mig = {a};
  return p;
}

// The worked example's metric once the instance is realised (protocol reference §2.4); an
// instance the plugin has not realised yet has no sample, as in HAMi (RuntimeReady only).
TEST(MigFamiliesTest, OneSamplePerRealisedInstance) {
  ledger::Ledger l;
  ASSERT_TRUE(l.SetNode(::tessera::testing::MigNodeDevices("gpu-a100-1", {"GPU-m0"})).ok());
  ASSERT_TRUE(l.Apply(MigPod("0", /*realised=*/true)).ok());
  ASSERT_TRUE(l.Apply(MigPod("1", /*realised=*/false)).ok());
  const std::string text = RenderDeviceFamilies(l.Full(), /*legacy=*/true);
  EXPECT_THAT(text, HasSubstr("# TYPE hami_node_gpu_mig_instance_info gauge\n"
                              "hami_node_gpu_mig_instance_info{compute_instance_id=\"0\","
                              "device_index=\"0\",device_uuid=\"GPU-m0\",gpu_instance_id=\"13\","
                              "mig_uuid=\"MIG-9b0e\",node=\"gpu-a100-1\",placement_size=\"1\","
                              "placement_start=\"6\",profile=\"1g.5gb\",zone=\"vGPU\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("nodeGPUMigInstance{deviceidx=\"0\",deviceuuid=\"GPU-m0\","
                              "migname=\"1g.5gb-13\",nodeid=\"gpu-a100-1\",zone=\"vGPU\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("placement_start=\"5\"")));
  // The usual families count the profile's memory of both instances.
  EXPECT_THAT(text, HasSubstr("hami_gpu_memory_allocated_bytes{device_cores=\"100\","
                              "device_index=\"0\",device_type=\"NVIDIA A100-SXM4-40GB\","
                              "device_uuid=\"GPU-m0\",node=\"gpu-a100-1\",zone=\"vGPU\"} " +
                              std::to_string(2 * 4864 * 1048576LL)));
  EXPECT_THAT(RenderDeviceFamilies(l.Full(), /*legacy=*/false),
              Not(HasSubstr("nodeGPUMigInstance")));
  // Deleted: no sample.
  ASSERT_TRUE(l.Remove("0"));
  EXPECT_THAT(RenderDeviceFamilies(l.Full(), true), Not(HasSubstr("mig_instance")));
}

}  // namespace
}  // namespace tessera::metrics

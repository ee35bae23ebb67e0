#include "tessera/accounting/projection.h"

#include "gtest/gtest.h"

#include "tessera/device/vendor.h"
#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

using ::tessera::testing::AllocatedPod;
using ::tessera::testing::GpuNode;

class ProjectionTest : public ::testing::Test {
 protected:
  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
};

TEST_F(ProjectionTest, NodeInEitherFormatWithCordon) {
  kube::Node json = GpuNode(
      "a",
      R"([{"id":"GPU-1","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-T4","health":true},)"
      R"({"id":"GPU-2","index":1,"count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-T4","numa":1,"health":true}])");
  json.meta.annotations.Set("hami.io/device-cordon", " GPU-2 ,");
  absl::StatusOr<std::shared_ptr<const device::NodeDevices>> a = ProjectNode(*vendor_, json);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->node, "a");
  EXPECT_EQ((*a)->format, device::RegisterFormat::kJson);
  ASSERT_EQ((*a)->devices.size(), 2u);
  EXPECT_EQ((*a)->devices[1].numa, 1);
  EXPECT_TRUE((*a)->IsCordoned("GPU-2"));
  EXPECT_FALSE((*a)->IsCordoned("GPU-1"));

  kube::Node delimited = GpuNode("b", "GPU-9,10,7680,100,NVIDIA-Tesla P4,0,true:");
  absl::StatusOr<std::shared_ptr<const device::NodeDevices>> b = ProjectNode(*vendor_, delimited);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->format, device::RegisterFormat::kDelimited);
  EXPECT_EQ((*b)->devices[0].devmem, 7680);
}

TEST_F(ProjectionTest, NodeWithoutOrWithBrokenRegistration) {
  kube::Node plain;
  plain.meta.name = "cpu";
  EXPECT_TRUE(absl::IsNotFound(ProjectNode(*vendor_, plain).status()));
  absl::Status broken = ProjectNode(*vendor_, GpuNode("x", "GPU-1,ten,1,1,T,0,true:")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(broken));
  EXPECT_NE(std::string(broken.message()).find("node x"), std::string::npos) << broken;
}

TEST_F(ProjectionTest, PodStates) {
  kube::Pod bound = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  absl::StatusOr<ledger::PodAllocation> p = ProjectPod(*vendor_, bound);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->uid, "uid-p");
  EXPECT_EQ(p->node, "a");
  EXPECT_EQ(p->bound_node, "a");
  EXPECT_FALSE(p->terminal);
  EXPECT_FALSE(p->bind_failed);
  ASSERT_EQ(p->devices.size(), 1u);
  EXPECT_EQ(p->devices[0][0].uuid, "GPU-1");
  EXPECT_EQ(p->devices[0][0].usedmem, 1000);
  EXPECT_EQ(p->init_count, 0);

  // Init containers come first in the allocation: init_count tells the ledger how many.
  kube::Pod staged = AllocatedPod("s", "a", "GPU-1,NVIDIA,1000,10:;;GPU-1,NVIDIA,2000,10:;");
  staged.init_containers.resize(2);
  p = ProjectPod(*vendor_, staged);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->init_count, 2);
  ASSERT_EQ(p->devices.size(), 3u);

  // A v2.5-era compacted string lists app containers only: with fewer entries than containers
  // nothing can be told to be an init container, so everything counts additively.
  kube::Pod compacted = AllocatedPod("c", "a", "GPU-1,NVIDIA,2000,10:;");
  compacted.init_containers.resize(1);
  p = ProjectPod(*vendor_, compacted);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->init_count, 0);
  ASSERT_EQ(p->devices.size(), 1u);

  bound.phase = kube::PodPhase::kSucceeded;
  bound.meta.annotations.Set("hami.io/bind-phase", "failed");
  p = ProjectPod(*vendor_, bound);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->terminal);
  EXPECT_TRUE(p->bind_failed);

  kube::Pod plain = AllocatedPod("q", "a", "");
  p = ProjectPod(*vendor_, plain);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->node.empty());
  EXPECT_TRUE(p->devices.empty());

  kube::Pod broken = AllocatedPod("r", "a", "GPU-1,NVIDIA;");
  absl::Status s = ProjectPod(*vendor_, broken).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(std::string(s.message()).find("pod ml/r"), std::string::npos) << s;
}

// hami.io/vgpu-mig-allocations is decoded into the record; a value that does not decode holds
// no placement, as HAMi's usage rebuild ignores it (scheduler.go:getNodesUsage).
TEST_F(ProjectionTest, MigAllocationsAreProjected) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,4864,15:;");
  pod.meta.annotations.Set(
      "hami.io/vgpu-mig-allocations",
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
      R"("placement":{"start":6,"size":1},"migUUID":"MIG-9","gpuInstanceID":13,)"
      R"("computeInstanceID":0}])");
  absl::StatusOr<ledger::PodAllocation> p = ProjectPod(*vendor_, pod);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->mig.size(), 1U);
  EXPECT_EQ(p->mig[0].gpu_uuid, "GPU-1");
  EXPECT_EQ(p->mig[0].placement, (device::MigPlacement{6, 1}));
  EXPECT_EQ(p->mig[0].mig_uuid, "MIG-9");
  pod.meta.annotations.Set("hami.io/vgpu-mig-allocations", "[{");
  p = ProjectPod(*vendor_, pod);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->mig.empty());
  EXPECT_EQ(p->devices.size(), 1U);
}

TEST_F(ProjectionTest, ForLedgerIsProjectPodWhenTheAllocationDecodes) {
  kube::Pod bound = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  absl::Status error = absl::UnknownError("unset");
  EXPECT_EQ(ProjectPodForLedger(*vendor_, bound, &error), *ProjectPod(*vendor_, bound));
  EXPECT_TRUE(error.ok());
  kube::Pod plain = AllocatedPod("q", "a", "");
  EXPECT_EQ(ProjectPodForLedger(*vendor_, plain, &error), *ProjectPod(*vendor_, plain));
  EXPECT_TRUE(error.ok());
  // No hami.io/vgpu-node but a readable allocation: no allocation, as in ProjectPod.
  bound.meta.annotations.Erase("hami.io/vgpu-node");
  EXPECT_EQ(ProjectPodForLedger(*vendor_, bound), *ProjectPod(*vendor_, bound));
}

TEST_F(ProjectionTest, ForLedgerFailsClosedOnAnAllocationThatDoesNotDecode) {
  kube::Pod broken = AllocatedPod("r", "a", "GPU-1,NVIDIA;");
  broken.meta.annotations.Set("hami.io/vgpu-node", "elsewhere");
  absl::Status error;
  ledger::PodAllocation p = ProjectPodForLedger(*vendor_, broken, &error);
  EXPECT_TRUE(absl::IsInvalidArgument(error));
  EXPECT_NE(std::string(error.message()).find("pod ml/r"), std::string::npos) << error;
  EXPECT_TRUE(p.unreadable);
  EXPECT_EQ(p.uid, "uid-r");
  EXPECT_EQ(p.ns, "ml");
  EXPECT_EQ(p.name, "r");
  EXPECT_EQ(p.node, "a");  // where it runs, not the annotation
  EXPECT_EQ(p.bound_node, "a");
  EXPECT_TRUE(p.devices.empty());
  EXPECT_FALSE(p.terminal);

  // Unbound: the annotated node (it blocks nothing until bound).
  broken.node_name.clear();
  p = ProjectPodForLedger(*vendor_, broken, &error);
  EXPECT_TRUE(p.unreadable);
  EXPECT_EQ(p.node, "elsewhere");
  EXPECT_TRUE(p.bound_node.empty());

  // Bound without hami.io/vgpu-node: spec.nodeName.
  broken.node_name = "a";
  broken.meta.annotations.Erase("hami.io/vgpu-node");
  p = ProjectPodForLedger(*vendor_, broken, &error);
  EXPECT_FALSE(error.ok());
  EXPECT_TRUE(p.unreadable);
  EXPECT_EQ(p.node, "a");

  // Terminal and bind-failed are kept (the ledger stores neither).
  broken.phase = kube::PodPhase::kFailed;
  broken.meta.annotations.Set("hami.io/bind-phase", "failed");
  p = ProjectPodForLedger(*vendor_, broken);
  EXPECT_TRUE(p.terminal);
  EXPECT_TRUE(p.bind_failed);
}

}  // namespace
}  // namespace tessera::accounting

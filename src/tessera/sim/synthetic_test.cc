#include "tessera/sim/synthetic.h"

#include <memory>
#include <set>

#include "gtest/gtest.h"

#include "tessera/accounting/projection.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/decode.h"
#include "tessera/ledger/ledger.h"

namespace tessera::sim {
namespace {

TEST(Synthetic, ObjectsDecodeAndProjectToAnEvenNeverOvercommittedLedger) {
  SyntheticClusterOptions o{.nodes = 3, .gpus_per_node = 2, .pods = 14};
  SyntheticCluster c = GenerateCluster(o);
  ASSERT_EQ(c.nodes.size(), 3u);
  ASSERT_EQ(c.pods.size(), 14u);
  auto vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  std::vector<std::shared_ptr<const device::NodeDevices>> nodes;
  std::set<std::string> uuids;
  for (const std::string& json : c.nodes) {
    absl::StatusOr<kube::Node> node = kube::DecodeNode(json);
    ASSERT_TRUE(node.ok()) << node.status();
    EXPECT_EQ(node->ready, kube::ConditionStatus::kTrue);
    EXPECT_EQ(node->allocatable.Get("nvidia.com/gpu"), "20");
    auto devices = accounting::ProjectNode(*vendor, *node);
    ASSERT_TRUE(devices.ok()) << devices.status();
    for (const auto& d : (*devices)->devices) {
      uuids.insert(d.id);
    }
    nodes.push_back(*devices);
  }
  EXPECT_EQ(uuids.size(), 6u);  // unique across the cluster
  std::vector<ledger::PodAllocation> pods;
  for (const std::string& json : c.pods) {
    absl::StatusOr<kube::Pod> pod = kube::DecodePod(json);
    ASSERT_TRUE(pod.ok()) << pod.status();
    auto alloc = accounting::ProjectPod(*vendor, *pod);
    ASSERT_TRUE(alloc.ok()) << alloc.status();
    EXPECT_EQ(alloc->node, alloc->bound_node);
    pods.push_back(*alloc);
  }
  auto ledger = ledger::Ledger::Recompute(nodes, pods, {});
  ledger::FullSnapshot full = ledger->Full();
  int32_t total_mem = 0;
  for (const ledger::NodeView& n : full.nodes) {
    for (const device::DeviceUsage& u : n.usage) {
      // 14 pods over 6 GPUs round-robin: two or three pods per GPU.
      EXPECT_GE(u.used, 2);
      EXPECT_LE(u.used, 3);
      EXPECT_LE(u.usedmem, o.devmem_mib);
      total_mem += u.usedmem;
    }
  }
  EXPECT_EQ(total_mem, 14 * o.pod_mem_mib);
  EXPECT_TRUE(ledger->FindProblems().orphans.empty());
  EXPECT_TRUE(ledger->FindProblems().unregistered.empty());
  EXPECT_EQ(full.records, 14u);
}

TEST(Synthetic, PopulateFillsTheSimulatorStore) {
  apisim::Store store;
  SyntheticCluster c = GenerateCluster({.nodes = 2, .gpus_per_node = 1, .pods = 3});
  ASSERT_TRUE(Populate(store, c).ok());
  const apisim::ResourceInfo* pods = apisim::FindResource("", "v1", "pods");
  absl::StatusOr<std::string> list = store.List(*pods, c.ns, {});
  ASSERT_TRUE(list.ok()) << list.status();
  absl::StatusOr<kube::PodList> decoded = kube::DecodePodList(*list);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->items.size(), 3u);
  // A second Populate of the same objects fails (they exist) instead of duplicating them.
  EXPECT_FALSE(Populate(store, c).ok());
}

TEST(Synthetic, PendingPodAsksForItsDevices) {
  absl::StatusOr<kube::Pod> pod = kube::DecodePod(PendingPodJson("gpu", "new", 2, 4000, 30));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(pod->node_name.empty());
  auto vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  auto request = vendor->DecodeRequest(*pod);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_FALSE(request->Empty());
}

}  // namespace
}  // namespace tessera::sim

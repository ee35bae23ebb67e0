#include "tessera/accounting/pod_feed.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/accounting/projection.h"
#include "tessera/device/vendor.h"
#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

using ::tessera::testing::AllocatedPod;
using ::tessera::testing::GpuNode;

constexpr char kRegister[] =
    R"([{"id":"GPU-1","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-T4","health":true}])";

class PodFeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = accounting::ProjectNode(*vendor_, GpuNode("a", kRegister));
    ASSERT_TRUE(node.ok()) << node.status();
    ASSERT_TRUE(ledger_.SetNode(*node).ok());
  }

  // Memory used on GPU-1 of node a (MiB).
  int64_t UsedMem() const {
    std::vector<std::string_view> names = {"a"};
    auto snap = ledger_.Snapshot(names);
    return (*snap[0]).usage[0].usedmem;
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  FakeClock clock_{absl::FromUnixSeconds(1'800'000'000)};
  PodFeed feed_{vendor_.get(), &ledger_, &clock_, {.reservation_ttl = absl::Minutes(5)}};
};

TEST_F(PodFeedTest, BoundPodHoldsAndItsDeletionFreesEvenWithoutAnnotations) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  feed_.OnAdd(pod);
  EXPECT_EQ(UsedMem(), 1000);
  // The final state of a DELETED event may carry no HAMi annotations at all.
  kube::Pod last = pod;
  last.meta.annotations.Clear();
  feed_.OnDelete(last, /*final_state_unknown=*/false);
  EXPECT_EQ(UsedMem(), 0);
  EXPECT_EQ(feed_.stats().removed, 1);
}

TEST_F(PodFeedTest, TombstoneFreesTheDevices) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  feed_.OnAdd(pod);
  feed_.OnDelete(pod, /*final_state_unknown=*/true);
  EXPECT_EQ(UsedMem(), 0);
  EXPECT_EQ(feed_.stats().tombstones, 1);
}

TEST_F(PodFeedTest, TerminalPodStopsHolding) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  feed_.OnAdd(pod);
  kube::Pod done = pod;
  done.phase = kube::PodPhase::kSucceeded;
  feed_.OnUpdate(pod, done);
  EXPECT_EQ(UsedMem(), 0);
}

TEST_F(PodFeedTest, RecreatedUnderTheSameNameReplacesTheOldUid) {
  kube::Pod old_pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  feed_.OnAdd(old_pod);
  kube::Pod new_pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,3000,10:;");
  new_pod.meta.uid = "uid-p-2";
  feed_.OnUpdate(old_pod, new_pod);
  EXPECT_EQ(UsedMem(), 3000);  // not 4000: the old uid is gone
  EXPECT_EQ(feed_.stats().uid_changes, 1);
  ASSERT_EQ(ledger_.Records().size(), 1u);
  EXPECT_EQ(ledger_.Records()[0].uid, "uid-p-2");
}

// Fits a 1-GPU, 1000 MiB pod on node a as the ledger now sees it.
schedule::FitResult FitOneGpu(const ledger::Ledger& ledger) {
  std::vector<std::string_view> names = {"a"};
  auto snap = ledger.Snapshot(names);
  device::ContainerRequest r;
  r.nums = 1;
  r.memreq = 1000;
  device::PodRequest request;
  request.containers = {r};
  return schedule::FitPod(*snap[0], request, {}, {});
}

TEST_F(PodFeedTest, UndecodableAllocationOfARunningPodBlocksItsNode) {
  // HAMi #2958: a running pod whose allocation does not decode must not have its GPU offered
  // again; which device it uses is unknown, so the whole node is refused until it is fixed.
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  feed_.OnAdd(pod);
  kube::Pod broken = pod;
  broken.meta.annotations.Set("hami.io/vgpu-devices-allocated", "GPU-1,NVIDIA,lots,10:;");
  feed_.OnUpdate(pod, broken);
  EXPECT_EQ(UsedMem(), 0);
  EXPECT_EQ(feed_.stats().projection_errors, 1);
  EXPECT_NE(feed_.stats().last_error.find("ml/p"), std::string::npos);
  schedule::FitResult fit = FitOneGpu(ledger_);
  EXPECT_FALSE(fit.fit);
  EXPECT_EQ(fit.reason, "node has an allocation Tessera cannot read (pod ml/p)");

  // Fixed: the block goes and the allocation holds again.
  feed_.OnUpdate(broken, pod);
  EXPECT_TRUE(FitOneGpu(ledger_).fit);
  EXPECT_EQ(UsedMem(), 1000);
  // Broken again, then terminal: the block goes.
  feed_.OnUpdate(pod, broken);
  EXPECT_FALSE(FitOneGpu(ledger_).fit);
  kube::Pod done = broken;
  done.phase = kube::PodPhase::kFailed;
  feed_.OnUpdate(broken, done);
  EXPECT_TRUE(FitOneGpu(ledger_).fit);
  // Broken and running again, then deleted: the block goes.
  feed_.OnUpdate(done, broken);
  EXPECT_FALSE(FitOneGpu(ledger_).fit);
  feed_.OnDelete(broken, /*final_state_unknown=*/false);
  EXPECT_TRUE(FitOneGpu(ledger_).fit);
}

TEST_F(PodFeedTest, UndecodableAllocationOfAnUnboundPodBlocksNothing) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,lots,10:;");
  pod.node_name.clear();
  pod.phase = kube::PodPhase::kPending;
  feed_.OnAdd(pod);
  EXPECT_TRUE(FitOneGpu(ledger_).fit);
  EXPECT_EQ(feed_.stats().projection_errors, 1);
}

TEST_F(PodFeedTest, UndecodableAllocationWithoutVgpuNodeBlocksTheBoundNode) {
  // The devices cannot be named and hami.io/vgpu-node is absent: spec.nodeName says where the
  // pod runs.
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,lots,10:;");
  pod.meta.annotations.Erase("hami.io/vgpu-node");
  feed_.OnAdd(pod);
  schedule::FitResult fit = FitOneGpu(ledger_);
  EXPECT_FALSE(fit.fit);
  EXPECT_EQ(fit.reason, "node has an allocation Tessera cannot read (pod ml/p)");
}

kube::Pod InFlight(absl::Time filtered_at) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,2000,10:;");
  pod.node_name.clear();
  pod.phase = kube::PodPhase::kPending;
  pod.meta.annotations.Set("hami.io/bind-phase", "allocating");
  pod.meta.annotations.Set("hami.io/vgpu-time", std::to_string(absl::ToUnixSeconds(filtered_at)));
  return pod;
}

TEST_F(PodFeedTest, InFlightPodOfTheFirstListIsReservedUntilItsFilterTimePlusTtl) {
  const absl::Time filtered = clock_.Now() - absl::Minutes(1);
  feed_.OnAdd(InFlight(filtered), /*in_initial_list=*/true);
  EXPECT_EQ(UsedMem(), 2000);
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(ledger_.Reservations()[0].expires_at, filtered + absl::Minutes(5));
  EXPECT_EQ(feed_.stats().rereserved, 1);
  // Once it is observed bound, the record holds instead of the reservation.
  kube::Pod bound = InFlight(filtered);
  bound.node_name = "a";
  feed_.OnUpdate(InFlight(filtered), bound);
  EXPECT_EQ(UsedMem(), 2000);
  EXPECT_TRUE(ledger_.Reservations().empty());
}

TEST_F(PodFeedTest, StaleOrLaterInFlightPodsAreNotReserved) {
  // Filtered longer ago than the TTL: the decision has lapsed.
  feed_.OnAdd(InFlight(clock_.Now() - absl::Minutes(6)), /*in_initial_list=*/true);
  EXPECT_EQ(UsedMem(), 0);
  // Not from the first list: a running Tessera made (or released) that reservation itself.
  kube::Pod later = InFlight(clock_.Now());
  later.meta.uid = "uid-q";
  later.meta.name = "q";
  feed_.OnAdd(later, /*in_initial_list=*/false);
  EXPECT_EQ(UsedMem(), 0);
  // Bind failed: never reserved.
  kube::Pod failed = InFlight(clock_.Now());
  failed.meta.uid = "uid-r";
  failed.meta.name = "r";
  failed.meta.annotations.Set("hami.io/bind-phase", "failed");
  feed_.OnAdd(failed, /*in_initial_list=*/true);
  EXPECT_EQ(UsedMem(), 0);
  EXPECT_TRUE(ledger_.Reservations().empty());
}

}  // namespace
}  // namespace tessera::accounting

#include "tessera/accounting/auditor.h"

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/accounting/projection.h"
#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

using ::tessera::testing::AllocatedPod;
using ::tessera::testing::GpuNode;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kRegister[] =
    R"([{"id":"GPU-1","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-T4","health":true}])";

class AuditorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = accounting::ProjectNode(*vendor_, GpuNode("a", kRegister));
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *node;
    ASSERT_TRUE(ledger_.SetNode(node_).ok());
  }

  void Add(const kube::Pod& pod) {
    store_[pod.meta.uid] = std::make_shared<const kube::Pod>(pod);
    feed_.OnAdd(pod);
  }
  int64_t UsedMem() const {
    std::vector<std::string_view> names = {"a"};
    return (*ledger_.Snapshot(names)[0]).usage[0].usedmem;
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  FakeClock clock_;
  PodFeed feed_{vendor_.get(), &ledger_, &clock_};
  std::shared_ptr<const device::NodeDevices> node_;
  std::map<std::string, std::shared_ptr<const kube::Pod>> store_;   // what the informer holds
  std::map<std::string, std::shared_ptr<const kube::Pod>> listed_;  // what the audit lists
  bool list_store_ = true;
  Auditor auditor_{
      vendor_.get(),
      &ledger_,
      &feed_,
      [this] {
        std::vector<std::shared_ptr<const kube::Pod>> out;
        for (const auto& [uid, pod] : list_store_ ? store_ : listed_) {
          out.push_back(pod);
        }
        return out;
      },
      [this](std::string_view uid) -> std::shared_ptr<const kube::Pod> {
        auto it = store_.find(std::string(uid));
        return it == store_.end() ? nullptr : it->second;
      },
      [this] { return std::vector<std::shared_ptr<const device::NodeDevices>>{node_}; },
      AuditorOptions{.scheduler_name = "hami-scheduler"}};
};

TEST_F(AuditorTest, AConsistentLedgerNeedsNoCorrection) {
  Add(AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;"));
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  EXPECT_EQ(r.pods, 1u);
  EXPECT_EQ(r.nodes, 1u);
  EXPECT_EQ(auditor_.last().pods, 1u);
}

TEST_F(AuditorTest, AMissedAddIsCountedAndRepaired) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  store_[pod.meta.uid] = std::make_shared<const kube::Pod>(pod);  // the handler never ran
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["missing_record"], 1);
  EXPECT_EQ(r.corrections["quota"], 1);  // namespace ml's quota usage was short by 1000 MiB
  ASSERT_EQ(r.details.size(), 2u);
  EXPECT_EQ(r.details[1],
            "quota: namespace ml: quota usage 0 MiB / 0 cores, truth 1000 MiB / 10 cores");
  EXPECT_THAT(r.details[0], HasSubstr("ml/p"));
  EXPECT_THAT(r.details[0], HasSubstr("GPU-1 1000MiB"));
  EXPECT_EQ(UsedMem(), 1000);
  EXPECT_THAT(auditor_.Run(clock_.Now()).corrections, IsEmpty());  // fixed for good
}

TEST_F(AuditorTest, ALeakedRecordOfAGonePodIsCountedAndFreed) {
  // The ledger holds a pod the store does not have: a lost delete.
  ASSERT_TRUE(ledger_
                  .Apply(*accounting::ProjectPod(
                      *vendor_, AllocatedPod("ghost", "a", "GPU-1,NVIDIA,4000,10:;")))
                  .ok());
  EXPECT_EQ(UsedMem(), 4000);
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["stale_record"], 1);
  EXPECT_EQ(UsedMem(), 0);
}

// MIG (docs/mig.md "The ledger"): a leaked MIG record frees its placement, and a bound pod's
// reservation the device plugin never realised is a problem once it outlives the deadline.
TEST_F(AuditorTest, MigLeaksAreRepairedAndUnrealisedReservationsReportedPastTheDeadline) {
  node_ = ::tessera::testing::MigNodeDevices("a", {"GPU-1"});
  ASSERT_TRUE(ledger_.SetNode(node_).ok());
  auto placements = [this] {
    std::vector<std::string_view> names = {"a"};
    std::optional<device::NodeSnapshot> snap = ledger_.Snapshot(names)[0];
    return snap.has_value() && !snap->mig.empty() ? snap->mig[0].occupied
                                                  : std::vector<device::MigPlacement>{};
  };
  auto mig_pod = [](const std::string& name, const std::string& allocation) {
    kube::Pod pod = AllocatedPod(name, "a", "GPU-1,NVIDIA,4864,15:;");
    pod.meta.annotations.Set("hami.io/vgpu-mig-allocations", allocation);
    return pod;
  };
  constexpr char kUnrealised[] =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
      R"("placement":{"start":6,"size":1}}])";
  // A lost delete: the ghost's placement is held until the audit frees it.
  ASSERT_TRUE(ledger_.Apply(*accounting::ProjectPod(*vendor_, mig_pod("ghost", kUnrealised))).ok());
  EXPECT_EQ(placements(), (std::vector<device::MigPlacement>{{6, 1}}));
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["stale_record"], 1);
  EXPECT_THAT(placements(), IsEmpty());

  Add(mig_pod("p", kUnrealised));
  EXPECT_THAT(auditor_.Run(clock_.Now()).problems.mig, IsEmpty());  // just bound
  clock_.Advance(absl::Minutes(4));
  EXPECT_THAT(auditor_.Run(clock_.Now()).problems.mig, IsEmpty());
  clock_.Advance(absl::Minutes(1));
  r = auditor_.Run(clock_.Now());
  ASSERT_EQ(r.problems.mig.size(), 1U);
  EXPECT_EQ(r.problems.mig[0].kind, ledger::MigProblemKind::kUnrealised);
  EXPECT_EQ(r.problems.mig[0].name, "p");
  EXPECT_EQ(r.problems.mig[0].why,
            "1g.5gb at slices 6-6 of container 0 device 0 not realised by the device plugin");
  // The plugin realises it: the problem goes.
  Add(mig_pod("p", R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
                   R"("placement":{"start":6,"size":1},"migUUID":"MIG-1","gpuInstanceID":13,)"
                   R"("computeInstanceID":0}])"));
  EXPECT_THAT(auditor_.Run(clock_.Now()).problems.mig, IsEmpty());
  EXPECT_EQ(placements(), (std::vector<device::MigPlacement>{{6, 1}}));
}

TEST_F(AuditorTest, QuotaUsageOfALostDeleteIsReportedAndCorrected) {
  // AllocatedPod's namespace is "ml". A live pod holds 1000 MiB; a deleted one, whose DELETED
  // event was lost, still holds 4000 in the ledger: the filter would check ml's quota against
  // 5000 until the audit recomputes 1000 from the store.
  Add(AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;"));
  ASSERT_TRUE(ledger_
                  .Apply(*accounting::ProjectPod(
                      *vendor_, AllocatedPod("ghost", "a", "GPU-1,NVIDIA,4000,10:;")))
                  .ok());
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 5000);
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["stale_record"], 1);
  EXPECT_EQ(r.corrections["quota"], 1);
  ASSERT_EQ(r.quota.size(), 1u);
  EXPECT_EQ(r.quota[0].ns, "ml");
  EXPECT_EQ(r.quota[0].filter, (ledger::NamespaceUsage{5000, 20, 2}));
  EXPECT_EQ(r.quota[0].truth, (ledger::NamespaceUsage{1000, 10, 1}));
  EXPECT_EQ(r.quota[0].after, r.quota[0].truth);
  EXPECT_THAT(r.details, ::testing::Contains(
                             "quota: namespace ml: quota usage 5000 MiB / 20 cores, truth 1000 MiB "
                             "/ 10 cores"));
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 1000);
  EXPECT_THAT(auditor_.Run(clock_.Now()).quota, IsEmpty());
}

TEST_F(AuditorTest, AChangedRecordIsReplacedByTheStoresTruth) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  Add(pod);
  kube::Pod wrong = pod;
  wrong.meta.annotations.Set("hami.io/vgpu-devices-allocated", "GPU-1,NVIDIA,6000,10:;");
  ASSERT_TRUE(ledger_.Apply(*accounting::ProjectPod(*vendor_, wrong)).ok());
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["changed_record"], 1);
  EXPECT_EQ(UsedMem(), 1000);
}

TEST_F(AuditorTest, ADifferenceFixedByARacingDeliveryIsNotCounted) {
  // The audit listed the store before the pod arrived, but the delivery (store and ledger)
  // happened before the repair: the current object already agrees with the ledger.
  list_store_ = false;
  Add(AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;"));
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  EXPECT_EQ(UsedMem(), 1000);  // and the repair did not undo the delivery
}

TEST_F(AuditorTest, AStoreObjectNewerThanTheAuditsListIsAppliedButNotCounted) {
  // Simulate finding 3: the store is updated before the handler runs, so between the audit's
  // list and its repair the store can hold a newer object (a re-filter to another node) whose
  // delivery is still in flight. Reconcile applies it; it is not an apply-layer bug, and the
  // report must not pair the listed node with the newer devices.
  list_store_ = false;
  kube::Pod old_pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  old_pod.meta.resource_version = "10";
  listed_[old_pod.meta.uid] = std::make_shared<const kube::Pod>(old_pod);
  kube::Pod newer = old_pod;
  newer.meta.resource_version = "11";
  newer.meta.annotations.Set("hami.io/vgpu-devices-allocated", "GPU-1,NVIDIA,2000,10:;");
  store_[newer.meta.uid] = std::make_shared<const kube::Pod>(newer);  // handler not yet run
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  EXPECT_EQ(UsedMem(), 2000);
  ASSERT_EQ(r.quota.size(), 1u);  // listed, not counted: the repair raced a delivery
  EXPECT_EQ(r.quota[0].after.usedmem, 2000);
}

TEST_F(AuditorTest, ACorrectionReportsNodeAndDevicesOfTheSameRecords) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;");
  Add(pod);
  kube::Pod wrong = pod;
  wrong.meta.annotations.Set("hami.io/vgpu-node", "elsewhere");
  ASSERT_TRUE(ledger_.Apply(*accounting::ProjectPod(*vendor_, wrong)).ok());
  AuditReport r = auditor_.Run(clock_.Now());
  ASSERT_EQ(r.details.size(), 2u);  // the record, then namespace ml's quota usage it restored
  EXPECT_THAT(r.details[0], HasSubstr("held on node elsewhere [GPU-1 1000MiB 10%], truth node a "
                                      "[GPU-1 1000MiB 10%]"));
}

TEST_F(AuditorTest, ALostRegistrationIsRestored) {
  Add(AllocatedPod("p", "a", "GPU-1,NVIDIA,1000,10:;"));
  ASSERT_TRUE(ledger_.RemoveNode("a"));
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["node"], 1);
  EXPECT_EQ(UsedMem(), 1000);
}

std::string BlockedBy(const ledger::Ledger& ledger) {
  std::vector<std::string_view> names = {"a"};
  return (*ledger.Snapshot(names)[0]).blocked_by;
}

TEST_F(AuditorTest, AMissedPodWithAnUnreadableAllocationIsRepairedAndBlocksItsNode) {
  kube::Pod pod = AllocatedPod("p", "a", "GPU-1,NVIDIA,lots,10:;");
  store_[pod.meta.uid] = std::make_shared<const kube::Pod>(pod);  // the handler never ran
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_EQ(r.corrections["missing_record"], 1);
  EXPECT_EQ(BlockedBy(ledger_), "ml/p");
  ASSERT_EQ(r.problems.unreadable.size(), 1u);
  EXPECT_EQ(r.problems.unreadable[0].name, "p");
  EXPECT_EQ(r.problems.unreadable[0].node, "a");
  // Consistent from now on: the audit's recomputation blocks the node too.
  EXPECT_THAT(auditor_.Run(clock_.Now()).corrections, IsEmpty());
  EXPECT_EQ(BlockedBy(ledger_), "ml/p");
}

TEST_F(AuditorTest, AnAllocationNamingAnotherSchedulerIsCountedAndReported) {
  kube::Pod ours = AllocatedPod("ours", "a", "GPU-1,NVIDIA,1000,10:;");
  ours.scheduler_name = "hami-scheduler";
  Add(ours);
  kube::Pod foreign = AllocatedPod("forged", "a", "GPU-1,NVIDIA,2000,10:;");
  foreign.scheduler_name = "default-scheduler";
  Add(foreign);
  // Counted: nothing new lands on top of it.
  EXPECT_EQ(UsedMem(), 3000);
  // Not bound, or finished: nothing to report.
  kube::Pod pending = AllocatedPod("pending", "a", "GPU-1,NVIDIA,500,10:;");
  pending.scheduler_name = "volcano";
  pending.node_name.clear();
  Add(pending);
  kube::Pod done = AllocatedPod("done", "a", "GPU-1,NVIDIA,500,10:;");
  done.scheduler_name = "volcano";
  done.phase = kube::PodPhase::kSucceeded;
  Add(done);
  // No allocation: not reported.
  kube::Pod plain = AllocatedPod("plain", "a", "");
  plain.scheduler_name = "volcano";
  Add(plain);
  // An unreadable allocation is an allocation too.
  kube::Pod garbled = AllocatedPod("garbled", "a", "GPU-1,NVIDIA,lots,10:;");
  garbled.scheduler_name = "volcano";
  Add(garbled);

  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  ASSERT_EQ(r.foreign.size(), 2u);
  EXPECT_EQ(r.foreign[0].name, "forged");
  EXPECT_EQ(r.foreign[0].ns, "ml");
  EXPECT_EQ(r.foreign[0].uid, "uid-forged");
  EXPECT_EQ(r.foreign[0].scheduler, "default-scheduler");
  EXPECT_EQ(r.foreign[0].node, "a");
  EXPECT_EQ(r.foreign[1].name, "garbled");
  EXPECT_EQ(auditor_.last().foreign.size(), 2u);

  // Gone: no longer reported.
  store_.erase(foreign.meta.uid);
  feed_.OnDelete(foreign, false);
  store_.erase(garbled.meta.uid);
  feed_.OnDelete(garbled, false);
  EXPECT_THAT(auditor_.Run(clock_.Now()).foreign, IsEmpty());
}

TEST_F(AuditorTest, WithoutASchedulerNameNothingIsForeign) {
  Auditor auditor(
      vendor_.get(), &ledger_, &feed_,
      [this] {
        std::vector<std::shared_ptr<const kube::Pod>> out;
        for (const auto& [uid, pod] : store_) {
          out.push_back(pod);
        }
        return out;
      },
      [this](std::string_view uid) -> std::shared_ptr<const kube::Pod> {
        auto it = store_.find(std::string(uid));
        return it == store_.end() ? nullptr : it->second;
      },
      [this] { return std::vector<std::shared_ptr<const device::NodeDevices>>{node_}; },
      AuditorOptions{.scheduler_name = ""});
  kube::Pod foreign = AllocatedPod("forged", "a", "GPU-1,NVIDIA,2000,10:;");
  foreign.scheduler_name = "default-scheduler";
  Add(foreign);
  EXPECT_THAT(auditor.Run(clock_.Now()).foreign, IsEmpty());
}

}  // namespace
}  // namespace tessera::accounting

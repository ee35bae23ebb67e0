// Issue #41 finding 2, replayed on the accounting layers (pod feed, ledger, audit, quota, fit):
// a tenant patches the allocation of its running pod; the ledger keeps Tessera's decision, the
// audit reports the rewrite and does not "repair" the decision away, and neither the card nor
// the namespace quota is promised twice.
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/pod_feed.h"
#include "tessera/accounting/projection.h"
#include "tessera/accounting/quota_book.h"
#include "tessera/device/annotations.h"
#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

using ::tessera::testing::AllocatedPod;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kRegister[] =
    R"([{"id":"GPU-1","count":10,"devmem":16000,"devcore":100,"type":"NVIDIA-A100","health":true}])";

class RewriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = ProjectNode(*vendor_, ::tessera::testing::GpuNode("a", kRegister));
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *node;
    ASSERT_TRUE(ledger_.SetNode(node_).ok());
    kube::ResourceQuota quota;
    quota.meta.ns = "ml";
    quota.meta.name = "gpu";
    quota.hard.Set("limits.nvidia.com/gpumem", kube::ShortString("16000"));
    quotas_.Upsert(quota);
  }

  // What the informer delivers: the store's copy changes, then the handler runs.
  void Add(const kube::Pod& pod) {
    store_[pod.meta.uid] = std::make_shared<const kube::Pod>(pod);
    feed_.OnAdd(pod);
  }
  void Update(const kube::Pod& pod) {
    auto old = store_.at(pod.meta.uid);
    store_[pod.meta.uid] = std::make_shared<const kube::Pod>(pod);
    feed_.OnUpdate(*old, pod);
  }
  static kube::Pod Patched(kube::Pod pod, std::string_view key, std::string value) {
    pod.meta.annotations.Set(std::string(key), std::move(value));
    pod.meta.resource_version += "+";
    return pod;
  }
  int64_t UsedMem() const { return ledger_.Snapshot({"a"})[0]->usage[0].usedmem; }
  // Whether a new pod of namespace ml asking for `mem` MiB fits node a's card and the quota.
  bool CardFits(int mem) const {
    kube::Pod b = AllocatedPod("b", "", "");
    b.containers[0] = ::tessera::testing::GpuContainer("main", "1", std::to_string(mem), "0");
    const device::PodRequest request = *vendor_->DecodeRequest(b);
    return schedule::FitPod(*ledger_.Snapshot({"a"})[0], request, {}, device::GpuPolicy{}).fit;
  }
  bool QuotaFits(int mem) const { return quotas_.Quota("ml", ledger_).Fits(mem, 0); }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_{ledger::LedgerOptions{.pin_decisions = true}};
  FakeClock clock_;
  PodFeed feed_{vendor_.get(), &ledger_, &clock_};
  QuotaBook quotas_{QuotaBook::Options{}};
  std::shared_ptr<const device::NodeDevices> node_;
  std::map<std::string, std::shared_ptr<const kube::Pod>> store_;
  Auditor auditor_{
      vendor_.get(),
      &ledger_,
      &feed_,
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
      AuditorOptions{}};
};

// The issue's numbers: a 16,000 MiB card and a 16,000 MiB namespace quota; pod A bound with
// 12,000 MiB is patched to 1 MiB by its owner.
TEST_F(RewriteTest, ATenantsRewriteOfItsRunningPodChangesNothingTheLedgerHolds) {
  kube::Pod a = AllocatedPod("a", "a", "GPU-1,NVIDIA,12000,0:;");
  Add(a);
  ASSERT_EQ(UsedMem(), 12000);
  ASSERT_FALSE(CardFits(12000));
  ASSERT_FALSE(QuotaFits(12000));

  Update(Patched(a, device::kDevicesAllocatedAnnotation, "GPU-1,NVIDIA,1,0:;"));
  EXPECT_EQ(UsedMem(), 12000);
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 12000);
  EXPECT_FALSE(CardFits(12000)) << "a 12,000 MiB pod B would be promised the same card";
  EXPECT_FALSE(QuotaFits(12000)) << "the quota would admit 24,000 MiB";
  EXPECT_TRUE(CardFits(4000));

  // The audit reports it (once as new), and does not repair the decision away.
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  EXPECT_THAT(r.quota, IsEmpty());
  ASSERT_THAT(r.problems.rewritten, SizeIs(1));
  EXPECT_EQ(r.problems.rewritten[0].name, "a");
  EXPECT_EQ(ledger::DecisionText(r.problems.rewritten[0].kept), "GPU-1 12000MiB 0%");
  EXPECT_EQ(ledger::DecisionText(r.problems.rewritten[0].observed), "GPU-1 1MiB 0%");
  EXPECT_THAT(r.new_rewrites, SizeIs(1));
  EXPECT_EQ(UsedMem(), 12000);
  r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.problems.rewritten, SizeIs(1));
  EXPECT_THAT(r.new_rewrites, IsEmpty());  // already reported
  // Also the repair path of the resync and the audit (Reconcile) keeps it.
  feed_.Reconcile(a.meta.uid, store_.at(a.meta.uid).get());
  EXPECT_EQ(UsedMem(), 12000);

  // A second rewrite (garbage this time) is reported again; the node is not blocked.
  Update(Patched(a, device::kDevicesAllocatedAnnotation, "GPU-1,NVIDIA,lots,0:;"));
  EXPECT_THAT(ledger_.FindProblems().unreadable, IsEmpty());
  r = auditor_.Run(clock_.Now());
  ASSERT_THAT(r.new_rewrites, SizeIs(1));
  EXPECT_EQ(ledger::DecisionText(r.new_rewrites[0].observed), "allocation unreadable");
  EXPECT_TRUE(CardFits(4000));

  // The device plugin's own writes are not rewrites; the pod's end ends it all.
  kube::Pod restored = Patched(a, device::kBindPhaseAnnotation, "success");
  restored = Patched(restored, device::kDevicesToAllocateAnnotation, ";;");
  Update(restored);
  EXPECT_THAT(auditor_.Run(clock_.Now()).problems.rewritten, IsEmpty());
  kube::Pod done = Patched(restored, device::kDevicesAllocatedAnnotation, "GPU-1,NVIDIA,1,0:;");
  done.phase = kube::PodPhase::kSucceeded;
  Update(done);
  EXPECT_EQ(UsedMem(), 0);
  r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.problems.rewritten, IsEmpty());
  EXPECT_THAT(r.corrections, IsEmpty());
}

// A pod moved to another node's name, or stripped of its node annotation, still holds here.
TEST_F(RewriteTest, ANodeRewriteNeitherFreesTheCardNorMakesAConflict) {
  kube::Pod a = AllocatedPod("a", "a", "GPU-1,NVIDIA,12000,0:;");
  Add(a);
  Update(Patched(a, device::kVgpuNodeAnnotation, "elsewhere"));
  EXPECT_EQ(UsedMem(), 12000);
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.problems.conflicts, IsEmpty());
  ASSERT_THAT(r.problems.rewritten, SizeIs(1));
  EXPECT_EQ(r.problems.rewritten[0].observed.node, "elsewhere");
  kube::Pod stripped = *store_.at(a.meta.uid);
  stripped.meta.annotations.Erase(device::kVgpuNodeAnnotation);
  Update(stripped);
  EXPECT_EQ(UsedMem(), 12000);
  EXPECT_THAT(auditor_.Run(clock_.Now()).corrections, IsEmpty());
}

// The MIG variant: the slice in use is not handed to a second pod.
TEST_F(RewriteTest, AMovedMigPlacementLeavesTheSliceInUseHeld) {
  node_ = ::tessera::testing::MigNodeDevices("a", {"GPU-1"});
  ASSERT_TRUE(ledger_.SetNode(node_).ok());
  constexpr char kSlice6[] =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
      R"("placement":{"start":6,"size":1},"migUUID":"MIG-6","gpuInstanceID":13,)"
      R"("computeInstanceID":0}])";
  kube::Pod a = Patched(AllocatedPod("a", "a", "GPU-1,NVIDIA,4864,15:;"),
                        device::kMigAllocationsAnnotation, kSlice6);
  Add(a);
  ASSERT_EQ(ledger_.Snapshot({"a"})[0]->mig[0].occupied,
            (std::vector<device::MigPlacement>{{6, 1}}));
  // Its owner claims slice 0 instead, leaving 6 "free".
  std::string slice0 = kSlice6;
  slice0.replace(slice0.find(R"("start":6)"), 9, R"("start":0)");
  Update(Patched(a, device::kMigAllocationsAnnotation, slice0));
  EXPECT_EQ(ledger_.Snapshot({"a"})[0]->mig[0].occupied,
            (std::vector<device::MigPlacement>{{6, 1}}));
  AuditReport r = auditor_.Run(clock_.Now());
  EXPECT_THAT(r.corrections, IsEmpty());
  ASSERT_THAT(r.problems.rewritten, SizeIs(1));
  EXPECT_THAT(ledger::DecisionText(r.problems.rewritten[0].kept), HasSubstr("1g.5gb slices 6-6"));
  EXPECT_THAT(ledger::DecisionText(r.problems.rewritten[0].observed),
              HasSubstr("1g.5gb slices 0-0"));
  // A second pod that asks for a 1g instance gets slice 5, not the slice pod a runs on.
  kube::Pod b = AllocatedPod("b", "", "");
  b.meta.annotations.Set("nvidia.com/vgpu-mode", "mig");
  b.containers[0] = ::tessera::testing::GpuContainer("main", "1", "4000", "0");
  const schedule::FitResult fit =
      schedule::FitPod(*ledger_.Snapshot({"a"})[0], *vendor_->DecodeRequest(b),
                       *vendor_->DecodeConstraints(b), device::GpuPolicy{});
  ASSERT_TRUE(fit.fit) << fit.reason;
  ASSERT_THAT(fit.mig, SizeIs(1));
  ASSERT_THAT(fit.mig[0], SizeIs(1));
  ASSERT_TRUE(fit.mig[0][0].has_value());
  EXPECT_EQ(fit.mig[0][0]->placement, (device::MigPlacement{5, 1}));
}

}  // namespace
}  // namespace tessera::accounting

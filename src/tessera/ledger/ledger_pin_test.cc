// Pinned decisions (LedgerOptions::pin_decisions, issue #41 finding 2): once a pod is bound, a
// rewrite of its allocation annotations by anyone does not change what the ledger holds for it;
// the rewrite is reported, the device plugin's own writes are not rewrites, Recompute follows
// the same rule, and the pin ends with the pod.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/ledger/ledger.h"
#include "tessera/testing/objects.h"

namespace tessera::ledger {
namespace {

using device::ContainerDevice;
using device::DeviceUsage;
using device::MigAllocation;
using ::testing::IsEmpty;
using ::testing::SizeIs;

PodAllocation Bound(const std::string& uid, const std::string& node, int32_t mem,
                    const std::string& uuid = "GPU-a") {
  PodAllocation p;
  p.uid = uid;
  p.ns = "team";
  p.name = "pod-" + uid;
  p.node = node;
  p.bound_node = node;
  p.devices = {{ContainerDevice{uuid, "NVIDIA", mem, 0}}};
  return p;
}

DeviceUsage Usage(const Ledger& l, const std::string& node, size_t dev) {
  auto snap = l.Snapshot({node});
  return snap[0].has_value() ? snap[0]->usage.at(dev) : DeviceUsage{};
}

class LedgerPinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-a", "GPU-b"})).ok());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-c"})).ok());
  }
  Ledger ledger_{LedgerOptions{.pin_decisions = true}};
};

TEST_F(LedgerPinTest, ARewrittenAllocationOfABoundPodKeepsTheDecisionAndIsReported) {
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 12000)).ok());
  ASSERT_EQ(Usage(ledger_, "n1", 0).usedmem, 12000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());

  // The tenant patches its running pod to 1 MiB.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 1)).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 12000);
  EXPECT_EQ(ledger_.UsageOf("team").usedmem, 12000);
  const std::vector<Rewritten> rewritten = ledger_.FindProblems().rewritten;
  ASSERT_THAT(rewritten, SizeIs(1));
  EXPECT_EQ(rewritten[0].uid, "a");
  EXPECT_EQ(rewritten[0].name, "pod-a");
  EXPECT_EQ(rewritten[0].kept.node, "n1");
  EXPECT_EQ(rewritten[0].kept.devices[0][0].usedmem, 12000);
  EXPECT_EQ(rewritten[0].observed.devices[0][0].usedmem, 1);

  // Other rewrites: another card, another node, no node, garbage; all keep the decision.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 12000, "GPU-b")).ok());
  PodAllocation elsewhere = Bound("a", "n2", 1, "GPU-c");
  elsewhere.bound_node = "n1";
  ASSERT_TRUE(ledger_.Apply(elsewhere).ok());
  EXPECT_THAT(ledger_.FindProblems().conflicts, IsEmpty());
  PodAllocation none = Bound("a", "", 0);
  none.bound_node = "n1";
  none.devices.clear();
  ASSERT_TRUE(ledger_.Apply(none).ok());
  PodAllocation garbage = Bound("a", "n1", 0);
  garbage.devices.clear();
  garbage.unreadable = true;
  ASSERT_TRUE(ledger_.Apply(garbage).ok());
  EXPECT_THAT(ledger_.FindProblems().unreadable, IsEmpty());
  EXPECT_TRUE(ledger_.FindProblems().rewritten[0].observed.unreadable);
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 12000, 0}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), DeviceUsage{});
  EXPECT_EQ(Usage(ledger_, "n2", 0), DeviceUsage{});

  // Put back as decided: no longer reported.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 12000)).ok());
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
}

TEST_F(LedgerPinTest, StateChangesStillApplyAndThePinEndsWithThePod) {
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 12000)).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 1)).ok());
  // The device plugin's bind-phase=failed: the pod holds nothing (its decision is kept).
  PodAllocation failed = Bound("a", "n1", 1);
  failed.bind_failed = true;
  ASSERT_TRUE(ledger_.Apply(failed).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), DeviceUsage{});
  // Terminal: the pin ends, and the uid's record follows what it is given again.
  PodAllocation done = Bound("a", "n1", 1);
  done.terminal = true;
  ASSERT_TRUE(ledger_.Apply(done).ok());
  EXPECT_THAT(ledger_.Pinned(), IsEmpty());
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());

  // Removed: likewise.
  ASSERT_TRUE(ledger_.Apply(Bound("b", "n1", 4000)).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("b", "n1", 1)).ok());
  ASSERT_THAT(ledger_.FindProblems().rewritten, SizeIs(1));
  EXPECT_TRUE(ledger_.Remove("b"));
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  ASSERT_TRUE(ledger_.Apply(Bound("b", "n1", 1)).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 1);
}

TEST_F(LedgerPinTest, OnlyABoundHoldingReadableRecordIsPinned) {
  PodAllocation filtered = Bound("a", "n1", 1000);
  filtered.bound_node.clear();  // the filter's annotations, not yet bound
  ASSERT_TRUE(ledger_.Apply(filtered).ok());
  EXPECT_THAT(ledger_.Pinned(), IsEmpty());
  filtered.devices[0][0].usedmem = 2000;
  ASSERT_TRUE(ledger_.Apply(filtered).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 2000)).ok());  // bound: pinned as observed
  ASSERT_THAT(ledger_.Pinned(), SizeIs(1));
  EXPECT_EQ(ledger_.Pinned()[0].devices[0][0].usedmem, 2000);

  PodAllocation unreadable = Bound("u", "n1", 0);
  unreadable.devices.clear();
  unreadable.unreadable = true;
  ASSERT_TRUE(ledger_.Apply(unreadable).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("u", "n1", 500)).ok());  // fixed: follows, then pinned
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 2500);
  EXPECT_THAT(ledger_.Pinned(), SizeIs(2));

  // Without the option nothing is pinned: every Apply replaces.
  Ledger plain;
  ASSERT_TRUE(plain.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-a"})).ok());
  ASSERT_TRUE(plain.Apply(Bound("a", "n1", 12000)).ok());
  ASSERT_TRUE(plain.Apply(Bound("a", "n1", 1)).ok());
  EXPECT_EQ(Usage(plain, "n1", 0).usedmem, 1);
  EXPECT_THAT(plain.Pinned(), IsEmpty());
}

// The audit's recompute, given the pins, holds what the live ledger holds; without them it would
// "repair" the decision back to the rewritten value.
TEST_F(LedgerPinTest, RecomputeWithThePinsAgreesWithTheLiveLedger) {
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 12000)).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("b", "n1", 3000, "GPU-b")).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 1)).ok());
  const std::vector<PodAllocation> store = {Bound("a", "n1", 1), Bound("b", "n1", 3000, "GPU-b")};
  const std::vector<std::shared_ptr<const device::NodeDevices>> nodes = {
      ::tessera::testing::GpuNodeDevices("n1", {"GPU-a", "GPU-b"}),
      ::tessera::testing::GpuNodeDevices("n2", {"GPU-c"})};
  auto fresh = Ledger::Recompute(nodes, store, {}, ledger_.Pinned());
  EXPECT_TRUE(Diff(ledger_, *fresh).Empty()) << Diff(ledger_, *fresh).ToString();
  EXPECT_EQ(fresh->FindProblems().rewritten, ledger_.FindProblems().rewritten);
  auto unpinned = Ledger::Recompute(nodes, store, {});
  EXPECT_FALSE(Diff(ledger_, *unpinned).Empty());
  // A pin whose pod the store no longer has is not resurrected.
  auto gone = Ledger::Recompute(nodes, {store[1]}, {}, ledger_.Pinned());
  EXPECT_EQ(gone->Records().size(), 1U);
}

// The NUMA refit is Tessera's own decision: the pin moves with it, whichever of the refit's
// ledger move and the informer's delivery of its patch comes first.
TEST_F(LedgerPinTest, ARefitMovesThePin) {
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000)).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("a", 0, {ContainerDevice{"GPU-a", "NVIDIA", 4000, 0}},
                                      {ContainerDevice{"GPU-b", "NVIDIA", 4000, 0}}),
            1);
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000, "GPU-b")).ok());
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  // The informer first.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000, "GPU-a")).ok());
  ASSERT_THAT(ledger_.FindProblems().rewritten, SizeIs(1));
  ASSERT_EQ(*ledger_.ReplaceContainer("a", 0, {ContainerDevice{"GPU-b", "NVIDIA", 4000, 0}},
                                      {ContainerDevice{"GPU-a", "NVIDIA", 4000, 0}}),
            1);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 4000);
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 0);
}

// The refit can run before the informer has delivered the bind (kubelet calls the device plugin
// as soon as the pod is bound): the older events that follow still state the old devices and
// must neither move the usage back nor pin the old decision (the CI failure of stop 44:
// ServeTest.RefitMovesABoundPodsContainerAndTheMetricsFollow under load).
TEST_F(LedgerPinTest, ARefitAheadOfTheInformerHoldsAgainstTheOlderEvents) {
  PodAllocation filtered = Bound("a", "n1", 4000);
  filtered.bound_node.clear();  // the filter's annotations, not yet bound
  ASSERT_TRUE(ledger_.Apply(filtered).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("a", 0, {ContainerDevice{"GPU-a", "NVIDIA", 4000, 0}},
                                      {ContainerDevice{"GPU-b", "NVIDIA", 4000, 0}}),
            1);
  // The bind's event, older than the refit's patch.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000)).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 0);
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  // The refit's own event.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000, "GPU-b")).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 0);
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  // From then on the pin is GPU-b: a later rewrite back is held and reported.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000)).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, SizeIs(1));
}

// Only a reservation when the refit runs (the informer has not even seen the filter's patch).
TEST_F(LedgerPinTest, ARefitOfAReservationHoldsAgainstTheOlderEvents) {
  const PodAllocation bound = Bound("a", "n1", 4000);
  ASSERT_TRUE(
      ledger_.Reserve("a", bound.ns, bound.name, "n1", bound.devices, absl::InfiniteFuture()).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("a", 0, {ContainerDevice{"GPU-a", "NVIDIA", 4000, 0}},
                                      {ContainerDevice{"GPU-b", "NVIDIA", 4000, 0}}),
            1);
  PodAllocation created = bound;  // the pod as created: no annotations yet
  created.node.clear();
  created.bound_node.clear();
  created.devices.clear();
  PodAllocation filtered = bound;
  filtered.bound_node.clear();
  for (const PodAllocation& older : {created, filtered, bound}) {
    ASSERT_TRUE(ledger_.Apply(older).ok());
    EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 0);
    EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
    EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  }
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000, "GPU-b")).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

// An event that states neither side of the move (someone else's write after the refit) ends
// the wait: from there the ordinary rules apply (here: the pin holds what the ledger held).
TEST_F(LedgerPinTest, AThirdAllocationEndsTheRefitsWait) {
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000)).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("a", 0, {ContainerDevice{"GPU-a", "NVIDIA", 4000, 0}},
                                      {ContainerDevice{"GPU-b", "NVIDIA", 4000, 0}}),
            1);
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 1, "GPU-b")).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, SizeIs(1));
  // The wait is over: the old devices are now a rewrite like any other.
  ASSERT_TRUE(ledger_.Apply(Bound("a", "n1", 4000)).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 0);
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 4000);
  EXPECT_THAT(ledger_.FindProblems().rewritten, SizeIs(1));
  // A finished pod ends everything.
  PodAllocation done = Bound("a", "n1", 4000);
  done.terminal = true;
  ASSERT_TRUE(ledger_.Apply(done).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1).usedmem, 0);
  EXPECT_THAT(ledger_.FindProblems().rewritten, IsEmpty());
}

MigAllocation Slice(uint32_t start) {
  MigAllocation a;
  a.gpu_uuid = "GPU-m0";
  a.profile = "1g.5gb";
  a.placement = {start, 1};
  return a;
}

PodAllocation BoundMig(const std::string& uid, std::vector<MigAllocation> mig) {
  PodAllocation p;
  p.uid = uid;
  p.ns = "ml";
  p.name = "pod-" + uid;
  p.node = p.bound_node = "m1";
  p.devices = {{ContainerDevice{"GPU-m0", "NVIDIA", 4864, 15}}};
  p.mig = std::move(mig);
  return p;
}

// MIG: the plugin's write-back of the runtime identity is taken; a moved placement is a
// rewrite, and the slice in use stays held (a second pod's placement there is an overlap).
TEST(LedgerPinMigTest, ThePluginsRuntimeIdentityIsTakenAMovedPlacementIsNot) {
  Ledger ledger(LedgerOptions{.pin_decisions = true});
  ASSERT_TRUE(ledger.SetNode(::tessera::testing::MigNodeDevices("m1", {"GPU-m0"})).ok());
  ASSERT_TRUE(ledger.Apply(BoundMig("a", {Slice(6)})).ok());
  MigAllocation realised = Slice(6);
  realised.mig_uuid = "MIG-13";
  realised.gpu_instance_id = 13;
  realised.compute_instance_id = 0;
  ASSERT_TRUE(ledger.Apply(BoundMig("a", {realised})).ok());
  EXPECT_THAT(ledger.FindProblems().rewritten, IsEmpty());
  EXPECT_EQ(ledger.Records()[0].mig, (std::vector{realised}));

  // The tenant moves its placement to slice 0 (keeping the identity): slice 6 stays held.
  MigAllocation moved = realised;
  moved.placement = {0, 1};
  ASSERT_TRUE(ledger.Apply(BoundMig("a", {moved})).ok());
  ASSERT_THAT(ledger.FindProblems().rewritten, SizeIs(1));
  EXPECT_EQ(ledger.FindProblems().rewritten[0].kept.mig, (std::vector{realised}));
  EXPECT_EQ(ledger.FindProblems().rewritten[0].observed.mig, (std::vector{moved}));
  const std::vector<device::MigCardUsage> cards = ledger.Snapshot({"m1"})[0]->mig;
  ASSERT_THAT(cards, SizeIs(1));
  EXPECT_EQ(cards[0].occupied, (std::vector<device::MigPlacement>{{6, 1}}));
}

}  // namespace
}  // namespace tessera::ledger

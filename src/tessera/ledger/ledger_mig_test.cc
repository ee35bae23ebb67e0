// The ledger's MIG records (docs/mig.md "The ledger"): placements held by observed pods and
// reservations, HAMi's fail-closed usage rebuild (pkg/scheduler/scheduler.go:getNodesUsage), and
// the MIG problems the audit reports.
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
using device::MigAllocation;
using device::MigCardUsage;
using device::MigPlacement;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

// One 1g.5gb (or larger) instance of card `uuid` for container 0 device `device`.
MigAllocation Alloc(const std::string& uuid, MigPlacement placement, int32_t device = 0,
                    std::string profile = "1g.5gb") {
  MigAllocation a;
  a.device_index = device;
  a.gpu_uuid = uuid;
  a.profile = std::move(profile);
  a.placement = placement;
  return a;
}

MigAllocation Realised(MigAllocation a, uint32_t gi) {
  a.mig_uuid = "MIG-" + std::to_string(gi);
  a.gpu_instance_id = gi;
  a.compute_instance_id = 0;
  return a;
}

PodAllocation BoundMig(const std::string& uid, const std::string& uuid,
                       std::vector<MigAllocation> mig) {
  PodAllocation p;
  p.uid = uid;
  p.ns = "ml";
  p.name = "pod-" + uid;
  p.node = "m1";
  p.bound_node = "m1";
  for (size_t i = 0; i < mig.size(); ++i) {
    p.devices.resize(1);
    p.devices[0].push_back(ContainerDevice{uuid, "NVIDIA", 4864, 15});
  }
  p.mig = std::move(mig);
  return p;
}

class LedgerMigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        ledger_.SetNode(::tessera::testing::MigNodeDevices("m1", {"GPU-m0", "GPU-m1"})).ok());
  }
  std::vector<MigCardUsage> Mig() {
    auto snap = ledger_.Snapshot({"m1"});
    EXPECT_TRUE(snap[0].has_value());
    return snap[0].has_value() ? snap[0]->mig : std::vector<MigCardUsage>{};
  }
  std::vector<MigProblemKind> Kinds() {
    std::vector<MigProblemKind> out;
    for (const MigProblem& p : ledger_.FindProblems().mig) {
      out.push_back(p.kind);
    }
    return out;
  }
  Ledger ledger_;
};

TEST_F(LedgerMigTest, AnObservedPodHoldsItsPlacementUntilRemoved) {
  ASSERT_TRUE(
      ledger_.Apply(BoundMig("u1", "GPU-m1", {Realised(Alloc("GPU-m1", {6, 1}), 13)})).ok());
  std::vector<MigCardUsage> mig = Mig();
  ASSERT_EQ(mig.size(), 2U);
  EXPECT_THAT(mig[0].occupied, IsEmpty());
  EXPECT_THAT(mig[1].occupied, ElementsAre(MigPlacement{6, 1}));
  EXPECT_FALSE(mig[1].unusable);
  EXPECT_THAT(ledger_.FindProblems().mig, IsEmpty());
  ASSERT_TRUE(ledger_.Remove("u1"));
  mig = Mig();
  for (const MigCardUsage& card : mig) {
    EXPECT_THAT(card.occupied, IsEmpty());
  }
}

TEST_F(LedgerMigTest, AReservationHoldsItsPlacementUntilReleasedOrExpired) {
  const device::PodDevices devices = {{ContainerDevice{"GPU-m0", "NVIDIA", 9856, 29}}};
  ASSERT_TRUE(ledger_
                  .Reserve("r1", "ml", "a", "m1", devices, kT0 + absl::Seconds(30), 0,
                           {Alloc("GPU-m0", {0, 2}, 0, "2g.10gb")})
                  .ok());
  EXPECT_THAT(Mig()[0].occupied, ElementsAre(MigPlacement{0, 2}));
  ASSERT_EQ(ledger_.Reservations().size(), 1U);
  EXPECT_EQ(ledger_.Reservations()[0].mig, (std::vector{Alloc("GPU-m0", {0, 2}, 0, "2g.10gb")}));
  ASSERT_TRUE(ledger_.Release("r1"));
  EXPECT_THAT(Mig()[0].occupied, IsEmpty());

  ASSERT_TRUE(ledger_
                  .Reserve("r2", "ml", "b", "m1", devices, kT0 + absl::Seconds(30), 0,
                           {Alloc("GPU-m0", {4, 2}, 0, "2g.10gb")})
                  .ok());
  EXPECT_THAT(Mig()[0].occupied, ElementsAre(MigPlacement{4, 2}));
  EXPECT_EQ(ledger_.ExpireReservations(kT0 + absl::Seconds(31)).size(), 1U);
  EXPECT_THAT(Mig()[0].occupied, IsEmpty());
}

// The bound pod replaces its reservation: the placement is held once, by the record.
TEST_F(LedgerMigTest, TheObservedBindReplacesTheReservation) {
  const MigAllocation a = Alloc("GPU-m0", {6, 1});
  ASSERT_TRUE(ledger_
                  .Reserve("u1", "ml", "pod-u1", "m1",
                           {{ContainerDevice{"GPU-m0", "NVIDIA", 4864, 15}}},
                           kT0 + absl::Seconds(30), 0, {a})
                  .ok());
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {Realised(a, 13)})).ok());
  EXPECT_THAT(Mig()[0].occupied, ElementsAre(MigPlacement{6, 1}));
  EXPECT_FALSE(ledger_.HasReservation("u1"));
}

// HAMi fails closed: a pod on a mig card without a reservation makes the card unusable.
TEST_F(LedgerMigTest, AMigDeviceWithoutAReservationMakesTheCardUnusable) {
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {})).ok());
  PodAllocation p = BoundMig("u1", "GPU-m0", {});
  p.devices = {{ContainerDevice{"GPU-m0", "NVIDIA", 4864, 15}}};
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_TRUE(Mig()[0].unusable);
  EXPECT_FALSE(Mig()[1].unusable);
  const std::vector<MigProblem> problems = ledger_.FindProblems().mig;
  ASSERT_EQ(problems.size(), 1U);
  EXPECT_EQ(problems[0].kind, MigProblemKind::kUnusable);
  EXPECT_EQ(problems[0].uuid, "GPU-m0");
  EXPECT_EQ(problems[0].why, "MIG device without a reservation");
  ASSERT_TRUE(ledger_.Remove("u1"));
  EXPECT_FALSE(Mig()[0].unusable);
}

TEST_F(LedgerMigTest, OverlappingPlacementsOfTwoPodsAreAProblem) {
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {Realised(Alloc("GPU-m0", {0, 2}), 1)})).ok());
  ASSERT_TRUE(ledger_.Apply(BoundMig("u2", "GPU-m0", {Realised(Alloc("GPU-m0", {1, 1}), 2)})).ok());
  const std::vector<MigProblem> problems = ledger_.FindProblems().mig;
  ASSERT_EQ(problems.size(), 1U);
  EXPECT_EQ(problems[0].kind, MigProblemKind::kOverlap);
  EXPECT_THAT(problems[0].why, ::testing::HasSubstr("slices 0-1 overlap slices 1-1 held by"));
}

// The MIG flavour of the seed bug, both sides: an instance reserved and bound but never realised
// by the plugin, and an instance the plugin realised for a pod that holds nothing.
TEST_F(LedgerMigTest, UnrealisedAndStrayInstancesAreProblems) {
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {Alloc("GPU-m0", {6, 1})})).ok());
  EXPECT_THAT(Kinds(), ElementsAre(MigProblemKind::kUnrealised));
  ASSERT_TRUE(
      ledger_.Apply(BoundMig("u1", "GPU-m0", {Realised(Alloc("GPU-m0", {6, 1}), 13)})).ok());
  EXPECT_THAT(Kinds(), IsEmpty());

  PodAllocation failed = BoundMig("u2", "GPU-m1", {Realised(Alloc("GPU-m1", {6, 1}), 14)});
  failed.bind_failed = true;
  ASSERT_TRUE(ledger_.Apply(failed).ok());
  EXPECT_THAT(Mig()[1].occupied, IsEmpty());  // a failed bind holds nothing
  const std::vector<MigProblem> problems = ledger_.FindProblems().mig;
  ASSERT_EQ(problems.size(), 1U);
  EXPECT_EQ(problems[0].kind, MigProblemKind::kStrayInstance);
  EXPECT_EQ(problems[0].uid, "u2");
  EXPECT_THAT(problems[0].why, ::testing::HasSubstr("MIG-14"));
}

// Records and reservations carry their MIG allocations through Records/Reservations, Recompute
// equals the live ledger, and a record whose allocations changed is a difference.
TEST_F(LedgerMigTest, RecomputeAndDiffCoverMigAllocations) {
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {Alloc("GPU-m0", {6, 1})})).ok());
  ASSERT_TRUE(ledger_
                  .Reserve("r1", "ml", "a", "m1", {{ContainerDevice{"GPU-m1", "NVIDIA", 9856, 29}}},
                           kT0, 0, {Alloc("GPU-m1", {0, 2}, 0, "2g.10gb")})
                  .ok());
  const std::vector<PodAllocation> records = ledger_.Records();
  ASSERT_EQ(records.size(), 1U);
  EXPECT_EQ(records[0].mig, (std::vector{Alloc("GPU-m0", {6, 1})}));
  std::unique_ptr<Ledger> again =
      Ledger::Recompute({::tessera::testing::MigNodeDevices("m1", {"GPU-m0", "GPU-m1"})}, records,
                        ledger_.Reservations());
  EXPECT_TRUE(Diff(ledger_, *again).Empty()) << Diff(ledger_, *again).ToString();
  EXPECT_EQ(again->Snapshot({"m1"})[0]->mig, Mig());

  ASSERT_TRUE(again->Apply(BoundMig("u1", "GPU-m0", {Alloc("GPU-m0", {5, 1})})).ok());
  const LedgerDiff d = Diff(ledger_, *again);
  ASSERT_EQ(d.records.size(), 1U);
  EXPECT_EQ(d.records[0].kind, DiffKind::kChanged);
  EXPECT_EQ(d.records[0].uid, "u1");
}

// A status-only update keeps the record; a changed allocation annotation replaces it.
TEST_F(LedgerMigTest, ReapplyingTheSameRecordKeepsOnePlacement) {
  const PodAllocation p = BoundMig("u1", "GPU-m0", {Alloc("GPU-m0", {6, 1})});
  ASSERT_TRUE(ledger_.Apply(p).ok());
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_THAT(Mig()[0].occupied, ElementsAre(MigPlacement{6, 1}));
  ASSERT_TRUE(ledger_.Apply(BoundMig("u1", "GPU-m0", {Alloc("GPU-m0", {4, 1})})).ok());
  EXPECT_THAT(Mig()[0].occupied, ElementsAre(MigPlacement{4, 1}));
}

}  // namespace
}  // namespace tessera::ledger

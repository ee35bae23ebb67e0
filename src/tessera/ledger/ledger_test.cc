#include "tessera/ledger/ledger.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/testing/objects.h"

namespace tessera::ledger {
namespace {

using device::ContainerDevice;
using device::DeviceUsage;
using device::NodeDevices;
using device::PodDevices;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::shared_ptr<const NodeDevices> MakeNode(const std::string& name,
                                            const std::vector<std::string>& uuids) {
  return ::tessera::testing::GpuNodeDevices(name, uuids);
}

ContainerDevice Dev(const std::string& uuid, int32_t mem, int32_t cores) {
  return ContainerDevice{uuid, "NVIDIA", mem, cores};
}

PodAllocation Bound(const std::string& uid, const std::string& node, PodDevices devices) {
  PodAllocation p;
  p.uid = uid;
  p.ns = "default";
  p.name = "pod-" + uid;
  p.node = node;
  p.bound_node = node;
  p.devices = std::move(devices);
  return p;
}

DeviceUsage Usage(const Ledger& l, const std::string& node, size_t dev) {
  auto snap = l.Snapshot({node});
  EXPECT_TRUE(snap[0].has_value()) << node;
  if (!snap[0].has_value()) {
    return {};
  }
  return snap[0]->usage.at(dev);
}

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b"})).ok());
    ASSERT_TRUE(ledger_.SetNode(MakeNode("n2", {"GPU-c"})).ok());
  }
  Ledger ledger_;
};

TEST_F(LedgerTest, BoundPodHoldsItsDevices) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 3000, 30)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 3000, 30}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  const FullSnapshot full = ledger_.Full();
  ASSERT_THAT(full.nodes, SizeIs(2));
  EXPECT_EQ(full.records, 1u);
  EXPECT_THAT(full.nodes[0].holders[0],
              ElementsAre(Holder{"u1", "default", "pod-u1", 0, 3000, 30, false}));
}

TEST_F(LedgerTest, SameUuidInSeveralAppContainersAddsUp) {
  // No init containers (init_count 0): app containers 0 and 2 share GPU-a; container 1 has none.
  ASSERT_TRUE(
      ledger_
          .Apply(
              Bound("u1", "n1",
                    {{Dev("GPU-a", 1000, 10)}, {}, {Dev("GPU-a", 2000, 20), Dev("GPU-b", 500, 5)}}))
          .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{2, 3000, 30}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 500, 5}));
  const FullSnapshot full = ledger_.Full();
  EXPECT_THAT(full.nodes[0].holders[0],
              ElementsAre(Holder{"u1", "default", "pod-u1", 0, 1000, 10, false},
                          Holder{"u1", "default", "pod-u1", 2, 2000, 20, false}));
}

// ---- init containers: HAMi v2.10's collapse ----

PodAllocation WithInit(PodAllocation p, int32_t init_count) {
  p.init_count = init_count;
  return p;
}

TEST_F(LedgerTest, InitAndAppOnOneDeviceCountTheMaxNotTheSum) {
  // The case the fit accepts on a 16384 MiB device: init 12000 then app 12000, never both.
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(
                      Bound("u1", "n1", {{Dev("GPU-a", 12000, 60)}, {Dev("GPU-a", 12000, 30)}}), 1))
                  .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 12000, 60}));
  // The app side wins the fields where it is larger.
  ASSERT_TRUE(
      ledger_
          .Apply(WithInit(
              Bound("u1", "n1",
                    {{Dev("GPU-a", 1000, 50)}, {Dev("GPU-a", 3000, 10)}, {Dev("GPU-a", 2000, 10)}}),
              1))
          .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{2, 5000, 50}));
  // Holders still list every entry, marked init or app.
  EXPECT_THAT(ledger_.Full().nodes[0].holders[0],
              ElementsAre(Holder{"u1", "default", "pod-u1", 0, 1000, 50, false, true},
                          Holder{"u1", "default", "pod-u1", 1, 3000, 10, false, false},
                          Holder{"u1", "default", "pod-u1", 2, 2000, 10, false, false}));
  // The same entries without init containers add up (HAMi v2.5.2).
  ASSERT_TRUE(
      ledger_
          .Apply(
              Bound("u1", "n1",
                    {{Dev("GPU-a", 1000, 50)}, {Dev("GPU-a", 3000, 10)}, {Dev("GPU-a", 2000, 10)}}))
          .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{3, 6000, 70}));
  EXPECT_TRUE(ledger_.Remove("u1"));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
}

TEST_F(LedgerTest, InitContainersOnOneDeviceCountTheirPeakAndOneSlot) {
  // Two init containers on GPU-a (they run one after the other), no app container on it.
  ASSERT_TRUE(
      ledger_
          .Apply(WithInit(
              Bound("u1", "n1",
                    {{Dev("GPU-a", 4000, 10)}, {Dev("GPU-a", 3000, 40)}, {Dev("GPU-b", 500, 5)}}),
              2))
          .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 4000, 40}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 500, 5}));
  // Other pods on the device add to the collapsed usage as usual.
  ASSERT_TRUE(ledger_.Apply(Bound("u2", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{2, 5000, 50}));
}

TEST_F(LedgerTest, InitOnOneDeviceAndAppOnAnotherBothCount) {
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(
                      Bound("u1", "n1", {{Dev("GPU-a", 6000, 20)}, {Dev("GPU-b", 7000, 30)}}), 1))
                  .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 6000, 20}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 7000, 30}));
}

TEST_F(LedgerTest, SlotsAreTheAppCountOrOneForInit) {
  // Init and two app entries on GPU-a: max(1, 2) = 2 slots; an app entry alone on GPU-b: 1.
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(Bound("u1", "n1",
                                        {{Dev("GPU-a", 100, 0)},
                                         {Dev("GPU-a", 100, 0), Dev("GPU-b", 100, 0)},
                                         {Dev("GPU-a", 100, 0)}}),
                                  1))
                  .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).used, 2);
  EXPECT_EQ(Usage(ledger_, "n1", 0).usedmem, 200);
  EXPECT_EQ(Usage(ledger_, "n1", 1).used, 1);
  // Every container an init container: one slot, the peak.
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(Bound("u1", "n1",
                                        {{Dev("GPU-a", 100, 0)},
                                         {Dev("GPU-a", 300, 0), Dev("GPU-b", 100, 0)},
                                         {Dev("GPU-a", 200, 0)}}),
                                  3))
                  .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 300, 0}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 100, 0}));
}

TEST_F(LedgerTest, ReservationCollapsesInitContainersToo) {
  ASSERT_TRUE(ledger_
                  .Reserve("u1", "default", "pod-u1", "n1",
                           {{Dev("GPU-a", 6000, 10)}, {Dev("GPU-a", 5000, 20)}}, kT0, 1)
                  .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 6000, 20}));
  ASSERT_THAT(ledger_.Reservations(), SizeIs(1));
  EXPECT_EQ(ledger_.Reservations()[0].init_count, 1);
  // Confirmed by the bound pod with the same init count: same usage, now from the record.
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(
                      Bound("u1", "n1", {{Dev("GPU-a", 6000, 10)}, {Dev("GPU-a", 5000, 20)}}), 1))
                  .ok());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 6000, 20}));
}

TEST_F(LedgerTest, InitCountIsStoredClampedAndComparedByDiff) {
  // Init containers without devices after the last stored container are not kept: init_count is
  // clamped to the stored containers, which classifies every entry the same way.
  PodAllocation p = WithInit(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}, {}}), 5);
  ASSERT_TRUE(ledger_.Apply(p).ok());
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_EQ(ledger_.Records()[0].init_count, 1);
  // Re-applying with another count that classifies the same way changes nothing.
  p.init_count = 3;
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(ledger_.Records()[0].init_count, 1);
  // A ledger that disagrees about the init count differs, even where usage happens to agree.
  PodAllocation app = p;
  app.init_count = 0;
  auto other =
      Ledger::Recompute({MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})}, {app}, {});
  const LedgerDiff d = Diff(ledger_, *other);
  ASSERT_THAT(d.records, SizeIs(1)) << d.ToString();
  EXPECT_EQ(d.records[0].kind, DiffKind::kChanged);
  // Negative counts are refused.
  p.init_count = -1;
  EXPECT_EQ(ledger_.Apply(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Reserve("u2", "default", "p2", "n1", {{Dev("GPU-b", 1, 1)}}, kT0, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Records()[0].init_count, 1);
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

TEST_F(LedgerTest, CollapsedUsageFollowsReRegistration) {
  ASSERT_TRUE(ledger_
                  .Apply(WithInit(
                      Bound("u1", "n1", {{Dev("GPU-a", 6000, 10)}, {Dev("GPU-a", 5000, 20)}}), 1))
                  .ok());
  // GPU-a moves to position 1; then the node loses it (orphan); then it comes back.
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-b", "GPU-a"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 6000, 20}));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-b"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.FindProblems().orphans, SizeIs(2));
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 6000, 20}));
  auto fresh = Ledger::Recompute({MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})},
                                 ledger_.Records(), ledger_.Reservations());
  EXPECT_TRUE(Diff(ledger_, *fresh).Empty()) << Diff(ledger_, *fresh).ToString();
}

TEST_F(LedgerTest, BlankPaddingEntriesAreIgnoredAndMigSuffixMatches) {
  ASSERT_TRUE(
      ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a[7-9]", 1000, 0)}, {Dev("", 0, 0)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 0}));
  EXPECT_THAT(ledger_.FindProblems().orphans, IsEmpty());
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_EQ(ledger_.Records()[0].devices, (PodDevices{{Dev("GPU-a[7-9]", 1000, 0)}}));
}

TEST_F(LedgerTest, TerminalDeletedUnannotatedAndBindFailedHoldNothing) {
  PodAllocation terminal = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  terminal.terminal = true;
  PodAllocation deleted = Bound("u2", "n1", {{Dev("GPU-a", 1000, 10)}});
  deleted.deleted = true;
  PodAllocation unannotated = Bound("u3", "", {{Dev("GPU-a", 1000, 10)}});
  unannotated.bound_node = "n1";
  PodAllocation failed = Bound("u4", "n1", {{Dev("GPU-a", 1000, 10)}});
  failed.bind_failed = true;
  for (const auto& p : {terminal, deleted, unannotated, failed}) {
    ASSERT_TRUE(ledger_.Apply(p).ok());
  }
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  // Only the bind-failed pod is stored (it still carries a live allocation).
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_EQ(ledger_.Records()[0].uid, "u4");
  EXPECT_TRUE(ledger_.Records()[0].bind_failed);
}

TEST_F(LedgerTest, TerminatingPodStillHolds) {
  // deletionTimestamp set but the pod still exists: the caller passes deleted=false.
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0).used, 1);
  // Turning terminal releases it.
  PodAllocation done = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  done.terminal = true;
  ASSERT_TRUE(ledger_.Apply(done).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Records(), IsEmpty());
}

TEST_F(LedgerTest, UnboundRecordWithoutReservationHoldsNothing) {
  PodAllocation p = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  p.bound_node.clear();
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Records(), SizeIs(1));
}

TEST_F(LedgerTest, BoundElsewhereIsAConflictAndHoldsNothing) {
  PodAllocation p = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  p.bound_node = "n2";
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{}));
  const Problems problems = ledger_.FindProblems();
  ASSERT_THAT(problems.conflicts, SizeIs(1));
  EXPECT_EQ(problems.conflicts[0].uid, "u1");
  EXPECT_EQ(problems.conflicts[0].node, "n1");
  EXPECT_EQ(problems.conflicts[0].bound_node, "n2");
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_EQ(ledger_.Records()[0].bound_node, "n2");
  // Resolving the conflict (the annotation now agrees) makes it hold.
  p.node = "n2";
  p.devices = {{Dev("GPU-c", 1000, 10)}};
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_THAT(ledger_.FindProblems().conflicts, IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{1, 1000, 10}));
}

TEST_F(LedgerTest, UnknownUuidIsAnOrphanAndHoldsNothing) {
  ASSERT_TRUE(
      ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10), Dev("GPU-zz", 2000, 20)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  const Problems problems = ledger_.FindProblems();
  ASSERT_THAT(problems.orphans, SizeIs(1));
  EXPECT_EQ(problems.orphans[0].uuid, "GPU-zz");
  EXPECT_EQ(problems.orphans[0].node, "n1");
  EXPECT_FALSE(problems.orphans[0].reserved);
}

TEST_F(LedgerTest, ReplaceMovesPodToAnotherNode) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n2", {{Dev("GPU-c", 4000, 40)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{1, 4000, 40}));
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_EQ(ledger_.Records()[0].node, "n2");
  // Replacing the devices on the same node replaces, never adds.
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n2", {{Dev("GPU-c", 500, 5)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{1, 500, 5}));
}

TEST_F(LedgerTest, RemoveIsKeyedByUidOnly) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Reserve("u2", "default", "p2", "n1", {{Dev("GPU-b", 1, 1)}}, kT0).ok());
  EXPECT_TRUE(ledger_.Remove("u1"));  // a tombstone: no annotations, just the uid
  EXPECT_TRUE(ledger_.Remove("u2"));  // deleting a reserved pod ends the reservation
  EXPECT_FALSE(ledger_.Remove("u1"));
  EXPECT_FALSE(ledger_.Remove("never-seen"));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Records(), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

TEST_F(LedgerTest, DeletedApplyActsLikeRemove) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  PodAllocation tomb;
  tomb.uid = "u1";
  tomb.deleted = true;
  ASSERT_TRUE(ledger_.Apply(tomb).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Records(), IsEmpty());
}

TEST_F(LedgerTest, InvalidInputChangesNothing) {
  PodAllocation p = Bound("", "n1", {{Dev("GPU-a", 1000, 10)}});
  EXPECT_EQ(ledger_.Apply(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Reserve("u1", "ns", "n", "", {}, kT0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.SetNode(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.SetNode(MakeNode("", {"GPU-x"})).code(), absl::StatusCode::kInvalidArgument);
  PodAllocation huge = Bound("u9", "n1", {});
  huge.devices.resize(70000);
  EXPECT_EQ(ledger_.Apply(huge).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ledger_.Records(), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

// ---- reservations ----

TEST_F(LedgerTest, ReservationHoldsUntilConfirmedByBoundPod) {
  ASSERT_TRUE(
      ledger_.Reserve("u1", "default", "pod-u1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_TRUE(ledger_.Full().nodes[0].holders[0][0].reserved);
  // The watch first shows the patched but unbound pod: the reservation keeps holding, once.
  PodAllocation p = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  p.bound_node.clear();
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_THAT(ledger_.Reservations(), SizeIs(1));
  // Then bound: the record holds and the reservation is gone.
  p.bound_node = "n1";
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_FALSE(ledger_.Full().nodes[0].holders[0][0].reserved);
  // Nothing left to expire.
  EXPECT_THAT(ledger_.ExpireReservations(kT0 + absl::Hours(1)), IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
}

TEST_F(LedgerTest, ReservationExpires) {
  ASSERT_TRUE(
      ledger_
          .Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0 + absl::Seconds(60))
          .ok());
  ASSERT_TRUE(ledger_
                  .Reserve("u2", "default", "p2", "n1", {{Dev("GPU-b", 1000, 10)}},
                           kT0 + absl::Seconds(120))
                  .ok());
  EXPECT_THAT(ledger_.ExpireReservations(kT0 + absl::Seconds(59)), IsEmpty());
  const std::vector<Reservation> expired = ledger_.ExpireReservations(kT0 + absl::Seconds(60));
  ASSERT_THAT(expired, SizeIs(1));
  EXPECT_EQ(expired[0].uid, "u1");
  EXPECT_EQ(expired[0].node, "n1");
  EXPECT_EQ(expired[0].devices, (PodDevices{{Dev("GPU-a", 1000, 10)}}));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 1000, 10}));
}

TEST_F(LedgerTest, ExpiredReservationLeavesUnboundRecordHoldingNothing) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  PodAllocation p = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  p.bound_node.clear();
  ASSERT_TRUE(ledger_.Apply(p).ok());
  ASSERT_THAT(ledger_.ExpireReservations(kT0), SizeIs(1));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Records(), SizeIs(1));  // the record itself stays
}

TEST_F(LedgerTest, ReleaseEndsReservation) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  EXPECT_TRUE(ledger_.Release("u1"));
  EXPECT_FALSE(ledger_.Release("u1"));
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

TEST_F(LedgerTest, RefilterReplacesReservation) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  ASSERT_TRUE(
      ledger_
          .Reserve("u1", "default", "p1", "n2", {{Dev("GPU-c", 2000, 20)}}, kT0 + absl::Seconds(5))
          .ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{1, 2000, 20}));
  ASSERT_THAT(ledger_.Reservations(), SizeIs(1));
  EXPECT_EQ(ledger_.Reservations()[0].expires_at, kT0 + absl::Seconds(5));
}

TEST_F(LedgerTest, ReservationWinsOverStaleUnboundAnnotations) {
  // Old annotations (n1) observed after a re-filter reserved n2: the reservation holds.
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n2", {{Dev("GPU-c", 2000, 20)}}, kT0).ok());
  PodAllocation old = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  old.bound_node.clear();
  ASSERT_TRUE(ledger_.Apply(old).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n2", 0), (DeviceUsage{1, 2000, 20}));
}

TEST_F(LedgerTest, BoundElsewhereEndsReservation) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  PodAllocation p = Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}});
  p.bound_node = "n2";
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_THAT(ledger_.FindProblems().conflicts, SizeIs(1));
}

TEST_F(LedgerTest, ReserveOnBoundPodIsRefused) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-b", 1, 1)}}, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

TEST_F(LedgerTest, UnannotatedUnboundApplyKeepsReservation) {
  // The watch delivers the pod as it was before filter's patch landed.
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  PodAllocation before;
  before.uid = "u1";
  before.ns = "default";
  before.name = "p1";
  ASSERT_TRUE(ledger_.Apply(before).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
}

TEST_F(LedgerTest, TerminalPodEndsReservation) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-a", 1000, 10)}}, kT0).ok());
  PodAllocation p;
  p.uid = "u1";
  p.terminal = true;
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
}

TEST_F(LedgerTest, ReservedOrphanIsReported) {
  ASSERT_TRUE(ledger_.Reserve("u1", "default", "p1", "n1", {{Dev("GPU-q", 1000, 10)}}, kT0).ok());
  const Problems problems = ledger_.FindProblems();
  ASSERT_THAT(problems.orphans, SizeIs(1));
  EXPECT_TRUE(problems.orphans[0].reserved);
}

// ---- nodes ----

TEST_F(LedgerTest, NodeRemovalAndReRegistration) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Reserve("u2", "default", "p2", "n1", {{Dev("GPU-b", 500, 5)}}, kT0).ok());
  EXPECT_TRUE(ledger_.RemoveNode("n1"));
  EXPECT_FALSE(ledger_.RemoveNode("n1"));
  EXPECT_FALSE(ledger_.Snapshot({"n1"})[0].has_value());
  const Problems problems = ledger_.FindProblems();
  EXPECT_THAT(problems.unregistered, SizeIs(2));
  EXPECT_THAT(ledger_.Records(), SizeIs(1));  // the record stays, holding nothing
  // Re-registration: the same pods hold again.
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 500, 5}));
  EXPECT_THAT(ledger_.FindProblems().unregistered, IsEmpty());
}

TEST_F(LedgerTest, ReRegistrationReDerivesUsage) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-b", 1000, 10)}})).ok());
  // GPU-b disappears, GPU-a moves to index 1 and GPU-d appears.
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-d", "GPU-a"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  ASSERT_THAT(ledger_.FindProblems().orphans, SizeIs(1));
  // The UUID comes back (at a different index): it holds again.
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-d", "GPU-a", "GPU-b"})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 2), (DeviceUsage{1, 1000, 10}));
  EXPECT_THAT(ledger_.FindProblems().orphans, IsEmpty());
}

TEST_F(LedgerTest, RecordOnNodeRegisteredLaterHoldsOnceRegistered) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n9", {{Dev("GPU-z", 1000, 10)}})).ok());
  EXPECT_FALSE(ledger_.Snapshot({"n9"})[0].has_value());
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n9", {"GPU-z"})).ok());
  EXPECT_EQ(Usage(ledger_, "n9", 0), (DeviceUsage{1, 1000, 10}));
}

TEST_F(LedgerTest, IdenticalReRegistrationSwapsPointerOnly) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  auto again = MakeNode("n1", {"GPU-a", "GPU-b"});
  ASSERT_TRUE(ledger_.SetNode(again).ok());
  auto snap = ledger_.Snapshot({"n1"});
  EXPECT_EQ(snap[0]->devices, again);
  EXPECT_EQ(snap[0]->usage[0], (DeviceUsage{1, 1000, 10}));
}

// ---- snapshot, recompute, diff ----

TEST_F(LedgerTest, SnapshotReportsUnregisteredAsNullopt) {
  auto snap = ledger_.Snapshot({"n2", "nope", "n1"});
  ASSERT_THAT(snap, SizeIs(3));
  EXPECT_TRUE(snap[0].has_value());
  EXPECT_EQ(snap[0]->devices->node, "n2");
  EXPECT_FALSE(snap[1].has_value());
  EXPECT_EQ(snap[2]->devices->node, "n1");
  EXPECT_THAT(snap[2]->usage, SizeIs(2));
}

PodAllocation Unreadable(const std::string& uid, const std::string& node) {
  PodAllocation p = Bound(uid, node, {});
  p.unreadable = true;
  return p;
}

std::string BlockedBy(const Ledger& l, const std::string& node) {
  auto snap = l.Snapshot({node});
  EXPECT_TRUE(snap[0].has_value()) << node;
  return snap[0].has_value() ? snap[0]->blocked_by : "";
}

TEST_F(LedgerTest, UnreadableBoundRecordBlocksItsNodeAndHoldsNoDevice) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 3000, 30)}})).ok());
  PodAllocation broken = Unreadable("u1", "n1");
  broken.devices = {{Dev("GPU-b", 1000, 10)}};  // ignored: not stored
  ASSERT_TRUE(ledger_.Apply(broken).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "default/pod-u1");
  EXPECT_EQ(BlockedBy(ledger_, "n2"), "");
  ASSERT_THAT(ledger_.Records(), SizeIs(1));
  EXPECT_TRUE(ledger_.Records()[0].unreadable);
  EXPECT_THAT(ledger_.Records()[0].devices, IsEmpty());
  const Problems problems = ledger_.FindProblems();
  ASSERT_THAT(problems.unreadable, SizeIs(1));
  EXPECT_EQ(problems.unreadable[0].uid, "u1");
  EXPECT_EQ(problems.unreadable[0].node, "n1");
  EXPECT_THAT(problems.unregistered, IsEmpty());

  // Fixed: the block goes, the devices hold again.
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 3000, 30)}})).ok());
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "");
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 3000, 30}));
  EXPECT_THAT(ledger_.FindProblems().unreadable, IsEmpty());
}

TEST_F(LedgerTest, UnreadableBlockEndsWhenTerminalUnboundBindFailedOrRemoved) {
  auto blocked = [&](const PodAllocation& p) {
    EXPECT_TRUE(ledger_.Apply(Unreadable("u1", "n1")).ok());
    EXPECT_EQ(BlockedBy(ledger_, "n1"), "default/pod-u1");
    EXPECT_TRUE(ledger_.Apply(p).ok());
    return BlockedBy(ledger_, "n1");
  };
  PodAllocation terminal = Unreadable("u1", "n1");
  terminal.terminal = true;
  EXPECT_EQ(blocked(terminal), "");
  PodAllocation unbound = Unreadable("u1", "n1");
  unbound.bound_node.clear();
  EXPECT_EQ(blocked(unbound), "");
  PodAllocation failed = Unreadable("u1", "n1");
  failed.bind_failed = true;
  EXPECT_EQ(blocked(failed), "");
  PodAllocation deleted = Unreadable("u1", "n1");
  deleted.deleted = true;
  EXPECT_EQ(blocked(deleted), "");
  ASSERT_TRUE(ledger_.Apply(Unreadable("u1", "n1")).ok());
  EXPECT_TRUE(ledger_.Remove("u1"));
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "");
}

TEST_F(LedgerTest, SeveralBlockersNameTheSmallestUidAndSurviveReRegistration) {
  ASSERT_TRUE(ledger_.Apply(Unreadable("u2", "n1")).ok());
  ASSERT_TRUE(ledger_.Apply(Unreadable("u1", "n1")).ok());
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "default/pod-u1");
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a"})).ok());  // different devices
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "default/pod-u1");
  ASSERT_TRUE(ledger_.RemoveNode("n1"));
  EXPECT_THAT(ledger_.FindProblems().unreadable, SizeIs(2));  // held, on an unregistered node
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b"})).ok());
  EXPECT_TRUE(ledger_.Remove("u1"));
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "default/pod-u2");
  EXPECT_TRUE(ledger_.Remove("u2"));
  EXPECT_EQ(BlockedBy(ledger_, "n1"), "");
}

TEST_F(LedgerTest, UnreadableIsComparedByDiffAndRebuiltByRecompute) {
  ASSERT_TRUE(ledger_.Apply(Unreadable("u1", "n1")).ok());
  auto nodes = std::vector<std::shared_ptr<const NodeDevices>>{MakeNode("n1", {"GPU-a", "GPU-b"}),
                                                               MakeNode("n2", {"GPU-c"})};
  auto same = Ledger::Recompute(nodes, {Unreadable("u1", "n1")}, {});
  EXPECT_TRUE(Diff(ledger_, *same).Empty()) << Diff(ledger_, *same).ToString();
  EXPECT_EQ(BlockedBy(*same, "n1"), "default/pod-u1");
  auto readable = Ledger::Recompute(nodes, {Bound("u1", "n1", {})}, {});
  const LedgerDiff diff = Diff(ledger_, *readable);
  ASSERT_THAT(diff.records, SizeIs(1));
  EXPECT_EQ(diff.records[0].kind, DiffKind::kChanged);
  EXPECT_EQ(BlockedBy(*readable, "n1"), "");
}

TEST_F(LedgerTest, RecomputeEqualsIncremental) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("u2", "n2", {{Dev("GPU-c", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Reserve("u3", "default", "p3", "n1", {{Dev("GPU-b", 1, 1)}}, kT0).ok());
  auto fresh = Ledger::Recompute({MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})},
                                 ledger_.Records(), ledger_.Reservations());
  const LedgerDiff d = Diff(ledger_, *fresh);
  EXPECT_TRUE(d.Empty()) << d.ToString();
  EXPECT_TRUE(Diff(ledger_, ledger_).Empty());
}

TEST_F(LedgerTest, DiffReportsStaleMissingChangedAndUsage) {
  ASSERT_TRUE(ledger_.Apply(Bound("stale", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("moved", "n1", {{Dev("GPU-b", 1000, 10)}})).ok());
  auto truth = Ledger::Recompute({MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})},
                                 {Bound("moved", "n2", {{Dev("GPU-c", 1000, 10)}}),
                                  Bound("missing", "n2", {{Dev("GPU-c", 500, 5)}})},
                                 {});
  const LedgerDiff d = Diff(ledger_, *truth);
  ASSERT_THAT(d.records, SizeIs(3)) << d.ToString();
  EXPECT_EQ(d.records[0].uid, "missing");
  EXPECT_EQ(d.records[0].kind, DiffKind::kMissing);
  EXPECT_EQ(d.records[0].node_b, "n2");
  EXPECT_EQ(d.records[1].uid, "moved");
  EXPECT_EQ(d.records[1].kind, DiffKind::kChanged);
  EXPECT_EQ(d.records[1].node_a, "n1");
  EXPECT_EQ(d.records[1].node_b, "n2");
  EXPECT_EQ(d.records[2].uid, "stale");
  EXPECT_EQ(d.records[2].kind, DiffKind::kStale);
  ASSERT_THAT(d.usage, SizeIs(3)) << d.ToString();
  EXPECT_EQ(d.usage[0].uuid, "GPU-a");
  EXPECT_EQ(d.usage[0].a, (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(d.usage[0].b, (DeviceUsage{}));
  EXPECT_THAT(d.usage[0].holders_a, ElementsAre("stale"));
  EXPECT_EQ(d.usage[2].node, "n2");
  EXPECT_EQ(d.usage[2].b, (DeviceUsage{2, 1500, 15}));
  EXPECT_THAT(d.nodes, IsEmpty());
}

TEST_F(LedgerTest, DiffReportsNodeDifferences) {
  auto other = Ledger::Recompute({MakeNode("n1", {"GPU-a"}), MakeNode("n3", {"GPU-x"})}, {}, {});
  const LedgerDiff d = Diff(ledger_, *other);
  ASSERT_THAT(d.nodes, SizeIs(3)) << d.ToString();
  EXPECT_EQ(d.nodes[0].node, "n1");  // devices differ
  EXPECT_TRUE(d.nodes[0].registered_a && d.nodes[0].registered_b);
  EXPECT_EQ(d.nodes[1].node, "n2");
  EXPECT_FALSE(d.nodes[1].registered_b);
  EXPECT_EQ(d.nodes[2].node, "n3");
  EXPECT_FALSE(d.nodes[2].registered_a);
  EXPECT_THAT(d.usage, IsEmpty());  // nothing is used on either side
}

// ---- namespace usage (the view namespace quota reads) ------------------------------------

PodAllocation InNs(PodAllocation p, const std::string& ns) {
  p.ns = ns;
  return p;
}

TEST_F(LedgerTest, NamespaceUsageCountsPerDeviceTimesCount) {
  // HAMi v2.10 pkg/device/quota.go countPodDevices: a container given 2 cards x 3000 MiB counts
  // 6000 (issue #1393); TestAddUsageAndRmUsage: add, then remove back to nothing.
  ASSERT_TRUE(
      ledger_
          .Apply(InNs(Bound("u1", "n1", {{Dev("GPU-a", 3000, 20), Dev("GPU-b", 3000, 20)}}), "ml"))
          .ok());
  ASSERT_TRUE(ledger_.Apply(InNs(Bound("u2", "n2", {{Dev("GPU-c", 1000, 0)}}), "ml")).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("u3", "n2", {{Dev("GPU-c", 500, 5)}})).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{7000, 40, 2}));
  EXPECT_EQ(ledger_.UsageOf("default"), (NamespaceUsage{500, 5, 1}));
  EXPECT_EQ(ledger_.UsageOf("other"), NamespaceUsage{});
  const FullSnapshot full = ledger_.Full();
  ASSERT_THAT(full.namespaces, SizeIs(2));
  EXPECT_EQ(full.namespaces[0].first, "default");
  EXPECT_EQ(full.namespaces[1].first, "ml");

  EXPECT_TRUE(ledger_.Remove("u1"));
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{1000, 0, 1}));
  EXPECT_TRUE(ledger_.Remove("u2"));
  EXPECT_FALSE(ledger_.Remove("u2"));  // a second delete subtracts nothing (HAMi clamps at 0)
  EXPECT_EQ(ledger_.UsageOf("ml"), NamespaceUsage{});
  EXPECT_THAT(ledger_.Full().namespaces, SizeIs(1));
}

TEST_F(LedgerTest, NamespaceUsageCollapsesInitContainersLikeDeviceUsage) {
  // HAMi v2.10 pkg/device/initContainer.go CollapseInitContainerUsage: per card,
  // max(peak over init containers, sum over app containers). Init 5000 on GPU-a, apps 3000 +
  // 1000 on GPU-a and 2000 on GPU-b: max(5000, 4000) + 2000 = 7000 MiB.
  PodAllocation p = InNs(Bound("u1", "n1",
                               {{Dev("GPU-a", 5000, 50)},
                                {Dev("GPU-a", 3000, 10)},
                                {Dev("GPU-a", 1000, 10), Dev("GPU-b", 2000, 30)}}),
                         "ml");
  p.init_count = 1;
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{7000, 80, 1}));
  // Once the init container is no longer counted (a new record without it), usage shrinks to
  // the apps' sum, as HAMi's ReplaceUsage after the init containers exit.
  p.devices.erase(p.devices.begin());
  p.init_count = 0;
  ASSERT_TRUE(ledger_.Apply(p).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{6000, 50, 1}));
}

TEST_F(LedgerTest, ReservationsCountTowardNamespaceUsageAndReleaseWithIt) {
  ASSERT_TRUE(ledger_.Reserve("r1", "ml", "p1", "n1", {{Dev("GPU-a", 8000, 0)}}, kT0).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{8000, 0, 1}));
  // Observed bound with the same devices: the record replaces the reservation, counted once.
  PodAllocation bound = InNs(Bound("r1", "n1", {{Dev("GPU-a", 8000, 0)}}), "ml");
  bound.name = "p1";
  ASSERT_TRUE(ledger_.Apply(bound).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), (NamespaceUsage{8000, 0, 1}));
  ASSERT_TRUE(ledger_.Reserve("r2", "ml", "p2", "n2", {{Dev("GPU-c", 1000, 0)}}, kT0).ok());
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 9000);
  EXPECT_TRUE(ledger_.Release("r2"));
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 8000);
  ASSERT_TRUE(ledger_.Reserve("r3", "ml", "p3", "n2", {{Dev("GPU-c", 1000, 0)}}, kT0).ok());
  EXPECT_THAT(ledger_.ExpireReservations(kT0), SizeIs(1));
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 8000);
  // A finished pod holds nothing.
  bound.terminal = true;
  ASSERT_TRUE(ledger_.Apply(bound).ok());
  EXPECT_EQ(ledger_.UsageOf("ml"), NamespaceUsage{});
}

TEST_F(LedgerTest, NamespaceUsageFollowsNodeRegistrationAndDiff) {
  ASSERT_TRUE(ledger_.Apply(InNs(Bound("u1", "n2", {{Dev("GPU-c", 4000, 0)}}), "ml")).ok());
  EXPECT_TRUE(ledger_.RemoveNode("n2"));  // its devices are unknown: nothing is held
  EXPECT_EQ(ledger_.UsageOf("ml"), NamespaceUsage{});
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n2", {"GPU-c"})).ok());
  EXPECT_EQ(ledger_.UsageOf("ml").usedmem, 4000);

  auto recomputed = Ledger::Recompute(
      {MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})}, ledger_.Records(), {});
  EXPECT_TRUE(Diff(ledger_, *recomputed).Empty()) << Diff(ledger_, *recomputed).ToString();
  EXPECT_EQ(recomputed->UsageOf("ml").usedmem, 4000);
  auto empty = Ledger::Recompute({MakeNode("n2", {"GPU-c"})}, {}, {});
  const LedgerDiff d = Diff(ledger_, *empty);
  ASSERT_THAT(d.namespaces, SizeIs(1));
  EXPECT_EQ(d.namespaces[0].ns, "ml");
  EXPECT_EQ(d.namespaces[0].a.usedmem, 4000);
  EXPECT_EQ(d.namespaces[0].b, NamespaceUsage{});
  EXPECT_THAT(d.ToString(), ::testing::HasSubstr("namespace ml: a=(mem 4000"));
}

}  // namespace
// ---- CapacitySince (the requeue's reads) ----------------------------------------------------

namespace {

std::vector<std::string> ChangedNodes(const CapacityChanges& c) {
  std::vector<std::string> out;
  for (const auto& [name, snapshot] : c.nodes) {
    out.push_back(name + (snapshot.has_value() ? "" : " (unregistered)"));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_F(LedgerTest, CapacitySinceListsOnlyTheNodesThatChanged) {
  const CapacityChanges all = ledger_.CapacitySince(0);
  EXPECT_THAT(ChangedNodes(all), ElementsAre("n1", "n2"));
  EXPECT_EQ(all.registered, 2U);
  EXPECT_THAT(ChangedNodes(ledger_.CapacitySince(all.version)), IsEmpty());
  // A pod bound on n1: n1 only, with its usage; its namespace among all namespaces.
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  const CapacityChanges one = ledger_.CapacitySince(all.version);
  ASSERT_THAT(ChangedNodes(one), ElementsAre("n1"));
  EXPECT_EQ(one.nodes[0].second->usage[0], (DeviceUsage{1, 1000, 10}));
  ASSERT_EQ(one.namespaces.size(), 1U);
  EXPECT_EQ(one.namespaces[0].first, "default");
  // A reservation and its release, a registration change, a blocker: each a change of its node.
  ASSERT_TRUE(ledger_
                  .Reserve("u2", "default", "pod-u2", "n2", {{Dev("GPU-c", 500, 5)}},
                           kT0 + absl::Minutes(5))
                  .ok());
  const CapacityChanges two = ledger_.CapacitySince(one.version);
  EXPECT_THAT(ChangedNodes(two), ElementsAre("n2"));
  ASSERT_TRUE(ledger_.Release("u2"));
  EXPECT_THAT(ChangedNodes(ledger_.CapacitySince(two.version)), ElementsAre("n2"));
  const uint64_t before = ledger_.CapacitySince(0).version;
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b"})).ok());  // the same again
  EXPECT_THAT(ChangedNodes(ledger_.CapacitySince(before)), IsEmpty());
  ASSERT_TRUE(ledger_.SetNode(MakeNode("n1", {"GPU-a", "GPU-b", "GPU-x"})).ok());
  EXPECT_THAT(ChangedNodes(ledger_.CapacitySince(before)), ElementsAre("n1"));
  // A node removed while a pod still names it: listed unregistered; one without: not listed,
  // and `registered` tells.
  const uint64_t now = ledger_.CapacitySince(0).version;
  ASSERT_TRUE(ledger_.RemoveNode("n1"));
  ASSERT_TRUE(ledger_.RemoveNode("n2"));
  const CapacityChanges gone = ledger_.CapacitySince(now);
  EXPECT_THAT(ChangedNodes(gone), ElementsAre("n1 (unregistered)"));
  EXPECT_EQ(gone.registered, 0U);
}

// ---- ReplaceContainer (the NUMA refit's accounting) ---------------------------------------

TEST_F(LedgerTest, ReplaceContainerMovesOnlyThatContainersUsage) {
  // Container 0 on GPU-a, container 1 on GPU-a too; container 1 moves to GPU-b.
  ASSERT_TRUE(
      ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}, {Dev("GPU-a", 2000, 20)}})).ok());
  ASSERT_TRUE(ledger_.Apply(Bound("u2", "n1", {{Dev("GPU-b", 500, 5)}})).ok());
  absl::StatusOr<int> moved =
      ledger_.ReplaceContainer("u1", 1, {Dev("GPU-a", 2000, 20)}, {Dev("GPU-b", 2000, 20)});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 1);
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{2, 2500, 25}));
  const std::optional<Held> held = ledger_.Find("u1");
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->node, "n1");
  EXPECT_FALSE(held->reserved);
  EXPECT_EQ(held->devices, (PodDevices{{Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 2000, 20)}}));
  // The result is what the informer will deliver once it sees the patched annotation.
  const auto truth =
      Ledger::Recompute({MakeNode("n1", {"GPU-a", "GPU-b"}), MakeNode("n2", {"GPU-c"})},
                        {Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 2000, 20)}}),
                         Bound("u2", "n1", {{Dev("GPU-b", 500, 5)}})},
                        {});
  EXPECT_TRUE(Diff(ledger_, *truth).Empty()) << Diff(ledger_, *truth).ToString();
}

TEST_F(LedgerTest, ReplaceContainerMovesTheReservationOfAnUnobservedBind) {
  ASSERT_TRUE(ledger_
                  .Reserve("u1", "default", "pod-u1", "n1", {{Dev("GPU-a", 1000, 10)}},
                           kT0 + absl::Minutes(5))
                  .ok());
  absl::StatusOr<int> moved =
      ledger_.ReplaceContainer("u1", 0, {Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 1000, 10)});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 1);
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 1000, 10}));
  ASSERT_THAT(ledger_.Reservations(), SizeIs(1));
  EXPECT_EQ(ledger_.Reservations()[0].devices, (PodDevices{{Dev("GPU-b", 1000, 10)}}));
  EXPECT_EQ(ledger_.Reservations()[0].expires_at, kT0 + absl::Minutes(5));
}

// Without pins too: the informer's events older than the refit's patch do not move the usage
// back (for as long as it takes the refit's own event to arrive), and a pod deleted meanwhile
// frees everything.
TEST_F(LedgerTest, ReplaceContainerHoldsAgainstOlderEventsUntilItsOwnArrives) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("u1", 0, {Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 1000, 10)}),
            1);
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{1, 1000, 10}));
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-b", 1000, 10)}})).ok());
  // Its own event arrived: an unpinned ledger follows the annotations again.
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));

  ASSERT_TRUE(ledger_.Apply(Bound("u2", "n1", {{Dev("GPU-a", 500, 5)}})).ok());
  ASSERT_EQ(*ledger_.ReplaceContainer("u2", 0, {Dev("GPU-a", 500, 5)}, {Dev("GPU-b", 500, 5)}), 1);
  PodAllocation gone = Bound("u2", "n1", {{Dev("GPU-a", 500, 5)}});
  gone.deleted = true;
  ASSERT_TRUE(ledger_.Apply(gone).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
  // A new pod with the same uid starts with nothing held for it.
  ASSERT_TRUE(ledger_.Apply(Bound("u2", "n1", {{Dev("GPU-a", 500, 5)}})).ok());
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{2, 1500, 15}));
}

TEST_F(LedgerTest, ReplaceContainerChangesNothingWhenTheDevicesDiffer) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  // Another amount, another UUID, another container: the record no longer holds `from`.
  for (const auto& [container, from] :
       std::vector<std::pair<int, device::ContainerDevices>>{{0, {Dev("GPU-a", 999, 10)}},
                                                             {0, {Dev("GPU-b", 1000, 10)}},
                                                             {1, {Dev("GPU-a", 1000, 10)}}}) {
    absl::StatusOr<int> moved =
        ledger_.ReplaceContainer("u1", container, from, {Dev("GPU-b", 1000, 10)});
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_EQ(*moved, 0);
  }
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_EQ(Usage(ledger_, "n1", 1), (DeviceUsage{}));
}

TEST_F(LedgerTest, ReplaceContainerRefusesBadInputAndUnknownPods) {
  ASSERT_TRUE(ledger_.Apply(Bound("u1", "n1", {{Dev("GPU-a", 1000, 10)}})).ok());
  EXPECT_EQ(
      ledger_.ReplaceContainer("nobody", 0, {Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 1000, 10)})
          .status()
          .code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(ledger_.ReplaceContainer("u1", 0, {}, {Dev("GPU-b", 1000, 10)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.ReplaceContainer("u1", 0, {Dev("GPU-a", 1000, 10)}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.ReplaceContainer("u1", -1, {Dev("GPU-a", 1000, 10)}, {Dev("GPU-b", 1, 1)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Usage(ledger_, "n1", 0), (DeviceUsage{1, 1000, 10}));
  EXPECT_FALSE(ledger_.Find("nobody").has_value());
}

}  // namespace tessera::ledger

// Scheduler::Nominate: the share a preemption frees is held for its preemptor (docs/preemption.md
// "The nominated reservation") — no smaller pod takes it while the preemptor waits, the preemptor's
// own filter gets it, and the hold ends with the pod or its expiry.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_test_fixture.h"
#include "tessera/ledger/ledger.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class NominationTest : public SchedulerTest {
 protected:
  // n1: one 8000 MiB card, two bound pods "low1" and "low2" of 4000 MiB each; "big" (the
  // preemptor) and "small" pending, asking 4000 and 2000 MiB; the lookup reads the API server
  // (the informer's copy).
  Scheduler& Given() {
    AddNode("n1", {{"GPU-a", 10, 8000}});
    for (const char* low : {"low1", "low2"}) {
      env_.CreatePod(low, Limits(4000));
      ledger::PodAllocation held{.uid = Pod(low).meta.uid,
                                 .ns = "default",
                                 .name = low,
                                 .node = "n1",
                                 .bound_node = "n1",
                                 .devices = {{{"GPU-a", "NVIDIA", 4000, 0}}}};
      EXPECT_TRUE(ledger_.Apply(held).ok());
    }
    env_.CreatePod("big", Limits(4000));
    env_.CreatePod("small", Limits(2000));
    return Make([this](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
      absl::StatusOr<kube::Pod> pod = env_.client()->GetPod("default", std::string(name));
      return pod.ok() ? std::optional<kube::Pod>(*pod) : std::nullopt;
    });
  }
  // The victim leaves: its record goes (the pod feed's DELETED event).
  void Evict(const std::string& pod) { ASSERT_TRUE(ledger_.Remove(Pod(pod).meta.uid)); }
  std::vector<std::string> Fits(Scheduler& s, const std::string& pod) {
    return *s.Filter(Args(pod, {"n1"})).node_names;
  }
};

TEST_F(NominationTest, ASmallerPodCannotTakeTheShareThePreemptorsVictimFreed) {
  Scheduler& s = Given();
  s.Nominate(Pod("big"), {"n1"});
  EXPECT_EQ(s.Nominated(), 1u);
  // While the victim holds the card, nothing is reserved and the small pod does not fit either.
  EXPECT_THAT(s.SettleNominations(), IsEmpty());
  EXPECT_THAT(Fits(s, "small"), IsEmpty());

  Evict("low2");
  // The small pod's filter comes first: the freed share goes to the preemptor before it decides.
  EXPECT_THAT(Fits(s, "small"), IsEmpty()) << "the small pod took the preemptor's share";
  std::optional<ledger::Reservation> held = ledger_.ReservationOf(Pod("big").meta.uid);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->node, "n1");
  EXPECT_EQ(held->devices, device::PodDevices({{{"GPU-a", "NVIDIA", 4000, 0}}}));
  EXPECT_EQ(s.Nominated(), 0u);
  std::optional<ledger::NodeView> view = ledger_.View("n1");
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->usage[0].usedmem, 8000) << "the card is full, never over";

  // The preemptor's own filter takes it (its reservation replaced by its decision) and binds.
  EXPECT_THAT(Fits(s, "big"), ElementsAre("n1"));
  EXPECT_EQ(ledger_.ReservationOf(Pod("big").meta.uid)->node, "n1");
  EXPECT_EQ(ledger_.View("n1")->usage[0].usedmem, 8000);
  bool reserved_event = false;
  for (const SeenEvent& e : Events()) {
    if (e.reason == "PreemptionShareReserved" && e.pod == "big") {
      reserved_event = true;
      EXPECT_EQ(e.message, "the GPU share freed on n1 is held for this pod: GPU-a 4000MiB 0%");
    }
  }
  EXPECT_TRUE(reserved_event);
}

TEST_F(NominationTest, ThePreemptorsOwnFilterEndsItsNomination) {
  Scheduler& s = Given();
  s.Nominate(Pod("big"), {"n1"});
  EXPECT_THAT(Fits(s, "big"), IsEmpty()) << "the victims still hold the card";
  EXPECT_EQ(s.Nominated(), 1u) << "a filter that found nothing keeps the nomination";
  Evict("low2");
  EXPECT_THAT(Fits(s, "big"), ElementsAre("n1"));
  EXPECT_EQ(s.Nominated(), 0u);
  // The small pod finds the card full, and no second reservation is made for the preemptor.
  EXPECT_THAT(Fits(s, "small"), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), SizeIs(1));
}

TEST_F(NominationTest, ANominationWhoseVictimsNeverLeaveExpiresAndHoldsNothing) {
  Scheduler& s = Given();
  s.Nominate(Pod("big"), {"n1"});
  clock_.Advance(options_.reservation_ttl);
  EXPECT_THAT(s.SettleNominations(), IsEmpty());
  EXPECT_EQ(s.Nominated(), 0u);
  Evict("low2");
  EXPECT_THAT(Fits(s, "small"), ElementsAre("n1")) << "an expired nomination still held the share";
}

TEST_F(NominationTest, ANominationEndsWithItsPod) {
  Scheduler& s = Given();
  const std::string big = Pod("big").meta.uid;
  s.Nominate(Pod("big"), {"n1"});
  env_.Delete("pods", "default", "big");
  Evict("low2");
  EXPECT_THAT(Fits(s, "small"), ElementsAre("n1")) << "a deleted preemptor still held the share";
  EXPECT_EQ(s.Nominated(), 0u);
  EXPECT_FALSE(ledger_.HasReservation(big));
}

TEST_F(NominationTest, TheShareIsReservedOnTheNodeWhereThePodFits) {
  AddNode("n2", {{"GPU-b", 10, 8000}});
  Scheduler& s = Given();
  ledger::PodAllocation full{.uid = "u-full",
                             .ns = "default",
                             .name = "full",
                             .node = "n2",
                             .bound_node = "n2",
                             .devices = {{{"GPU-b", "NVIDIA", 8000, 0}}}};
  ASSERT_TRUE(ledger_.Apply(full).ok());
  s.Nominate(Pod("big"), {"n1", "n2"});
  ASSERT_TRUE(ledger_.Remove("u-full"));  // n2's holder leaves; n1's victims stay
  std::vector<ledger::Reservation> made = s.SettleNominations();
  ASSERT_THAT(made, SizeIs(1));
  EXPECT_EQ(made[0].node, "n2");
  EXPECT_EQ(made[0].name, "big");
  EXPECT_EQ(ledger_.View("n1")->usage[0].usedmem, 8000);
  EXPECT_EQ(ledger_.View("n2")->usage[0].usedmem, 4000);
}

}  // namespace
}  // namespace tessera::extender

// The filter's annotation patch written behind its reply, and the bind that waits for it; filters
// and binds racing another scheduler replica.
#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/device/annotations.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_test_fixture.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/wait.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---- the filter patch written behind the reply -----------------------------------------------

TEST_F(SchedulerTest, WriteBehindBindWaitsForThePatchAndUsesThePodItReturned) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  const kube::Pod unannotated = Pod("p1");
  options_.write_behind = true;
  std::atomic<int> lookups{0};
  Scheduler& s = Make([&](std::string_view, std::string_view) -> std::optional<kube::Pod> {
    ++lookups;
    return unannotated;  // an informer that has not seen the patch yet
  });
  FilterResult r = s.Filter(Args("p1", {"n1"}));
  ASSERT_EQ(r.error, "");
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
  const BindArgs bind = BindFor("p1", "n1");
  const size_t gets = env_.faults()->Matching("GET", std::string(kPodPath) + "p1").size();
  lookups = 0;  // the filter's check that the pod is pending used it
  BindResult b = s.Bind(bind);
  EXPECT_EQ(b.error, "");
  // The patched pod came from the patch's reply: neither the lookup nor a GET was needed.
  EXPECT_EQ(lookups.load(), 0);
  EXPECT_EQ(env_.faults()->Matching("GET", std::string(kPodPath) + "p1").size(), gets);
  kube::Pod bound = Pod("p1");
  EXPECT_EQ(bound.node_name, "n1");
  EXPECT_EQ(bound.meta.annotations.Get(device::kVgpuNodeAnnotation), "n1");
  EXPECT_EQ(PodPatches("p1").size(), 1u);  // one filter patch, written behind the reply
}

TEST_F(SchedulerTest, WriteBehindPatchFailureFailsTheBindAndHoldsNothing) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  options_.write_behind = true;
  Scheduler& s = Make();
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "p1", 500, "InternalError");
  FilterResult r = s.Filter(Args("p1", {"n1"}));
  EXPECT_EQ(r.error, "");  // the decision was made; the patch is behind the reply
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("patch pod default/p1 annotations"));
  ExpectNothingHeld("p1", "n1");
  EXPECT_EQ(PodPatches("p1").size(), 1u);  // the failed patch, not retried
  EXPECT_EQ(outcome.code, BindCode::kPatchFailed);
  // The failure is also the filter's event (written behind, it could not be the reply).
  EXPECT_THAT(EventReasons(),
              UnorderedElementsAre("FilteringSucceed", "FilteringFailed", "BindingFailed"));
}

TEST_F(SchedulerTest, WriteBehindReFilterLeavesTheLastDecisionOnThePod) {
  AddNode("n1", {{"GPU-a"}});
  AddNode("n2", {{"GPU-b"}});
  env_.CreatePod("p1", Limits(1000));
  options_.write_behind = true;
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_THAT(*s.Filter(Args("p1", {"n2"})).node_names, ElementsAre("n2"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n2")).error, "");
  kube::Pod bound = Pod("p1");
  EXPECT_EQ(bound.meta.annotations.Get(device::kVgpuNodeAnnotation), "n2");
  EXPECT_THAT(std::string(bound.meta.annotations.Get(device::kDevicesAllocatedAnnotation)),
              HasSubstr("GPU-b"));
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(ledger_.Reservations()[0].node, "n2");
}

// Two replicas across a leadership handover (test/controlplane/failover_test.sh --graceful,
// docs/e2e.md): the stopping replica's filter patch has landed and its bind is in flight when
// the new leader filters the same, still unbound pod to another node. The stopping replica's
// Binding must not land on a pod that now carries the other replica's decision: before the
// Binding named the resourceVersion it checked, the pod ended bound to n1 with n2's GPU in its
// annotations, and every ledger counted it nowhere.
TEST_F(SchedulerTest, ABindIsRefusedOnceAnotherReplicaDecidedAgainForThePod) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  AddNode("n2", {{"GPU-b", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  options_.write_behind = true;
  Scheduler& stopping = Make();
  ASSERT_THAT(*stopping.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_TRUE(testing::Eventually(
      [&] { return Pod("p1").meta.annotations.Get(device::kVgpuNodeAnnotation) == "n1"; }));

  // The new leader: its own ledger, the same API server.
  ledger::Ledger other_ledger;
  ASSERT_NO_FATAL_FAILURE(FillLedger(other_ledger, {"n1", "n2"}));
  Scheduler::Options leader_options = options_;
  leader_options.write_behind = false;
  Scheduler leader(leader_options, Scheduler::Deps{&other_ledger, env_.client(), &clock_, nullptr});
  ASSERT_THAT(*leader.Filter(Args("p1", {"n2"})).node_names, ElementsAre("n2"));

  BindOutcome outcome;
  BindResult late = stopping.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(late.error, HasSubstr("n2"));
  EXPECT_EQ(outcome.code, BindCode::kBindingRejected);
  EXPECT_EQ(Pod("p1").node_name, "");
  EXPECT_EQ(Lock("n1"), "<none>");

  ASSERT_EQ(leader.Bind(BindFor("p1", "n2")).error, "");
  const kube::Pod bound = Pod("p1");
  EXPECT_EQ(bound.node_name, "n2");
  EXPECT_EQ(bound.meta.annotations.Get(device::kVgpuNodeAnnotation), "n2");
  EXPECT_THAT(std::string(bound.meta.annotations.Get(device::kDevicesAllocatedAnnotation)),
              HasSubstr("GPU-b"));
}

// The other order of the same handover: the stopping replica's Binding landed first, and the
// new leader's informer has not seen it yet. Its filter must not re-annotate a bound pod: the
// patch names the resourceVersion its pending check read, and the API server's 409 is answered
// by a fresh read that finds the pod bound.
TEST_F(SchedulerTest, AFilterPatchIsRefusedOnceAnotherReplicaBoundThePod) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  AddNode("n2", {{"GPU-b", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  const kube::Pod unbound = Pod("p1");  // what the new leader's informer still holds
  Scheduler& stopping = Make();
  ASSERT_THAT(*stopping.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(stopping.Bind(BindFor("p1", "n1")).error, "");
  const kube::Pod bound = Pod("p1");

  for (const bool write_behind : {false, true}) {
    ledger::Ledger other_ledger;
    ASSERT_NO_FATAL_FAILURE(FillLedger(other_ledger, {"n1", "n2"}));
    Scheduler::Options leader_options = options_;
    leader_options.write_behind = write_behind;
    Scheduler leader(leader_options, Scheduler::Deps{&other_ledger, env_.client(), &clock_,
                                                     [&](std::string_view, std::string_view) {
                                                       return std::optional<kube::Pod>(unbound);
                                                     }});
    FilterArgs args;
    args.pod = unbound;
    args.node_names = std::vector<std::string>{"n2"};
    FilterResult r = leader.Filter(args);
    if (write_behind) {
      // The decision was answered before the patch; the bind finds the patch refused.
      BindResult b = leader.Bind(BindFor("p1", "n2"));
      EXPECT_THAT(b.error, HasSubstr("already bound to node n1"));
    } else {
      EXPECT_THAT(r.error, HasSubstr("already bound to node n1"));
    }
    EXPECT_EQ(Pod("p1"), bound) << "write_behind " << write_behind;
    EXPECT_THAT(other_ledger.Reservations(), IsEmpty()) << "write_behind " << write_behind;
  }
}

// The preconditions refuse only a changed decision: a pod changed in some other way between the
// check and the write (a label added; a cache a version behind) is written at its new version.
TEST_F(SchedulerTest, ChangesOtherThanADecisionDoNotFailFilterOrBind) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  const kube::Pod stale = Pod("p1");
  kube::MetadataPatch label;
  label.labels.emplace_back("team", "a");
  ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", label).ok());
  options_.write_behind = true;
  Scheduler& s = Make([&](std::string_view, std::string_view) -> std::optional<kube::Pod> {
    return stale;  // an informer a version behind
  });
  FilterArgs args;
  args.pod = stale;
  args.node_names = std::vector<std::string>{"n1"};
  ASSERT_THAT(*s.Filter(args).node_names, ElementsAre("n1"));
  ASSERT_TRUE(testing::Eventually(
      [&] { return Pod("p1").meta.annotations.Get(device::kVgpuNodeAnnotation) == "n1"; }));
  label.labels = {{"team", "b"}};
  ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", label).ok());

  BindResult b = s.Bind(BindFor("p1", "n1"));
  EXPECT_EQ(b.error, "");
  EXPECT_EQ(Pod("p1").node_name, "n1");
  // label, the filter's 409 and its write at the new version, the second label
  EXPECT_EQ(PodPatches("p1").size(), 4u);
  // the Binding at the filter's version (409), then at the label's
  EXPECT_EQ(env_.faults()->Matching("POST", std::string(kPodPath) + "p1/binding").size(), 2u);
}

}  // namespace
}  // namespace tessera::extender

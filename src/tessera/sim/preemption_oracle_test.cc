#include "tessera/sim/preemption_oracle.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <fmt/core.h>

#include "tessera/device/codec.h"
#include "tessera/testing/objects.h"

namespace tessera::sim {
namespace {

using ::tessera::testing::AllocatedPod;
using ::tessera::testing::GpuContainer;
using ::tessera::testing::GpuDevice;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

// Node n1: two cards of 16,000 MiB, `slots` shares each.
kube::Node Node(int slots = 4) {
  return ::tessera::testing::GpuNode(
      "n1", device::EncodeNodeRegisterJson({GpuDevice("GPU-a", 0, 16000, "NVIDIA-A100", slots),
                                            GpuDevice("GPU-b", 1, 16000, "NVIDIA-A100", slots)}));
}

// A running pod on n1 holding `mem` MiB (and `cores`) of `card`, of `priority`.
kube::Pod Holder(const std::string& name, const std::string& card, int mem, int priority = 0,
                 int cores = 0) {
  kube::Pod p = AllocatedPod(name, "n1", fmt::format("{},NVIDIA,{},{}:;", card, mem, cores));
  p.meta.ns = "default";
  p.meta.uid = "uid-" + name;
  p.priority = priority;
  return p;
}

// A pending pod of one container asking `count` GPUs of `mem` MiB ("" none) and `cores`.
kube::Pod Asking(const std::string& name, const std::string& count, const std::string& mem,
                 const std::string& cores = "", int priority = 1000) {
  kube::Pod p;
  p.meta.ns = "default";
  p.meta.name = name;
  p.meta.uid = "uid-" + name;
  p.priority = priority;
  p.containers.push_back(GpuContainer("main", count, mem, cores));
  return p;
}

TEST(PreemptionFitTest, SlotsMemoryAndCoresPerCardAsHamiCountsThem) {
  const kube::Node n = Node();
  const kube::Pod big = Asking("big", "1", "12000");
  EXPECT_EQ(FitsOnNode(big, n, {}), true);
  EXPECT_EQ(FitsOnNode(big, n, {Holder("a", "GPU-a", 8000), Holder("b", "GPU-b", 8000)}), false);
  EXPECT_EQ(FitsOnNode(big, n, {Holder("a", "GPU-a", 8000), Holder("b", "GPU-b", 4000)}), true);
  // Two cards, each with room.
  EXPECT_EQ(FitsOnNode(Asking("two", "2", "8000"), n, {Holder("a", "GPU-a", 8000)}), true);
  EXPECT_EQ(FitsOnNode(Asking("two", "2", "8001"), n, {Holder("a", "GPU-a", 8000)}), false);
  // No memory asked: the whole card.
  EXPECT_EQ(FitsOnNode(Asking("whole", "1", ""), n, {Holder("a", "GPU-a", 1)}), true);
  EXPECT_EQ(FitsOnNode(Asking("whole", "2", ""), n, {Holder("a", "GPU-a", 1)}), false);
  // Slots: a card of one share is taken by any holder.
  EXPECT_EQ(FitsOnNode(Asking("small", "1", "100"), Node(1),
                       {Holder("a", "GPU-a", 100), Holder("b", "GPU-b", 100)}),
            false);
  // Cores: exclusive use wants an idle card; a card with every core taken refuses 0 cores.
  EXPECT_EQ(FitsOnNode(Asking("excl", "1", "100", "100"), n,
                       {Holder("a", "GPU-a", 100), Holder("b", "GPU-b", 100)}),
            false);
  EXPECT_EQ(FitsOnNode(Asking("zero", "1", "100"), n,
                       {Holder("a", "GPU-a", 100, 0, 100), Holder("b", "GPU-b", 100, 0, 100)}),
            false);
  EXPECT_EQ(FitsOnNode(Asking("zero", "1", "100"), n, {Holder("a", "GPU-a", 100, 0, 100)}), true);
  // A finished holder holds nothing.
  kube::Pod done = Holder("done", "GPU-a", 16000);
  done.phase = kube::PodPhase::kSucceeded;
  EXPECT_EQ(FitsOnNode(Asking("whole", "2", ""), n, {done}), true);
}

TEST(PreemptionFitTest, RequestsTheRuleDoesNotModelAreNotJudged) {
  const kube::Node n = Node();
  kube::Pod typed = Asking("typed", "1", "1000");
  typed.meta.annotations.Set("nvidia.com/use-gputype", "A100");
  EXPECT_EQ(FitsOnNode(typed, n, {}), std::nullopt);
  kube::Pod two = Asking("two", "1", "1000");
  two.containers.push_back(GpuContainer("b", "1", "1000", ""));
  EXPECT_EQ(FitsOnNode(two, n, {}), std::nullopt);
  EXPECT_EQ(FitsOnNode(Asking("odd", "1", "1Gi"), n, {}), std::nullopt);
  kube::Pod none;
  EXPECT_EQ(FitsOnNode(none, n, {}), std::nullopt);
}

// What apisim and Tessera recorded for the victims `names` of `preemptor` on n1, evicted from
// kT0 + `at` on, 10 ms apart, each with `state` as the node's pods.
struct Recorded {
  std::vector<EvictionRecord> evictions;
  std::vector<PreemptedEvent> events;
};
void Evict(Recorded& r, const std::vector<std::string>& names, const std::string& preemptor,
           const std::vector<kube::Pod>& state, absl::Duration at = absl::ZeroDuration()) {
  for (size_t i = 0; i < names.size(); ++i) {
    r.evictions.push_back({.ns = "default",
                           .name = names[i],
                           .uid = "uid-" + names[i],
                           .node = "n1",
                           .at = kT0 + at + absl::Milliseconds(10 * static_cast<int>(i)),
                           .node_pods = state});
    r.events.push_back(
        {.victim_uid = "uid-" + names[i], .node = "n1", .preemptor = "default/" + preemptor});
  }
}

PreemptionInput Input(const Recorded& r, const std::vector<kube::Pod>& workload) {
  PreemptionInput in;
  in.evictions = r.evictions;
  in.events = r.events;
  in.nodes = {Node()};
  for (const kube::Pod& p : workload) {
    in.pods["default/" + p.meta.name] = {
        .pod = p, .node = "n1", .bound_at = kT0 + absl::Seconds(2)};
  }
  return in;
}

// a1, a2 fill card a (8,000 MiB each); b1 holds 10,000 of card b: a pod of 12,000 MiB needs b1
// gone, and only b1.
std::vector<kube::Pod> Full() {
  return {Holder("a1", "GPU-a", 8000), Holder("a2", "GPU-a", 8000), Holder("b1", "GPU-b", 10000)};
}

TEST(PreemptionOracleTest, TheOneVictimThatFreesTheShareIsNeeded) {
  Recorded r;
  Evict(r, {"b1"}, "hi", Full());
  const PreemptionFindings f = JudgePreemptions(Input(r, {Asking("hi", "1", "12000")}));
  EXPECT_TRUE(f.violations.empty()) << f.violations[0].what;
  EXPECT_EQ(f.preemptions, 1);
  EXPECT_EQ(f.victims, 1);
  EXPECT_EQ(f.judged, 1);
  EXPECT_EQ(f.bound_there, 1);
}

TEST(PreemptionOracleTest, AVictimThePodFitsWithoutIsNeedless) {
  Recorded r;
  Evict(r, {"a1", "b1"}, "hi", Full());
  const PreemptionFindings f = JudgePreemptions(Input(r, {Asking("hi", "1", "12000")}));
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_THAT(f.violations[0].what,
              HasSubstr("default/a1 was a needless victim: default/hi (priority 1000) fits on n1 "
                        "with it kept"));
  EXPECT_EQ(f.judged, 1);
  // An eviction when the pod fitted already: the one victim is needless.
  Recorded spare;
  Evict(spare, {"a1"}, "hi", {Holder("a1", "GPU-a", 8000)});
  EXPECT_EQ(JudgePreemptions(Input(spare, {Asking("hi", "1", "12000")})).violations.size(), 1u);
}

TEST(PreemptionOracleTest, AVictimOfEqualOrHigherPriorityIsAViolation) {
  std::vector<kube::Pod> state = Full();
  state[2].priority = 1000;
  Recorded r;
  Evict(r, {"b1"}, "hi", state);
  const PreemptionFindings f = JudgePreemptions(Input(r, {Asking("hi", "1", "12000")}));
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_THAT(f.violations[0].what, HasSubstr("default/b1 (priority 1000) was evicted for "
                                              "default/hi (priority 1000) on n1: not of lower "
                                              "priority"));
}

// The recorded state may not be the one the scheduler decided on: counted, not judged.
TEST(PreemptionOracleTest, ANodeThatChangedOrHoldsANominationIsNotJudged) {
  Recorded r;
  Evict(r, {"a1", "b1"}, "hi", Full());  // needless a1, were it judged
  PreemptionInput in = Input(r, {Asking("hi", "1", "12000")});
  in.departures = {{"default/z", "n1", kT0 - absl::Milliseconds(400)}};
  PreemptionFindings f = JudgePreemptions(in);
  EXPECT_TRUE(f.violations.empty());
  EXPECT_EQ(f.unjudged_changed, 1);
  // Long before, elsewhere, after the decision, or the round's own victims leaving: judged.
  in.departures = {{"default/z", "n1", kT0 - absl::Seconds(3)},
                   {"default/z", "n2", kT0},
                   {"default/z", "n1", kT0 + absl::Milliseconds(800)},
                   {"default/a1", "n1", kT0 + absl::Milliseconds(100)}};
  EXPECT_EQ(JudgePreemptions(in).violations.size(), 1u);

  // "early" preempted on n1 a second before and was not bound yet: its nomination holds part
  // of the node in the scheduler's view.
  Recorded two;
  Evict(two, {"x"}, "early", Full(), -absl::Seconds(1));
  Evict(two, {"a1", "b1"}, "hi", Full());
  in = Input(two, {Asking("hi", "1", "12000"), Asking("early", "1", "4000")});
  in.pods["default/early"].bound_at = kT0 + absl::Seconds(3);
  f = JudgePreemptions(in);
  EXPECT_EQ(f.unjudged_nominated, 1);
  EXPECT_EQ(f.preemptions, 2);
  EXPECT_EQ(f.victims, 3);
  // Bound before "hi"'s evictions: no nomination left, "hi" is judged.
  in.pods["default/early"].bound_at = kT0 - absl::Milliseconds(500);
  EXPECT_EQ(JudgePreemptions(in).unjudged_nominated, 0);
}

TEST(PreemptionOracleTest, EvictionsAreGroupedIntoRoundsAndAttributed) {
  Recorded r;
  Evict(r, {"b1"}, "hi", Full());
  Evict(r, {"b2"}, "hi",
        {Holder("a1", "GPU-a", 8000), Holder("a2", "GPU-a", 8000), Holder("b2", "GPU-b", 9000)},
        absl::Seconds(30));
  r.evictions.push_back({.ns = "default",
                         .name = "lost",
                         .uid = "uid-lost",
                         .node = "n1",
                         .at = kT0,
                         .node_pods = {}});
  r.events.push_back({.victim_uid = "uid-far", .node = "n2", .preemptor = "default/hi"});
  r.evictions.push_back(
      {.ns = "default", .name = "far", .uid = "uid-far", .node = "n1", .at = kT0, .node_pods = {}});
  PreemptionInput in = Input(r, {Asking("hi", "1", "12000")});
  in.pods["default/hi"].bound_at = kT0 + absl::Seconds(40);
  const PreemptionFindings f = JudgePreemptions(in);
  EXPECT_EQ(f.preemptions, 2);
  EXPECT_EQ(f.victims, 3);
  EXPECT_EQ(f.unattributed, 1);
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_THAT(f.violations[0].what,
              HasSubstr("default/far on n1 was evicted to free a share on n2: it cannot help"));
}

TEST(PreemptionOracleTest, EvictingForAPodBoundAlreadyIsAViolation) {
  Recorded r;
  Evict(r, {"b1"}, "hi", Full());
  PreemptionInput in = Input(r, {Asking("hi", "1", "12000")});
  in.pods["default/hi"].bound_at = kT0 - absl::Seconds(5);
  PreemptionFindings f = JudgePreemptions(in);
  ASSERT_EQ(f.violations.size(), 1u);
  EXPECT_THAT(f.violations[0].what, HasSubstr("was evicted for default/hi, bound to n1 5s before"));
  in.pods["default/hi"].bound_at = kT0 - absl::Milliseconds(200);  // a race: not judged
  f = JudgePreemptions(in);
  EXPECT_TRUE(f.violations.empty());
  EXPECT_EQ(f.unjudged_changed, 1);
}

TEST(PreemptionOracleTest, ParsesApisimsRecordsAndTesserasEvents) {
  absl::StatusOr<std::vector<EvictionRecord>> e = ParseEvictions(
      R"({"evictions":[{"namespace":"default","name":"v","uid":"u1","node":"n1",)"
      R"("at":"2026-12-07T22:40:01.123456Z","resourceVersion":"7","nodePods":[)"
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"v","namespace":"default",)"
      R"("uid":"u1"},"spec":{"nodeName":"n1","priority":5,"containers":[{"name":"c"}]}}]}]})");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 1u);
  EXPECT_EQ((*e)[0].node, "n1");
  EXPECT_EQ((*e)[0].at, absl::FromUnixMicros(1796683201123456));
  ASSERT_EQ((*e)[0].node_pods.size(), 1u);
  EXPECT_EQ((*e)[0].node_pods[0].priority, 5);
  EXPECT_FALSE(ParseEvictions("[]").ok());
  EXPECT_FALSE(ParseEvictions(R"({"evictions":[{"at":"yesterday","nodePods":[]}]})").ok());

  absl::StatusOr<std::vector<PreemptedEvent>> ev = ParsePreemptedEvents(
      R"({"kind":"EventList","items":[)"
      R"({"reason":"Preempted","involvedObject":{"uid":"u1"},"message":"Tessera evicted this )"
      R"x(pod to free a GPU share on node-3 for team/big (priority 1000)"},)x"
      R"({"reason":"Scheduled","involvedObject":{"uid":"u2"},"message":"x"},)"
      R"({"reason":"Preempted","involvedObject":{"uid":"u3"},"message":"by kube-scheduler"}]})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_EQ((*ev)[0].victim_uid, "u1");
  EXPECT_EQ((*ev)[0].node, "node-3");
  EXPECT_EQ((*ev)[0].preemptor, "team/big");
  EXPECT_FALSE(ParsePreemptedEvents("{}").ok());
}

}  // namespace
}  // namespace tessera::sim

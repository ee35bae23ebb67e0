// SelfPreemptor: kube-scheduler's node order (PickNode), and preemption without kube-scheduler's
// verb against apisim — the refusal settles, the cheapest victim is evicted through the Eviction
// API, its budget is respected and the freed share is nominated for the preemptor.
#include "tessera/extender/self_preempt.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/store.h"
#include "tessera/extender/disruption_budgets.h"
#include "tessera/extender/scheduler_test_fixture.h"

namespace tessera::extender {
namespace {

using ::testing::IsEmpty;
using ::testing::Optional;

cycle::PotentialVictim V(std::string name, int32_t priority, int64_t start) {
  return {.uid = "u-" + name,
          .ns = "ml",
          .name = std::move(name),
          .priority = priority,
          .start_unix = start};
}

TEST(PickNodeTest, KubeSchedulersOrder) {
  EXPECT_EQ(PickNode({}), std::nullopt);
  // Fewest budget violations first, even against more and higher victims.
  EXPECT_THAT(PickNode({{"a", {V("x", 1, 0)}, 1}, {"b", {V("y", 9, 0), V("z", 9, 0)}, 0}}),
              Optional(1u));
  // Then the lowest highest priority.
  EXPECT_THAT(PickNode({{"a", {V("x", 5, 0)}, 0}, {"b", {V("y", 1, 0), V("z", 2, 0)}, 0}}),
              Optional(1u));
  // Then the lowest sum of priorities (each offset by 2^31: fewer victims weigh less).
  EXPECT_THAT(PickNode({{"a", {V("x", 5, 0), V("w", 5, 0)}, 0}, {"b", {V("y", 5, 0)}, 0}}),
              Optional(1u));
  EXPECT_THAT(
      PickNode({{"a", {V("x", 5, 0), V("w", 3, 0)}, 0}, {"b", {V("y", 5, 0), V("z", 1, 0)}, 0}}),
      Optional(1u));
  // Then the latest start among the most important victims (the least work lost).
  EXPECT_THAT(PickNode({{"a", {V("x", 5, 100)}, 0}, {"b", {V("y", 5, 200)}, 0}}), Optional(1u));
  // All equal: the first.
  EXPECT_THAT(PickNode({{"a", {V("x", 5, 100)}, 0}, {"b", {V("y", 5, 100)}, 0}}), Optional(0u));
}

class SelfPreemptTest : public SchedulerTest {
 protected:
  // n1: one 8000 MiB card; low-old and low-young (priority 10, an hour apart) hold 4000 each.
  void SetUp() override {
    SchedulerTest::SetUp();
    AddNode("n1", {{"GPU-a", 10, 8000}});
    Low("low-old", "2026-12-07T10:00:00Z");
    Low("low-young", "2026-12-07T11:00:00Z");
    options_.refused = [this](const kube::Pod& pod, std::vector<std::string> nodes) {
      self_->Refused(pod, std::move(nodes));
    };
    PodLookup lookup = [this](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
      absl::StatusOr<kube::Pod> pod = env_.client()->GetPod("default", std::string(name));
      return pod.ok() ? std::optional<kube::Pod>(*pod) : std::nullopt;
    };
    Make(lookup);
    preemptor_ = std::make_unique<Preemptor>(
        Preemptor::Deps{.ledger = &ledger_,
                        .lookup = lookup,
                        .vendor = vendor_.get(),
                        .config = {},
                        .budget_violations = [this](std::string_view node,
                                                    const std::vector<const kube::Pod*>& pods) {
                          return BudgetViolations(env_.client(), node, pods);
                        }});
    self_ = std::make_unique<SelfPreemptor>(SelfPreemptor::Options{},
                                            SelfPreemptor::Deps{.preemptor = preemptor_.get(),
                                                                .scheduler = scheduler_.get(),
                                                                .client = env_.client(),
                                                                .clock = &clock_,
                                                                .lookup = lookup});
  }
  void Low(const std::string& name, const std::string& started) {
    nlohmann::json pod = nlohmann::json::parse(PodWithPriority(name, 4000, 10));
    pod["metadata"]["labels"] = {{"app", name}};
    pod["metadata"]["annotations"] = {{"hami.io/vgpu-node", "n1"},
                                      {"hami.io/vgpu-devices-allocated", "GPU-a,NVIDIA,4000,0:;"}};
    pod["spec"]["nodeName"] = "n1";
    pod["status"] = {{"phase", "Running"}, {"startTime", started}};
    env_.Create("pods", "default", pod.dump());
    ledger::PodAllocation held{.uid = Pod(name).meta.uid,
                               .ns = "default",
                               .name = name,
                               .node = "n1",
                               .bound_node = "n1",
                               .devices = {{{"GPU-a", "NVIDIA", 4000, 0}}}};
    ASSERT_TRUE(ledger_.Apply(held).ok());
  }
  static std::string PodWithPriority(const std::string& name, int mem, int priority,
                                     bool never = false) {
    nlohmann::json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"schedulerName", "hami-scheduler"},
          {"priority", priority},
          {"containers",
           {{{"name", "c"},
             {"image", "busybox"},
             {"resources",
              {{"limits",
                {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", std::to_string(mem)}}}}}}}}}}};
    if (never) {
      pod["spec"]["preemptionPolicy"] = "Never";
    }
    return pod.dump();
  }
  void Pending(const std::string& name, int mem, int priority, bool never = false) {
    env_.Create("pods", "default", PodWithPriority(name, mem, priority, never));
  }
  bool Deleting(const std::string& name) { return Pod(name).Deleting(); }
  // The pod's tessera.io/verdict as the API server stores it (the client keeps only HAMi's
  // annotations).
  std::string StoredVerdict(const std::string& name) {
    absl::StatusOr<std::string> raw =
        env_.store().Get(*apisim::FindResource("", "v1", "pods"), "default", name);
    const nlohmann::json doc = nlohmann::json::parse(raw.ok() ? *raw : "{}");
    return doc.value("/metadata/annotations"_json_pointer, nlohmann::json::object())
        .value(std::string(device::kVerdictAnnotation), "");
  }
  // A PodDisruptionBudget over app=`app` allowing `allowed` disruptions.
  void Budget(const std::string& app, int allowed) {
    const nlohmann::json pdb = {
        {"apiVersion", "policy/v1"},
        {"kind", "PodDisruptionBudget"},
        {"metadata", {{"name", app}, {"namespace", "default"}}},
        {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", app}}}}}}},
        {"status", {{"disruptionsAllowed", allowed}}}};
    ASSERT_TRUE(env_.store()
                    .Create(*apisim::FindResource("policy", "v1", "poddisruptionbudgets"),
                            "default", pdb.dump())
                    .ok());
  }

  std::unique_ptr<Preemptor> preemptor_;
  std::unique_ptr<SelfPreemptor> self_;
};

TEST_F(SelfPreemptTest, ARefusedPodOfHigherPriorityEvictsTheYoungerVictimAndHoldsTheShare) {
  Pending("high", 4000, 1000);
  EXPECT_THAT(*scheduler_->Filter(Args("high", {"n1"})).node_names, IsEmpty());
  EXPECT_EQ(self_->tracked(), 1u);
  self_->Round();
  EXPECT_FALSE(Deleting("low-young")) << "evicted before the refusal settled";
  clock_.Advance(absl::Seconds(5));
  self_->Round();
  EXPECT_TRUE(Deleting("low-young"));
  EXPECT_FALSE(Deleting("low-old"));
  EXPECT_EQ(self_->counts().preempted, 1u);
  EXPECT_EQ(self_->counts().evicted, 1u);
  EXPECT_TRUE(scheduler_->IsNominated(Pod("high").meta.uid));
  EXPECT_EQ(self_->tracked(), 0u);

  // Refused again while the victim terminates: nobody else is evicted.
  EXPECT_THAT(*scheduler_->Filter(Args("high", {"n1"})).node_names, IsEmpty());
  clock_.Advance(absl::Seconds(5));
  self_->Round();
  EXPECT_FALSE(Deleting("low-old"));
  EXPECT_EQ(self_->counts().evicted, 1u);

  // The victim leaves: a smaller pod cannot take its share; the preemptor can.
  ASSERT_TRUE(ledger_.Remove(Pod("low-young").meta.uid));
  Pending("small", 2000, 10);
  EXPECT_THAT(*scheduler_->Filter(Args("small", {"n1"})).node_names, IsEmpty());
  EXPECT_THAT(*scheduler_->Filter(Args("high", {"n1"})).node_names, ::testing::ElementsAre("n1"));

  bool victim_told = false;
  bool preemptor_told = false;
  for (const SeenEvent& e : Events()) {
    victim_told |= e.reason == "Preempted" && e.pod == "low-young" &&
                   e.message ==
                       "Tessera evicted this pod to free a GPU share on n1 for default/high "
                       "(priority 1000)";
    preemptor_told |= e.reason == "PreemptionVictimsEvicted" && e.pod == "high" &&
                      e.message == "to free a GPU share on n1, Tessera evicted: default/low-young";
  }
  EXPECT_TRUE(victim_told);
  EXPECT_TRUE(preemptor_told);
}

TEST_F(SelfPreemptTest, ABudgetThatForbidsTheCheaperVictimMakesTheOtherOneGo) {
  Budget("low-young", 0);
  Pending("high", 4000, 1000);
  scheduler_->Filter(Args("high", {"n1"}));
  clock_.Advance(absl::Seconds(5));
  self_->Round();
  EXPECT_FALSE(Deleting("low-young"));
  EXPECT_TRUE(Deleting("low-old"));
  EXPECT_EQ(self_->counts().refused, 0u);
}

TEST_F(SelfPreemptTest, NobodyIsEvictedForAPodThatCannotPreemptOrWouldNotFit) {
  Pending("never", 4000, 1000, /*never=*/true);
  Pending("unprioritised", 4000, 0);
  Pending("huge", 9000, 1000);
  for (const char* pod : {"never", "unprioritised", "huge"}) {
    scheduler_->Filter(Args(pod, {"n1"}));
  }
  EXPECT_EQ(self_->tracked(), 1u) << "only the pod that may preempt is remembered";
  clock_.Advance(absl::Seconds(5));
  self_->Round();
  EXPECT_FALSE(Deleting("low-young"));
  EXPECT_FALSE(Deleting("low-old"));
  EXPECT_EQ(self_->counts().hopeless, 1u);
  EXPECT_EQ(self_->counts().evicted, 0u);
  // The next refusal's verdict says why preemption did not help.
  scheduler_->Filter(Args("huge", {"n1"}));
  scheduler_->verdicts().Flush();
  EXPECT_THAT(
      StoredVerdict("huge"),
      ::testing::HasSubstr(
          R"("preemption":"no eviction of lower-priority pods frees a GPU share on 1 node")"));
}

TEST_F(SelfPreemptTest, ABudgetOnEveryVictimEvictsNobody) {
  Budget("low-young", 0);
  Budget("low-old", 0);
  Pending("high", 8000, 1000);
  scheduler_->Filter(Args("high", {"n1"}));
  clock_.Advance(absl::Seconds(5));
  self_->Round();
  EXPECT_FALSE(Deleting("low-young"));
  EXPECT_FALSE(Deleting("low-old"));
  EXPECT_EQ(self_->counts().evicted, 0u);
  EXPECT_FALSE(scheduler_->IsNominated(Pod("high").meta.uid));
  scheduler_->Filter(Args("high", {"n1"}));
  scheduler_->verdicts().Flush();
  EXPECT_THAT(StoredVerdict("high"),
              ::testing::HasSubstr("frees a GPU share on 1 node without breaking a "
                                   "PodDisruptionBudget"));
}

}  // namespace
}  // namespace tessera::extender

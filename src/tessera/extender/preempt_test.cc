#include "tessera/extender/preempt.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

PreemptArgs Args(kube::Pod pod, std::map<std::string, WireVictims> victims, bool meta = false) {
  PreemptArgs args;
  args.pod = std::move(pod);
  args.victims = std::move(victims);
  args.meta = meta;
  return args;
}

// n1: one 8000 MiB card; n2: one 8000 MiB card. The informer's pods are `pods_`.
class PreemptorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"}, 8000)).ok());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-2"}, 8000)).ok());
  }

  // Pod ml/<name> (uid u-<name>) running on `node` with `mem` MiB of its card (n1: GPU-1, n2:
  // GPU-2, any other: GPU-3).
  void Running(const std::string& name, const std::string& node, int32_t mem, int32_t priority,
               int64_t start) {
    kube::Pod pod;
    pod.meta.ns = "ml";
    pod.meta.name = name;
    pod.meta.uid = "u-" + name;
    pod.node_name = node;
    pod.phase = kube::PodPhase::kRunning;
    pod.priority = priority;
    pod.start_unix = start;
    pods_[pod.Key()] = pod;
    ledger::PodAllocation a;
    a.uid = pod.meta.uid;
    a.ns = "ml";
    a.name = name;
    a.node = node;
    a.bound_node = node;
    const std::string uuid = node == "n1" ? "GPU-1" : node == "n2" ? "GPU-2" : "GPU-3";
    a.devices = {{{uuid, "NVIDIA", mem, 0}}};
    ASSERT_TRUE(ledger_.Apply(a).ok());
  }

  // The preemptor ml/high asking one GPU of `mem` MiB ("" for none), stored in the informer.
  kube::Pod High(const std::string& mem, int32_t priority = 1000) {
    kube::Pod pod;
    pod.meta.ns = "ml";
    pod.meta.name = "high";
    pod.meta.uid = "u-high";
    pod.priority = priority;
    pod.containers.push_back(
        ::tessera::testing::GpuContainer("main", mem.empty() ? "" : "1", mem, ""));
    pods_[pod.Key()] = pod;
    return pod;
  }

  Preemptor Make() {
    return Preemptor(
        {.ledger = &ledger_,
         .lookup = [this](std::string_view ns, std::string_view name) -> std::optional<kube::Pod> {
           auto it = pods_.find(std::string(ns) + "/" + std::string(name));
           if (it == pods_.end()) {
             return std::nullopt;
           }
           return it->second;
         },
         .vendor = vendor_.get(),
         .config = {},
         .budget_violations = [this](std::string_view node,
                                     const std::vector<const kube::Pod*>& pods)
             -> absl::StatusOr<std::vector<bool>> {
           if (node == "broken") {
             return absl::PermissionDeniedError("poddisruptionbudgets is forbidden");
           }
           std::vector<bool> out;
           for (const kube::Pod* pod : pods) {
             order_.push_back(pod->meta.name);
             out.push_back(guarded_.contains(pod->meta.name));
           }
           return out;
         }});
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  std::map<std::string, kube::Pod> pods_;
  absl::flat_hash_set<std::string> guarded_;
  std::vector<std::string> order_;  // the pods the budget hook saw, in its order
};

TEST_F(PreemptorTest, AddsTheOneVictimTheDeviceShareNeeds) {
  // The case, as Kubernetes 1.38 asks: the node offered with no victims.
  Running("old", "n1", 4000, 0, 100);
  Running("young", "n1", 4000, 0, 200);
  PreemptArgs args = Args(High("4000"), {{"n1", {}}}, true);
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> r = Make().Preempt(args, &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->victims.size(), 1u);
  EXPECT_THAT(r->victims.at("n1").pod_uids, ElementsAre("u-young"));
  EXPECT_EQ(r->victims.at("n1").num_pdb_violations, 0);
  ASSERT_EQ(outcome.added.size(), 1u);
  EXPECT_EQ(VictimNames(outcome.added[0].second), "ml/young");
  EXPECT_THAT(outcome.dropped, IsEmpty());
  EXPECT_TRUE(outcome.stored);

  // A body whose pod the informer does not hold is decided on as sent, and said so.
  kube::Pod unknown = High("4000");
  pods_.erase("ml/high");
  ASSERT_TRUE(Make().Preempt(Args(unknown, {{"n1", {}}}), &outcome).ok());
  EXPECT_FALSE(outcome.stored);
}

TEST_F(PreemptorTest, KeepsKubeSchedulersVictimsAndAddsItsCount) {
  Running("old", "n1", 4000, 0, 100);
  Running("young", "n1", 4000, 0, 200);
  guarded_.insert("old");
  guarded_.insert("young");
  // kube-scheduler evicts a CPU-only pod (unknown to the ledger) with one violation already.
  PreemptArgs args = Args(High("4000"), {{"n1", {{"u-cpu"}, 1}}});
  absl::StatusOr<PreemptResult> r = Make().Preempt(args);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->victims.at("n1").pod_uids, ElementsAre("u-cpu", "u-young"));
  EXPECT_EQ(r->victims.at("n1").num_pdb_violations, 2);
  // The budget check saw the candidates most important first (equal priority: older first).
  EXPECT_THAT(order_, ElementsAre("old", "young"));
}

TEST_F(PreemptorTest, UnreadableBudgetsFailTheCallRatherThanGuess) {
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("broken", {"GPU-3"}, 8000)).ok());
  Running("low", "broken", 8000, 0, 100);
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(High("4000"), {{"broken", {}}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("PodDisruptionBudgets"));
}

TEST_F(PreemptorTest, APodBeingDeletedCountsAsGoneSoNobodyElseIsAdded) {
  // An earlier call's victim (young) is terminating: asked again, Tessera adds nobody, not the
  // older pod, even though the younger one still holds its share until it is gone.
  Running("old", "n1", 4000, 0, 100);
  Running("young", "n1", 4000, 0, 200);
  pods_["ml/young"].meta.deleting = true;
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(High("4000"), {{"n1", {}}}, true));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->victims.count("n1"), 1u);
  EXPECT_THAT(r->victims.at("n1").pod_uids, IsEmpty());
}

TEST_F(PreemptorTest, ANodeWhereNoEvictionMakesRoomIsLeftOut) {
  Running("same", "n1", 8000, 1000, 100);  // not lower than the preemptor
  Running("low", "n2", 8000, 0, 100);
  PreemptArgs args = Args(High("4000"), {{"n1", {}}, {"n2", {}}, {"ghost", {}}});
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> r = Make().Preempt(args, &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->victims.size(), 1u);
  EXPECT_THAT(r->victims.at("n2").pod_uids, ElementsAre("u-low"));
  EXPECT_THAT(outcome.dropped, ElementsAre("ghost", "n1"));
}

TEST_F(PreemptorTest, APodThatMayNotPreemptGetsNoNode) {
  Running("low", "n1", 8000, 0, 100);
  kube::Pod high = High("4000");
  high.preempt_never = true;
  pods_["ml/high"] = high;
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(high, {{"n1", {}}}), &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->victims.empty());
  EXPECT_TRUE(outcome.never);
  EXPECT_EQ(PreemptionNote(outcome, *r),
            "preemptionPolicy Never: it may not evict pods of lower priority");
}

// The verdict's note (Verdict::preemption): why an answer does not help, or nothing when it does.
TEST_F(PreemptorTest, TheNoteSaysOnHowManyNodesNoEvictionHelps) {
  Running("low", "n1", 4000, 0, 100);
  Running("peer", "n2", 8000, 1000, 100);  // not lower: never a victim
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> r =
      Make().Preempt(Args(High("8000"), {{"n2", {}}, {"ghost", {}}}), &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->victims.empty());
  EXPECT_EQ(PreemptionNote(outcome, *r),
            "no eviction of lower-priority pods frees a GPU share on 2 nodes");
  r = Make().Preempt(Args(High("8000"), {{"n1", {}}, {"n2", {}}}), &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->victims.size(), 1u);
  EXPECT_EQ(PreemptionNote(outcome, *r), "") << "an answer with victims carries no note";
}

TEST_F(PreemptorTest, APodAskingNoDeviceGetsKubeSchedulersOfferBack) {
  PreemptArgs args = Args(High(""), {{"n1", {{"u-a", "u-b"}, 3}}, {"n2", {}}});
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> r = Make().Preempt(args, &outcome);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->victims, args.victims);
  EXPECT_TRUE(outcome.pass_through);
}

TEST_F(PreemptorTest, TheStoredPodsPriorityCountsNotTheBodys) {
  Running("low", "n1", 8000, 10, 100);
  kube::Pod stored = High("4000", 5);  // the informer: priority 5
  kube::Pod forged = stored;
  forged.priority = 1000000;
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(forged, {{"n1", {}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->victims.empty());
}

TEST_F(PreemptorTest, APodRecreatedUnderItsNameIsNotAVictim) {
  Running("low", "n1", 8000, 0, 100);
  pods_["ml/low"].meta.uid = "u-low-2";  // the informer holds a newer pod of that name
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(High("4000"), {{"n1", {}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->victims.empty());
}

TEST_F(PreemptorTest, AMalformedRequestIsAnErrorNamingThePod) {
  kube::Pod bad = High("4000");
  bad.containers[0].limits.Set("nvidia.com/gpu", "lots");
  pods_["ml/high"] = bad;
  absl::StatusOr<PreemptResult> r = Make().Preempt(Args(bad, {{"n1", {}}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("ml/high"));
}

}  // namespace
}  // namespace tessera::extender

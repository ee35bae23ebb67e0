// The verdict of a filter that finds no node (verdict.h, verdict_writer.h): written when it
// changes, cleared once the pod is scheduled, only by the leader.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/projection.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_test_fixture.h"
#include "tessera/extender/verdict.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

// ---- verdicts (verdict.h, verdict_writer.h) ---------------------------------------------------

// The pod's verdict annotation as the API server stores it ("" when absent): the client's decoder
// keeps only hami.io/ and nvidia.com/ annotations.
std::string VerdictOn(testing::ApisimEnv& env, const std::string& pod) {
  absl::StatusOr<std::string> raw =
      env.store().Get(*apisim::FindResource("", "v1", "pods"), "default", pod);
  EXPECT_TRUE(raw.ok()) << raw.status();
  const nlohmann::json doc = nlohmann::json::parse(raw.ok() ? *raw : "{}");
  return doc.value("/metadata/annotations"_json_pointer, nlohmann::json::object())
      .value(std::string(device::kVerdictAnnotation), "");
}

std::vector<std::string> VerdictMessages(const std::vector<SeenEvent>& events) {
  std::vector<std::string> out;
  for (const SeenEvent& e : events) {
    if (e.reason == "FilteringFailed" && e.message.starts_with("{")) {
      out.push_back(e.message);
    }
  }
  return out;
}

// A pod the namespace quota refuses: its verdict names the quota, its limit, the usage and the
// ask, as the quota's own event does.
TEST_F(SchedulerTest, AVerdictNamesTheQuotaThatRefusedThePod) {
  accounting::QuotaBook book({});
  book.Upsert(GpuMemQuota("default", "gpu", "40000"));
  MakeWithQuotaOn36000MiBUsed(&book);
  FilterOutcome outcome;
  scheduler_->Filter(Args("p1", {"n1"}), &outcome);
  ASSERT_EQ(outcome.code, FilterCode::kNoFit);
  scheduler_->verdicts().Flush();
  absl::StatusOr<Verdict> v = DecodeVerdict(VerdictOn(env_, "p1"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->reason, "ResourceQuotaNotFit");
  EXPECT_EQ(v->quota, "namespace default: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked");
}

// kube-scheduler retries an unschedulable pod again and again: the verdict is written (patch
// and event) at the first filter and again only when the state behind it changes.
TEST_F(SchedulerTest, AVerdictIsWrittenOnlyWhenItChanges) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(9000));
  Scheduler& s = Make();
  for (int i = 0; i < 5; ++i) {
    FilterOutcome outcome;
    s.Filter(Args("p1", {"n1"}), &outcome);
    ASSERT_EQ(outcome.code, FilterCode::kNoFit);
  }
  s.verdicts().Flush();
  EXPECT_EQ(s.verdicts().counts().written, 1u) << s.verdicts().counts().failed;
  EXPECT_EQ(PodPatches("p1").size(), 1u);
  const std::string written(VerdictOn(env_, "p1"));
  absl::StatusOr<Verdict> v = DecodeVerdict(written);
  ASSERT_TRUE(v.ok()) << v.status() << " in " << written;
  EXPECT_EQ(v->reason, "CardInsufficientMemory");
  ASSERT_TRUE(v->nearest.has_value());
  EXPECT_EQ(v->nearest->node, "n1");
  EXPECT_EQ(v->nearest->need_mib, 9000);
  EXPECT_EQ(v->nearest->free_mib, 8000);
  EXPECT_THAT(VerdictMessages(Events()), ElementsAre(written));
  EXPECT_EQ(s.verdicts().counts().unchanged, 4u);

  // Another pod's decision now holds 1000 MiB of the device: a new verdict naming it.
  ASSERT_TRUE(ledger_
                  .Reserve("uid-other", "default", "other", "n1", {{{"GPU-a", "NVIDIA", 1000, 0}}},
                           kNow + absl::Minutes(5))
                  .ok());
  s.Filter(Args("p1", {"n1"}));
  s.Filter(Args("p1", {"n1"}));
  s.verdicts().Flush();
  EXPECT_EQ(PodPatches("p1").size(), 2u);
  v = DecodeVerdict(VerdictOn(env_, "p1"));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->nearest->held_by.size(), 1u);
  EXPECT_EQ(v->nearest->held_by[0].pod, "default/other");
  EXPECT_EQ(v->nearest->held_by[0].reserved_until, kNow + absl::Minutes(5));
  EXPECT_EQ(VerdictMessages(Events()).size(), 2u);
  EXPECT_THAT(s.verdicts().CountByReason(), ElementsAre(Pair("CardInsufficientMemory", 1)));
}

// Every verdict written requeues the pod in kube-scheduler (an update of a pending pod,
// docs/requeue.md), so a verdict that changed with nothing but kube-scheduler's choice of
// candidates would be rewritten at every retry, for ever. kube-scheduler lists the candidates in
// another order each time (a rotating start), sends a different subset in a large cluster, and
// filters a pod with a nominated node on that node alone first.
TEST_F(SchedulerTest, AVerdictIsNotRewrittenForTheOrderOrSubsetOfTheCandidates) {
  for (const char* node : {"n1", "n2", "n3"}) {
    AddNode(node, {{std::string("GPU-") + node}});
  }
  env_.CreatePod("p1", Limits(9000));
  Scheduler& s = Make();
  for (const std::vector<std::string>& nodes :
       std::vector<std::vector<std::string>>{{"n1", "n2", "n3"},
                                             {"n3", "n1", "n2"},
                                             {"n2", "n3", "n1"},
                                             {"n2"},  // the nominated node alone
                                             {"n1", "n2"},
                                             {"n3", "n1", "n2"}}) {
    FilterOutcome outcome;
    s.Filter(Args("p1", nodes), &outcome);
    ASSERT_EQ(outcome.code, FilterCode::kNoFit);
  }
  s.verdicts().Flush();
  EXPECT_EQ(s.verdicts().counts().written, 1u);
  // The nearest miss does not depend on the order: the first node by name among equals.
  absl::StatusOr<Verdict> v = DecodeVerdict(VerdictOn(env_, "p1"));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->nearest.has_value());
  EXPECT_EQ(v->nearest->node, "n1");
  // Another subset still tells the user something new once the last write is old enough.
  clock_.Advance(VerdictWriter::Options().refresh);
  s.Filter(Args("p1", {"n2"}));
  s.verdicts().Flush();
  EXPECT_EQ(s.verdicts().counts().written, 2u);
}

// The filter that finds the pod a node removes its verdict in the decision's own patch, and the
// pod is no longer counted as pending.
TEST_F(SchedulerTest, TheVerdictIsClearedWhenThePodIsScheduled) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(9000));
  Scheduler& s = Make();
  s.Filter(Args("p1", {"n1"}));
  s.verdicts().Flush();
  ASSERT_NE(VerdictOn(env_, "p1"), "");
  AddNode("n2", {{"GPU-b", 10, 16000}});
  FilterResult r = s.Filter(Args("p1", {"n1", "n2"}));
  ASSERT_TRUE(r.node_names.has_value());
  ASSERT_THAT(*r.node_names, ElementsAre("n2"));
  EXPECT_EQ(VerdictOn(env_, "p1"), "");
  EXPECT_EQ(s.verdicts().size(), 0u);
  EXPECT_EQ(s.Bind(BindFor("p1", "n2")).error, "");
  EXPECT_EQ(VerdictOn(env_, "p1"), "");
  EXPECT_THAT(s.verdicts().CountByReason(), IsEmpty());
}

// Only the leader writes: a follower's filter (its kube-scheduler may call it) leaves the pod
// alone.
TEST_F(SchedulerTest, AFollowerWritesNoVerdict) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(9000));
  options_.is_leader = [] { return false; };
  Scheduler& s = Make();
  FilterOutcome outcome;
  s.Filter(Args("p1", {"n1"}), &outcome);
  EXPECT_EQ(outcome.code, FilterCode::kNoFit);
  s.verdicts().Flush();
  EXPECT_THAT(PodPatches("p1"), IsEmpty());
  EXPECT_THAT(VerdictMessages(Events()), IsEmpty());
  EXPECT_EQ(s.verdicts().size(), 0u);
}

// A failed write is forgotten, so the pod's next filter writes it again.
TEST_F(SchedulerTest, AFailedVerdictWriteIsRetriedByTheNextFilter) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(9000));
  Scheduler& s = Make();
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "p1", 500, "InternalError");
  s.Filter(Args("p1", {"n1"}));
  s.verdicts().Flush();
  EXPECT_EQ(VerdictOn(env_, "p1"), "");
  EXPECT_EQ(s.verdicts().counts().failed, 1u);
  s.Filter(Args("p1", {"n1"}));
  s.verdicts().Flush();
  EXPECT_NE(VerdictOn(env_, "p1"), "");
}

}  // namespace
}  // namespace tessera::extender

// Scheduler::Filter against an in-process apisim over the real HTTP client, with the ledger filled
// directly (the informer wiring is not part of this library): the choice, the reasons, the
// namespace quota and the pending check.
#include <atomic>
#include <barrier>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/accounting/projection.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_test_fixture.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---- filter -------------------------------------------------------------------------------

TEST_F(SchedulerTest, FilterWritesHamiAnnotationsAndLabelInOnePatch) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000, 30));
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("p1", {"n1"}), &outcome);
  EXPECT_EQ(r.error, "");
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
  EXPECT_THAT(r.failed_nodes, IsEmpty());
  EXPECT_EQ(outcome.code, FilterCode::kFit);
  EXPECT_FALSE(outcome.simulated);
  EXPECT_THAT(outcome.failed_nodes, IsEmpty());

  ASSERT_EQ(PodPatches("p1").size(), 1u);
  const kube::Pod pod = Pod("p1");
  const std::string expected = vendor_->EncodeAllocation({{{"GPU-a", "NVIDIA", 1000, 30}}});
  EXPECT_EQ(expected, "GPU-a,NVIDIA,1000,30:;");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-node"), "n1");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-time"), "1767225600");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), expected);
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"), expected);
  EXPECT_EQ(pod.meta.labels.Get("hami.io/vgpu-node"), "n1");
  absl::StatusOr<device::PodDevices> decoded =
      device::DecodePodDevices(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, (device::PodDevices{{{"GPU-a", "NVIDIA", 1000, 30}}}));

  std::vector<ledger::Reservation> res = ledger_.Reservations();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].uid, pod.meta.uid);
  EXPECT_EQ(res[0].node, "n1");
  EXPECT_EQ(res[0].expires_at, kNow + absl::Minutes(5));
  EXPECT_EQ(res[0].devices, *decoded);

  std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "FilteringSucceed");
  EXPECT_EQ(events[0].type, "Normal");
  EXPECT_EQ(events[0].component, "hami-scheduler");
  EXPECT_EQ(events[0].pod, "p1");
  EXPECT_EQ(events[0].uid, pod.meta.uid);
  EXPECT_EQ(events[0].message, "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)");
  const EventRecorder::Counts sent = s.events().counts();
  EXPECT_EQ(sent.sent, 1u);
  EXPECT_EQ(sent.failed, 0u);
  EXPECT_EQ(sent.dropped, 0u);
}

TEST_F(SchedulerTest, FilterReadsOnlyTheCandidatesAndPicksPerPolicy) {
  AddNode("busy", {{"GPU-b"}});
  AddNode("idle", {{"GPU-i"}});
  AddNode("other", {{"GPU-o"}});
  ledger::PodAllocation running{
      "r1", "default", "r1", "busy", "busy", false, false, false, {{{"GPU-b", "NVIDIA", 2000, 0}}},
      0};
  ASSERT_TRUE(ledger_.Apply(running).ok());
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  // Binpack (the default) takes the busier node; "other" is not a candidate and never chosen.
  FilterResult r = s.Filter(Args("p1", {"idle", "busy"}));
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("busy"));
}

// Under binpack a burst's next pod goes where the last one went, whose bind then holds the node
// lock until the device plugin's Allocate: a bind there would be refused. The filter sends the
// pod to another fitting node while the first pod's decision or lock occupies its node, and
// back once the lock is released (busy_nodes.h).
TEST_F(SchedulerTest, FilterPrefersNodesNoOtherPodsBindOccupies) {
  AddNode("n1", {{"GPU-1"}});
  AddNode("n2", {{"GPU-2"}});
  for (const char* p : {"p1", "p2", "p3"}) {
    env_.CreatePod(p, Limits(1000));
  }
  // The node informer's copy, up to date (the store lags in the next test and in serve's).
  options_.node_lock = [this](std::string_view node) {
    absl::StatusOr<kube::Node> got = env_.client()->GetNode(node);
    EXPECT_TRUE(got.ok()) << got.status();
    BusyNodes::NodeView view;
    if (got.ok()) {
      view.lock = got->meta.annotations.Get(device::kNodeLockAnnotation);
      view.resource_version = got->meta.resource_version;
    }
    return view;
  };
  Scheduler& s = Make();
  const std::vector<std::string> both = {"n1", "n2"};
  ASSERT_THAT(*s.Filter(Args("p1", both)).node_names, ElementsAre("n1"));  // tie: name order
  // p1's decision, not yet bound, occupies n1.
  EXPECT_THAT(*s.Filter(Args("p2", both)).node_names, ElementsAre("n2"));
  // Bound: its lock occupies n1 until the plugin releases it.
  ASSERT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  ASSERT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_THAT(*s.Filter(Args("p3", both)).node_names, ElementsAre("n1"))
      << "both occupied (p1's lock, p2's decision): binpack's choice";
  EXPECT_THAT(*s.Filter(Args("p2", both)).node_names, ElementsAre("n2"))
      << "p3's decision and p1's lock occupy n1";
  ASSERT_THAT(*s.Filter(Args("p3", both)).node_names, ElementsAre("n1"));
  ClearLock("n1");  // the device plugin's Allocate released p1's lock
  ASSERT_EQ(s.Bind(BindFor("p3", "n1")).error, "");
  ClearLock("n1");  // ... and p3's
  EXPECT_THAT(*s.Filter(Args("p2", both)).node_names, ElementsAre("n1"))
      << "nothing occupies n1 now: binpack's busier node";
}

// Under load the node's watch event with a bind's lock arrives after the bind's reply: until the
// informer's copy is as new as the lock write, the node stays busy.
TEST_F(SchedulerTest, ANodeBoundToStaysBusyUntilTheInformersCopyHasCaughtUp) {
  AddNode("n1", {{"GPU-1"}});
  AddNode("n2", {{"GPU-2"}});
  env_.CreatePod("p1", Limits(1000));
  env_.CreatePod("p2", Limits(1000));
  const kube::Node before = *env_.client()->GetNode("n1");  // the informer's copy, frozen
  std::atomic<bool> caught_up{false};
  options_.node_lock = [&](std::string_view node) {
    kube::Node copy = caught_up ? *env_.client()->GetNode(node) : before;
    return BusyNodes::NodeView{
        .lock = std::string(copy.meta.annotations.Get(device::kNodeLockAnnotation)),
        .resource_version = copy.meta.resource_version};
  };
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1", "n2"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  ClearLock("n1");  // the plugin was quick
  EXPECT_THAT(*s.Filter(Args("p2", {"n1", "n2"})).node_names, ElementsAre("n2"))
      << "the copy predates p1's lock";
  caught_up = true;
  EXPECT_THAT(*s.Filter(Args("p2", {"n1", "n2"})).node_names, ElementsAre("n1"));
}

TEST_F(SchedulerTest, WithoutAvoidBusyNodesTheChoiceIsTheNodePolicysAlone) {
  AddNode("n1", {{"GPU-1"}});
  AddNode("n2", {{"GPU-2"}});
  env_.CreatePod("p1", Limits(1000));
  env_.CreatePod("p2", Limits(1000));
  options_.avoid_busy_nodes = false;
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1", "n2"})).node_names, ElementsAre("n1"));
  EXPECT_THAT(*s.Filter(Args("p2", {"n1", "n2"})).node_names, ElementsAre("n1"));
}

TEST_F(SchedulerTest, NoFitReturnsFailedNodesWithHamiReasons) {
  options_.verdicts = false;  // HAMi's events alone (the verdict's: the Verdict tests)
  AddNode("n1", {{"GPU-a"}});
  env_.CreateNode("n2", "{}");  // no registration: not in the ledger
  env_.CreatePod("p1", Limits(20000));
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("p1", {"n1", "n2"}), &outcome);
  EXPECT_EQ(r.error, "");
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, IsEmpty());
  EXPECT_EQ(r.failed_nodes,
            (std::map<std::string, std::string>{{"n1", "1/1 CardInsufficientMemory"},
                                                {"n2", "node unregistered"}}));
  EXPECT_THAT(PodPatches("p1"), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  std::vector<std::string> messages;
  for (const SeenEvent& e : Events()) {
    EXPECT_EQ(e.reason, "FilteringFailed");
    EXPECT_EQ(e.type, "Warning");
    messages.push_back(e.message);
  }
  EXPECT_THAT(messages, UnorderedElementsAre("1 nodes CardInsufficientMemory(n1)",
                                             "1 nodes node unregistered(n2)"));
  // The same reasons, typed: what serve's decisions metric counts.
  EXPECT_EQ(outcome.code, FilterCode::kNoFit);
  ASSERT_EQ(outcome.failed_nodes.size(), 2u);
  EXPECT_EQ(outcome.failed_nodes[0].node, "n1");
  EXPECT_EQ(outcome.failed_nodes[0].failure, NodeFailure::kDevices);
  ASSERT_EQ(outcome.failed_nodes[0].parts.size(), 1u);
  EXPECT_EQ(outcome.failed_nodes[0].parts[0],
            (schedule::ReasonPart{schedule::Reason::kCardInsufficientMemory, 1, 1}));
  EXPECT_EQ(outcome.failed_nodes[1].node, "n2");
  EXPECT_EQ(outcome.failed_nodes[1].failure, NodeFailure::kUnregistered);
  EXPECT_THAT(outcome.failed_nodes[1].parts, IsEmpty());
  EXPECT_EQ(NodeFailureLabel(outcome.failed_nodes[1].failure), "node unregistered");
}

// FailedNodes is keyed by node, so a candidate named twice fails once; the typed list (what
// serve's decisions metric counts) agrees with it.
TEST_F(SchedulerTest, ACandidateNamedTwiceFailsOnce) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreateNode("n2", "{}");
  env_.CreatePod("p1", Limits(20000));
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("p1", {"n2", "n1", "n2"}), &outcome);
  EXPECT_EQ(r.failed_nodes.size(), 2u);
  EXPECT_EQ(outcome.code, FilterCode::kNoFit);
  ASSERT_EQ(outcome.failed_nodes.size(), 2u);
  EXPECT_EQ(outcome.failed_nodes[0].node, "n2");
  EXPECT_EQ(outcome.failed_nodes[0].failure, NodeFailure::kUnregistered);
  EXPECT_EQ(outcome.failed_nodes[1].node, "n1");
  EXPECT_EQ(outcome.failed_nodes[1].failure, NodeFailure::kDevices);
}

// HAMi #2958: a running pod whose allocation does not decode blocks its node; the filter's
// FailedNodes and its FilteringFailed event name the pod.
TEST_F(SchedulerTest, ANodeBlockedByAnUnreadableAllocationIsRefusedWithThePodNamed) {
  options_.verdicts = false;  // HAMi's events alone (the verdict's: the Verdict tests)
  AddNode("n1", {{"GPU-a"}});
  ledger::PodAllocation broken;
  broken.uid = "uid-broken";
  broken.ns = "ml";
  broken.name = "broken";
  broken.node = "n1";
  broken.bound_node = "n1";
  broken.unreadable = true;
  ASSERT_TRUE(ledger_.Apply(broken).ok());
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("p1", {"n1"}), &outcome);
  EXPECT_EQ(r.error, "");
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, IsEmpty());
  EXPECT_EQ(r.failed_nodes,
            (std::map<std::string, std::string>{
                {"n1", "node has an allocation Tessera cannot read (pod ml/broken)"}}));
  std::vector<std::string> messages;
  for (const SeenEvent& e : Events()) {
    EXPECT_EQ(e.reason, "FilteringFailed");
    messages.push_back(e.message);
  }
  EXPECT_THAT(messages, ElementsAre("1 nodes node has an allocation Tessera cannot read (pod "
                                    "ml/broken)(n1)"));
  // The typed reason (a metric label) does not grow with every blocking pod.
  EXPECT_EQ(outcome.code, FilterCode::kNoFit);
  ASSERT_EQ(outcome.failed_nodes.size(), 1u);
  EXPECT_EQ(outcome.failed_nodes[0].failure, NodeFailure::kBlocked);
  EXPECT_EQ(NodeFailureLabel(outcome.failed_nodes[0].failure),
            "node has an allocation Tessera cannot read");
  // Fixed (the record holds nothing unusual now): the node is offered again.
  broken.unreadable = false;
  ASSERT_TRUE(ledger_.Apply(broken).ok());
  r = s.Filter(Args("p1", {"n1"}));
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
}

// HAMi lists every fitting (or failing) node in the event; with hundreds of candidates that is
// kilobytes per pod. The list is cut to keep the message within the events.k8s.io note limit,
// and what was cut is counted.
TEST_F(SchedulerTest, EventNodeListsAreCutAtTheMessageLimitAndCounted) {
  options_.verdicts = false;  // HAMi's events alone (the verdict's: the Verdict tests)
  std::vector<std::string> nodes;
  for (int i = 0; i < 120; ++i) {
    nodes.push_back(fmt::format("node-{:03}", i));
    AddNode(nodes.back(), {{fmt::format("GPU-{}", i)}});
  }
  // A list of entries "<prefix><first>, <first+1>, ..., ... <n> more)": its entries, checked to be
  // the candidates in order from the first, and the count of those left out.
  auto parse = [&](const std::string& message, const std::string& prefix,
                   const std::string& separator, const std::string& suffix) {
    EXPECT_LE(message.size(), EventRecorder::kMessageLimit) << message;
    EXPECT_EQ(message.substr(0, prefix.size()), prefix) << message;
    const std::string tail = " more)";
    const size_t more = message.rfind("... ");
    if (more == std::string::npos || more < prefix.size() + separator.size() ||
        message.size() < more + 4 + tail.size()) {
      ADD_FAILURE() << "no \"... <n> more)\" in " << message;
      return std::make_pair(size_t{0}, size_t{0});
    }
    EXPECT_EQ(message.substr(message.size() - tail.size()), tail) << message;
    const size_t omitted =
        std::stoul(message.substr(more + 4, message.size() - more - 4 - tail.size()));
    std::vector<std::string> entries;
    const std::string list =
        message.substr(prefix.size(), more - separator.size() - prefix.size()) + separator;
    for (size_t at = 0; at < list.size();) {
      const size_t end = list.find(separator, at);
      entries.push_back(list.substr(at, end - at));
      at = end + separator.size();
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      EXPECT_EQ(entries[i], nodes[i] + suffix);
    }
    return std::make_pair(entries.size(), omitted);
  };

  env_.CreatePod("fits", Limits(1000));
  Scheduler& s = Make();
  FilterResult fit = s.Filter(Args("fits", nodes));
  ASSERT_TRUE(fit.node_names.has_value());
  ASSERT_EQ(fit.node_names->size(), 1u);
  std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  const auto [listed, omitted] =
      parse(events[0].message,
            fmt::format("find fit node({}), 0 nodes not fit, 120 nodes fit(", (*fit.node_names)[0]),
            ",", ":0.00");
  EXPECT_GT(listed, 50u);  // as many as fit: 13 bytes each in ~1,000
  EXPECT_EQ(listed + omitted, 120u);

  env_.CreatePod("big", Limits(20000));
  FilterResult none = s.Filter(Args("big", nodes));
  ASSERT_TRUE(none.node_names.has_value());
  EXPECT_THAT(*none.node_names, IsEmpty());
  events = Events();
  ASSERT_EQ(events.size(), 2u);
  const SeenEvent& failed = events[0].reason == "FilteringFailed" ? events[0] : events[1];
  EXPECT_EQ(failed.reason, "FilteringFailed");
  const auto [failed_listed, failed_omitted] =
      parse(failed.message, "120 nodes CardInsufficientMemory(", ", ", "");
  EXPECT_GT(failed_listed, 50u);
  EXPECT_EQ(failed_listed + failed_omitted, 120u);
}

// Any other message (an API error's text) is cut at the limit too, never inside a character.
TEST_F(SchedulerTest, LongEventMessagesAreCutAtACharacterBoundary) {
  AddNode("n1", {{"GPU-a"}});
  Scheduler& s = Make();
  // Two-byte characters after prefixes of both parities: one of the two cuts would otherwise
  // fall inside a character.
  std::string accents;
  for (int i = 0; i < 700; ++i) {
    accents += "\u00e9";
  }
  for (const std::string pod : {"pa", "pb"}) {
    env_.CreatePod(pod, Limits(1000));
    env_.faults()->Inject("PATCH", std::string(kPodPath) + pod, 500,
                          (pod == "pb" ? "x" : "") + accents);
    FilterResult r = s.Filter(Args(pod, {"n1"}));
    EXPECT_THAT(r.error, HasSubstr("\u00e9\u00e9"));
  }
  std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 2u);
  for (const SeenEvent& e : events) {
    EXPECT_EQ(e.reason, "FilteringFailed");
    EXPECT_LE(e.message.size(), EventRecorder::kMessageLimit);
    EXPECT_GE(e.message.size(), EventRecorder::kMessageLimit - 4);
    ASSERT_TRUE(absl::EndsWith(e.message, "\u00e9..."));
  }
}

TEST_F(SchedulerTest, PodsWithoutManagedDevicesPassThroughUntouched) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("plain", R"({"cpu":"1"})");
  const kube::Pod before = Pod("plain");
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("plain", {"n1", "n2"}), &outcome);
  EXPECT_EQ(outcome.code, FilterCode::kPassThrough);  // what serve's decisions metric reports
  EXPECT_EQ(r.error, "");
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1", "n2"));
  EXPECT_THAT(r.failed_nodes, IsEmpty());
  EXPECT_THAT(PodPatches("plain"), IsEmpty());
  EXPECT_EQ(Pod("plain"), before);
  EXPECT_THAT(Events(), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

// Under HAMi's chart kube-scheduler also sends pods asking for other vendors' devices; they are
// refused with the vendor named, never passed to a node with their devices unaccounted.
TEST_F(SchedulerTest, PodsAskingForAnotherVendorsDevicesAreRefusedNamingTheVendor) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("mlu", R"({"cpu":"1","cambricon.com/vmlu":"1"})");
  Scheduler& s = Make();
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("mlu", {"n1"}), &outcome);
  EXPECT_EQ(outcome.code, FilterCode::kError);
  EXPECT_THAT(r.error, HasSubstr("cambricon.com/vmlu"));
  EXPECT_THAT(r.error, HasSubstr("Cambricon MLU devices are not supported"));
  EXPECT_FALSE(r.node_names.has_value() && !r.node_names->empty());
  EXPECT_THAT(PodPatches("mlu"), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "FilteringFailed");
  EXPECT_THAT(events[0].message, HasSubstr("Cambricon MLU"));
}

TEST_F(SchedulerTest, FilteringAgainReleasesTheEarlierReservation) {
  AddNode("n1", {{"GPU-a", /*count=*/1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  env_.CreatePod("p2", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  // The whole GPU is reserved for p1; p1 itself still fits (its old reservation goes first).
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  // ...and nobody else does.
  FilterResult r2 = s.Filter(Args("p2", {"n1"}));
  EXPECT_THAT(*r2.node_names, IsEmpty());
  EXPECT_THAT(r2.failed_nodes.at("n1"), HasSubstr("CardTimeSlicingExhausted"));
}

TEST_F(SchedulerTest, ConcurrentFiltersNeverOverCommit) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  constexpr int kPods = 16;
  std::vector<FilterArgs> args;
  for (int i = 0; i < kPods; ++i) {
    env_.CreatePod(fmt::format("p{}", i), Limits(1000));
    args.push_back(Args(fmt::format("p{}", i), {"n1"}));
  }
  Scheduler& s = Make();
  std::atomic<int> fits{0};
  std::atomic<int> no_fits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kPods; i += 4) {
        FilterOutcome outcome;
        FilterResult r = s.Filter(args[static_cast<size_t>(i)], &outcome);
        EXPECT_EQ(r.error, "");
        if (r.node_names && !r.node_names->empty()) {
          ++fits;
        }
        if (outcome.code == FilterCode::kNoFit) {
          ++no_fits;
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(fits.load(), 8);
  EXPECT_EQ(ledger_.Reservations().size(), 8u);
  auto snap = ledger_.Snapshot({"n1"});
  ASSERT_TRUE(snap[0].has_value());
  EXPECT_EQ(snap[0]->usage[0].usedmem, 8000);
  EXPECT_EQ(no_fits.load(), 8);
}

// ---- namespace quota (docs/quota.md) ------------------------------------------------------

TEST_F(SchedulerTest, FilterRefusesWhatTheNamespaceQuotaCannotTakeAndNamesIt) {
  accounting::QuotaBook book({});
  book.Upsert(GpuMemQuota("default", "gpu", "40000"));
  options_.verdicts = false;  // HAMi's events and the quota's (the verdict's: the Verdict tests)
  MakeWithQuotaOn36000MiBUsed(&book);
  FilterOutcome outcome;
  FilterResult r = scheduler_->Filter(Args("p1", {"n1"}), &outcome);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(outcome.code, FilterCode::kNoFit);
  EXPECT_EQ(r.failed_nodes.at("n1"), "1/1 ResourceQuotaNotFit");  // HAMi's reason text
  EXPECT_EQ(outcome.quota,
            "namespace default: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked");
  std::vector<std::string> messages;
  for (const SeenEvent& e : Events()) {
    messages.push_back(e.message);
  }
  EXPECT_THAT(messages,
              UnorderedElementsAre(
                  "1 nodes ResourceQuotaNotFit(n1)",
                  "namespace default: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked"));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_THAT(PodPatches("p1"), IsEmpty());

  // An edit takes effect at the next filter, without a restart.
  book.Upsert(GpuMemQuota("default", "gpu", "44000"));
  r = scheduler_->Filter(Args("p1", {"n1"}), &outcome);
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
  EXPECT_EQ(ledger_.UsageOf("default").usedmem, 44000);
  // A second pod no longer fits; deleting the quota makes the namespace unlimited.
  env_.CreatePod("p2", Limits(1000));
  EXPECT_EQ(scheduler_->Filter(Args("p2", {"n1"})).failed_nodes.at("n1"),
            "1/1 ResourceQuotaNotFit");
  book.Remove("default", "gpu");
  r = scheduler_->Filter(Args("p2", {"n1"}));
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
}

TEST_F(SchedulerTest, ConcurrentFiltersInANamespaceCannotTogetherPassItsQuota) {
  // 10000 MiB of quota, 24 pods of 3000 MiB filtered from 4 threads released together, room on
  // the devices for all of them: exactly 3 are given a node in all, whatever the interleaving.
  constexpr int kThreads = 4;
  constexpr int kRounds = 6;
  std::vector<Gpu> gpus;
  for (int g = 0; g < 8; ++g) {
    gpus.push_back({fmt::format("GPU-{}", g), 10, 48000});
  }
  AddNode("n1", gpus);
  accounting::QuotaBook book({});
  book.Upsert(GpuMemQuota("default", "gpu", "10000"));
  std::vector<std::vector<FilterArgs>> args(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      const std::string name = fmt::format("q{}-{}", r, t);
      env_.CreatePod(name, Limits(3000));
      args[static_cast<size_t>(r)].push_back(Args(name, {"n1"}));
    }
  }
  scheduler_ = std::make_unique<Scheduler>(
      options_, Scheduler::Deps{&ledger_, env_.client(), &clock_, nullptr, &book});
  std::barrier sync(kThreads);
  std::atomic<int> fits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        sync.arrive_and_wait();
        FilterResult res = scheduler_->Filter(args[static_cast<size_t>(r)][static_cast<size_t>(t)]);
        EXPECT_EQ(res.error, "");
        if (res.node_names && !res.node_names->empty()) {
          ++fits;
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(fits.load(), 3);
  EXPECT_EQ(ledger_.UsageOf("default").usedmem, 9000);
  EXPECT_EQ(ledger_.Reservations().size(), 3u);
}

// HAMi #1896: quota usage leaked when the filter's annotation patch failed. Here the failed
// patch ends the reservation, and quota usage is the ledger's: nothing is left to leak.
TEST_F(SchedulerTest, AFailedFilterPatchLeavesNoQuotaUsed) {
  AddNode("n1", {{"GPU-a", 10, 48000}});
  accounting::QuotaBook book({});
  book.Upsert(GpuMemQuota("default", "gpu", "8000"));
  options_.write_behind = true;
  scheduler_ = std::make_unique<Scheduler>(
      options_, Scheduler::Deps{&ledger_, env_.client(), &clock_, nullptr, &book});
  env_.CreatePod("p1", Limits(8000));
  env_.CreatePod("p2", Limits(8000));
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "p1", 500, "InternalError");
  ASSERT_THAT(*scheduler_->Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  // The bind waits for the patch, which failed: the reservation (and the quota it used) ends.
  EXPECT_THAT(scheduler_->Bind(BindFor("p1", "n1")).error, HasSubstr("patch pod default/p1"));
  EXPECT_EQ(ledger_.UsageOf("default"), ledger::NamespaceUsage{});
  FilterResult r = scheduler_->Filter(Args("p2", {"n1"}));
  ASSERT_TRUE(r.node_names.has_value());
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
}

// HAMi #3027: a refit's temporary remove/add of a pod's usage raced a delete handler, the pod
// was subtracted twice and other pods' usage in the namespace vanished, so the quota admitted
// too much. Here a pod filtered again (its reservation released and re-made) races its own
// deletion and a replayed delete (tombstone); whatever the interleaving, the namespace holds
// exactly what its records and reservations say, and the running pod's usage stays counted.
TEST_F(SchedulerTest, ARefilterRacingADeleteNeverErasesAnotherPodsQuotaUsage) {
  AddNode("n1", {{"GPU-a", 10, 48000}});
  ledger::PodAllocation running{
      "r1", "default", "r1", "n1", "n1", false, false, false, {{{"GPU-a", "NVIDIA", 6000, 0}}}, 0};
  ASSERT_TRUE(ledger_.Apply(running).ok());
  accounting::QuotaBook book({});
  book.Upsert(GpuMemQuota("default", "gpu", "10000"));
  scheduler_ = std::make_unique<Scheduler>(
      options_, Scheduler::Deps{&ledger_, env_.client(), &clock_, nullptr, &book});
  env_.CreatePod("racer", Limits(2000));
  env_.CreatePod("big", Limits(4001));
  for (int round = 0; round < 50; ++round) {
    const FilterArgs racer = Args("racer", {"n1"});
    std::barrier sync(2);
    std::thread filter([&] {
      sync.arrive_and_wait();
      scheduler_->Filter(racer);
    });
    std::thread deleter([&] {
      sync.arrive_and_wait();
      ledger_.Remove(racer.pod.meta.uid);  // DELETED
      ledger_.Remove(racer.pod.meta.uid);  // the same delete replayed as a tombstone
    });
    filter.join();
    deleter.join();
    const ledger::NamespaceUsage used = ledger_.UsageOf("default");
    const bool reserved = ledger_.HasReservation(racer.pod.meta.uid);
    ASSERT_EQ(used.usedmem, reserved ? 8000 : 6000) << "round " << round;
    // 6000 used: 4001 more is over the 10000 quota, whatever happened to the racer.
    ASSERT_EQ(scheduler_->Filter(Args("big", {"n1"})).failed_nodes.count("n1"), 1u)
        << "round " << round;
    ledger_.Remove(racer.pod.meta.uid);
  }
  EXPECT_EQ(ledger_.UsageOf("default").usedmem, 6000);
  EXPECT_EQ(ledger_.UsageOf("default").holders, 1);
}

TEST_F(SchedulerTest, SimultaneousFiltersForTheLastSlotHaveOneWinner) {
  // Each round: one node with room for one pod, four pods filtered at the same instant (a
  // barrier releases the threads together). 400 small candidate nodes (in the ledger only) make
  // each decision long enough that, without the decision lock, the threads would overlap.
  constexpr int kRounds = 25;
  constexpr int kThreads = 4;
  std::vector<std::string> small;
  for (int k = 0; k < 400; ++k) {
    std::vector<std::string> uuids;
    for (int g = 0; g < 4; ++g) {
      uuids.push_back(fmt::format("GPU-s{}-{}", k, g));
    }
    const std::string name = fmt::format("small-{}", k);
    auto node = testing::GpuNodeDevices(name, uuids, /*devmem=*/100, "NVIDIA-T4", /*count=*/10,
                                        /*devcore=*/100);
    ASSERT_TRUE(ledger_.SetNode(node).ok());
    small.push_back(name);
  }
  std::vector<std::vector<FilterArgs>> args(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    AddNode(fmt::format("n{}", r), {{fmt::format("GPU-{}", r), /*count=*/1, 8000}});
    std::vector<std::string> candidates = small;
    candidates.push_back(fmt::format("n{}", r));
    for (int t = 0; t < kThreads; ++t) {
      const std::string name = fmt::format("r{}-{}", r, t);
      env_.CreatePod(name, Limits(8000));
      args[static_cast<size_t>(r)].push_back(Args(name, candidates));
    }
  }
  Scheduler& s = Make();
  std::barrier sync(kThreads);
  std::vector<std::atomic<int>> wins(kRounds);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        sync.arrive_and_wait();
        FilterResult res = s.Filter(args[static_cast<size_t>(r)][static_cast<size_t>(t)]);
        EXPECT_EQ(res.error, "");
        if (res.node_names && !res.node_names->empty()) {
          ++wins[static_cast<size_t>(r)];
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_EQ(wins[static_cast<size_t>(r)].load(), 1) << "round " << r;
  }
  EXPECT_EQ(ledger_.Reservations().size(), static_cast<size_t>(kRounds));
}

TEST_F(SchedulerTest, FailedAnnotationPatchUndoesTheReservation) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "p1", 500, "InternalError");
  FilterOutcome outcome;
  FilterResult r = s.Filter(Args("p1", {"n1"}), &outcome);
  EXPECT_THAT(r.error, HasSubstr("patch pod default/p1 annotations"));
  EXPECT_FALSE(r.node_names.has_value());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_THAT(EventReasons(), ElementsAre("FilteringFailed"));
  EXPECT_EQ(outcome.code, FilterCode::kError);
}

TEST_F(SchedulerTest, NodesRequestIsAnsweredWithNodesAndNoSideEffects) {
  AddNode("small", {{"GPU-s", 10, 2000}});
  env_.CreatePod("p1", Limits(4000));
  Scheduler& s = Make();
  FilterArgs args;
  args.pod = Pod("p1");
  kube::Node small = *env_.client()->GetNode("small");
  // A template node the ledger does not know: decided on its own registration, unused.
  kube::Node tmpl;
  tmpl.meta.name = "template-1";
  tmpl.meta.annotations.Set("hami.io/node-nvidia-register", Register({{"GPU-t"}}));
  args.nodes = std::vector<WireNode>{{small, R"({"metadata":{"name":"small"}})"},
                                     {tmpl, R"({"metadata":{"name":"template-1"}})"}};
  FilterOutcome outcome;
  FilterResult r = s.Filter(args, &outcome);
  EXPECT_EQ(r.error, "");
  EXPECT_FALSE(r.node_names.has_value());
  ASSERT_TRUE(r.nodes.has_value());
  EXPECT_THAT(*r.nodes, ElementsAre(R"({"metadata":{"name":"template-1"}})"));
  EXPECT_THAT(PodPatches("p1"), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_THAT(Events(), IsEmpty());
  EXPECT_EQ(outcome.code, FilterCode::kFit);
  EXPECT_TRUE(outcome.simulated);
}

// ---- the pending check (docs/serve.md "Filter and bind") ---------------------------------------

// Issue #21: a /filter naming a running pod (with any uid) rewrote that pod's annotations by
// name; the ledger then saw it bound to a node its annotations no longer named, freed its GPU,
// and the next pod was placed on the same GPU.
TEST_F(SchedulerTest, AFilterNamingARunningPodChangesNothing) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  AddNode("n2", {{"GPU-b", 1, 8000}});
  env_.CreatePod("running", Limits(8000));
  env_.CreatePod("next", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("running", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(s.Bind(BindFor("running", "n1")).error, "");
  absl::StatusOr<ledger::PodAllocation> observed = accounting::ProjectPod(*vendor_, Pod("running"));
  ASSERT_TRUE(observed.ok());
  ASSERT_TRUE(ledger_.Apply(*observed).ok());
  const kube::Pod before = Pod("running");
  const size_t patches = PodPatches("running").size();

  // The forger's copy: unbound, asking for a little memory, with the real uid or another.
  kube::Pod forged = before;
  forged.node_name.clear();
  for (const std::string& uid : {before.meta.uid, std::string("forged-uid")}) {
    forged.meta.uid = uid;
    FilterArgs args;
    args.pod = forged;
    args.node_names = std::vector<std::string>{"n2"};
    FilterOutcome outcome;
    FilterResult r = s.Filter(args, &outcome);
    EXPECT_EQ(outcome.code, FilterCode::kError) << uid;
    EXPECT_THAT(r.error, uid == before.meta.uid ? HasSubstr("is already bound to node n1")
                                                : HasSubstr("has uid " + before.meta.uid))
        << uid;
  }
  // A request that says the pod is bound is refused without a look at the API server.
  forged.meta.uid = before.meta.uid;
  forged.node_name = "n1";
  FilterArgs bound_args;
  bound_args.pod = forged;
  bound_args.node_names = std::vector<std::string>{"n2"};
  EXPECT_THAT(s.Filter(bound_args).error, HasSubstr("already bound"));

  EXPECT_EQ(PodPatches("running").size(), patches);
  EXPECT_EQ(Pod("running"), before);
  // GPU-a is still held: the next pod goes to n2, not onto the running pod's memory.
  EXPECT_THAT(*s.Filter(Args("next", {"n1", "n2"})).node_names, ElementsAre("n2"));
}

// The second layer: a cache that still holds a deleted pod's copy lets the check pass, but the
// patch names the uid, so the pod that now has that name is not written.
TEST_F(SchedulerTest, TheFilterPatchNamesThePodsUid) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  kube::Pod ghost = Pod("p1");
  ghost.meta.uid = "uid-of-a-deleted-pod";
  Scheduler& s =
      Make([&](std::string_view, std::string_view) -> std::optional<kube::Pod> { return ghost; });
  FilterArgs args;
  args.pod = ghost;
  args.node_names = std::vector<std::string>{"n1"};
  FilterResult r = s.Filter(args);
  EXPECT_THAT(r.error, HasSubstr("metadata.uid"));
  ASSERT_EQ(PodPatches("p1").size(), 1u);
  EXPECT_THAT(PodPatches("p1")[0].body, HasSubstr(R"("uid":"uid-of-a-deleted-pod")"));
  EXPECT_FALSE(Pod("p1").meta.annotations.Contains(device::kVgpuNodeAnnotation));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

// kube-scheduler sends the pod in the request body, but any caller can: a body that claims less
// than the pod asks (here 1000 MiB instead of 6000) must not get the smaller reservation. The
// stored copy of the same uid decides, from the informer's cache when it holds the pod...
TEST_F(SchedulerTest, TheStoredPodsResourcesDecideNotTheRequestBodys) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  env_.CreatePod("p1", Limits(6000));
  env_.CreatePod("p2", Limits(4000));
  const kube::Pod stored = Pod("p1");
  Scheduler& s = Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    if (name == "p1") {
      return stored;
    }
    return std::nullopt;
  });
  FilterArgs forged = Args("p1", {"n1"});
  forged.pod.containers[0].limits.Set("nvidia.com/gpumem", "1000");
  FilterOutcome outcome;
  ASSERT_THAT(*s.Filter(forged, &outcome).node_names, ElementsAre("n1"));
  EXPECT_TRUE(outcome.stale_body);
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(ledger_.Reservations()[0].devices.at(0).at(0).usedmem, 6000);
  EXPECT_THAT(Annotation("p1", device::kDevicesToAllocateAnnotation), HasSubstr(",6000,"));
  // 2000 MiB are left: p2's 4000 do not fit.
  EXPECT_THAT(*s.Filter(Args("p2", {"n1"})).node_names, IsEmpty());
  // The body that agrees with the stored pod is not flagged.
  FilterOutcome honest;
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"}), &honest).node_names, ElementsAre("n1"));
  EXPECT_FALSE(honest.stale_body);
}

// ... and from the API server when the cache misses it.
TEST_F(SchedulerTest, WithoutACachedCopyTheApiServersPodDecides) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  env_.CreatePod("p1", Limits(6000));
  Scheduler& s = Make();
  FilterArgs forged = Args("p1", {"n1"});
  forged.pod.containers[0].limits.Set("nvidia.com/gpumem", "1000");
  FilterOutcome outcome;
  ASSERT_THAT(*s.Filter(forged, &outcome).node_names, ElementsAre("n1"));
  EXPECT_TRUE(outcome.stale_body);
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(ledger_.Reservations()[0].devices.at(0).at(0).usedmem, 6000);
}

// A body claiming no device at all does not pass the stored pod through with its reservation
// dropped: the stored pod asks for one, so it is filtered as such.
TEST_F(SchedulerTest, ABodyClaimingNoDeviceDoesNotPassAStoredGpuPodThrough) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  env_.CreatePod("p1", Limits(6000));
  const kube::Pod stored = Pod("p1");
  Scheduler& s =
      Make([&](std::string_view, std::string_view) -> std::optional<kube::Pod> { return stored; });
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  FilterArgs forged = Args("p1", {"n1", "n2"});
  forged.pod.containers[0].limits = {};
  FilterOutcome outcome;
  FilterResult r = s.Filter(forged, &outcome);
  EXPECT_EQ(outcome.code, FilterCode::kFit);
  EXPECT_TRUE(outcome.stale_body);
  EXPECT_THAT(*r.node_names, ElementsAre("n1"));
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(ledger_.Reservations()[0].devices.at(0).at(0).usedmem, 6000);
}

// A body whose uid no stored pod has (forged, or a pod deleted and created again under its
// name) is refused, naming both uids, and nothing is reserved or written.
TEST_F(SchedulerTest, ABodyWithAnUnknownUidIsRefused) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  env_.CreatePod("p1", Limits(6000));
  const kube::Pod stored = Pod("p1");
  Scheduler& s =
      Make([&](std::string_view, std::string_view) -> std::optional<kube::Pod> { return stored; });
  FilterArgs forged = Args("p1", {"n1"});
  forged.pod.meta.uid = "uid-nobody-has";
  FilterOutcome outcome;
  FilterResult r = s.Filter(forged, &outcome);
  EXPECT_EQ(outcome.code, FilterCode::kError);
  EXPECT_THAT(r.error, HasSubstr("not uid-nobody-has"));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_THAT(PodPatches("p1"), IsEmpty());
}

TEST_F(SchedulerTest, FilterRefusesPodsBeingDeletedOrFinished) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  FilterArgs args = Args("p1", {"n1"});
  args.pod.meta.deleting = true;
  EXPECT_THAT(s.Filter(args).error, HasSubstr("pod default/p1 is being deleted"));
  args = Args("p1", {"n1"});
  args.pod.phase = kube::PodPhase::kFailed;
  EXPECT_THAT(s.Filter(args).error, HasSubstr("pod default/p1 has finished (phase Failed)"));
  EXPECT_THAT(PodPatches("p1"), IsEmpty());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  // The API server's copy counts too: the pod is deleted while the request says it is pending.
  args = Args("p1", {"n1"});
  env_.Delete("pods", "default", "p1");
  EXPECT_THAT(s.Filter(args).error, HasSubstr("not found"));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

}  // namespace
}  // namespace tessera::extender

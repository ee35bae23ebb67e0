// EventRecorder against an in-process apisim over the real HTTP client.
#include "tessera/extender/event_recorder.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/testing/apisim_env.h"
#include "tessera/testing/gate_transport.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;

const absl::Time kNow = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z

struct Seen {
  std::string name, reason, message, type, component, kind, pod, uid;
};

class EventRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override { env_.Start(); }

  kube::ObjectMeta PodMeta(std::string name, std::string uid) {
    kube::ObjectMeta m;
    m.ns = "default";
    m.name = std::move(name);
    m.uid = std::move(uid);
    return m;
  }
  std::vector<Seen> Listed() {
    absl::StatusOr<std::string> list =
        env_.store().List(*apisim::FindResource("", "v1", "events"), "default", {});
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<Seen> out;
    const nlohmann::json doc = nlohmann::json::parse(*list);
    for (const auto& item : doc["items"]) {
      out.push_back(
          {item["metadata"].value("name", ""), item.value("reason", ""), item.value("message", ""),
           item.value("type", ""), item["source"].value("component", ""),
           item["involvedObject"].value("kind", ""), item["involvedObject"].value("name", ""),
           item["involvedObject"].value("uid", "")});
    }
    return out;
  }

  testing::ApisimEnv env_;
  FakeClock clock_{kNow};
};

TEST_F(EventRecorderTest, SendsOneEventPerRecordNamedUniquelyWhileTheClockStandsStill) {
  EventRecorder events({.component = "tessera-test"}, env_.client(), &clock_);
  events.Record(PodMeta("p1", "uid-1"), "FilteringSucceed", "find fit node(n1)",
                EventType::kNormal);
  events.Record(PodMeta("p1", "uid-1"), "BindingFailed", "locked", EventType::kWarning);
  events.Flush();
  std::vector<Seen> seen = Listed();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].name, seen[1].name);
  std::vector<std::string> reasons;
  for (const Seen& e : seen) {
    reasons.push_back(e.reason);
    EXPECT_EQ(e.component, "tessera-test");
    EXPECT_EQ(e.kind, "Pod");
    EXPECT_EQ(e.pod, "p1");
    EXPECT_EQ(e.uid, "uid-1");
    EXPECT_EQ(e.type, e.reason == "BindingFailed" ? "Warning" : "Normal");
  }
  EXPECT_THAT(reasons, ::testing::UnorderedElementsAre("FilteringSucceed", "BindingFailed"));
  const EventRecorder::Counts counts = events.counts();
  EXPECT_EQ(counts.sent, 2u);
  EXPECT_EQ(counts.failed, 0u);
  EXPECT_EQ(counts.dropped, 0u);
}

TEST_F(EventRecorderTest, AFullQueueDropsAndCountsTheNewEvent) {
  testing::GateTransport gate(env_.faults(), "POST", "/events");
  kube::ApiClient client(&gate,
                         kube::ApiClient::Options{kube::RetryPolicy{.max_attempts = 1}, nullptr});
  EventRecorder events({.queue_limit = 2}, &client, &clock_);
  events.Record(PodMeta("p0", "u0"), "R", "sending", EventType::kNormal);
  gate.WaitHeld(1);  // the sender holds p0: the queue is empty again
  for (const char* pod : {"p1", "p2", "p3"}) {
    events.Record(PodMeta(pod, pod), "R", "queued", EventType::kNormal);
  }
  EXPECT_EQ(events.counts().dropped, 1u);  // p3
  gate.Open();
  events.Flush();
  std::vector<std::string> pods;
  for (const Seen& e : Listed()) {
    pods.push_back(e.pod);
  }
  std::sort(pods.begin(), pods.end());
  EXPECT_THAT(pods, ElementsAre("p0", "p1", "p2"));
  EXPECT_EQ(events.counts().sent, 3u);
  EXPECT_EQ(events.counts().dropped, 1u);
}

// client-go's spam filter, per reason: 25 events per pod and reason, then one per 5 minutes; a
// pod over its budget neither takes the others' nor loses its events of another reason (the
// least recently seen pairs are forgotten past `spam_pods`, and start again with a full budget).
TEST_F(EventRecorderTest, EachPodGetsABurstPerReasonThenOneEventPerRefill) {
  EventRecorder events({.spam_pods = 3}, env_.client(), &clock_);
  auto failed = [&](const char* message) {
    events.Record(PodMeta("busy", "u-busy"), "FilteringFailed", message, EventType::kWarning);
  };
  for (int i = 0; i < 30; ++i) {
    failed("no fit");
  }
  events.Record(PodMeta("victim", "u-victim"), "Preempted", "evicted", EventType::kNormal);
  events.Record(PodMeta("busy", "u-busy"), "Preempted", "its own budget", EventType::kNormal);
  events.Flush();
  EXPECT_EQ(events.counts().sent, 27u);
  EXPECT_EQ(events.counts().throttled, 5u);
  clock_.Advance(absl::Minutes(4));
  failed("too early");
  clock_.Advance(absl::Minutes(1));
  failed("refilled");
  failed("spent again");
  events.Flush();
  EXPECT_EQ(events.counts().sent, 28u);
  EXPECT_EQ(events.counts().throttled, 7u);
  // A fourth pair forgets the least recently seen (victim's), not busy's spent budget.
  events.Record(PodMeta("p3", "u3"), "R", "x", EventType::kNormal);
  failed("still spent");
  events.Flush();
  EXPECT_EQ(events.counts().throttled, 8u);
  for (const char* pod : {"p4", "p3", "p5"}) {  // the last forgets busy's
    events.Record(PodMeta(pod, pod), "R", "x", EventType::kNormal);
  }
  failed("a fresh budget");
  events.Flush();
  EXPECT_EQ(events.counts().sent, 33u);
  EXPECT_EQ(events.counts().throttled, 8u);
  std::vector<std::string> busy;
  for (const Seen& e : Listed()) {
    if (e.pod == "busy" && e.reason == "FilteringFailed" && e.message != "no fit") {
      busy.push_back(e.message);
    }
  }
  EXPECT_THAT(busy, ::testing::UnorderedElementsAre("refilled", "a fresh budget"));
}

TEST_F(EventRecorderTest, ARefusedEventIsCountedAndNeverRetried) {
  env_.faults()->Inject("POST", "/api/v1/namespaces/default/events", 500, "InternalError");
  EventRecorder events({}, env_.client(), &clock_);
  events.Record(PodMeta("p1", "u1"), "R", "lost", EventType::kNormal);
  events.Record(PodMeta("p2", "u2"), "R", "kept", EventType::kNormal);
  events.Flush();
  EXPECT_EQ(events.counts().failed, 1u);
  EXPECT_EQ(events.counts().sent, 1u);
  std::vector<Seen> seen = Listed();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].message, "kept");
}

TEST_F(EventRecorderTest, TheDestructorSendsWhatIsQueued) {
  {
    EventRecorder events({}, env_.client(), &clock_);
    for (int i = 0; i < 5; ++i) {
      events.Record(PodMeta("p1", "u1"), "R", std::to_string(i), EventType::kNormal);
    }
  }
  EXPECT_EQ(Listed().size(), 5u);
}

TEST_F(EventRecorderTest, MessagesAreCutAtTheLimitOnACharacterBoundary) {
  // Two-byte characters after prefixes of both parities: one of the two cuts would otherwise
  // fall inside a character.
  std::string accents;
  for (int i = 0; i < 700; ++i) {
    accents += "\u00e9";
  }
  for (const std::string& text : {accents, "x" + accents}) {
    std::string cut = text;
    CapEventMessage(&cut);
    EXPECT_LE(cut.size(), EventRecorder::kMessageLimit);
    EXPECT_GE(cut.size(), EventRecorder::kMessageLimit - 4);
    EXPECT_TRUE(absl::EndsWith(cut, "\u00e9...")) << cut.substr(cut.size() - 8);
  }
  std::string short_text = "fits";
  CapEventMessage(&short_text);
  EXPECT_EQ(short_text, "fits");
  // Record applies it.
  EventRecorder events({}, env_.client(), &clock_);
  events.Record(PodMeta("p1", "u1"), "R", accents, EventType::kWarning);
  events.Flush();
  std::vector<Seen> seen = Listed();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_LE(seen[0].message.size(), EventRecorder::kMessageLimit);
  EXPECT_TRUE(absl::EndsWith(seen[0].message, "..."));
}

TEST_F(EventRecorderTest, NodeListsEndWithTheCountOfWhatDidNotFit) {
  EventNodeList small("2 nodes CardNotHealth", ", ");
  small.Add("n1");
  small.Add("n2");
  EXPECT_EQ(std::move(small).Finish(), "2 nodes CardNotHealth(n1, n2)");

  EventNodeList empty("0 nodes fit", ",");
  EXPECT_EQ(std::move(empty).Finish(), "0 nodes fit()");

  EventNodeList big("300 nodes CardInsufficientMemory", ", ");
  size_t added = 0;
  for (int i = 0; i < 300; ++i) {
    if (big.Open()) {
      ++added;
    }
    big.Add("node-" + std::to_string(1000 + i));
  }
  const std::string text = std::move(big).Finish();
  EXPECT_LE(text.size(), EventRecorder::kMessageLimit);
  const size_t listed = added - 1;  // the first item that did not fit was counted, not listed
  EXPECT_TRUE(absl::EndsWith(text, ", ... " + std::to_string(300 - listed) + " more)")) << text;
  EXPECT_TRUE(absl::StartsWith(text, "300 nodes CardInsufficientMemory(node-1000, node-1001, "));
  EXPECT_FALSE(absl::StrContains(text, "node-" + std::to_string(1000 + listed)));
  EXPECT_TRUE(absl::StrContains(text, "node-" + std::to_string(1000 + listed - 1) + ", ..."));

  EventNodeList omitted("1 nodes fit", ",");
  omitted.Omit();
  EXPECT_FALSE(omitted.Open());
  omitted.Add("n1");  // the list is closed once anything was left out
  EXPECT_EQ(std::move(omitted).Finish(), "1 nodes fit(... 2 more)");
}

}  // namespace
}  // namespace tessera::extender

#include "tessera/sim/scheduler_events.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/testing/apisim_env.h"
#include "tessera/testing/wait.h"

namespace tessera::sim {
namespace {

kube::Pod PodWith(const std::string& rv, const std::string& node) {
  kube::Pod p;
  p.meta.name = "p";
  p.meta.resource_version = rv;
  p.node_name = node;
  return p;
}

TEST(ClassifyPodEventTest, AssignedPodsAreClusterEventsAPendingPodsUpdateMovesItself) {
  const kube::Pod pending = PodWith("1", "");
  const kube::Pod pending_annotated = PodWith("2", "");
  const kube::Pod bound = PodWith("3", "n1");
  const kube::Pod bound_updated = PodWith("4", "n1");
  EXPECT_EQ(ClassifyPodEvent(nullptr, &pending), PodEvent::kNone) << "a new pod is scheduled";
  EXPECT_EQ(ClassifyPodEvent(nullptr, &bound), PodEvent::kClusterEvent);
  EXPECT_EQ(ClassifyPodEvent(&pending, &bound), PodEvent::kClusterEvent) << "a binding";
  EXPECT_EQ(ClassifyPodEvent(&bound, &bound_updated), PodEvent::kClusterEvent);
  EXPECT_EQ(ClassifyPodEvent(&bound, nullptr), PodEvent::kClusterEvent);
  EXPECT_EQ(ClassifyPodEvent(&pending, nullptr), PodEvent::kNone);
  EXPECT_EQ(ClassifyPodEvent(&pending, &pending_annotated), PodEvent::kPodUpdated);
  EXPECT_EQ(ClassifyPodEvent(&pending, &pending), PodEvent::kNone) << "a resync";
}

TEST(NodeUpdateMattersTest, AnnotationsLabelsAndSchedulabilityMatter) {
  kube::Node a;
  a.meta.resource_version = "1";
  kube::Node b = a;
  b.meta.resource_version = "2";
  EXPECT_FALSE(NodeUpdateMatters(a, b)) << "a heartbeat";
  b.meta.annotations.Set("hami.io/node-handshake", "Reported 2026-12-07 00:00:00");
  EXPECT_TRUE(NodeUpdateMatters(a, b));
  b = a;
  b.unschedulable = true;
  EXPECT_TRUE(NodeUpdateMatters(a, b));
}

// Against an in-process apisim: a pod waiting in the queue is moved by a binding elsewhere and
// by an update of itself, and only when it waits.
class SchedulerEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(env_.Start());
    client_ = env_.client();
    env_.CreateNode("n1", "{}");
    for (const char* name : {"waits", "other", "bystander"}) {
      env_.CreatePod(name, R"({"nvidia.com/gpu":"1"})");
    }
    events_ = std::make_unique<SchedulerEvents>(
        SchedulerEvents::Options{.scenario = &scenario_,
                                 .book = &book_,
                                 .client = client_,
                                 .clock = Clock::Real(),
                                 .retry = [this](const SchedulingQueue::Now& names) {
                                   MutexLock l(&mu_);
                                   moved_.insert(moved_.end(), names.begin(), names.end());
                                 }});
    events_->Start();
    ASSERT_TRUE(events_->WaitForSync(absl::Seconds(10)));
  }

  void Wait(const std::string& name) {
    MutexLock l(&book_.mutex);
    const uint64_t token = book_.queue.Attempt(name, absl::Now() - absl::Minutes(1));
    ASSERT_TRUE(book_.queue.Refused(name, token, absl::Now()).empty());
  }
  std::vector<std::string> Moved() {
    MutexLock l(&mu_);
    return moved_;
  }
  void Annotate(const std::string& pod) {
    kube::MetadataPatch patch;
    patch.annotations.emplace_back("tessera.io/requeue", absl::FormatTime(absl::Now()));
    ASSERT_TRUE(client_->PatchPodMetadata("default", pod, patch).ok());
  }

  // The informers' threads call `retry` until they stop: they go first (members end in reverse).
  Mutex mu_;
  std::vector<std::string> moved_ ABSL_GUARDED_BY(mu_);
  Scenario scenario_;
  RunBook book_;
  ::tessera::testing::ApisimEnv env_;
  kube::ApiClient* client_ = nullptr;
  std::unique_ptr<SchedulerEvents> events_;
};

TEST_F(SchedulerEventsTest, AnUpdateOfAWaitingPodMovesThatPod) {
  Wait("waits");
  Wait("other");
  Annotate("bystander");  // a pending pod that does not wait: moves nobody
  Annotate("waits");
  ASSERT_TRUE(::tessera::testing::Eventually([&] { return !Moved().empty(); }));
  EXPECT_EQ(Moved(), std::vector<std::string>{"waits"});
  MutexLock l(&book_.mutex);
  EXPECT_EQ(book_.queue.waiting(), 1u) << "other still waits";
}

TEST_F(SchedulerEventsTest, ABindingElsewhereMovesEveryWaitingPod) {
  Wait("waits");
  Wait("other");
  ASSERT_TRUE(client_->BindPod("default", "bystander", "", "n1").ok());
  ASSERT_TRUE(::tessera::testing::Eventually([&] { return Moved().size() >= 2; }));
  EXPECT_EQ(Moved(), (std::vector<std::string>{"other", "waits"}));
}

}  // namespace
}  // namespace tessera::sim

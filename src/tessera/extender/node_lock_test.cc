// The HAMi node lock against an in-process apisim over the real HTTP client.
#include "tessera/extender/node_lock.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/extender/scheduler_testutil.h"

namespace tessera::extender {
namespace {

using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z

class NodeLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.Start();
    options_.sleep = [this](absl::Duration d) { sleeps_.push_back(d); };
  }
  void NodeWithLock(const std::string& value) {
    env_.CreateNode("n1",
                    value.empty() ? "{}" : fmt::format(R"({{"hami.io/mutex.lock":"{}"}})", value));
  }
  // The lock value on the server, or "<none>".
  std::string Lock() {
    absl::StatusOr<kube::Node> node = env_.client()->GetNode("n1");
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) {
      return "<error>";
    }
    return std::string(node->meta.annotations.Get(device::kNodeLockAnnotation, "<none>"));
  }
  std::string NodeRv() { return env_.client()->GetNode("n1")->meta.resource_version; }
  absl::StatusOr<NodeLockResult> Acquire(std::string_view name, OwnerExists exists = nullptr) {
    return AcquireNodeLock(env_.client(), "n1", "default", name, kNow, options_, exists);
  }

  testing::ApisimEnv env_;
  NodeLockOptions options_;
  std::vector<absl::Duration> sleeps_;
};

OwnerExists Exists(bool exists) {
  return [exists](std::string_view, std::string_view) -> absl::StatusOr<bool> { return exists; };
}

TEST_F(NodeLockTest, FreeNodeIsLockedInHamiFormat) {
  NodeWithLock("");
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kAcquired);
  EXPECT_EQ(r->value, "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
  // The write carried the node's resourceVersion as a precondition, in one merge patch.
  std::vector<kube::Request> patches = env_.faults()->Matching("PATCH", "/api/v1/nodes/n1");
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0].content_type, "application/merge-patch+json");
  EXPECT_THAT(patches[0].body, HasSubstr(R"("resourceVersion":")"));
}

TEST_F(NodeLockTest, ReentrantForTheSamePodWithoutAWrite) {
  NodeWithLock("2025-12-31T23:59:00Z,default,p1");
  const std::string rv = NodeRv();
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kReentered);
  EXPECT_EQ(NodeRv(), rv);
  EXPECT_EQ(Lock(), "2025-12-31T23:59:00Z,default,p1");
}

TEST_F(NodeLockTest, YoungLockOfALivePodIsContention) {
  NodeWithLock("2026-01-01T00:58:00+01:00,default,other");  // 2 min old, local offset
  const std::string rv = NodeRv();
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("locked by default/other"));
  EXPECT_EQ(NodeRv(), rv);
  // An owner check that fails counts as "exists": never steal on doubt.
  r = Acquire("p1", [](std::string_view, std::string_view) -> absl::StatusOr<bool> {
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(NodeRv(), rv);
}

TEST_F(NodeLockTest, LockOlderThanTheTimeoutIsTakenOver) {
  NodeWithLock("2025-12-31T23:54:59Z,default,other");  // 5m01s old
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kTookOverExpired);
  EXPECT_EQ(r->previous, "2025-12-31T23:54:59Z,default,other");
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(NodeLockTest, LockExactlyAtTheTimeoutIsStillHeld) {
  NodeWithLock("2025-12-31T23:55:00Z,default,other");  // exactly 5m: HAMi's "> timeout"
  EXPECT_EQ(Acquire("p1", Exists(true)).status().code(), absl::StatusCode::kAborted);
}

TEST_F(NodeLockTest, LegacyBareTimeLocksExpireButHaveNoOwner) {
  NodeWithLock("2025-12-31T23:59:30Z");
  // Young and ownerless: the owner check does not apply.
  EXPECT_EQ(Acquire("p1", Exists(false)).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Lock(), "2025-12-31T23:59:30Z");
  options_.timeout = absl::Seconds(10);
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kTookOverExpired);
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(NodeLockTest, LockWhoseOwnerPodIsGoneIsTakenOver) {
  NodeWithLock("2025-12-31T23:59:59Z,default,ghost");
  std::vector<std::string> asked;
  absl::StatusOr<NodeLockResult> r =
      Acquire("p1", [&](std::string_view ns, std::string_view name) -> absl::StatusOr<bool> {
        asked.push_back(std::string(ns) + "/" + std::string(name));
        return false;
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kTookOverOrphan);
  EXPECT_THAT(asked, ::testing::ElementsAre("default/ghost"));
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(NodeLockTest, UnparsableLockIsRefused) {
  NodeWithLock("yesterday,default");
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(false));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("hami.io/mutex.lock"));
  EXPECT_EQ(Lock(), "yesterday,default");
}

TEST_F(NodeLockTest, ConflictOnThePatchIsRetriedWithBackoff) {
  NodeWithLock("");
  env_.faults()->Inject("PATCH", "/api/v1/nodes/n1", 409, "Conflict", 2);
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->conflicts, 2);
  EXPECT_EQ(sleeps_.size(), 2u);
  EXPECT_EQ(env_.faults()->Matching("GET", "/api/v1/nodes/n1").size(), 3u);  // re-read each time
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(NodeLockTest, ConflictsBeyondTheBudgetFail) {
  NodeWithLock("");
  options_.max_attempts = 3;
  env_.faults()->Inject("PATCH", "/api/v1/nodes/n1", 409, "Conflict", 3);
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("3 conflicting attempts"));
  EXPECT_EQ(Lock(), "<none>");
}

TEST_F(NodeLockTest, OtherPatchErrorsAreReturnedAsTheyAre) {
  NodeWithLock("");
  env_.faults()->Inject("PATCH", "/api/v1/nodes/n1", 403, "Forbidden");
  EXPECT_EQ(Acquire("p1", Exists(true)).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AcquireNodeLock(env_.client(), "nope", "default", "p1", kNow, options_, nullptr)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodeLockTest, RaceBetweenTwoSchedulersHasOneWinner) {
  // Real concurrent lockers against the server: the resourceVersion precondition admits one.
  for (int round = 0; round < 5; ++round) {
    const std::string node = fmt::format("race{}", round);
    env_.CreateNode(node, "{}");
    std::atomic<int> won{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        NodeLockOptions o;
        o.sleep = [](absl::Duration) {};
        absl::StatusOr<NodeLockResult> r = AcquireNodeLock(
            env_.client(), node, "default", fmt::format("p{}", i), kNow, o, Exists(true));
        if (r.ok()) {
          ++won;
        } else {
          EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
        }
      });
    }
    for (std::thread& t : threads) {
      t.join();
    }
    EXPECT_EQ(won.load(), 1) << node;
  }
}

TEST_F(NodeLockTest, ReleaseRemovesOnlyOurLock) {
  NodeWithLock("2026-01-01T00:00:00Z,default,p1");
  // Someone else's release leaves it.
  ASSERT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "p2", options_).ok());
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
  // Ours goes, even through a conflict.
  env_.faults()->Inject("PATCH", "/api/v1/nodes/n1", 409, "Conflict");
  ASSERT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "p1", options_).ok());
  EXPECT_EQ(Lock(), "<none>");
  EXPECT_EQ(sleeps_.size(), 1u);
  // Absent: nothing to do. A vanished node: nothing to do.
  EXPECT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "p1", options_).ok());
  EXPECT_TRUE(ReleaseNodeLock(env_.client(), "nope", "default", "p1", options_).ok());
}

TEST_F(NodeLockTest, ReleaseLeavesLegacyAndUnparsableLocks) {
  NodeWithLock("2026-01-01T00:00:00Z");
  ASSERT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "p1", options_).ok());
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z");
}

TEST_F(NodeLockTest, AnUnlockedCachedCopySavesTheGet) {
  NodeWithLock("");
  const kube::Node copy = *env_.client()->GetNode("n1");
  const size_t gets = env_.faults()->Matching("GET", "/api/v1/nodes/n1").size();
  options_.cached = [&](std::string_view) -> std::optional<kube::Node> { return copy; };
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kAcquired);
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
  // Lock() itself GETs once.
  EXPECT_EQ(env_.faults()->Matching("GET", "/api/v1/nodes/n1").size(), gets + 1);
}

TEST_F(NodeLockTest, AStaleCachedCopyCostsOneConflictAndNoSleep) {
  NodeWithLock("");
  const kube::Node stale = *env_.client()->GetNode("n1");
  // Another pod locks the node after the copy was taken.
  ASSERT_TRUE(Acquire("other", Exists(true)).ok());
  options_.cached = [&](std::string_view) -> std::optional<kube::Node> { return stale; };
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsAborted(r.status())) << r.status();  // held by a live pod, seen by a GET
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("default/other"));
  EXPECT_TRUE(sleeps_.empty());
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,other");
}

TEST_F(NodeLockTest, ACachedCopyShowingALockIsNotTrusted) {
  NodeWithLock("");  // free on the server
  kube::Node copy = *env_.client()->GetNode("n1");
  copy.meta.annotations.Set(std::string(device::kNodeLockAnnotation),
                            "2026-01-01T00:00:00Z,default,other");
  options_.cached = [&](std::string_view) -> std::optional<kube::Node> { return copy; };
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();  // decided from a GET, which shows no lock
  EXPECT_EQ(r->outcome, NodeLockOutcome::kAcquired);
}

}  // namespace
}  // namespace tessera::extender

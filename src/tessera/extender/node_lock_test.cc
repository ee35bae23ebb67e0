// The HAMi node lock against an in-process apisim over the real HTTP client.
#include "tessera/extender/node_lock.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::extender {
namespace {

using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z

// A holder's state: bound to `node` (empty: unbound) with bind-phase `phase`.
NodeLockHolder Holder(std::string node = "", std::string phase = "", bool fresh = false) {
  NodeLockHolder h;
  h.node_name = std::move(node);
  h.bind_phase = std::move(phase);
  h.fresh = fresh;
  return h;
}
NodeLockHolder Gone() {
  NodeLockHolder h;
  h.gone = true;
  h.fresh = true;
  return h;
}
NodeLockHolder Terminal(std::string node) {
  NodeLockHolder h = Holder(std::move(node));
  h.terminal = true;
  return h;
}

std::string FormatNodeLockAt(absl::Time t, std::string_view name) {
  return device::FormatNodeLock(t, "default", name);
}

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
  void SetLock(const std::string& value) {
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), value);
    ASSERT_TRUE(env_.client()->PatchNodeMetadata("n1", patch).ok());
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
  absl::StatusOr<NodeLockResult> Acquire(std::string_view name, HolderLookup exists = nullptr) {
    return AcquireNodeLock(env_.client(), "n1", "default", name, kNow, options_, exists);
  }

  ::tessera::testing::ApisimEnv env_;
  NodeLockOptions options_;
  std::vector<absl::Duration> sleeps_;
};

// A holder that exists (unbound, Pending) or is gone.
HolderLookup Exists(bool exists) {
  return [exists](std::string_view, std::string_view, bool) -> absl::StatusOr<NodeLockHolder> {
    return exists ? Holder("", "", true) : Gone();
  };
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
  r = Acquire("p1", [](std::string_view, std::string_view, bool) -> absl::StatusOr<NodeLockHolder> {
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
  absl::StatusOr<NodeLockResult> r = Acquire(
      "p1",
      [&](std::string_view ns, std::string_view name, bool) -> absl::StatusOr<NodeLockHolder> {
        asked.push_back(std::string(ns) + "/" + std::string(name));
        return Gone();
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

// ---- DecideNodeLock: the rules, one row each -------------------------------------------------

struct DecideCase {
  std::string what;
  std::optional<std::string> lock;       // nullopt: no lock on the node
  std::optional<NodeLockHolder> holder;  // nullopt: not looked up
  bool holder_error = false;
  NodeLockDecision::Action action;
  NodeLockOutcome outcome = NodeLockOutcome::kAcquired;
  std::string refusal = "";  // a substring of the refusal
};

TEST(DecideNodeLockTest, Table) {
  using A = NodeLockDecision::Action;
  using O = NodeLockOutcome;
  const std::string young = "2025-12-31T23:58:00Z,default,h";  // 2 min old at kNow
  const std::string old = "2025-12-31T23:54:00Z,default,h";    // 6 min old
  const NodeLockHolder unbound = Holder();
  const NodeLockHolder gone = Gone();
  const NodeLockHolder succeeded = Terminal("n1");
  const NodeLockHolder elsewhere = Holder("n2", "allocating");
  const NodeLockHolder allocating = Holder("n1", "allocating");
  const NodeLockHolder allocated = Holder("n1", "success");
  const NodeLockHolder failed_alloc = Holder("n1", "failed");
  NodeLockHolder running_allocating = Holder("n1", "allocating");
  running_allocating.running = true;
  const std::vector<DecideCase> cases = {
      {"free", std::nullopt, std::nullopt, false, A::kWrite, O::kAcquired},
      {"ours, young", "2025-12-31T23:58:00Z,default,me", std::nullopt, false, A::kKeep,
       O::kReentered},
      {"ours, expired", "2025-12-31T23:54:00Z,default,me", std::nullopt, false, A::kWrite,
       O::kRenewed},
      {"legacy, young", "2025-12-31T23:58:00Z", std::nullopt, false, A::kRefuse, O::kAcquired,
       "locked by a legacy lock"},
      {"legacy, expired", "2025-12-31T23:54:00Z", std::nullopt, false, A::kWrite,
       O::kTookOverExpired},
      {"unparsable", "soon,default", std::nullopt, false, A::kRefuse, O::kAcquired, "unparsable"},
      {"another pod's, not yet asked", young, std::nullopt, false, A::kAskHolder},
      {"young, holder lookup failed", young, std::nullopt, true, A::kRefuse, O::kAcquired,
       "cannot tell whether default/h still needs it"},
      {"expired, holder lookup failed", old, std::nullopt, true, A::kRefuse, O::kAcquired,
       "cannot tell"},
      {"young, holder gone", young, gone, false, A::kWrite, O::kTookOverOrphan},
      {"young, holder Succeeded", young, succeeded, false, A::kWrite, O::kTookOverTerminal},
      {"young, holder bound elsewhere", young, elsewhere, false, A::kWrite, O::kTookOverElsewhere},
      {"young, holder unbound (binding)", young, unbound, false, A::kRefuse, O::kAcquired,
       "locked by default/h since 2025-12-31T23:58:00Z (timeout 5m)"},
      {"young, holder allocating", young, allocating, false, A::kRefuse, O::kAcquired,
       "locked by default/h"},
      {"young, holder past Allocate", young, allocated, false, A::kRefuse, O::kAcquired,
       "locked by default/h"},
      {"expired, holder gone", old, gone, false, A::kWrite, O::kTookOverOrphan},
      {"expired, holder Succeeded", old, succeeded, false, A::kWrite, O::kTookOverTerminal},
      {"expired, holder bound elsewhere", old, elsewhere, false, A::kWrite, O::kTookOverElsewhere},
      {"expired, holder unbound", old, unbound, false, A::kWrite, O::kTookOverExpired},
      {"expired, holder past Allocate (success)", old, allocated, false, A::kWrite,
       O::kTookOverExpired},
      {"expired, holder past Allocate (failed)", old, failed_alloc, false, A::kWrite,
       O::kTookOverExpired},
      {"expired, holder still allocating here (PR #3097)", old, allocating, false, A::kRefuse,
       O::kAcquired, "default/h is still waiting for the device plugin's Allocate"},
      {"expired, holder Running though still marked allocating", old, running_allocating, false,
       A::kWrite, O::kTookOverExpired},
      {"young, holder Running", young, running_allocating, false, A::kRefuse, O::kAcquired,
       "locked by default/h"},
  };
  for (const DecideCase& c : cases) {
    SCOPED_TRACE(c.what);
    std::optional<absl::StatusOr<NodeLockHolder>> holder;
    if (c.holder_error) {
      holder = absl::UnavailableError("apiserver down");
    } else if (c.holder) {
      holder = *c.holder;
    }
    const NodeLockDecision d = DecideNodeLock("n1", c.lock ? &*c.lock : nullptr, "default", "me",
                                              kNow, absl::Minutes(5), holder ? &*holder : nullptr);
    EXPECT_EQ(d.action, c.action);
    if (c.action == A::kWrite || c.action == A::kKeep) {
      EXPECT_EQ(NodeLockOutcomeName(d.outcome), NodeLockOutcomeName(c.outcome));
    }
    if (c.action == A::kRefuse) {
      EXPECT_THAT(std::string(d.refusal.message()), HasSubstr(c.refusal));
      EXPECT_EQ(d.refusal.code(), c.lock == std::optional<std::string>("soon,default")
                                      ? absl::StatusCode::kFailedPrecondition
                                      : absl::StatusCode::kAborted);
    }
  }
}

TEST_F(NodeLockTest, AnExpiredLockStaysWithAHolderStillAllocatingOnTheNode) {
  NodeWithLock("2025-12-31T23:54:00Z,default,holder");
  const std::string rv = NodeRv();
  absl::StatusOr<NodeLockResult> r =
      Acquire("p1", [](std::string_view, std::string_view, bool) -> absl::StatusOr<NodeLockHolder> {
        return Holder("n1", "allocating", true);
      });
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("still waiting for the device plugin's Allocate"));
  EXPECT_EQ(NodeRv(), rv);
}

TEST_F(NodeLockTest, ATakeoverSeenInACachedHolderIsConfirmedWithAFreshRead) {
  NodeWithLock("2025-12-31T23:54:00Z,default,holder");  // expired
  std::vector<bool> asked;
  // The cache still shows the holder unbound; the API server has it bound here, allocating.
  HolderLookup holder = [&](std::string_view, std::string_view,
                            bool fresh) -> absl::StatusOr<NodeLockHolder> {
    asked.push_back(fresh);
    if (!fresh) {
      return Holder();
    }
    return Holder("n1", "allocating", true);
  };
  absl::StatusOr<NodeLockResult> r = Acquire("p1", holder);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(asked, ::testing::ElementsAre(false, true));
  EXPECT_EQ(Lock(), "2025-12-31T23:54:00Z,default,holder");
  // A cached state that keeps a young lock needs no fresh read (5 s after it was taken).
  asked.clear();
  r = AcquireNodeLock(
      env_.client(), "n1", "default", "p1", kNow - absl::Minutes(6) + absl::Seconds(5), options_,
      [&](std::string_view, std::string_view, bool fresh) -> absl::StatusOr<NodeLockHolder> {
        asked.push_back(fresh);
        return Holder("n1", "allocating");
      });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(asked, ::testing::ElementsAre(false));
}

// The simulate_mig flake: a lock holder force-deleted with its DELETED event lost stays
// "present" in the informer's copy until a resync, so its young lock kept refusing binds. A lock
// older than confirm_after that the cached state keeps is confirmed with a fresh read.
TEST_F(NodeLockTest, AnOldLockKeptByACachedHolderIsConfirmedWithAFreshRead) {
  NodeWithLock("2025-12-31T23:59:49Z,default,holder");  // 11 s old, far from the timeout
  std::vector<bool> asked;
  HolderLookup holder = [&](std::string_view, std::string_view,
                            bool fresh) -> absl::StatusOr<NodeLockHolder> {
    asked.push_back(fresh);
    if (!fresh) {
      return Holder();  // the informer still has it, pending
    }
    NodeLockHolder gone;
    gone.gone = true;
    gone.fresh = true;
    return gone;
  };
  absl::StatusOr<NodeLockResult> r = Acquire("p1", holder);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kTookOverOrphan);
  EXPECT_THAT(asked, ::testing::ElementsAre(false, true));
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,p1");
  // Still there when asked afresh: refused, as before.
  SetLock("2025-12-31T23:59:49Z,default,holder");
  asked.clear();
  r = Acquire(
      "p1", [&](std::string_view, std::string_view, bool fresh) -> absl::StatusOr<NodeLockHolder> {
        asked.push_back(fresh);
        return Holder("", "", fresh);
      });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(asked, ::testing::ElementsAre(false, true));
  // confirm_after zero: the cached state decides.
  options_.confirm_after = absl::ZeroDuration();
  asked.clear();
  r = Acquire("p1", holder);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(asked, ::testing::ElementsAre(false));
}

TEST_F(NodeLockTest, TookSaysWhetherThisCallTookTheLock) {
  NodeWithLock("");
  absl::StatusOr<NodeLockResult> r = Acquire("p1", Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->took);
  r = Acquire("p1", Exists(true));  // the same pod again: re-entrant
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kReentered);
  EXPECT_FALSE(r->took);
  // Its own expired lock is renewed, but it was the pod's before: not taken by this call.
  options_.timeout = absl::Seconds(10);
  r = AcquireNodeLock(env_.client(), "n1", "default", "p1", kNow + absl::Minutes(1), options_,
                      Exists(true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kRenewed);
  EXPECT_FALSE(r->took);
  EXPECT_EQ(Lock(), "2026-01-01T00:01:00Z,default,p1");
}

// ---- AcquireNodeLockWaiting ------------------------------------------------------------------

class NodeLockWaitTest : public NodeLockTest {
 protected:
  void SetUp() override {
    NodeLockTest::SetUp();
    options_.wait = absl::Seconds(28);
    // Each pause moves the fake clock; `release_after` pauses in, the holder's device plugin
    // removes its lock.
    options_.sleep = [this](absl::Duration d) {
      sleeps_.push_back(d);
      clock_.Advance(d);
      if (static_cast<int>(sleeps_.size()) == release_after_) {
        ASSERT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "holder", options_).ok());
      }
    };
  }
  absl::StatusOr<NodeLockResult> AcquireWaiting(std::string_view name) {
    return AcquireNodeLockWaiting(env_.client(), "n1", "default", name, clock_, options_,
                                  Exists(true));
  }
  absl::Duration Slept() {
    absl::Duration total;
    for (absl::Duration d : sleeps_) {
      total += d;
    }
    return total;
  }

  FakeClock clock_{kNow};
  int release_after_ = -1;
};

TEST_F(NodeLockWaitTest, ABindWaitsForTheHolderToRelease) {
  NodeWithLock("2026-01-01T00:00:00Z,default,holder");
  release_after_ = 4;
  absl::StatusOr<NodeLockResult> r = AcquireWaiting("p1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, NodeLockOutcome::kAcquired);
  EXPECT_TRUE(r->took);
  EXPECT_EQ(r->refusals, 4);
  EXPECT_EQ(r->waited, Slept());
  EXPECT_GT(Slept(), absl::ZeroDuration());
  EXPECT_LT(Slept(), absl::Seconds(2));
  // The first pause is HAMi's 100 ms poll (jitter 0.2); later ones back off to at most 1 s.
  EXPECT_GE(sleeps_[0], absl::Milliseconds(80));
  EXPECT_LE(sleeps_[0], absl::Milliseconds(120));
  for (absl::Duration d : sleeps_) {
    EXPECT_LE(d, absl::Seconds(1));
  }
  EXPECT_EQ(Lock(), FormatNodeLockAt(clock_.Now(), "p1"));
}

TEST_F(NodeLockWaitTest, TheWaitIsBoundedAndTheRefusalSaysWhoAndHowLong) {
  NodeWithLock("2026-01-01T00:00:00Z,default,holder");
  absl::StatusOr<NodeLockResult> r = AcquireWaiting("p1");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("locked by default/holder"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("gave up after waiting 28s"));
  EXPECT_EQ(Slept(), absl::Seconds(28));  // the last pause is cut to the deadline
  EXPECT_LE(sleeps_.size(), 50u);
  EXPECT_EQ(Lock(), "2026-01-01T00:00:00Z,default,holder");
}

TEST_F(NodeLockWaitTest, AReleaseSeenInTheCachedCopyEndsThePauseEarly) {
  NodeWithLock("2026-01-01T00:00:00Z,default,holder");
  std::optional<kube::Node> copy = *env_.client()->GetNode("n1");  // the informer's, locked
  Mutex mu;
  options_.cached = [&](std::string_view) {
    MutexLock l(&mu);
    return copy;
  };
  int looks = 0;
  options_.sleep = [&](absl::Duration d) {
    sleeps_.push_back(d);
    clock_.Advance(d);
    if (++looks == 3) {  // 30 ms into the first 100 ms pause the plugin releases the lock
      ASSERT_TRUE(ReleaseNodeLock(env_.client(), "n1", "default", "holder", options_).ok());
      MutexLock l(&mu);
      copy = *env_.client()->GetNode("n1");
    }
  };
  absl::StatusOr<NodeLockResult> r = AcquireWaiting("p1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->refusals, 1);
  EXPECT_EQ(Slept(), absl::Milliseconds(30));
  EXPECT_THAT(sleeps_, ::testing::Each(absl::Milliseconds(10)));
  EXPECT_EQ(Lock(), FormatNodeLockAt(clock_.Now(), "p1"));
  // Without a change in the copy, a pause runs its full length in such steps, and the wait is
  // still bounded: p2 waits for p1's lock, which nobody releases.
  sleeps_.clear();
  const size_t gets = env_.faults()->Matching("GET", "/api/v1/nodes/n1").size();
  r = AcquireWaiting("p2");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("gave up after waiting 28s"));
  EXPECT_EQ(Slept(), absl::Seconds(28));
  EXPECT_THAT(sleeps_, ::testing::Each(::testing::Le(absl::Milliseconds(10))));
  // The tries (one GET each) follow the backoff, not the 10 ms looks.
  EXPECT_LE(env_.faults()->Matching("GET", "/api/v1/nodes/n1").size() - gets, 50u);
}

TEST_F(NodeLockWaitTest, AShutdownEndsTheWait) {
  NodeWithLock("2026-01-01T00:00:00Z,default,holder");
  bool stopping = false;
  options_.stopping = [&] { return stopping; };
  release_after_ = -1;
  options_.sleep = [&](absl::Duration d) {
    sleeps_.push_back(d);
    clock_.Advance(d);
    stopping = sleeps_.size() == 2;  // the service stops during the second pause
  };
  absl::StatusOr<NodeLockResult> r = AcquireWaiting("p1");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("locked by default/holder"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("shutting down"));
  EXPECT_EQ(sleeps_.size(), 2u);
  EXPECT_LT(Slept(), absl::Seconds(1));
}

TEST_F(NodeLockWaitTest, NoWaitFailsAtOnceAndOtherErrorsEndTheWait) {
  NodeWithLock("2026-01-01T00:00:00Z,default,holder");
  options_.wait = absl::ZeroDuration();
  absl::StatusOr<NodeLockResult> r = AcquireWaiting("p1");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), ::testing::Not(HasSubstr("waiting")));
  EXPECT_TRUE(sleeps_.empty());
  options_.wait = absl::Seconds(28);
  env_.faults()->Inject("GET", "/api/v1/nodes/n1", 403, "Forbidden");
  EXPECT_EQ(AcquireWaiting("p1").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(sleeps_.empty());
}

TEST(NodeLockTimeoutFromEnvTest, GoDurationsOrTheFallbackWithAWarning) {
  std::string warning = "stale";
  EXPECT_EQ(NodeLockTimeoutFromEnv(nullptr, absl::Minutes(5), &warning), absl::Minutes(5));
  EXPECT_EQ(warning, "");
  EXPECT_EQ(NodeLockTimeoutFromEnv("", absl::Minutes(5), &warning), absl::Minutes(5));
  EXPECT_EQ(warning, "");
  EXPECT_EQ(NodeLockTimeoutFromEnv("90s", absl::Minutes(5), &warning), absl::Seconds(90));
  EXPECT_EQ(NodeLockTimeoutFromEnv("1h30m", absl::Minutes(5), &warning), absl::Minutes(90));
  EXPECT_EQ(NodeLockTimeoutFromEnv("2.5m", absl::Minutes(5), &warning), absl::Seconds(150));
  EXPECT_EQ(warning, "");
  for (const char* bad : {"5 minutes", "300", "0s", "-1m", "inf"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(NodeLockTimeoutFromEnv(bad, absl::Minutes(5), &warning), absl::Minutes(5));
    EXPECT_THAT(warning, HasSubstr("HAMI_NODELOCK_EXPIRE"));
    EXPECT_THAT(warning, HasSubstr("using 5m"));
  }
}

}  // namespace
}  // namespace tessera::extender

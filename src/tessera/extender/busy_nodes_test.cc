#include "tessera/extender/busy_nodes.h"

#include <map>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"

namespace tessera::extender {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

class BusyNodesTest : public ::testing::Test {
 protected:
  BusyNodes busy_{[this](std::string_view node) {
                    BusyNodes::NodeView view;
                    if (auto it = locks_.find(std::string(node)); it != locks_.end()) {
                      view.lock = it->second;
                    }
                    if (auto it = versions_.find(std::string(node)); it != versions_.end()) {
                      view.resource_version = it->second;
                    }
                    return view;
                  },
                  [this](std::string_view uid) { return !gone_.contains(std::string(uid)); },
                  [this](std::string_view ns, std::string_view name) {
                    return done_.contains(std::string(ns) + "/" + std::string(name));
                  },
                  absl::Minutes(5)};
  std::map<std::string, std::string> locks_;     // the informer's copies: lock value
  std::map<std::string, std::string> versions_;  // ... and resourceVersion
  std::set<std::string> gone_;                   // pods whose reservation ended without a bind
  std::set<std::string> done_;                   // "ns/name" of pods deleted or finished
};

const BusyNodes::Pod kA{"uid-a", "ml", "a"};
const BusyNodes::Pod kB{"uid-b", "ml", "b"};

// From Filter's decision until Bind returns, the node is busy for every other pod, not for
// the pod itself; a decision past its reservation's expiry no longer counts.
TEST_F(BusyNodesTest, ADecisionOccupiesItsNodeUntilItsBindEnds) {
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow));
  busy_.Decided(kA.uid, "gpu-1", kNow + absl::Minutes(5));
  EXPECT_TRUE(busy_.Busy("gpu-1", kB, kNow));
  EXPECT_FALSE(busy_.Busy("gpu-1", kA, kNow));
  EXPECT_FALSE(busy_.Busy("gpu-2", kB, kNow));
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow + absl::Minutes(5)));

  busy_.Decided(kA.uid, "gpu-2", kNow + absl::Minutes(5));  // filtered again elsewhere
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow));
  EXPECT_TRUE(busy_.Busy("gpu-2", kB, kNow));
  busy_.Ended(kA.uid);
  EXPECT_FALSE(busy_.Busy("gpu-2", kB, kNow));
  EXPECT_EQ(busy_.decisions(), 0u);
  busy_.Ended(kA.uid);  // twice: nothing
}

// A pod deleted (or whose reservation ended otherwise) before its bind occupies nothing.
TEST_F(BusyNodesTest, ADecisionWhoseReservationEndedNoLongerCounts) {
  busy_.Decided(kA.uid, "gpu-1", kNow + absl::Minutes(5));
  busy_.Decided(kB.uid, "gpu-2", kNow + absl::Minutes(5));
  gone_.insert(std::string(kA.uid));
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow));
  EXPECT_TRUE(busy_.Busy("gpu-2", kA, kNow));
  busy_.Purge(kNow);
  EXPECT_EQ(busy_.decisions(), 1u);
}

// Bound, the pod's reservation soon ends (its record takes over) and the informer may show the
// node with its lock only seconds later: until the informer's copy is as new as the lock write,
// the node is busy; from then on its lock annotation tells.
TEST_F(BusyNodesTest, ABoundPodOccupiesItsNodeUntilTheInformerHasCaughtUpWithItsLock) {
  versions_["gpu-1"] = "99";
  busy_.Decided(kA.uid, "gpu-1", kNow + absl::Minutes(5));
  busy_.Bound(kA.uid, "gpu-1", "100", kNow + absl::Seconds(30));
  gone_.insert(std::string(kA.uid));
  EXPECT_TRUE(busy_.Busy("gpu-1", kB, kNow + absl::Seconds(1))) << "the copy predates the lock";
  EXPECT_FALSE(busy_.Busy("gpu-1", kA, kNow + absl::Seconds(1)));
  versions_["gpu-1"] = "100";
  locks_["gpu-1"] = device::FormatNodeLock(kNow, "ml", "a");
  EXPECT_TRUE(busy_.Busy("gpu-1", kB, kNow + absl::Seconds(1))) << "the copy shows a's lock";
  versions_["gpu-1"] = "101";
  locks_.erase("gpu-1");
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow + absl::Seconds(1))) << "released";
  busy_.Purge(kNow + absl::Seconds(1));
  EXPECT_EQ(busy_.decisions(), 0u);

  // Versions that are not integers never catch up: busy until `until`.
  busy_.Bound(kA.uid, "gpu-1", "v100", kNow + absl::Seconds(30));
  EXPECT_TRUE(busy_.Busy("gpu-1", kB, kNow + absl::Seconds(29)));
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow + absl::Seconds(30)));
  busy_.Purge(kNow + absl::Seconds(30));
  EXPECT_EQ(busy_.decisions(), 0u);
}

TEST_F(BusyNodesTest, PurgeDropsExpiredDecisionsOnly) {
  busy_.Decided(kA.uid, "gpu-1", kNow + absl::Seconds(1));
  busy_.Decided(kB.uid, "gpu-1", kNow + absl::Seconds(10));
  busy_.Purge(kNow + absl::Seconds(1));
  EXPECT_EQ(busy_.decisions(), 1u);
  EXPECT_TRUE(busy_.Busy("gpu-1", kA, kNow));  // b's decision stays
  busy_.Purge(kNow + absl::Seconds(10));
  EXPECT_EQ(busy_.decisions(), 0u);
}

// After the bind, the node lock as the informer sees it: held by another pod (or by no one in
// particular: a legacy lock, or a value that does not parse) until it is released or expires.
TEST_F(BusyNodesTest, ALockHeldByAnotherPodMakesTheNodeBusyUntilItExpires) {
  locks_["gpu-1"] = device::FormatNodeLock(kNow - absl::Seconds(3), "ml", "a");
  EXPECT_TRUE(busy_.Busy("gpu-1", kB, kNow));
  EXPECT_FALSE(busy_.Busy("gpu-1", kA, kNow));                     // its own lock
  EXPECT_FALSE(busy_.Busy("gpu-1", kB, kNow + absl::Minutes(5)));  // expired: taken over
  locks_["gpu-1"] = device::FormatNodeLock(kNow - absl::Seconds(3), "other", "a");
  EXPECT_TRUE(busy_.Busy("gpu-1", kA, kNow));  // same name, another namespace
  done_.insert("other/a");  // the lock's pod was deleted: a bind takes the lock over
  EXPECT_FALSE(busy_.Busy("gpu-1", kA, kNow));
  locks_["gpu-1"] = "2026-01-02T03:04:05Z";
  EXPECT_TRUE(busy_.Busy("gpu-1", kA, absl::FromUnixSeconds(1'767'323'045)));  // legacy, fresh
  locks_["gpu-1"] = "not a lock";
  EXPECT_TRUE(busy_.Busy("gpu-1", kA, kNow));
  locks_.erase("gpu-1");
  EXPECT_FALSE(busy_.Busy("gpu-1", kA, kNow));
}

TEST(BusyNodesWithoutLocks, OnlyDecisionsCount) {
  BusyNodes busy(nullptr, nullptr, nullptr, absl::Minutes(5));
  EXPECT_FALSE(busy.Busy("gpu-1", kB, kNow));
  busy.Decided(kA.uid, "gpu-1", kNow + absl::Minutes(1));
  EXPECT_TRUE(busy.Busy("gpu-1", kB, kNow));
}

}  // namespace
}  // namespace tessera::extender

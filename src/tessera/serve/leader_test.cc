// Elector against an in-process apisim (127.0.0.1, port 0), time from a FakeClock, rounds
// driven by Step() (no thread): own-Lease acquisition, renewal, takeover after expiry, loss on
// a stolen Lease and on renewals failing for the renew deadline, release on stop; following a
// kube-scheduler Lease as its holder and expiry change; the configuration checks.
#include "tessera/serve/leader.h"

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/wait.h"

namespace tessera::serve {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kNs[] = "kube-system";
constexpr char kName[] = "hami-scheduler";

std::string Micro(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

class LeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(api_.Start({.server = {}, .max_attempts = 2}));
    server_ = api_.server();
    client_ = api_.client();
  }
  void TearDown() override {
    electors_.clear();
    api_.Stop();
  }

  Elector* New(LeaderMode mode, const std::string& identity) {
    ElectorOptions o;
    o.mode = mode;
    o.ns = kNs;
    o.name = kName;
    o.identity = identity;
    o.clock = &clock_;
    o.on_change = [this, identity](bool leader) {
      changes_.push_back(identity + (leader ? ":leader" : ":follower"));
    };
    absl::StatusOr<std::unique_ptr<Elector>> e = Elector::Create(client_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) {
      return nullptr;
    }
    electors_.push_back(*std::move(e));
    return electors_.back().get();
  }

  kube::Lease Get() {
    absl::StatusOr<kube::Lease> lease = client_->GetLease(kNs, kName);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *lease : kube::Lease{};
  }

  // What a kube-scheduler does: create or overwrite the Lease with `holder` renewed at `at`.
  void SchedulerWrites(const std::string& holder, absl::Time at, int32_t duration_s = 15) {
    kube::Lease lease;
    absl::StatusOr<kube::Lease> old = client_->GetLease(kNs, kName);
    if (old.ok()) {
      lease = *old;
    }
    lease.meta.ns = kNs;
    lease.meta.name = kName;
    lease.holder_identity = holder;
    lease.lease_duration_seconds = duration_s;
    lease.acquire_time = Micro(at);
    lease.renew_time = Micro(at);
    absl::StatusOr<kube::Lease> written =
        old.ok() ? client_->UpdateLease(lease) : client_->CreateLease(lease);
    ASSERT_TRUE(written.ok()) << written.status();
  }

  void FailRequests(std::vector<std::string> verbs) { api_.FailRequests(std::move(verbs)); }

  FakeClock clock_{absl::FromUnixSeconds(1800000000)};
  ::tessera::testing::ApisimEnv api_;
  apisim::Server* server_ = nullptr;
  kube::ApiClient* client_ = nullptr;
  std::vector<std::unique_ptr<Elector>> electors_;
  std::vector<std::string> changes_;
};

// ---- --leader-elect-mode=lease: Tessera's own Lease ------------------------------------------

TEST_F(LeaderTest, LeaseAcquiredByCreateThenRenewedKeepingAcquireTime) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  EXPECT_FALSE(a->IsLeader());
  a->Step();
  ASSERT_TRUE(a->IsLeader()) << a->Describe();
  EXPECT_EQ(a->generation(), 1u);
  const std::string me = a->status().identity;
  EXPECT_THAT(me, StartsWith("host-a_"));
  EXPECT_EQ(me.size(), std::string("host-a_").size() + 36);  // a UUID

  kube::Lease lease = Get();
  EXPECT_EQ(lease.holder_identity, me);
  EXPECT_EQ(lease.lease_duration_seconds, 15);
  EXPECT_EQ(lease.lease_transitions, 0);
  EXPECT_EQ(lease.acquire_time, Micro(clock_.Now()));
  EXPECT_EQ(lease.renew_time, Micro(clock_.Now()));

  const absl::Time t0 = clock_.Now();
  clock_.Advance(absl::Seconds(2));
  a->Step();
  EXPECT_TRUE(a->IsLeader());
  kube::Lease renewed = Get();
  EXPECT_EQ(renewed.renew_time, Micro(t0 + absl::Seconds(2)));
  EXPECT_EQ(renewed.acquire_time, Micro(t0));
  EXPECT_EQ(renewed.lease_transitions, 0);
  EXPECT_NE(renewed.meta.resource_version, lease.meta.resource_version);
  EXPECT_EQ(a->generation(), 1u);  // no change of role
  EXPECT_THAT(a->Describe(),
              StartsWith("leader (holds Lease kube-system/hami-scheduler as host-a_"));
  EXPECT_EQ(changes_, std::vector<std::string>{"host-a:leader"});
}

TEST_F(LeaderTest, ASecondElectorWaitsForTheExpiryThenTakesOver) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  Elector* b = New(LeaderMode::kLease, "host-b");
  a->Step();
  b->Step();
  ASSERT_TRUE(a->IsLeader());
  EXPECT_FALSE(b->IsLeader());
  EXPECT_THAT(b->Describe(), HasSubstr("follower (Lease kube-system/hami-scheduler held by"));
  const absl::Time t0 = clock_.Now();

  // a keeps renewing: b never takes over, however long it waits.
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(absl::Seconds(2));
    a->Step();
    b->Step();
    ASSERT_TRUE(a->IsLeader());
    ASSERT_FALSE(b->IsLeader());
  }

  // a stops renewing (hung, partitioned). It steps down by itself after the renew deadline
  // (10 s), before b may take over after the lease duration (15 s) since it saw the last change.
  const absl::Time last = clock_.Now();
  clock_.Advance(absl::Seconds(9));
  b->Step();
  EXPECT_TRUE(a->IsLeader());
  EXPECT_FALSE(b->IsLeader());
  clock_.Advance(absl::Seconds(1));
  EXPECT_FALSE(a->IsLeader()) << "no renewal for the renew deadline";
  b->Step();
  EXPECT_FALSE(b->IsLeader()) << "the lease has not expired yet";
  clock_.Set(last + absl::Seconds(15));
  b->Step();
  ASSERT_TRUE(b->IsLeader()) << b->Describe();
  kube::Lease lease = Get();
  EXPECT_EQ(lease.holder_identity, b->status().identity);
  EXPECT_EQ(lease.lease_transitions, 1);
  EXPECT_EQ(lease.acquire_time, Micro(last + absl::Seconds(15)));

  // a comes back: it sees b's Lease and stays a follower.
  a->Step();
  EXPECT_FALSE(a->IsLeader());
  EXPECT_TRUE(b->IsLeader());
  EXPECT_GE(clock_.Now() - t0, absl::Seconds(55));
}

TEST_F(LeaderTest, AStolenLeaseEndsLeadershipAtTheNextRound) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  a->Step();
  ASSERT_TRUE(a->IsLeader());
  const uint64_t gen = a->generation();

  // Someone else overwrites the Lease (an operator, a misconfigured second deployment).
  SchedulerWrites("intruder_1", clock_.Now());
  clock_.Advance(absl::Seconds(2));
  a->Step();  // the renewal's precondition fails (409), the read shows the new holder
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->generation(), gen + 1);
  EXPECT_EQ(Get().holder_identity, "intruder_1");
  EXPECT_THAT(a->Describe(), HasSubstr("held by \"intruder_1\""));
  EXPECT_EQ(changes_, (std::vector<std::string>{"host-a:leader", "host-a:follower"}));

  // The intruder never renews: after the lease duration a takes it back, as a new transition.
  clock_.Advance(absl::Seconds(15));
  a->Step();
  EXPECT_TRUE(a->IsLeader());
  EXPECT_EQ(Get().lease_transitions, 1);
}

TEST_F(LeaderTest, RenewalsFailingForTheRenewDeadlineEndLeadershipThenItIsRegained) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  a->Step();
  ASSERT_TRUE(a->IsLeader());
  const kube::Lease before = Get();
  const absl::Time t0 = clock_.Now();

  FailRequests({"get", "update"});
  for (int s = 2; s <= 8; s += 2) {
    clock_.Set(t0 + absl::Seconds(s));
    a->Step();
    EXPECT_TRUE(a->IsLeader()) << "within the renew deadline at +" << s << "s";
  }
  EXPECT_GT(a->status().errors, 0u);
  EXPECT_THAT(a->Describe(), HasSubstr("last error"));
  clock_.Set(t0 + absl::Seconds(10));
  EXPECT_FALSE(a->IsLeader()) << "the clock alone ends it, before the next round";
  a->Step();
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->generation(), 2u);

  // The API server answers again and nobody else took the Lease: a renews it as the same
  // holder (acquireTime and transitions kept).
  FailRequests({});
  clock_.Advance(absl::Seconds(2));
  a->Step();
  EXPECT_TRUE(a->IsLeader());
  kube::Lease after = Get();
  EXPECT_EQ(after.holder_identity, before.holder_identity);
  EXPECT_EQ(after.acquire_time, before.acquire_time);
  EXPECT_EQ(after.lease_transitions, 0);
}

TEST_F(LeaderTest, StopReleasesTheLeaseAndAFollowerTakesOverAtOnce) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  Elector* b = New(LeaderMode::kLease, "host-b");
  a->Step();
  b->Step();
  ASSERT_TRUE(a->IsLeader());
  a->Stop();
  EXPECT_FALSE(a->IsLeader());
  kube::Lease released = Get();
  EXPECT_EQ(released.holder_identity, "");
  EXPECT_EQ(released.lease_duration_seconds, 1);
  EXPECT_EQ(released.lease_transitions, 0);

  clock_.Advance(absl::Milliseconds(100));  // far less than any expiry
  b->Step();
  EXPECT_TRUE(b->IsLeader());
  EXPECT_EQ(Get().lease_transitions, 1);
  a->Step();  // a stopped elector does nothing
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(Get().holder_identity, b->status().identity);
}

TEST_F(LeaderTest, TwoElectorsRacingForAMissingLeaseProduceOneLeader) {
  Elector* a = New(LeaderMode::kLease, "host-a");
  Elector* b = New(LeaderMode::kLease, "host-b");
  // Whatever the interleaving of their rounds, one holds the Lease and the other follows.
  a->Step();
  b->Step();
  EXPECT_NE(a->IsLeader(), b->IsLeader());
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(2));
    a->Step();
    b->Step();
    EXPECT_NE(a->IsLeader(), b->IsLeader());
  }
}

// ---- follow mode: the kube-scheduler's Lease ---------------------------------------------------

TEST_F(LeaderTest, FollowLeadsWhileTheLeaseNamesThisHostAndHasNotExpired) {
  Elector* e = New(LeaderMode::kFollow, "sched-1");
  EXPECT_FALSE(e->IsLeader()) << "nothing read yet";
  EXPECT_THAT(e->Describe(), HasSubstr("not read yet"));

  // No Lease at all: no election to follow, so this replica leads.
  e->Step();
  EXPECT_TRUE(e->IsLeader());
  EXPECT_THAT(e->Describe(), HasSubstr("not found"));

  // The co-located kube-scheduler on another host leads.
  SchedulerWrites("sched-2_8f1d", clock_.Now());
  e->Step();
  EXPECT_FALSE(e->IsLeader());
  // A host whose name only starts with ours is not us.
  SchedulerWrites("sched-10_77aa", clock_.Now());
  e->Step();
  EXPECT_FALSE(e->IsLeader());

  // Ours leads: renewed now, 15 s.
  const absl::Time t = clock_.Now();
  SchedulerWrites("sched-1_0b3c", t);
  e->Step();
  EXPECT_TRUE(e->IsLeader());
  EXPECT_THAT(e->Describe(), HasSubstr("leader (follows the kube-scheduler Lease"));

  // It stops renewing: leadership ends when renewTime + 15 s passes, without another read.
  clock_.Set(t + absl::Seconds(14));
  EXPECT_TRUE(e->IsLeader());
  clock_.Set(t + absl::Seconds(15));
  EXPECT_FALSE(e->IsLeader());
  e->Step();
  EXPECT_FALSE(e->IsLeader());
  EXPECT_THAT(e->Describe(), HasSubstr("expired"));

  // A stopping kube-scheduler releases it (empty holder): nobody leads until one acquires.
  SchedulerWrites("", clock_.Now(), 1);
  e->Step();
  EXPECT_FALSE(e->IsLeader());
  SchedulerWrites("sched-1_99", clock_.Now());
  e->Step();
  EXPECT_TRUE(e->IsLeader());

  EXPECT_EQ(changes_,
            (std::vector<std::string>{"sched-1:leader", "sched-1:follower", "sched-1:leader",
                                      "sched-1:follower", "sched-1:leader"}));
}

TEST_F(LeaderTest, FollowKeepsTheLastLeaseWhenTheApiFailsAndItStillExpires) {
  Elector* e = New(LeaderMode::kFollow, "sched-1");
  const absl::Time t = clock_.Now();
  SchedulerWrites("sched-1_abc", t, 5);
  e->Step();
  ASSERT_TRUE(e->IsLeader());
  FailRequests({"get"});
  clock_.Advance(absl::Seconds(2));
  e->Step();
  EXPECT_TRUE(e->IsLeader()) << "an unreadable Lease is not a lost one";
  EXPECT_EQ(e->status().errors, 1u);
  clock_.Set(t + absl::Seconds(5));
  e->Step();
  EXPECT_FALSE(e->IsLeader()) << "but its expiry still counts";
}

TEST_F(LeaderTest, FollowUsesTheConfiguredDurationWhenTheLeaseHasNone) {
  Elector* e = New(LeaderMode::kFollow, "sched-1");
  kube::Lease lease;
  lease.meta.ns = kNs;
  lease.meta.name = kName;
  lease.holder_identity = "sched-1_x";
  lease.renew_time = Micro(clock_.Now());
  ASSERT_TRUE(client_->CreateLease(lease).ok());
  e->Step();
  EXPECT_TRUE(e->IsLeader());
  clock_.Advance(absl::Seconds(15));  // the default lease_duration
  EXPECT_FALSE(e->IsLeader());
}

// ---- none and the configuration checks ---------------------------------------------------------

TEST_F(LeaderTest, NoneAlwaysLeadsWithoutAClient) {
  ElectorOptions o;
  o.mode = LeaderMode::kNone;
  o.ns = "";
  o.name = "";
  absl::StatusOr<std::unique_ptr<Elector>> e = Elector::Create(nullptr, o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->IsLeader());
  (*e)->Step();
  EXPECT_TRUE((*e)->IsLeader());
  EXPECT_THAT((*e)->Describe(), HasSubstr("leader election off"));
}

TEST_F(LeaderTest, BadConfigurationsAreRefused) {
  auto create = [this](auto adjust) {
    ElectorOptions o;
    o.mode = LeaderMode::kLease;
    o.clock = &clock_;
    adjust(o);
    return Elector::Create(client_, o).status();
  };
  EXPECT_TRUE(create([](ElectorOptions&) {}).ok());
  EXPECT_THAT(create([](ElectorOptions& o) { o.renew_deadline = absl::Seconds(15); }).message(),
              HasSubstr("must be greater than --leader-elect-renew-deadline"));
  EXPECT_THAT(create([](ElectorOptions& o) { o.retry_period = absl::Seconds(9); }).message(),
              HasSubstr("1.2"));
  EXPECT_FALSE(create([](ElectorOptions& o) { o.retry_period = absl::ZeroDuration(); }).ok());
  EXPECT_FALSE(create([](ElectorOptions& o) { o.name = ""; }).ok());
  EXPECT_FALSE(create([](ElectorOptions& o) {
                 o.mode = LeaderMode::kFollow;
                 o.ns = "";
               }).ok());
  // Follow mode does not need renew_deadline < lease_duration.
  EXPECT_TRUE(create([](ElectorOptions& o) {
                o.mode = LeaderMode::kFollow;
                o.renew_deadline = absl::Seconds(30);
              }).ok());
  EXPECT_EQ(*ParseLeaderMode("lease"), LeaderMode::kLease);
  EXPECT_FALSE(ParseLeaderMode("kube").ok());
}

TEST_F(LeaderTest, StartRunsRoundsOnAThreadAndStopReleases) {
  ElectorOptions o;
  o.mode = LeaderMode::kLease;
  o.ns = kNs;
  o.name = kName;
  o.identity = "host-t";
  o.lease_duration = absl::Seconds(2);
  o.renew_deadline = absl::Seconds(1);
  o.retry_period = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<Elector>> e = Elector::Create(client_, o);
  ASSERT_TRUE(e.ok()) << e.status();
  (*e)->Start();
  ASSERT_TRUE(::tessera::testing::Eventually([&] { return (*e)->IsLeader(); }));
  (*e)->Stop();
  EXPECT_FALSE((*e)->IsLeader());
  EXPECT_EQ(Get().holder_identity, "");
}

}  // namespace
}  // namespace tessera::serve

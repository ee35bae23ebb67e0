// RoleLabeler against an in-process apisim (127.0.0.1, port 0), time from a FakeClock: the
// leader labels the scheduler pods of its namespace and nothing else, a second pass writes
// nothing, the labels follow leadership as it moves between replicas (real Electors following
// a kube-scheduler Lease), the schedule (gain, period, informer difference, backoff), and
// failed API calls that are logged and retried without stopping the caller.
#include "tessera/serve/role_labels.h"

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/store.h"
#include "tessera/base/clock.h"
#include "tessera/base/logging.h"
#include "tessera/kube/client.h"
#include "tessera/kube/decode.h"
#include "tessera/serve/leader.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::serve {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr char kNs[] = "kube-system";

const apisim::ResourceInfo& Pods() { return *apisim::FindResource("", "v1", "pods"); }

std::string Micro(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

// A pod with `labels`, in `ns`.
std::string PodJson(const std::string& ns, const std::string& name, nlohmann::json labels) {
  return nlohmann::json{{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
                        {"spec", {{"containers", {{{"name", "c"}, {"image", "x"}}}}}}}
      .dump();
}

nlohmann::json SchedulerLabels() {
  return {{"app.kubernetes.io/name", "tessera"}, {"app.kubernetes.io/component", "hami-scheduler"}};
}

class RoleLabelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(api_.Start({.server = {}, .max_attempts = 2}));
    server_ = api_.server();
    client_ = api_.client();

    // Three replicas of the scheduler (sched-c already labelled as a follower by an earlier
    // leader), an unrelated pod in the same namespace, and a pod with the component label in
    // another namespace.
    Create(kNs, "sched-a", SchedulerLabels());
    Create(kNs, "sched-b", SchedulerLabels());
    nlohmann::json c = SchedulerLabels();
    c["hami.io/scheduler-role"] = "follower";
    Create(kNs, "sched-c", c);
    Create(kNs, "coredns", {{"k8s-app", "kube-dns"}});
    Create("default", "elsewhere", SchedulerLabels());
  }
  void TearDown() override {
    SetLogSink(nullptr);
    labelers_.clear();
    electors_.clear();
    api_.Stop();
  }

  void Create(const std::string& ns, const std::string& name, nlohmann::json labels) {
    absl::StatusOr<std::string> created =
        server_->store().Create(Pods(), ns, PodJson(ns, name, std::move(labels)));
    ASSERT_TRUE(created.ok()) << created.status();
  }

  kube::Pod Get(const std::string& ns, const std::string& name) {
    absl::StatusOr<std::string> json = server_->store().Get(Pods(), ns, name);
    EXPECT_TRUE(json.ok()) << json.status();
    absl::StatusOr<kube::Pod> pod = kube::DecodePod(json.ok() ? *json : "{}");
    EXPECT_TRUE(pod.ok()) << pod.status();
    return pod.ok() ? *pod : kube::Pod{};
  }

  // The label as stored ("-" when absent).
  std::string Role(const std::string& name, const std::string& ns = kNs) {
    const kube::Pod pod = Get(ns, name);
    if (pod.meta.labels.Contains(kSchedulerRoleLabel)) {
      return std::string(pod.meta.labels.Get(kSchedulerRoleLabel));
    }
    return "-";
  }

  // An operator (or another program) sets the label.
  void SetRole(const std::string& name, const std::string& role) {
    ASSERT_TRUE(
        server_->store()
            .Patch(Pods(), kNs, name, "", apisim::PatchType::kMerge,
                   nlohmann::json{{"metadata", {{"labels", {{kSchedulerRoleLabel, role}}}}}}.dump())
            .ok());
  }

  RoleLabeler* New(const std::string& pod_name, bool with_informer = false) {
    RoleLabelOptions o;
    o.pod_name = pod_name;
    o.ns = kNs;
    if (with_informer) {
      // Stands for the pod informer: the stored object, or a frozen copy when one is set.
      o.observed = [this](std::string_view name) -> std::optional<kube::Pod> {
        if (frozen_) {
          return frozen_->meta.name == name ? std::optional<kube::Pod>(*frozen_) : std::nullopt;
        }
        return Get(kNs, std::string(name));
      };
    }
    labelers_.push_back(std::make_unique<RoleLabeler>(client_, o));
    return labelers_.back().get();
  }

  Elector* NewElector(const std::string& identity) {
    ElectorOptions o;
    o.mode = LeaderMode::kFollow;
    o.ns = kNs;
    o.name = "hami-scheduler";
    o.identity = identity;
    o.clock = &clock_;
    absl::StatusOr<std::unique_ptr<Elector>> e = Elector::Create(client_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    electors_.push_back(*std::move(e));
    return electors_.back().get();
  }

  // What a kube-scheduler does when it takes its Lease.
  void LeaseHeldBy(const std::string& holder) {
    kube::Lease lease;
    absl::StatusOr<kube::Lease> old = client_->GetLease(kNs, "hami-scheduler");
    if (old.ok()) {
      lease = *old;
    }
    lease.meta.ns = kNs;
    lease.meta.name = "hami-scheduler";
    lease.holder_identity = holder;
    lease.lease_duration_seconds = 15;
    lease.acquire_time = Micro(clock_.Now());
    lease.renew_time = Micro(clock_.Now());
    ASSERT_TRUE((old.ok() ? client_->UpdateLease(lease) : client_->CreateLease(lease)).ok());
  }

  void FailRequests(std::vector<std::string> verbs) { api_.FailRequests(std::move(verbs)); }

  // Captures the warnings logged from now on (until TearDown).
  std::vector<std::string>* CaptureWarnings() {
    SetLogSink([this](LogSeverity severity, std::string_view line) {
      if (severity == LogSeverity::kWarning) {
        warnings_.emplace_back(line);
      }
    });
    return &warnings_;
  }

  uint64_t Revision() { return server_->store().CurrentRevision(); }

  FakeClock clock_{absl::FromUnixSeconds(1800000000)};
  ::tessera::testing::ApisimEnv api_;
  apisim::Server* server_ = nullptr;
  kube::ApiClient* client_ = nullptr;
  std::vector<std::string> warnings_;
  std::vector<std::unique_ptr<Elector>> electors_;
  std::vector<std::unique_ptr<RoleLabeler>> labelers_;
  std::optional<kube::Pod> frozen_;
};

TEST_F(RoleLabelsTest, TheLeaderLabelsTheSchedulerPodsOfItsNamespaceAndNothingElse) {
  const kube::Pod coredns = Get(kNs, "coredns");
  const kube::Pod elsewhere = Get("default", "elsewhere");
  const std::string c_rv = Get(kNs, "sched-c").meta.resource_version;
  RoleLabeler* a = New("sched-a");
  ASSERT_TRUE(a->enabled());

  const uint64_t before = Revision();
  a->Tick(clock_.Now(), /*leader=*/true, /*generation=*/1);
  EXPECT_EQ(Role("sched-a"), "leader");
  EXPECT_EQ(Role("sched-b"), "follower");
  EXPECT_EQ(Role("sched-c"), "follower");
  // Two writes: sched-c was already right.
  EXPECT_EQ(Revision(), before + 2);
  EXPECT_EQ(Get(kNs, "sched-c").meta.resource_version, c_rv);
  // Pods without the component label, and scheduler pods of other namespaces, are not touched.
  EXPECT_EQ(Get(kNs, "coredns").meta.resource_version, coredns.meta.resource_version);
  EXPECT_EQ(Role("coredns"), "-");
  EXPECT_EQ(Get("default", "elsewhere").meta.resource_version, elsewhere.meta.resource_version);
  EXPECT_EQ(Role("elsewhere", "default"), "-");
  const RoleLabelStats s = a->stats();
  EXPECT_EQ(s.passes, 1u);
  EXPECT_EQ(s.patches, 2u);
  EXPECT_EQ(s.unchanged, 1u);
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.last_error, "");
  EXPECT_EQ(s.roles, (std::map<std::string, std::string>{
                         {"sched-a", "leader"}, {"sched-b", "follower"}, {"sched-c", "follower"}}));

  // A second pass finds every label right and writes nothing.
  EXPECT_TRUE(a->Pass(clock_.Now()));
  EXPECT_EQ(Revision(), before + 2);
  EXPECT_EQ(a->stats().patches, 2u);
  EXPECT_EQ(a->stats().unchanged, 4u);
}

TEST_F(RoleLabelsTest, OtherLabelsOfThePodAreKept) {
  RoleLabeler* a = New("sched-a");
  a->Tick(clock_.Now(), true, 1);
  absl::StatusOr<std::string> json = server_->store().Get(Pods(), kNs, "sched-a");
  ASSERT_TRUE(json.ok());
  const nlohmann::json labels = nlohmann::json::parse(*json)["metadata"]["labels"];
  EXPECT_EQ(labels, (nlohmann::json{{"app.kubernetes.io/name", "tessera"},
                                    {"app.kubernetes.io/component", "hami-scheduler"},
                                    {"hami.io/scheduler-role", "leader"}}));
}

TEST_F(RoleLabelsTest, AFollowerOrADisabledLabelerWritesNothing) {
  const uint64_t before = Revision();
  RoleLabeler* b = New("sched-b");
  for (int i = 0; i < 3; ++i) {
    b->Tick(clock_.Now(), /*leader=*/false, 1);
    clock_.Advance(absl::Minutes(2));
  }
  EXPECT_EQ(b->stats().passes, 0u);

  RoleLabeler* nameless = New("");
  EXPECT_FALSE(nameless->enabled());
  nameless->Tick(clock_.Now(), true, 1);
  EXPECT_EQ(nameless->stats().passes, 0u);

  RoleLabelOptions off;
  off.enabled = false;
  off.pod_name = "sched-a";
  off.ns = kNs;
  RoleLabeler disabled(client_, off);
  EXPECT_FALSE(disabled.enabled());
  disabled.Tick(clock_.Now(), true, 1);
  EXPECT_EQ(disabled.stats().passes, 0u);
  EXPECT_EQ(Revision(), before);
  EXPECT_EQ(Role("sched-a"), "-");
}

// Three replicas, each with its elector following the kube-scheduler Lease and its labeler,
// ticked as the housekeeping loop does: the labels move with the Lease.
TEST_F(RoleLabelsTest, LabelsFollowLeadershipAcrossLossAndRegain) {
  const std::vector<std::string> names = {"sched-a", "sched-b", "sched-c"};
  std::vector<Elector*> electors;
  std::vector<RoleLabeler*> labelers;
  for (const std::string& n : names) {
    electors.push_back(NewElector(n));
    labelers.push_back(New(n));
  }
  auto round = [&] {
    for (size_t i = 0; i < names.size(); ++i) {
      electors[i]->Step();
      labelers[i]->Tick(clock_.Now(), electors[i]->IsLeader(), electors[i]->generation());
    }
    clock_.Advance(absl::Seconds(1));
  };
  auto roles = [&] { return Role("sched-a") + " " + Role("sched-b") + " " + Role("sched-c"); };

  LeaseHeldBy("sched-a_1");
  round();
  EXPECT_EQ(roles(), "leader follower follower");

  LeaseHeldBy("sched-b_2");  // sched-a's kube-scheduler lost its Lease
  round();
  EXPECT_EQ(roles(), "follower leader follower");
  EXPECT_FALSE(electors[0]->IsLeader());

  LeaseHeldBy("sched-a_3");  // and regained it
  round();
  EXPECT_EQ(roles(), "leader follower follower");

  // Steady state: further rounds (within the period) write nothing.
  const uint64_t before = Revision();
  for (int i = 0; i < 10; ++i) {
    round();
  }
  EXPECT_EQ(Revision(), before);
  EXPECT_EQ(labelers[0]->stats().passes, 2u);  // its two gains
  EXPECT_EQ(labelers[1]->stats().passes, 1u);
  EXPECT_EQ(labelers[2]->stats().passes, 0u);
}

TEST_F(RoleLabelsTest, APassIsDueOnGainEveryPeriodAndWhenTheInformerShowsADifference) {
  RoleLabeler* a = New("sched-a", /*with_informer=*/true);
  const absl::Time t0 = clock_.Now();
  a->Tick(t0, true, 1);
  ASSERT_EQ(a->stats().passes, 1u);
  a->Tick(t0 + absl::Seconds(1), true, 1);
  a->Tick(t0 + absl::Seconds(30), true, 1);
  EXPECT_EQ(a->stats().passes, 1u) << "nothing due within the period";

  // Someone else writes the label: the informer shows it; a pass puts it back, no sooner than
  // min_interval after the last one.
  SetRole("sched-b", "leader");
  a->Tick(t0 + absl::Seconds(31), true, 1);
  EXPECT_EQ(a->stats().passes, 2u);
  EXPECT_EQ(Role("sched-b"), "follower");
  SetRole("sched-b", "");
  a->Tick(t0 + absl::Seconds(33), true, 1);
  EXPECT_EQ(a->stats().passes, 2u) << "min_interval";
  a->Tick(t0 + absl::Seconds(36), true, 1);
  EXPECT_EQ(a->stats().passes, 3u);
  EXPECT_EQ(Role("sched-b"), "follower");

  // A replica created later (a rolling update) is labelled at the next periodic pass.
  Create(kNs, "sched-d", SchedulerLabels());
  a->Tick(t0 + absl::Seconds(60), true, 1);
  EXPECT_EQ(Role("sched-d"), "-");
  a->Tick(t0 + absl::Seconds(96), true, 1);
  EXPECT_EQ(a->stats().passes, 4u);
  EXPECT_EQ(Role("sched-d"), "follower");

  // A lost and regained leadership between two ticks (the generation moved by two) is a gain.
  a->Tick(t0 + absl::Seconds(97), true, 3);
  EXPECT_EQ(a->stats().passes, 5u);
  // A follower's ticks do nothing; leading again is a gain.
  a->Tick(t0 + absl::Seconds(98), false, 4);
  a->Tick(t0 + absl::Seconds(300), false, 4);
  EXPECT_EQ(a->stats().passes, 5u);
  a->Tick(t0 + absl::Seconds(301), true, 5);
  EXPECT_EQ(a->stats().passes, 6u);
}

TEST_F(RoleLabelsTest, TheInformerNotYetShowingOurOwnPatchIsNoDifference) {
  frozen_ = Get(kNs, "sched-b");  // the informer's copy from before the pass
  RoleLabeler* a = New("sched-a", /*with_informer=*/true);
  const absl::Time t0 = clock_.Now();
  a->Tick(t0, true, 1);
  ASSERT_EQ(Role("sched-b"), "follower");
  a->Tick(t0 + absl::Seconds(10), true, 1);
  EXPECT_EQ(a->stats().passes, 1u);
  // The informer then shows a newer version with another role: a difference.
  SetRole("sched-b", "leader");
  frozen_ = Get(kNs, "sched-b");
  a->Tick(t0 + absl::Seconds(11), true, 1);
  EXPECT_EQ(a->stats().passes, 2u);
  EXPECT_EQ(Role("sched-b"), "follower");
}

TEST_F(RoleLabelsTest, FailedPatchesAreLoggedCountedAndRetriedWithBackoff) {
  std::vector<std::string>& warnings = *CaptureWarnings();
  RoleLabeler* a = New("sched-a", /*with_informer=*/true);
  FailRequests({"patch"});
  const absl::Time t0 = clock_.Now();
  a->Tick(t0, true, 1);  // returns: the failure does not block
  RoleLabelStats s = a->stats();
  EXPECT_EQ(s.passes, 1u);
  EXPECT_EQ(s.patches, 0u);
  EXPECT_EQ(s.failures, 2u);
  EXPECT_EQ(s.consecutive_failed_passes, 1u);
  EXPECT_THAT(s.last_error, HasSubstr("setting hami.io/scheduler-role=follower on pod "
                                      "kube-system/sched-b: "));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0], HasSubstr("role labels: setting hami.io/scheduler-role=leader on pod "
                                     "kube-system/sched-a: "));
  EXPECT_THAT(warnings[0], HasSubstr("500"));
  EXPECT_EQ(Role("sched-a"), "-");

  // Retried after min_interval (5 s), then 10 s, ...: the informer's difference does not
  // hurry it. The same errors are not logged again.
  a->Tick(t0 + absl::Seconds(4), true, 1);
  EXPECT_EQ(a->stats().passes, 1u);
  a->Tick(t0 + absl::Seconds(5), true, 1);
  EXPECT_EQ(a->stats().passes, 2u);
  EXPECT_EQ(a->stats().consecutive_failed_passes, 2u);
  a->Tick(t0 + absl::Seconds(14), true, 1);
  EXPECT_EQ(a->stats().passes, 2u);
  EXPECT_EQ(warnings.size(), 2u);

  // The API server lets the patches through again: the next retry labels them.
  FailRequests({});
  a->Tick(t0 + absl::Seconds(15), true, 1);
  s = a->stats();
  EXPECT_EQ(s.passes, 3u);
  EXPECT_EQ(s.consecutive_failed_passes, 0u);
  EXPECT_EQ(s.last_error, "");
  EXPECT_EQ(Role("sched-a"), "leader");
  EXPECT_EQ(Role("sched-b"), "follower");
}

TEST_F(RoleLabelsTest, AFailedListIsLoggedAndRetried) {
  std::vector<std::string>& warnings = *CaptureWarnings();
  RoleLabeler* a = New("sched-a");
  FailRequests({"list"});
  const absl::Time t0 = clock_.Now();
  EXPECT_FALSE(a->Pass(t0));
  EXPECT_THAT(a->stats().last_error,
              HasSubstr("listing the pods app.kubernetes.io/component=hami-scheduler in "
                        "namespace kube-system: "));
  EXPECT_THAT(warnings, Contains(HasSubstr("role labels: listing the pods")));
  FailRequests({});
  a->Tick(t0 + absl::Seconds(5), true, 1);  // a gain anyway; and the retry is due
  EXPECT_EQ(Role("sched-a"), "leader");
  EXPECT_EQ(a->stats().failures, 1u);
}

TEST_F(RoleLabelsTest, AReplicaWhosePodIsNotListedLabelsTheOthersAndSaysSo) {
  std::vector<std::string>& warnings = *CaptureWarnings();
  RoleLabeler* x = New("not-a-scheduler-pod");
  x->Tick(clock_.Now(), true, 1);
  EXPECT_EQ(Role("sched-a"), "follower");
  EXPECT_EQ(Role("sched-b"), "follower");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("this replica's pod kube-system/not-a-scheduler-pod "
                                     "($POD_NAME) is not among the pods labelled "
                                     "app.kubernetes.io/component=hami-scheduler"));
  x->Pass(clock_.Now());
  EXPECT_EQ(warnings.size(), 1u) << "said once";
}

}  // namespace
}  // namespace tessera::serve

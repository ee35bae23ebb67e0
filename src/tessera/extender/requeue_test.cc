// The requeue of refused pods when capacity frees (requeue.h, issue #35): what counts as a gain,
// which pods are picked for it and in what order, and the writes on a real (simulated) API
// server — one per pick, rate-limited, never repeated while the pick is held.
#include "tessera/extender/requeue.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#include "tessera/apisim/store.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/event_recorder.h"
#include "tessera/kube/decode.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::unique_ptr<device::Vendor> Nvidia() {
  return device::NewNvidiaVendor(device::DefaultNvidiaConfig());
}

// Pod ml/<name> (uid "uid-<name>") asking one GPU of `mem` MiB, at `priority`.
std::shared_ptr<const kube::Pod> GpuPod(const std::string& name, const std::string& mem,
                                        int32_t priority = 0, const std::string& ns = "ml") {
  auto pod = std::make_shared<kube::Pod>();
  pod->meta.ns = ns;
  pod->meta.name = name;
  pod->meta.uid = "uid-" + name;
  pod->priority = priority;
  pod->containers.push_back(::tessera::testing::GpuContainer("main", "1", mem, ""));
  return pod;
}

ledger::PodAllocation Holder(const std::string& name, const std::string& node,
                             const std::string& uuid, int32_t mem, const std::string& ns = "ml") {
  ledger::PodAllocation a;
  a.uid = "uid-" + name;
  a.ns = ns;
  a.name = name;
  a.node = a.bound_node = node;
  a.devices = {{{uuid, "NVIDIA", mem, 0}}};
  return a;
}

kube::ResourceQuota GpumemQuota(const std::string& limit) {
  return ::tessera::testing::GpuMemQuota("ml", "gpu", limit);
}

std::vector<std::string> Names(const std::vector<Requeue>& picks) {
  std::vector<std::string> out;
  for (const Requeue& r : picks) {
    out.push_back(r.pod->meta.name + "@" + r.node);
  }
  return out;
}

// Nodes n1 (GPU-1) and n2 (GPU-2), one 16384 MiB card each, both full (ml/a on GPU-1, ml/b on
// GPU-2, 16000 MiB each).
class RequeueRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-2"})).ok());
    ASSERT_TRUE(ledger_.Apply(Holder("a", "n1", "GPU-1", 16000)).ok());
    ASSERT_TRUE(ledger_.Apply(Holder("b", "n2", "GPU-2", 16000)).ok());
    EXPECT_THAT(Step().nodes, ElementsAre("n1", "n2"));  // a new view: every node is new
  }
  // Brings view_ up to the ledger and the quotas; where capacity rose.
  Gains Step() { return Advance(ledger_, quotas_.AllLimits(), &view_); }
  std::vector<Requeue> Pick(const Gains& gains,
                            const std::vector<std::shared_ptr<const kube::Pod>>& pods,
                            const std::vector<Requeue>& held = {}, size_t limit = 100) {
    Step();
    return PickRequeues(*vendor_, cycle::Config{.quotas = &quotas_}, gains, pods, held, limit,
                        view_, &tried_all_);
  }

  ledger::Ledger ledger_;
  accounting::QuotaBook quotas_{{}};
  CapacityView view_;
  std::unique_ptr<device::Vendor> vendor_ = Nvidia();
  bool tried_all_ = false;
};

TEST_F(RequeueRulesTest, AFreedDeviceIsAGainAndATakenOneIsNot) {
  EXPECT_TRUE(Step().Empty());
  ASSERT_TRUE(ledger_.Remove("uid-a"));
  Gains gains = Step();
  EXPECT_THAT(gains.nodes, ElementsAre("n1"));
  EXPECT_THAT(gains.namespaces, ElementsAre("ml"));  // its usage fell
  // Taken again, by whoever: no gain.
  ASSERT_TRUE(ledger_.Apply(Holder("c", "n1", "GPU-1", 8000, "other")).ok());
  EXPECT_TRUE(Step().Empty());
  // Less memory on the same card is a gain, with as many pods on it.
  ASSERT_TRUE(ledger_.Apply(Holder("c", "n1", "GPU-1", 4000, "other")).ok());
  gains = Step();
  EXPECT_THAT(gains.nodes, ElementsAre("n1"));
  EXPECT_THAT(gains.namespaces, ElementsAre("other"));
  // Freed and taken again between two rounds: nothing rose.
  ASSERT_TRUE(ledger_.Remove("uid-b"));
  ASSERT_TRUE(ledger_.Apply(Holder("d", "n2", "GPU-2", 16000)).ok());
  EXPECT_TRUE(Step().Empty());
}

TEST_F(RequeueRulesTest, RegistrationHealthCordonAndNewNodesAreGains) {
  // Same registration again (a resync of the node): nothing.
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
  EXPECT_TRUE(Step().Empty());
  // n2 grows a card, n3 registers.
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-2", "GPU-2b"})).ok());
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n3", {"GPU-3"})).ok());
  EXPECT_THAT(Step().nodes, ElementsAre("n2", "n3"));
  // A card healthy again; a cordon lifted.
  auto sick =
      std::make_shared<device::NodeDevices>(*::tessera::testing::GpuNodeDevices("n1", {"GPU-1"}));
  sick->devices[0].health = false;
  ASSERT_TRUE(ledger_.SetNode(sick).ok());
  Step();
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
  EXPECT_THAT(Step().nodes, ElementsAre("n1"));
  auto cordoned =
      std::make_shared<device::NodeDevices>(*::tessera::testing::GpuNodeDevices("n1", {"GPU-1"}));
  cordoned->cordoned = {"GPU-1"};
  ASSERT_TRUE(ledger_.SetNode(cordoned).ok());
  Step();
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
  EXPECT_THAT(Step().nodes, ElementsAre("n1"));
  // A node removed is no node's gain, and leaves the view (whether the ledger keeps its slot or
  // not). Its pods no longer count in their namespace's usage: ml gained quota room.
  ASSERT_TRUE(ledger_.RemoveNode("n3"));
  ASSERT_TRUE(ledger_.RemoveNode("n2"));  // b still holds GPU-2: the slot stays
  const Gains gains = Step();
  EXPECT_THAT(gains.nodes, IsEmpty());
  EXPECT_THAT(gains.namespaces, ElementsAre("ml"));
  ASSERT_EQ(view_.nodes.size(), 1U);
  EXPECT_EQ(view_.nodes[0].first, "n1");
}

// A MIG card with all seven 1g.5gb instances held; one released (its pod deleted while the
// event was lost, then repaired): the node gained, and a pod that fits the instance is picked.
TEST_F(RequeueRulesTest, AReleasedMigInstanceIsAGainOfItsNode) {
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::MigNodeDevices("m1", {"GPU-m0"})).ok());
  for (uint32_t i = 0; i < 7; ++i) {
    ledger::PodAllocation held = Holder("r" + std::to_string(i), "m1", "GPU-m0", 4864);
    held.devices[0][0].usedcores = 15;
    device::MigAllocation a;
    a.gpu_uuid = "GPU-m0";
    a.profile = "1g.5gb";
    a.placement = {i, 1};
    held.mig = {a};
    ASSERT_TRUE(ledger_.Apply(held).ok());
  }
  EXPECT_THAT(Step().nodes, ElementsAre("m1"));  // new to the view
  const std::vector<std::shared_ptr<const kube::Pod>> pods = {GpuPod("small", "4000")};
  EXPECT_THAT(Pick(Gains{.nodes = {"m1"}, .namespaces = {}}, pods), IsEmpty());  // full
  ASSERT_TRUE(ledger_.Remove("uid-r3"));
  const Gains gains = Step();
  EXPECT_THAT(gains.nodes, ElementsAre("m1"));
  EXPECT_THAT(Names(Pick(gains, pods)), ElementsAre("small@m1"));
}

TEST_F(RequeueRulesTest, AQuotaRaisedOrRemovedIsAGainOfItsNamespace) {
  quotas_.Upsert(GpumemQuota("8000"));
  Step();
  quotas_.Upsert(GpumemQuota("4000"));
  EXPECT_TRUE(Step().Empty());  // lowered
  quotas_.Upsert(GpumemQuota("9000"));
  EXPECT_THAT(Step().namespaces, ElementsAre("ml"));
  quotas_.Remove("ml", "gpu");
  EXPECT_THAT(Step().namespaces, ElementsAre("ml"));
}

TEST_F(RequeueRulesTest, OneFreedCardWakesTheHighestPriorityPodThatFits) {
  ASSERT_TRUE(ledger_.Remove("uid-a"));
  const Gains gains{.nodes = {"n1"}, .namespaces = {}};
  const std::vector<std::shared_ptr<const kube::Pod>> pods = {
      GpuPod("low", "16000", 0), GpuPod("high", "16000", 100), GpuPod("mid", "16000", 50),
      GpuPod("huge", "20000", 1000)};  // asks more than any card has: never picked
  EXPECT_THAT(Names(Pick(gains, pods)), ElementsAre("high@n1"));
  EXPECT_TRUE(tried_all_);
  // Room for two 8000 MiB pods: the second pick sees the first one's share.
  const std::vector<std::shared_ptr<const kube::Pod>> halves = {
      GpuPod("h1", "8000"), GpuPod("h2", "8000"), GpuPod("h3", "8000")};
  EXPECT_THAT(Names(Pick(gains, halves)), ElementsAre("h1@n1", "h2@n1"));
  // A pick still held (requeued a moment ago, not yet bound) keeps its share.
  const std::vector<Requeue> held = {
      Requeue{GpuPod("h0", "8000"), "n1", {{{"GPU-1", "NVIDIA", 8000, 0}}}}};
  EXPECT_THAT(Names(Pick(gains, halves, held)), ElementsAre("h1@n1"));
  // The limit: one pick, and not everyone had a turn.
  EXPECT_THAT(Names(Pick(gains, halves, {}, 1)), ElementsAre("h1@n1"));
  EXPECT_FALSE(tried_all_);
}

TEST_F(RequeueRulesTest, OnlyGainedNodesAreTriedUnlessTheNamespaceGained) {
  ASSERT_TRUE(ledger_.Remove("uid-a"));
  const std::vector<std::shared_ptr<const kube::Pod>> pods = {GpuPod("p", "8000")};
  // Capacity rose on n2 only (say, a registration change): n1's free card is not looked at.
  EXPECT_THAT(Pick(Gains{.nodes = {"n2"}, .namespaces = {}}, pods), IsEmpty());
  // The pod's namespace gained (its quota was raised): every node is.
  EXPECT_THAT(Names(Pick(Gains{.nodes = {}, .namespaces = {"ml"}}, pods)), ElementsAre("p@n1"));
  EXPECT_THAT(Pick(Gains{.nodes = {}, .namespaces = {"other"}}, pods), IsEmpty());
}

TEST_F(RequeueRulesTest, TheQuotaIsCheckedAndEachPickCountsAgainstIt) {
  ASSERT_TRUE(ledger_.Remove("uid-a"));
  ASSERT_TRUE(ledger_.Remove("uid-b"));
  quotas_.Upsert(GpumemQuota("12000"));
  const Gains gains{.nodes = {"n1", "n2"}, .namespaces = {"ml"}};
  // Two cards free, but the namespace may hold 12000 MiB: one 8000 MiB pod, not two.
  EXPECT_THAT(Names(Pick(gains, {GpuPod("q1", "8000"), GpuPod("q2", "8000")})),
              ElementsAre("q1@n1"));
  // A pod of another namespace is not bound by ml's quota.
  EXPECT_THAT(Names(Pick(gains, {GpuPod("q1", "8000"), GpuPod("o", "8000", 0, "other")})),
              ElementsAre("q1@n1", "o@n1"));
}

TEST_F(RequeueRulesTest, APodWithoutADeviceRequestOrWithABadOneIsNotPicked) {
  ASSERT_TRUE(ledger_.Remove("uid-a"));
  auto plain = std::make_shared<kube::Pod>(*GpuPod("plain", "8000"));
  plain->containers[0].limits = {};
  auto bad = std::make_shared<kube::Pod>(*GpuPod("bad", "8000"));
  bad->containers[0].limits.Set("nvidia.com/gpumem", "lots");
  EXPECT_THAT(Pick(Gains{.nodes = {"n1"}, .namespaces = {}}, {plain, bad}), IsEmpty());
}

// ---- the writes ------------------------------------------------------------------------------

class RequeuerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.Start();
    env_.Create("namespaces", "", R"({"metadata":{"name":"ml"}})");
    events_ = std::make_unique<EventRecorder>(EventRecorder::Options{}, env_.client(), &clock_);
    verdicts_ =
        std::make_unique<VerdictWriter>(VerdictWriter::Options{}, env_.client(), events_.get());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
    // The card is held by a filter's reservation that will never be followed by a bind.
    ASSERT_TRUE(ledger_
                    .Reserve("uid-a", "ml", "a", "n1", {{{"GPU-1", "NVIDIA", 16000, 0}}},
                             clock_.Now() + absl::Minutes(1))
                    .ok());
  }
  // Creates pending pod ml/<name> asking one GPU of `mem` MiB, refused (its verdict offered).
  void Refused(const std::string& name, const std::string& mem, int priority = 0) {
    nlohmann::json pod = {
        {"metadata", {{"name", name}, {"namespace", "ml"}}},
        {"spec",
         {{"priority", priority},
          {"containers",
           {{{"name", "main"},
             {"image", "x"},
             {"resources",
              {{"limits", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", mem}}}}}}}}}}};
    absl::StatusOr<std::string> created =
        env_.store().Create(*apisim::FindResource("", "v1", "pods"), "ml", pod.dump());
    ASSERT_TRUE(created.ok()) << created.status() << pod.dump();
    absl::StatusOr<kube::Pod> decoded = kube::DecodePod(*created);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    pods_[decoded->meta.uid] = std::make_shared<kube::Pod>(*decoded);
    verdicts_->Offer(decoded->meta, decoded->meta.resource_version, "CardInsufficientMemory",
                     R"({"reason":"CardInsufficientMemory"})");
    verdicts_->Flush();
  }
  // Pod ml/<name>, created by Refused, refused again (the same verdict).
  void RefusedAgain(const std::string& name) {
    for (const auto& [uid, pod] : pods_) {
      if (pod->meta.name == name) {
        verdicts_->Offer(pod->meta, pod->meta.resource_version, "CardInsufficientMemory",
                         R"({"reason":"CardInsufficientMemory"})");
      }
    }
  }
  // The pod's tessera.io/requeue as the API server stores it ("" when absent).
  std::string RequeueOf(const std::string& name) {
    absl::StatusOr<std::string> pod =
        env_.store().Get(*apisim::FindResource("", "v1", "pods"), "ml", name);
    EXPECT_TRUE(pod.ok()) << pod.status();
    if (!pod.ok()) {
      return "";
    }
    const nlohmann::json annotations =
        nlohmann::json::parse(*pod)["metadata"].value("annotations", nlohmann::json::object());
    return annotations.value(std::string(device::kRequeueAnnotation), "");
  }
  Requeuer MakeRequeuer(Requeuer::Options options = {}) {
    return Requeuer(options, Requeuer::Parts{.vendor = vendor_.get(),
                                             .ledger = &ledger_,
                                             .quotas = &quotas_,
                                             .verdicts = verdicts_.get(),
                                             .pod =
                                                 [this](std::string_view uid) {
                                                   auto it = pods_.find(std::string(uid));
                                                   return it == pods_.end() ? nullptr : it->second;
                                                 },
                                             .client = env_.client(),
                                             .clock = &clock_});
  }

  ::tessera::testing::ApisimEnv env_;
  FakeClock clock_;
  ledger::Ledger ledger_;
  accounting::QuotaBook quotas_{{}};
  std::unique_ptr<device::Vendor> vendor_ = Nvidia();
  std::unique_ptr<EventRecorder> events_;
  std::unique_ptr<VerdictWriter> verdicts_;
  std::map<std::string, std::shared_ptr<const kube::Pod>> pods_;
};

TEST_F(RequeuerTest, AnExpiredReservationRequeuesTheRefusedPodOnce) {
  Refused("waiting", "16000");
  Requeuer requeuer = MakeRequeuer();
  requeuer.Round();  // the first view
  requeuer.Round();
  EXPECT_EQ(RequeueOf("waiting"), "");  // nothing freed yet
  clock_.Advance(absl::Minutes(2));
  ASSERT_THAT(ledger_.ExpireReservations(clock_.Now()), ::testing::SizeIs(1));
  requeuer.Round();
  EXPECT_EQ(RequeueOf("waiting"), "2026-01-01T00:02:00.000000Z");
  EXPECT_EQ(requeuer.counts().requeued, 1U);
  // Nothing more changes: no second write, even while the pod stays pending.
  clock_.Advance(absl::Seconds(1));
  requeuer.Round();
  EXPECT_EQ(RequeueOf("waiting"), "2026-01-01T00:02:00.000000Z");
  EXPECT_EQ(requeuer.counts().requeued, 1U);
}

// A limit that comes and goes between two rounds leaves both views without it; the pod it
// refused in between is still requeued (the flaky serve test of stop 47: the first view was
// taken before the quota informer had listed).
TEST_F(RequeuerTest, AQuotaThatCameAndWentBetweenTwoRoundsStillRequeuesItsPod) {
  ASSERT_TRUE(ledger_.Release("uid-a"));
  Requeuer requeuer = MakeRequeuer();
  requeuer.Round();  // the first view: no limit
  quotas_.Upsert(GpumemQuota("5000"));
  Refused("over", "6000");
  quotas_.Remove("ml", "gpu");
  requeuer.Round();
  EXPECT_EQ(RequeueOf("over"), "2026-01-01T00:00:00.000000Z");
  // A limit that only came (or fell) is no gain.
  quotas_.Upsert(GpumemQuota("5000"));
  clock_.Advance(absl::Minutes(1));
  Refused("later", "6000");
  requeuer.Round();
  EXPECT_EQ(RequeueOf("later"), "");
  EXPECT_EQ(requeuer.counts().requeued, 1U);
}

// A filter reads the ledger, then offers its refusal; a round in between takes the gain while
// the pod is not yet refused. The next round still tries it against that gain.
TEST_F(RequeuerTest, ARefusalOfferedAfterTheRoundThatSawTheGainIsStillRequeued) {
  Requeuer requeuer = MakeRequeuer();
  requeuer.Round();  // the first view: the card held
  ASSERT_TRUE(ledger_.Release("uid-a"));
  requeuer.Round();          // the gain, and nobody refused yet
  Refused("late", "16000");  // decided before the release
  requeuer.Round();
  EXPECT_EQ(RequeueOf("late"), "2026-01-01T00:00:00.000000Z");
  // Refused again later, with no gain since: not requeued again (held, then nothing gained).
  clock_.Advance(absl::Seconds(11));
  RefusedAgain("late");
  requeuer.Round();
  requeuer.Round();
  EXPECT_EQ(requeuer.counts().requeued, 1U);
}

TEST_F(RequeuerTest, WritesAreRateLimitedAndTheRestFollowInLaterRounds) {
  ASSERT_TRUE(
      ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1", "GPU-2", "GPU-3"})).ok());
  Refused("p1", "16000", 3);
  Refused("p2", "16000", 2);
  Refused("p3", "16000", 1);
  Requeuer requeuer = MakeRequeuer({.qps = 1, .burst = 1});
  requeuer.Round();
  clock_.Advance(absl::Minutes(2));
  ASSERT_THAT(ledger_.ExpireReservations(clock_.Now()), ::testing::SizeIs(1));
  requeuer.Round();
  EXPECT_NE(RequeueOf("p1"), "");
  EXPECT_EQ(RequeueOf("p2"), "");
  requeuer.Round();  // no token yet
  EXPECT_EQ(RequeueOf("p2"), "");
  clock_.Advance(absl::Seconds(1));
  requeuer.Round();  // the gain was carried: p2 now, p1 is held
  EXPECT_NE(RequeueOf("p2"), "");
  EXPECT_EQ(RequeueOf("p3"), "");
  clock_.Advance(absl::Seconds(1));
  requeuer.Round();
  EXPECT_NE(RequeueOf("p3"), "");
  EXPECT_EQ(requeuer.counts().requeued, 3U);
}

TEST_F(RequeuerTest, OffTurnsItOffAndAGonePodIsNotWritten) {
  Refused("waiting", "16000");
  Requeuer off = MakeRequeuer({.qps = 0});
  off.Round();
  ASSERT_TRUE(ledger_.Release("uid-a"));
  off.Round();
  EXPECT_EQ(RequeueOf("waiting"), "");

  ASSERT_TRUE(ledger_
                  .Reserve("uid-a", "ml", "a", "n1", {{{"GPU-1", "NVIDIA", 16000, 0}}},
                           clock_.Now() + absl::Minutes(1))
                  .ok());
  Requeuer on = MakeRequeuer();
  on.Round();
  pods_.clear();  // the informer no longer has it pending
  ASSERT_TRUE(ledger_.Release("uid-a"));
  on.Round();
  EXPECT_EQ(RequeueOf("waiting"), "");
  EXPECT_EQ(on.counts().requeued, 0U);
}

}  // namespace
}  // namespace tessera::extender

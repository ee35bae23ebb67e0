// The resync layer against an in-process apisim whose watch loses events for good (the
// dropWatchEvents fault): real informers over the CurlTransport feed a PodFeed and a ledger; one
// Resyncer pass must repair the store and the ledger, and never undo a newer watch delivery.
#include "tessera/accounting/resyncer.h"

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/accounting/pod_feed.h"
#include "tessera/apisim/server.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/wait.h"

namespace tessera::accounting {
namespace {

using ::tessera::testing::Eventually;
using ::testing::Contains;
using ::testing::HasSubstr;

const apisim::ResourceInfo& Res(const char* name) { return *apisim::FindResource("", "v1", name); }

// A pod bound to node "a" holding `mib` MiB of GPU-a-0.
std::string BoundPod(const std::string& name, int mib = 1000) {
  nlohmann::json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", name},
        {"namespace", "default"},
        {"annotations",
         {{"hami.io/vgpu-node", "a"},
          {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA," + std::to_string(mib) + ",0:;"},
          {"hami.io/bind-phase", "success"}}}}},
      {"spec",
       {{"schedulerName", "hami-scheduler"},
        {"nodeName", "a"},
        {"containers",
         {{{"name", "c"},
           {"image", "cuda"},
           {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}}}}},
      {"status", {{"phase", "Running"}}}};
  return pod.dump();
}

// A pending pod asking for one GPU, not yet decided.
std::string PendingPod(const std::string& name) {
  nlohmann::json pod = {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata", {{"name", name}, {"namespace", "default"}}},
                        {"spec",
                         {{"schedulerName", "hami-scheduler"},
                          {"containers",
                           {{{"name", "c"},
                             {"image", "cuda"},
                             {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}}}}}};
  return pod.dump();
}

std::string PlainNode(const std::string& name) {
  return nlohmann::json({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}})
      .dump();
}

class ResyncerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(env_.Start({.server = {}, .max_attempts = 0}));
    sim_ = env_.server();
    client_ = env_.client();
  }

  void TearDown() override {
    resyncer_.reset();
    if (pods_ != nullptr) {
      pods_->Stop();
    }
    if (nodes_ != nullptr) {
      nodes_->Stop();
    }
  }

  void StartInformers() {
    kube::Informer<kube::Pod>::Options po;
    po.name = "pods";
    pods_ = std::make_unique<kube::Informer<kube::Pod>>(client_, po, feed_.Handlers());
    kube::Informer<kube::Node>::Options no;
    no.name = "nodes";
    kube::EventHandlers<kube::Node> nh;
    nh.on_delete = [this](const kube::Node& n, bool unknown) {
      if (unknown) {
        MutexLock lock(&mu_);
        node_tombstones_.insert(n.meta.name);
      }
    };
    nodes_ = std::make_unique<kube::Informer<kube::Node>>(client_, no, std::move(nh));
    pods_->Start();
    nodes_->Start();
    ASSERT_TRUE(pods_->WaitForSync(absl::Seconds(10)));
    ASSERT_TRUE(nodes_->WaitForSync(absl::Seconds(10)));
    resyncer_ =
        std::make_unique<Resyncer>(client_, pods_.get(), nodes_.get(),
                                   ResyncOptions{.period = absl::ZeroDuration(), .page_size = 2},
                                   [this](const ResyncReport&) { ++reports_; });
  }

  void CreatePod(const std::string& name) {
    ASSERT_TRUE(sim_->store().Create(Res("pods"), "default", BoundPod(name)).ok());
  }
  void DeletePod(const std::string& name) {
    ASSERT_TRUE(
        sim_->store().Delete(Res("pods"), "default", name, R"({"gracePeriodSeconds":0})").ok());
  }
  void DropEvents(const std::string& resource, const std::string& type) {
    apisim::Faults faults;
    faults.drop_watch_events.push_back({.resource = resource, .type = type});
    sim_->store().SetFaults(faults);
  }
  // Creates a marker pod with no fault active and waits until the informer has it: every event
  // before it has then been delivered (or lost for good).
  void Barrier(const std::string& name) {
    sim_->store().SetFaults({});
    ASSERT_TRUE(
        sim_->store()
            .Create(
                Res("pods"), "default",
                R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name +
                    R"(","namespace":"default"},"spec":{"containers":[{"name":"c","image":"x"}]}})")
            .ok());
    ASSERT_TRUE(Eventually([&] { return pods_->store().Get("default/" + name) != nullptr; }));
  }
  // The pods the informer's store holds and the server's, key → "uid rv".
  std::map<std::string, std::string> StorePods() {
    std::map<std::string, std::string> out;
    for (const auto& p : pods_->store().List()) {
      out[p->Key()] = p->meta.uid + " " + p->meta.resource_version;
    }
    return out;
  }
  std::map<std::string, std::string> ServerPods() {
    std::map<std::string, std::string> out;
    absl::StatusOr<kube::PodList> list = client_->ListPods({});
    EXPECT_TRUE(list.ok()) << list.status();
    if (list.ok()) {
      for (const kube::Pod& p : list->items) {
        out[p.Key()] = p.meta.uid + " " + p.meta.resource_version;
      }
    }
    return out;
  }
  // The MiB of GPU memory the ledger's records hold.
  int64_t RecordedMiB() {
    int64_t mib = 0;
    for (const ledger::PodAllocation& p : ledger_.Records()) {
      for (const device::ContainerDevices& c : p.devices) {
        for (const device::ContainerDevice& d : c) {
          mib += d.usedmem;
        }
      }
    }
    return mib;
  }
  // Issue 41 finding 4's cluster: before the snapshot "steady", "changed" and "deleted" are
  // bound with 1,000 MiB each and "waiting" is pending; after it three pods with 5,000 MiB each
  // are created (the phantoms), "changed" gets a label, "deleted" is deleted and "waiting" is
  // decided and bound with 3,000 MiB.
  void RollbackScenario() {
    CreatePod("steady");
    CreatePod("changed");
    CreatePod("deleted");
    ASSERT_TRUE(sim_->store().Create(Res("pods"), "default", PendingPod("waiting")).ok());
    StartInformers();
    sim_->store().Snapshot();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(
          sim_->store()
              .Create(Res("pods"), "default", BoundPod("phantom-" + std::to_string(i), 5000))
              .ok());
    }
    ASSERT_TRUE(sim_->store()
                    .Patch(Res("pods"), "default", "changed", "", apisim::PatchType::kMerge,
                           R"({"metadata":{"labels":{"after":"snapshot"}}})")
                    .ok());
    DeletePod("deleted");
    ASSERT_TRUE(sim_->store()
                    .Patch(Res("pods"), "default", "waiting", "", apisim::PatchType::kMerge,
                           R"({"metadata":{"annotations":{"hami.io/vgpu-node":"a",)"
                           R"("hami.io/vgpu-devices-allocated":"GPU-a-0,NVIDIA,3000,0:;",)"
                           R"("hami.io/bind-phase":"success"}}})")
                    .ok());
    ASSERT_TRUE(sim_->store()
                    .Bind("default", "waiting",
                          R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"waiting"},)"
                          R"("target":{"apiVersion":"v1","kind":"Node","name":"a"}})")
                    .ok());
    ASSERT_TRUE(Eventually([&] { return StorePods() == ServerPods(); }));
    ASSERT_EQ(LedgerPods(), (std::set<std::string>{"steady", "changed", "waiting", "phantom-0",
                                                   "phantom-1", "phantom-2"}));
    ASSERT_EQ(RecordedMiB(), 2000 + 3000 + 15000);
  }
  // After the rollback: the store is the server's, the ledger holds exactly the snapshot's
  // usage, and "waiting" — pending again — can be reserved (scheduled) again.
  void ExpectRolledBack() {
    EXPECT_EQ(StorePods(), ServerPods());
    EXPECT_EQ(pods_->store().Get("default/changed")->meta.labels.Get("after"), "");
    EXPECT_EQ(LedgerPods(), (std::set<std::string>{"steady", "changed", "deleted"}));
    EXPECT_EQ(RecordedMiB(), 3000);
    auto waiting = pods_->store().Get("default/waiting");
    ASSERT_NE(waiting, nullptr);
    EXPECT_EQ(waiting->node_name, "");
    EXPECT_TRUE(ledger_
                    .Reserve(waiting->meta.uid, "default", "waiting", "a",
                             {{{.uuid = "GPU-a-0", .type = "NVIDIA", .usedmem = 3000}}},
                             clock_.Now() + absl::Minutes(1))
                    .ok());
  }

  std::set<std::string> LedgerPods() {
    std::set<std::string> names;
    for (const ledger::PodAllocation& p : ledger_.Records()) {
      names.insert(p.name);
    }
    return names;
  }

  FakeClock clock_;
  ::tessera::testing::ApisimEnv env_;  // apisim, its transport and a client with default retries
  apisim::Server* sim_ = nullptr;
  kube::ApiClient* client_ = nullptr;
  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  PodFeed feed_{vendor_.get(), &ledger_, &clock_};
  std::unique_ptr<kube::Informer<kube::Pod>> pods_;
  std::unique_ptr<kube::Informer<kube::Node>> nodes_;
  std::unique_ptr<Resyncer> resyncer_;
  std::atomic<int> reports_{0};
  Mutex mu_;
  std::set<std::string> node_tombstones_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ResyncerTest, ADeletedEventLostForGoodIsRepairedByOneResync) {
  CreatePod("keep");
  CreatePod("lost");
  StartInformers();
  ASSERT_EQ(LedgerPods(), (std::set<std::string>{"keep", "lost"}));

  DropEvents("pods", "DELETED");
  DeletePod("lost");
  Barrier("marker");
  // The watch never told: the store and the ledger still hold the deleted pod.
  ASSERT_NE(pods_->store().Get("default/lost"), nullptr);
  ASSERT_EQ(LedgerPods(), (std::set<std::string>{"keep", "lost"}));

  ResyncReport report = resyncer_->RunOnce();
  EXPECT_EQ(report.error, "");
  EXPECT_EQ(report.corrections, (std::map<std::string, int64_t>{{"gone", 1}}));
  EXPECT_THAT(report.details, Contains(HasSubstr("pods gone default/lost")));
  EXPECT_EQ(report.pods, 2u);  // keep, marker
  // Pages of 2: 2 pods → 1 page (+ nodes: 1 page).
  EXPECT_EQ(report.requests, 2);
  EXPECT_EQ(pods_->store().Get("default/lost"), nullptr);
  EXPECT_EQ(LedgerPods(), (std::set<std::string>{"keep"}));
  EXPECT_EQ(feed_.stats().tombstones, 1);
  EXPECT_EQ(reports_.load(), 1);
  EXPECT_EQ(resyncer_->last().corrections, report.corrections);

  // A second pass finds nothing left to repair.
  EXPECT_TRUE(resyncer_->RunOnce().corrections.empty());
}

TEST_F(ResyncerTest, LostAddedAndModifiedEventsAreRepairedAcrossPages) {
  for (int i = 0; i < 5; ++i) {
    CreatePod("p" + std::to_string(i));
  }
  StartInformers();
  DropEvents("pods", "ADDED");
  CreatePod("hidden");
  sim_->store().SetFaults({});
  DropEvents("pods", "MODIFIED");
  ASSERT_TRUE(sim_->store()
                  .Patch(Res("pods"), "default", "p3", "", apisim::PatchType::kMerge,
                         R"({"metadata":{"annotations":{"hami.io/bind-phase":"failed"}}})")
                  .ok());
  Barrier("marker");
  ASSERT_EQ(pods_->store().Get("default/hidden"), nullptr);
  ASSERT_EQ(pods_->store().Get("default/p3")->meta.annotations.Get("hami.io/bind-phase"),
            "success");

  ResyncReport report = resyncer_->RunOnce();
  EXPECT_EQ(report.error, "");
  EXPECT_EQ(report.corrections, (std::map<std::string, int64_t>({{"missing", 1}, {"stale", 1}})));
  EXPECT_EQ(report.pods, 7u);
  EXPECT_EQ(report.requests, 4 + 1);  // 7 pods in pages of 2, 1 node page
  ASSERT_NE(pods_->store().Get("default/hidden"), nullptr);
  EXPECT_EQ(pods_->store().Get("default/p3")->meta.annotations.Get("hami.io/bind-phase"), "failed");
  EXPECT_THAT(LedgerPods(), Contains("hidden"));
}

TEST_F(ResyncerTest, AnOldListNeverUndoesANewerWatchDelivery) {
  CreatePod("doomed");
  CreatePod("steady");
  StartInformers();
  absl::StatusOr<kube::PodList> old = client_->ListPods({});
  ASSERT_TRUE(old.ok()) << old.status();
  // After the LIST: one pod deleted, one created, one changed — all delivered by the watch.
  DeletePod("doomed");
  CreatePod("newborn");
  ASSERT_TRUE(sim_->store()
                  .Patch(Res("pods"), "default", "steady", "", apisim::PatchType::kMerge,
                         R"({"metadata":{"labels":{"hami.io/v":"2"}}})")
                  .ok());
  ASSERT_TRUE(Eventually([&] {
    auto steady = pods_->store().Get("default/steady");
    return pods_->store().Get("default/doomed") == nullptr &&
           pods_->store().Get("default/newborn") != nullptr && steady != nullptr &&
           steady->meta.labels.Get("hami.io/v") == "2";
  }));

  std::optional<kube::ReconcileResult> result;
  Mutex mu;
  pods_->Reconcile(old->items, old->meta.resource_version, [&](kube::ReconcileResult r) {
    MutexLock lock(&mu);
    result = std::move(r);
  });
  ASSERT_TRUE(Eventually([&] {
    MutexLock lock(&mu);
    return result.has_value();
  }));
  MutexLock lock(&mu);
  EXPECT_TRUE(result->ran);
  EXPECT_EQ(result->missing + result->stale + result->gone, 0) << result->details.size();
  EXPECT_EQ(pods_->store().Get("default/doomed"), nullptr);
  EXPECT_NE(pods_->store().Get("default/newborn"), nullptr);
  EXPECT_EQ(pods_->store().Get("default/steady")->meta.labels.Get("hami.io/v"), "2");
  EXPECT_EQ(LedgerPods(), (std::set<std::string>{"newborn", "steady"}));
}

TEST_F(ResyncerTest, ANodeDeletedBehindTheWatchIsDeliveredAsATombstone) {
  ASSERT_TRUE(sim_->store().Create(Res("nodes"), "", PlainNode("a")).ok());
  ASSERT_TRUE(sim_->store().Create(Res("nodes"), "", PlainNode("b")).ok());
  StartInformers();
  DropEvents("nodes", "DELETED");
  ASSERT_TRUE(sim_->store().Delete(Res("nodes"), "", "b", "").ok());
  sim_->store().SetFaults({});
  ASSERT_TRUE(sim_->store().Create(Res("nodes"), "", PlainNode("c")).ok());
  ASSERT_TRUE(Eventually([&] { return nodes_->store().Get("c") != nullptr; }));
  ASSERT_NE(nodes_->store().Get("b"), nullptr);

  ResyncReport report = resyncer_->RunOnce();
  EXPECT_EQ(report.corrections, (std::map<std::string, int64_t>{{"gone", 1}}));
  EXPECT_EQ(report.nodes, 2u);
  EXPECT_EQ(nodes_->store().Get("b"), nullptr);
  MutexLock lock(&mu_);
  EXPECT_EQ(node_tombstones_, (std::set<std::string>{"b"}));
}

// Issue 41 finding 4: the API server rolled back (an etcd restore, apisim's restore fault). Its
// restart breaks the watch, and the watch from the lost timeline's revision is answered 504 "Too
// large resource version": the informer relists from the latest state and the relist replaces
// the store — resourceVersions that went backwards, the deleted pod back, the phantoms gone — so
// the ledger holds no phantom usage and the pod pending again can be scheduled.
TEST_F(ResyncerTest, ARollbackOfTheApiServerIsRelistedAndLeavesNoPhantomUsage) {
  ASSERT_NO_FATAL_FAILURE(RollbackScenario());
  ASSERT_TRUE(sim_->store().Restore().ok());
  // The relist comes after the server's 3 s "too large" wait.
  ASSERT_TRUE(Eventually([&] { return StorePods() == ServerPods(); }, absl::Seconds(20)));
  ExpectRolledBack();
  EXPECT_GE(pods_->counters().reflector.rollbacks, 1);
}

// The same with etcdutl's --bump-revision: the watch is answered 410 and relists.
TEST_F(ResyncerTest, ARollbackWithABumpedRevisionIsRelistedToo) {
  ASSERT_NO_FATAL_FAILURE(RollbackScenario());
  ASSERT_TRUE(sim_->store().Restore(1000).ok());
  ASSERT_TRUE(Eventually([&] { return StorePods() == ServerPods(); }, absl::Seconds(20)));
  ExpectRolledBack();
}

// The restored server had already written past the lost timeline's revision when the informer
// watched again: the watch resumes without an error and nothing the informer sees tells. The
// resync's list does (a pod at a smaller resourceVersion than stored though the list is newer,
// a deleted pod listed again): the informer relists instead of trusting the watch's versions.
TEST_F(ResyncerTest, ARollbackTheWatchCannotSeeIsFoundByTheResync) {
  ASSERT_NO_FATAL_FAILURE(RollbackScenario());
  const uint64_t lost = sim_->store().CurrentRevision();
  apisim::Faults faults;  // the informers cannot watch until the server has passed `lost`
  faults.fail_probability = 1;
  faults.fail_code = 429;
  faults.fail_verbs = {"watch"};
  sim_->store().SetFaults(faults);
  ASSERT_TRUE(sim_->store().Restore().ok());
  for (int i = 0; sim_->store().CurrentRevision() <= lost; ++i) {
    ASSERT_TRUE(sim_->store()
                    .Create(Res("pods"), "default",
                            R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"filler-)" +
                                std::to_string(i) +
                                R"("},"spec":{"containers":[{"name":"c","image":"x"}]}})")
                    .ok());
  }
  Barrier("marker");  // the pod watch resumed from `lost` and delivers what follows
  // The watch cannot tell: the fillers at or below `lost` never came, the phantoms stay.
  ASSERT_EQ(pods_->store().Get("default/filler-0"), nullptr);
  ASSERT_NE(pods_->store().Get("default/phantom-0"), nullptr);

  ResyncReport report = resyncer_->RunOnce();
  EXPECT_EQ(report.error, "");
  EXPECT_THAT(report.details, Contains(HasSubstr("pods rollback")));
  ASSERT_TRUE(Eventually([&] { return StorePods() == ServerPods(); }, absl::Seconds(20)));
  ExpectRolledBack();
}

TEST_F(ResyncerTest, ItsThreadRunsPassesEveryPeriodAndStops) {
  StartInformers();
  Resyncer resyncer(client_, pods_.get(), nodes_.get(),
                    ResyncOptions{.period = absl::Milliseconds(50)}, nullptr);
  resyncer.Start();
  DropEvents("pods", "DELETED");
  CreatePod("x");
  ASSERT_TRUE(Eventually([&] { return pods_->store().Get("default/x") != nullptr; }));
  DeletePod("x");
  // The watch lost the delete; the periodic pass finds it.
  EXPECT_TRUE(Eventually([&] { return pods_->store().Get("default/x") == nullptr; }));
  // The store drops the pod before its delete handler updates the ledger.
  EXPECT_TRUE(Eventually([&] { return LedgerPods().empty(); }));
  resyncer.Stop();
  resyncer.Stop();
  EXPECT_NE(resyncer.last().at, absl::InfinitePast());
}

// The API load of one pass, as the API server counts it: ceil(pods / 500) + ceil(nodes / 500)
// LIST requests and nothing else (docs/self-healing.md "API load").
TEST_F(ResyncerTest, APassCostsOneListRequestPer500ObjectsAsTheServerCountsThem) {
  for (int i = 0; i < 1201; ++i) {
    ASSERT_TRUE(
        sim_->store()
            .Create(
                Res("pods"), "default",
                R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p)" + std::to_string(i) +
                    R"(","namespace":"default"},"spec":{"containers":[{"name":"c","image":"x"}]}})")
            .ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(sim_->store().Create(Res("nodes"), "", PlainNode("n" + std::to_string(i))).ok());
  }
  StartInformers();
  auto requests = [&]() -> std::map<std::string, int64_t> {
    kube::Request r;
    r.method = "GET";
    r.path = "/simulator/v1/stats";
    absl::StatusOr<kube::Response> res = kube::Do(*env_.transport(), r);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok()
               ? nlohmann::json::parse(res->body)["requests"].get<std::map<std::string, int64_t>>()
               : std::map<std::string, int64_t>{};
  };
  Resyncer resyncer(client_, pods_.get(), nodes_.get(), ResyncOptions{}, nullptr);
  // Both informers have opened their watch: from now on only the resync sends requests.
  ASSERT_TRUE(Eventually([&] { return requests()["watch"] >= 2; }));
  std::map<std::string, int64_t> before = requests();
  ResyncReport report = resyncer.RunOnce();
  std::map<std::string, int64_t> after = requests();
  EXPECT_EQ(report.error, "");
  EXPECT_TRUE(report.corrections.empty());
  EXPECT_EQ(report.pods, 1201u);
  EXPECT_EQ(report.requests, 3 + 1);
  // Paced: it waited after each of the first two pod pages (not after a resource's last page).
  EXPECT_GT(report.paused, absl::ZeroDuration());
  EXPECT_LT(report.paused, report.took);
  EXPECT_EQ(after["list"] - before["list"], 3 + 1);
  for (const auto& [verb, n] : after) {
    if (verb != "list") {
      EXPECT_EQ(n, before.count(verb) ? before.at(verb) : 0) << verb;
    }
  }
}

TEST_F(ResyncerTest, PaceZeroListsThePagesBackToBack) {
  for (int i = 0; i < 5; ++i) {
    CreatePod("p" + std::to_string(i));
  }
  StartInformers();
  Resyncer resyncer(client_, pods_.get(), nodes_.get(),
                    ResyncOptions{.period = absl::ZeroDuration(), .page_size = 2, .pace = 0},
                    nullptr);
  ResyncReport report = resyncer.RunOnce();
  EXPECT_EQ(report.error, "");
  EXPECT_EQ(report.requests, 3 + 1);
  EXPECT_EQ(report.paused, absl::ZeroDuration());
}

TEST_F(ResyncerTest, StopEndsAPassDuringItsPause) {
  for (int i = 0; i < 5; ++i) {
    CreatePod("p" + std::to_string(i));
  }
  StartInformers();
  // A pause of at least a minute after every page: only Stop can end the pass in time.
  Resyncer resyncer(client_, pods_.get(), nodes_.get(),
                    ResyncOptions{.period = absl::ZeroDuration(),
                                  .page_size = 2,
                                  .pace = 1e9,
                                  .max_page_pause = absl::Minutes(1)},
                    nullptr);
  const size_t lists_before = env_.faults()->Matching("GET", "/api/v1/pods").size();
  ResyncReport report;
  std::thread pass([&] { report = resyncer.RunOnce(); });
  // The pass has asked for its first page; its pause follows the reply.
  EXPECT_TRUE(::tessera::testing::Eventually(
      [&] { return env_.faults()->Matching("GET", "/api/v1/pods").size() > lists_before; }));
  resyncer.Stop();
  pass.join();
  EXPECT_THAT(report.error, HasSubstr("stopped"));
  EXPECT_LT(report.took, absl::Seconds(30));
}

// The period is measured on the resyncer's clock: a test drives it instead of waiting an hour.
TEST_F(ResyncerTest, StartedPassesFollowTheClock) {
  StartInformers();
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::atomic<int> passes{0};
  Resyncer resyncer(client_, pods_.get(), nodes_.get(),
                    // No timeout for the informers: the clock races ahead during the pass.
                    ResyncOptions{.period = absl::Hours(1),
                                  .jitter = 0,
                                  .reconcile_timeout = absl::InfiniteDuration(),
                                  .clock = &clock},
                    [&](const ResyncReport&) { ++passes; });
  resyncer.Start();
  EXPECT_TRUE(::tessera::testing::Eventually([&] {
    clock.Advance(absl::Minutes(10));
    return passes.load() > 0;
  }));
  resyncer.Stop();
  const ResyncReport report = resyncer.last();
  EXPECT_GE(report.at - start, absl::Hours(1));  // not before its period on the clock
  EXPECT_EQ(report.error, "");
}

TEST_F(ResyncerTest, APassBeforeTheInformersSyncedRepairsNothing) {
  kube::Informer<kube::Pod>::Options po;
  pods_ = std::make_unique<kube::Informer<kube::Pod>>(client_, po, feed_.Handlers());
  nodes_ = std::make_unique<kube::Informer<kube::Node>>(
      client_, kube::Informer<kube::Node>::Options{}, kube::EventHandlers<kube::Node>{});
  Resyncer resyncer(client_, pods_.get(), nodes_.get(), ResyncOptions{}, nullptr);
  ResyncReport report = resyncer.RunOnce();
  EXPECT_THAT(report.error, HasSubstr("not synced"));
  EXPECT_EQ(report.requests, 0);
}

}  // namespace
}  // namespace tessera::accounting

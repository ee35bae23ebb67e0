// The resync layer against an in-process apisim whose watch loses events for good (the
// dropWatchEvents fault): real informers over the CurlTransport feed a PodFeed and a ledger; one
// Resyncer pass must repair the store and the ledger, and never undo a newer watch delivery.
#include "tessera/accounting/resyncer.h"

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

// A pod bound to node "a" holding 1000 MiB of GPU-a-0.
std::string BoundPod(const std::string& name) {
  nlohmann::json pod = {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata",
                         {{"name", name},
                          {"namespace", "default"},
                          {"annotations",
                           {{"hami.io/vgpu-node", "a"},
                            {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA,1000,0:;"},
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
  EXPECT_TRUE(LedgerPods().empty());
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
  ResyncReport report;
  std::thread pass([&] { report = resyncer.RunOnce(); });
  absl::SleepFor(absl::Milliseconds(200));
  resyncer.Stop();
  pass.join();
  EXPECT_THAT(report.error, HasSubstr("stopped"));
  EXPECT_LT(report.took, absl::Seconds(30));
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

// Integration: a PodInformer over the real CurlTransport against `tessera apisim` (a subprocess
// on 127.0.0.1 port 0) with injected faults: DELETED events dropped for good, watch streams
// severed, history compacted while watches are held. Afterwards the informer's store must equal
// the server's state, and every pod deleted behind the informer's back must have been delivered
// as a "final state unknown" tombstone exactly once.
//
// The simulator binary: $TESSERA_APISIM_BIN, else the tessera binary of this build tree (a build
// dependency of this test). The test fails when the simulator does not start.
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/transport.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/apisim_process.h"
#include "tessera/testing/wait.h"

namespace tessera::kube {
namespace {

using ::tessera::testing::Eventually;

// The deadline of a wait on the apisim process (generous for a loaded machine).
constexpr absl::Duration kWait = absl::Seconds(20);

class InformerApisimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string bin = ::tessera::testing::ApisimProcess::DefaultBinary();
    url_ = sim_.Start(bin);
    if (url_.empty()) {
      FAIL() << "tessera apisim did not start (set TESSERA_APISIM_BIN); tried '" << bin << "'";
    }
    conn_ = std::make_unique<::tessera::testing::ApiConnection>(url_);
    ASSERT_TRUE(conn_->ok());
    client_ = conn_->client();
  }

  void Call(const std::string& method, const std::string& path, const std::string& body = "") {
    conn_->MustCall(method, path, body);
  }
  void CreatePod(const std::string& name) { conn_->CreatePod(name); }
  // Immediate deletion, so that the object is gone rather than terminating.
  void DeletePod(const std::string& name) { conn_->DeletePod(name); }
  std::vector<std::string> ServerKeys() {
    absl::StatusOr<PodList> list = client_->ListPods(ListOptions());
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<std::string> keys;
    if (list.ok()) {
      for (const Pod& p : list->items) {
        keys.push_back(p.Key());
      }
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  ::tessera::testing::ApisimProcess sim_;
  std::string url_;
  std::unique_ptr<::tessera::testing::ApiConnection> conn_;
  ApiClient* client_ = nullptr;
};

TEST_F(InformerApisimTest, StoreConvergesAfterLostDeletesSeveredWatchesAndCompaction) {
  for (int i = 0; i < 12; ++i) {
    CreatePod(fmt::format("p{}", i));
  }
  Mutex mu;
  std::set<std::string> alive;            // the handlers' view, by key
  std::map<std::string, int> tombstones;  // key → tombstones delivered
  std::map<std::string, int> deletes;     // key → watch deletes delivered
  EventHandlers<Pod> h;
  h.on_add = [&](const Pod& p, bool) {
    MutexLock l(&mu);
    alive.insert(p.Key());
  };
  h.on_update = [&](const Pod&, const Pod& p) {
    MutexLock l(&mu);
    alive.insert(p.Key());
  };
  h.on_delete = [&](const Pod& p, bool unknown) {
    MutexLock l(&mu);
    alive.erase(p.Key());
    ++(unknown ? tombstones : deletes)[p.Key()];
  };
  PodInformer::Options opts;
  opts.name = "apisim-pods";
  opts.reflector.page_size = 5;  // three pages
  opts.reflector.backoff = {absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.0};
  PodInformer informer(client_, opts, h);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
  EXPECT_EQ(informer.store().size(), 12u);
  // (The first LIST is at resourceVersion "0", which, like the watch cache, ignores limit.)

  // 1. Three deletions whose DELETED events are lost for every watcher.
  Call("PUT", "/simulator/v1/faults",
       R"({"dropWatchEvents":[{"resource":"pods","type":"DELETED","probability":1.0,"count":3}]})");
  for (int i = 0; i < 3; ++i) {
    DeletePod(fmt::format("p{}", i));
  }
  Call("DELETE", "/simulator/v1/faults");
  // 2. A deletion the watch does see.
  DeletePod("p3");
  ASSERT_TRUE(Eventually([&] { return informer.store().Get("default/p3") == nullptr; }, kWait));
  // 3. An outage: watches held, changes made, history compacted, streams severed.
  Call("PUT", "/simulator/v1/faults", R"({"pauseWatches":true})");
  DeletePod("p4");
  DeletePod("p5");
  CreatePod("q0");
  Call("POST", "/simulator/v1/compact", "{}");
  Call("PUT", "/simulator/v1/faults", R"({"pauseWatches":false})");
  Call("POST", "/simulator/v1/sever-watches", "{}");
  CreatePod("q1");

  const std::vector<std::string> expected = {"default/p10", "default/p11", "default/p6",
                                             "default/p7",  "default/p8",  "default/p9",
                                             "default/q0",  "default/q1"};
  ASSERT_EQ(ServerKeys(), expected);
  ASSERT_TRUE(Eventually([&] { return informer.store().Keys() == expected; }, kWait))
      << ::testing::PrintToString(informer.store().Keys());
  // The informer updates its store before it calls the handlers, and counts after them: wait
  // until the handlers have seen every change and the tombstones they got are counted.
  ASSERT_TRUE(Eventually(
      [&] {
        int64_t delivered = 0;
        bool same = false;
        {
          MutexLock l(&mu);
          for (const auto& [key, n] : tombstones) {
            delivered += n;
          }
          same = std::vector<std::string>(alive.begin(), alive.end()) == expected;
        }
        return same && informer.counters().tombstones == delivered;
      },
      kWait))
      << "the handlers' view or the tombstone count did not converge";
  {
    MutexLock l(&mu);
    EXPECT_EQ(std::vector<std::string>(alive.begin(), alive.end()), expected);
    // The lost deletes came back as tombstones, once each; no pod was deleted twice.
    for (int i = 0; i < 6; ++i) {
      const std::string key = fmt::format("default/p{}", i);
      EXPECT_EQ(tombstones[key] + deletes[key], 1) << key;
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(tombstones[fmt::format("default/p{}", i)], 1);
    }
  }
  EXPECT_GE(informer.counters().reflector.relists, 1);
  EXPECT_GE(informer.counters().reflector.lists, 2);

  // A further compaction + relist finds nothing new to delete.
  const int64_t tombstones_before = informer.counters().tombstones;
  const int64_t relists_before = informer.counters().reflector.relists;
  Call("PUT", "/simulator/v1/faults", R"({"pauseWatches":true})");
  CreatePod("q2");
  Call("POST", "/simulator/v1/compact", "{}");
  Call("PUT", "/simulator/v1/faults", R"({"pauseWatches":false})");
  Call("POST", "/simulator/v1/sever-watches", "{}");
  ASSERT_TRUE(Eventually([&] { return informer.store().Get("default/q2") != nullptr; }, kWait));
  ASSERT_TRUE(
      Eventually([&] { return informer.counters().reflector.relists > relists_before; }, kWait))
      << "no relist after the second compaction";
  EXPECT_EQ(informer.counters().tombstones, tombstones_before);
  informer.Stop();
}

}  // namespace
}  // namespace tessera::kube

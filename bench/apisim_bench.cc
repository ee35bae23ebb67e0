// Scale of `tessera apisim`: 100,000 pods and 5,000 nodes in one store, served over loopback.
//   BM_PagedListAllPods      a full LIST of every pod in pages of 500 (target <= 5 s)
//   BM_TwentyWatchersInOrder 20 concurrent watchers each receive every one of 2,000 pod
//                            updates, in revision order
// Counters: rss_mb is the process resident set after the fixture is loaded (target <= 2 GB).
//   cmake --preset release && cmake --build build/release --target apisim_bench -j2 &&
//   ./build/release/bench/apisim_bench
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fmt/core.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include <benchmark/benchmark.h>

#include "tessera/apisim/server.h"

namespace {

using tessera::apisim::Resources;
using tessera::apisim::Server;
using tessera::apisim::ServerOptions;

constexpr int kNodes = 5000;
constexpr int kPods = 100000;

double RssMb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stod(line.substr(6)) / 1024.0;
    }
  }
  return 0;
}

Server* Fixture() {
  static Server* server = [] {
    ServerOptions o;
    o.watch_history = 20000;
    auto s = Server::Start(o);
    if (!s.ok()) {
      std::abort();
    }
    Server* srv = s->release();
    const auto& nodes = Resources()[1];
    const auto& pods = Resources()[0];
    for (int n = 0; n < kNodes; ++n) {
      std::string body = fmt::format(
          R"({{"metadata":{{"name":"node-{}","labels":{{"gpu":"true"}},"annotations":{{)"
          R"("hami.io/node-nvidia-register":"GPU-{}-0,10,32768,100,NVIDIA-A100,0,true:"}}}},)"
          R"("status":{{"allocatable":{{"cpu":"64","memory":"256Gi","nvidia.com/gpu":"8"}}}}}})",
          n, n);
      (void)srv->store().Create(nodes, "", body);
    }
    for (int i = 0; i < kPods; ++i) {
      std::string body = fmt::format(
          R"({{"metadata":{{"name":"pod-{:06d}","labels":{{"app":"train-{}","team":"t{}"}},)"
          R"("annotations":{{"hami.io/vgpu-node":"node-{}","hami.io/vgpu-devices-allocated":)"
          R"("GPU-{}-0,NVIDIA,4096,25:;"}}}},"spec":{{"nodeName":"node-{}","containers":[{{)"
          R"("name":"main","image":"registry.example.com/train:1.0","resources":{{"limits":{{)"
          R"("nvidia.com/gpu":"1","nvidia.com/gpumem":"4096"}}}}}}]}},)"
          R"("status":{{"phase":"Running","podIP":"10.0.{}.{}"}}}})",
          i, i % 100, i % 7, i % kNodes, i % kNodes, i % kNodes, (i / 250) % 250, i % 250);
      (void)srv->store().Create(pods, "default", body);
    }
    return srv;
  }();
  return server;
}

void BM_PagedListAllPods(benchmark::State& state) {
  Server* srv = Fixture();
  httplib::Client cli("127.0.0.1", srv->port());
  cli.set_read_timeout(60, 0);
  cli.set_tcp_nodelay(true);
  int64_t items = 0;
  int64_t pages = 0;
  for (auto _ : state) {
    items = 0;
    pages = 0;
    std::string token;
    do {
      std::string path = "/api/v1/pods?limit=500";
      if (!token.empty()) {
        path += "&continue=" + token;
      }
      auto r = cli.Get(path.c_str());
      if (!r || r->status != 200) {
        state.SkipWithError("list failed");
        return;
      }
      auto j = nlohmann::json::parse(r->body);
      items += static_cast<int64_t>(j["items"].size());
      token = j["metadata"].value("continue", "");
      ++pages;
    } while (!token.empty());
  }
  if (items != kPods) {
    state.SkipWithError("wrong item count");
  }
  state.counters["items"] = static_cast<double>(items);
  state.counters["pages"] = static_cast<double>(pages);
  state.counters["rss_mb"] = RssMb();
}
BENCHMARK(BM_PagedListAllPods)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// The same pages fetched without decoding them on the client: the server's share.
void BM_PagedListAllPodsServerOnly(benchmark::State& state) {
  Server* srv = Fixture();
  httplib::Client cli("127.0.0.1", srv->port());
  cli.set_read_timeout(60, 0);
  cli.set_tcp_nodelay(true);
  for (auto _ : state) {
    std::string token;
    int pages = 0;
    do {
      std::string path = "/api/v1/pods?limit=500";
      if (!token.empty()) {
        path += "&continue=" + token;
      }
      auto r = cli.Get(path.c_str());
      if (!r || r->status != 200) {
        state.SkipWithError("list failed");
        return;
      }
      size_t at = r->body.find("\"continue\":\"");
      token.clear();
      if (at != std::string::npos && at < 200) {
        size_t start = at + 12;
        token = r->body.substr(start, r->body.find('"', start) - start);
      }
      ++pages;
    } while (!token.empty());
    state.counters["pages"] = pages;
  }
}
BENCHMARK(BM_PagedListAllPodsServerOnly)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();

void BM_TwentyWatchersInOrder(benchmark::State& state) {
  Server* srv = Fixture();
  constexpr int kWatchers = 20;
  constexpr int kEvents = 2000;
  const auto& pods = Resources()[0];
  int round = 0;
  for (auto _ : state) {
    const uint64_t from = srv->store().CurrentRevision();
    std::atomic<int> complete{0};
    std::atomic<int> out_of_order{0};
    std::vector<std::thread> watchers;
    for (int w = 0; w < kWatchers; ++w) {
      watchers.emplace_back([&, from] {
        httplib::Client c("127.0.0.1", srv->port());
        c.set_read_timeout(60, 0);
        std::string buf;
        int seen = 0;
        uint64_t last = from;
        c.Get(("/api/v1/pods?watch=true&resourceVersion=" + std::to_string(from)).c_str(),
              [&](const char* d, size_t n) {
                buf.append(d, n);
                size_t nl;
                while ((nl = buf.find('\n')) != std::string::npos) {
                  if (nl > 0) {
                    auto j = nlohmann::json::parse(buf.substr(0, nl));
                    uint64_t rv =
                        std::stoull(j["object"]["metadata"]["resourceVersion"].get<std::string>());
                    if (rv <= last) {
                      out_of_order.fetch_add(1);
                    }
                    last = rv;
                    ++seen;
                  }
                  buf.erase(0, nl + 1);
                }
                return seen < kEvents;
              });
        if (seen == kEvents) {
          complete.fetch_add(1);
        }
      });
    }
    for (int i = 0; i < kEvents; ++i) {
      std::string name = fmt::format("pod-{:06d}", (i * 37) % kPods);
      std::string patch =
          fmt::format(R"({{"metadata":{{"annotations":{{"bench":"{}-{}"}}}}}})", round, i);
      (void)srv->store().Patch(pods, "default", name, "", tessera::apisim::PatchType::kMerge,
                               patch);
    }
    for (std::thread& t : watchers) {
      t.join();
    }
    ++round;
    if (complete.load() != kWatchers || out_of_order.load() != 0) {
      state.SkipWithError("a watcher missed events or saw them out of order");
    }
  }
  state.counters["events_per_watcher"] = kEvents;
  state.counters["watchers"] = kWatchers;
  state.counters["rss_mb"] = RssMb();
}
BENCHMARK(BM_TwentyWatchersInOrder)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace

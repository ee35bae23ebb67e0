// /metrics benchmarks at the design size: 5,000 nodes x 8 GPUs, 100,000 pods (one in ten with
// two containers on two GPUs, so 110,000 pod-device samples per per-pod family).
//   BM_LedgerFull              Ledger::Full(): the one snapshot a scrape takes.
//   BM_RenderDeviceFamilies/L  the HAMi device families of that snapshot, streamed to a sink
//                              that only counts bytes (L=0: HEAD names; L=1: with --legacy).
//   BM_RenderBody/L            Registry::Render into one string: device families plus Tessera's
//                              own families (what the /metrics handler sends).
//   BM_Scrape/L                Ledger::Full() + Registry::Render, end to end.
// Counters: bytes = size of the text, samples = sample lines per render.
// Run: cmake --preset release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache &&
//      cmake --build build/release --target metrics_bench -j2 &&
//      ./build/release/bench/metrics_bench
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"

#include "tessera/base/clock.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/device_families.h"
#include "tessera/metrics/registry.h"
#include "tessera/testing/ledger_cluster.h"

namespace tessera::metrics {
namespace {

constexpr int kNodes = 5000;
constexpr int kGpus = 8;
constexpr int kPods = 100000;

struct Cluster {
  ledger::Ledger ledger;
  ledger::FullSnapshot snapshot;
  FakeClock clock;
  Registry registry{BuildInfo{"0.1.0", "bench", CompilerId()}, &clock};
  Cluster() {
    for (int n = 0; n < kNodes; ++n) {
      (void)ledger.SetNode(::tessera::testing::ClusterNode(n, kGpus));
    }
    for (int i = 0; i < kPods; ++i) {
      (void)ledger.Apply(::tessera::testing::ClusterPod(i, kNodes, kGpus));
    }
    snapshot = ledger.Full();
    // Some of Tessera's own series, as a running server would have them.
    for (int i = 0; i < 1000; ++i) {
      registry.RecordFilter(FilterOutcome::kScheduled, "", absl::Microseconds(100 + i));
      registry.RecordBind(BindOutcome::kBound, absl::Milliseconds(2));
    }
    registry.RecordFilter(FilterOutcome::kUnschedulable, "insufficient_memory",
                          absl::Microseconds(90));
    for (const char* r : {"pods", "nodes", "leases"}) {
      registry.SetInformerSynced(r, true);
      registry.RecordInformerEvents(r, 10);
    }
    registry.SetLeader(true);
  }
};

Cluster& TheCluster() {
  static Cluster* cluster = new Cluster();
  return *cluster;
}

size_t CountSamples(std::string_view text) {
  size_t n = 0;
  bool line_start = true;
  for (char c : text) {
    if (line_start && c != '#') {
      ++n;
    }
    line_start = c == '\n';
  }
  return n;
}

void BM_LedgerFull(benchmark::State& state) {
  Cluster& c = TheCluster();
  for (auto _ : state) {
    ledger::FullSnapshot s = c.ledger.Full();
    benchmark::DoNotOptimize(s.nodes.data());
  }
}
BENCHMARK(BM_LedgerFull)->Unit(benchmark::kMillisecond);

void BM_RenderDeviceFamilies(benchmark::State& state) {
  Cluster& c = TheCluster();
  const bool legacy = state.range(0) != 0;
  size_t bytes = 0;
  for (auto _ : state) {
    bytes = 0;
    RenderDeviceFamilies(c.snapshot, legacy,
                         [&bytes](std::string_view piece) { bytes += piece.size(); });
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["samples"] =
      static_cast<double>(CountSamples(RenderDeviceFamilies(c.snapshot, legacy)));
}
BENCHMARK(BM_RenderDeviceFamilies)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_RenderBody(benchmark::State& state) {
  Cluster& c = TheCluster();
  const bool legacy = state.range(0) != 0;
  size_t bytes = 0;
  for (auto _ : state) {
    std::string body = c.registry.Render(c.snapshot, legacy);
    bytes = body.size();
    benchmark::DoNotOptimize(body.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderBody)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_Scrape(benchmark::State& state) {
  Cluster& c = TheCluster();
  const bool legacy = state.range(0) != 0;
  for (auto _ : state) {
    std::string body = c.registry.Render(c.ledger.Full(), legacy);
    benchmark::DoNotOptimize(body.data());
  }
}
BENCHMARK(BM_Scrape)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::metrics

// Ledger benchmarks at the design size: 5,000 nodes x 8 GPUs, 100,000 allocation records.
//   BM_ApplyReplace       Apply that replaces a record (new device, new memory) — the watch
//                         update path.
//   BM_ApplyUnchanged     Apply of a record that did not change (a status-only watch update).
//   BM_RemoveThenApply    Remove a record and Apply it back (a delete + an add); items = 2 ops.
//   BM_ReserveRelease     Reserve then Release a two-GPU pod (filter + failed bind); items = 2.
//   BM_Snapshot500        Snapshot of 500 random candidate nodes (what one /filter reads).
//   BM_Snapshot500_ColdCaches  The same with 4 MiB written between snapshots (untimed).
//   BM_SnapshotDecide500  The same snapshot and then the decision cycle over it for a one-GPU pod:
//                         the part of a /filter that reads the cluster (the decision's loads of
//                         each node's device list are cache misses after the snapshot).
//   BM_MemoryPerRecord    Builds a fresh ledger of 100,000 records and reports heap bytes per
//                         record (operator new counted at usable size + chunk header) and the
//                         resident-set growth per record.
// Run: cmake --preset release && cmake --build build/release --target ledger_bench -j2 &&
//      ./build/release/bench/ledger_bench
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "benchmark/benchmark.h"
#include "cold_caches.h"
#include <malloc.h>

#include "tessera/cycle/cycle.h"
#include "tessera/ledger/heap_counter.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/ledger_cluster.h"

namespace tessera::ledger {
namespace {

constexpr int kNodes = 5000;
constexpr int kGpus = 8;
constexpr int kRecords = 100000;

struct Cluster {
  Ledger ledger;
  std::vector<PodAllocation> gen0, gen1;  // each pod in two placements
  std::vector<std::string> node_names;
  Cluster() {
    for (int n = 0; n < kNodes; ++n) {
      (void)ledger.SetNode(::tessera::testing::ClusterNode(n, kGpus));
      node_names.push_back(::tessera::testing::ClusterNodeName(n));
    }
    gen0.reserve(kRecords);
    gen1.reserve(kRecords);
    for (int i = 0; i < kRecords; ++i) {
      gen0.push_back(::tessera::testing::ClusterPod(i, kNodes, kGpus, 0));
      gen1.push_back(::tessera::testing::ClusterPod(i, kNodes, kGpus, 1));
      (void)ledger.Apply(gen0.back());
    }
  }
};

Cluster& TheCluster() {
  static Cluster* cluster = new Cluster();
  return *cluster;
}

void BM_ApplyReplace(benchmark::State& state) {
  Cluster& c = TheCluster();
  size_t i = 0;
  bool flip = true;
  for (auto _ : state) {
    const PodAllocation& p = flip ? c.gen1[i] : c.gen0[i];
    benchmark::DoNotOptimize(c.ledger.Apply(p));
    if (++i == c.gen0.size()) {
      i = 0;
      flip = !flip;
    }
  }
  state.SetItemsProcessed(state.iterations());
  // Leave every record in its generation-0 placement for the next benchmark.
  for (size_t j = 0; j < c.gen0.size(); ++j) {
    (void)c.ledger.Apply(c.gen0[j]);
  }
}
BENCHMARK(BM_ApplyReplace);

void BM_ApplyUnchanged(benchmark::State& state) {
  Cluster& c = TheCluster();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.ledger.Apply(c.gen0[i]));
    if (++i == c.gen0.size()) {
      i = 0;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ApplyUnchanged);

void BM_RemoveThenApply(benchmark::State& state) {
  Cluster& c = TheCluster();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.ledger.Remove(c.gen0[i].uid));
    benchmark::DoNotOptimize(c.ledger.Apply(c.gen0[i]));
    if (++i == c.gen0.size()) {
      i = 0;
    }
  }
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_RemoveThenApply);

void BM_ReserveRelease(benchmark::State& state) {
  Cluster& c = TheCluster();
  const absl::Time expiry = absl::FromUnixSeconds(1'800'000'000);
  std::vector<device::PodDevices> devs;
  for (int n = 0; n < 1000; ++n) {
    devs.push_back(
        {{device::ContainerDevice{::tessera::testing::ClusterGpuUuid(n, 0), "NVIDIA", 1024, 10},
          device::ContainerDevice{::tessera::testing::ClusterGpuUuid(n, 1), "NVIDIA", 1024, 10}}});
  }
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.ledger.Reserve("in-flight-pod-uid-0000000000000000000", "default",
                                              "pending", c.node_names[i], devs[i], expiry));
    benchmark::DoNotOptimize(c.ledger.Release("in-flight-pod-uid-0000000000000000000"));
    if (++i == devs.size()) {
      i = 0;
    }
  }
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_ReserveRelease);

// 64 lists of 500 node names drawn at random (with repeats), as kube-scheduler's candidates.
std::vector<std::vector<std::string_view>> CandidateSets(const Cluster& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::string_view>> sets(64);
  for (auto& set : sets) {
    for (int k = 0; k < 500; ++k) {
      set.push_back(c.node_names[rng() % c.node_names.size()]);
    }
  }
  return sets;
}

void BM_Snapshot500(benchmark::State& state) {
  Cluster& c = TheCluster();
  const std::vector<std::vector<std::string_view>> candidate_sets = CandidateSets(c, 42);
  size_t s = 0;
  for (auto _ : state) {
    auto snap = c.ledger.Snapshot(candidate_sets[s]);
    benchmark::DoNotOptimize(snap);
    s = (s + 1) % candidate_sets.size();
  }
  state.SetItemsProcessed(500 * state.iterations());
}
BENCHMARK(BM_Snapshot500);

// As in `tessera serve`, where the other threads (HTTP, informers, apisim) have used the caches
// between two filters: 4 MiB written between snapshots (outside the timing), so that the index,
// the slots and the usage are out of the L2.
void BM_Snapshot500_ColdCaches(benchmark::State& state) {
  Cluster& c = TheCluster();
  const std::vector<std::vector<std::string_view>> candidate_sets = CandidateSets(c, 44);
  tessera::bench::ColdCaches cold_caches;
  size_t s = 0;
  for (auto _ : state) {
    state.PauseTiming();
    cold_caches.Evict();
    state.ResumeTiming();
    auto snap = c.ledger.Snapshot(candidate_sets[s]);
    benchmark::DoNotOptimize(snap);
    s = (s + 1) % candidate_sets.size();
  }
  state.SetItemsProcessed(500 * state.iterations());
}
BENCHMARK(BM_Snapshot500_ColdCaches);

void BM_SnapshotDecide500(benchmark::State& state) {
  Cluster& c = TheCluster();
  const std::vector<std::vector<std::string_view>> candidate_sets = CandidateSets(c, 43);
  device::PodRequest request;
  device::ContainerRequest one;
  one.nums = 1;
  one.memreq = 1000;
  one.coresreq = 10;
  request.containers.push_back(one);
  const kube::Pod pod;
  const device::PodConstraints constraints;
  const cycle::Config config{.node_policy = device::NodePolicy::kSpread};
  size_t s = 0;
  for (auto _ : state) {
    const std::vector<std::string_view>& names = candidate_sets[s];
    std::vector<schedule::Candidate> candidates(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      candidates[i].name = std::string(names[i]);
    }
    cycle::Result d = cycle::Run(
        config,
        {.pod = &pod, .request = &request, .constraints = &constraints, .ledger = &c.ledger},
        &candidates);
    benchmark::DoNotOptimize(d);
    s = (s + 1) % candidate_sets.size();
  }
  state.SetItemsProcessed(500 * state.iterations());
}
BENCHMARK(BM_SnapshotDecide500);

int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) {
    return 0;
  }
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : 0;
}

void BM_MemoryPerRecord(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<PodAllocation> pods;
    pods.reserve(kRecords);
    for (int i = 0; i < kRecords; ++i) {
      pods.push_back(::tessera::testing::ClusterPod(i, kNodes, kGpus));
    }
    auto ledger = std::make_unique<Ledger>();
    for (int n = 0; n < kNodes; ++n) {
      (void)ledger->SetNode(::tessera::testing::ClusterNode(n, kGpus));
    }
    malloc_trim(0);
    const int64_t heap0 = LiveHeapBytes();
    const int64_t rss0 = ResidentBytes();
    state.ResumeTiming();
    for (const auto& p : pods) {
      (void)ledger->Apply(p);
    }
    state.PauseTiming();
    state.counters["heap_bytes_per_record"] =
        static_cast<double>(LiveHeapBytes() - heap0) / kRecords;
    state.counters["rss_bytes_per_record"] = static_cast<double>(ResidentBytes() - rss0) / kRecords;
    ledger.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_MemoryPerRecord)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::ledger

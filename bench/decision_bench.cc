// Benchmark of schedule::Decide: the fit-and-score decision over 500 candidate nodes drawn from
// a 5,000-node x 8-GPU cluster whose usage is that of 100,000 allocations (seeded, so every run
// sees the same cluster). Only the decision is timed: the candidates (name + snapshot) are built
// once, as the ledger would hand them over.
//
//   cmake --preset release && cmake --build build/release --target decision_bench -j2
//   ./build/release/bench/decision_bench --benchmark_repetitions=10
//       --benchmark_report_aggregates_only=true      (one command line)
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cold_caches.h"

#include "tessera/extender/verdict.h"
#include "tessera/schedule/quota.h"
#include "tessera/schedule/score.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::DeviceUsage;
using device::GpuPolicy;
using device::GpuPolicyKey;
using device::NodeDevices;
using device::NodePolicy;
using device::NodeSnapshot;
using device::PodRequest;

constexpr int kNodes = 5000;
constexpr int kGpusPerNode = 8;
constexpr int kAllocations = 100000;
constexpr int kCandidates = 500;

struct Cluster {
  std::vector<Candidate> nodes;
};

const Cluster& BuildCluster() {
  static const Cluster* cluster = [] {
    auto* c = new Cluster;
    std::mt19937_64 rng(20260801);
    c->nodes.reserve(kNodes);
    for (int n = 0; n < kNodes; ++n) {
      auto nd = std::make_shared<NodeDevices>();
      nd->node = "gpu-node-" + std::to_string(n) + ".cluster.example.internal";
      for (int g = 0; g < kGpusPerNode; ++g) {
        device::DeviceInfo d;
        d.id = "GPU-" + std::to_string(n) + "-" + std::to_string(g) +
               "-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";
        d.index = g;
        d.count = 10;
        d.devmem = 32768;
        d.devcore = 100;
        d.type = "NVIDIA-Tesla V100-SXM2-32GB";
        d.numa = g < kGpusPerNode / 2 ? 0 : 1;
        nd->devices.push_back(d);
      }
      NodeSnapshot s;
      s.usage.resize(kGpusPerNode);
      s.devices = std::move(nd);
      c->nodes.push_back(Candidate{s.devices->node, std::move(s)});
    }
    // 100,000 allocations of 1-8 GiB and 0-50 % cores on random GPUs, skipping those that would
    // overflow the card (so the usage is one HAMi could have produced).
    const int32_t mems[] = {1024, 2048, 4096, 8192};
    const int32_t cores[] = {0, 10, 20, 25, 50};
    std::uniform_int_distribution<int> node_dist(0, kNodes - 1);
    std::uniform_int_distribution<int> gpu_dist(0, kGpusPerNode - 1);
    for (int a = 0; a < kAllocations; ++a) {
      auto& s = *c->nodes[node_dist(rng)].snapshot;
      const auto& d = s.devices->devices[gpu_dist(rng)];
      DeviceUsage& u = s.usage[static_cast<size_t>(d.index)];
      int32_t mem = mems[rng() % 4];
      int32_t core = cores[rng() % 5];
      if (u.used < d.count && u.usedmem + mem <= d.devmem && u.usedcores + core <= d.devcore) {
        u.used += 1;
        u.usedmem += mem;
        u.usedcores += core;
      }
    }
    return c;
  }();
  return *cluster;
}

std::vector<Candidate> PickCandidates(uint64_t seed) {
  const Cluster& c = BuildCluster();
  std::vector<int> idx(kNodes);
  for (int i = 0; i < kNodes; ++i) {
    idx[static_cast<size_t>(i)] = i;
  }
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  std::vector<Candidate> out;
  out.reserve(kCandidates);
  for (int i = 0; i < kCandidates; ++i) {
    out.push_back(c.nodes[static_cast<size_t>(idx[static_cast<size_t>(i)])]);
  }
  return out;
}

ContainerRequest Req(int32_t nums, int32_t mem, int32_t cores) {
  ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  r.coresreq = cores;
  return r;
}

// A pod with an init container and three app containers, one of which wants two GPUs.
PodRequest FewContainers() {
  PodRequest p;
  p.containers = {Req(1, 2048, 10), Req(1, 4096, 20), std::nullopt, Req(2, 2048, 10),
                  Req(1, 1024, 0)};
  p.init_count = 1;
  return p;
}

// The most common HAMi pod: one container asking for a slice of one GPU.
PodRequest OneContainer() {
  PodRequest p;
  p.containers = {Req(1, 4096, 25)};
  return p;
}

// The same two with memory as a percentage of the card (12 % = 3932 MiB of a 32 GiB card): the
// quota cannot be settled before the card is known, so every card is checked.
PodRequest OneContainerPercent() {
  PodRequest p = OneContainer();
  p.containers[0]->memreq = 0;
  p.containers[0]->mem_percentage = 12;
  return p;
}
PodRequest FewContainersPercent() {
  PodRequest p = FewContainers();
  p.containers[1]->memreq = 0;
  p.containers[1]->mem_percentage = 12;
  return p;
}

// A pod that most nodes reject: every failing node gets its reason string built.
PodRequest LargeRequest() {
  PodRequest p;
  p.containers = {Req(6, 24576, 50)};
  return p;
}

// A namespace quota that limits memory and cores but never refuses.
const NamespaceQuota* RoomyQuota() {
  static const NamespaceQuota* quota = [] {
    auto* q = new NamespaceQuota;
    q->ns = "ml";
    q->memory_name = "nvidia.com/gpumem";
    q->cores_name = "nvidia.com/gpucores";
    q->memory = QuotaLimit{int64_t{1} << 40, "gpu"};
    q->cores = QuotaLimit{int64_t{1} << 40, "gpu"};
    q->usedmem = 123456;
    q->usedcores = 1234;
    return q;
  }();
  return quota;
}

void RunDecide(benchmark::State& state, NodePolicy node_policy, GpuPolicy gpu_policy,
               bool numa_bind, const PodRequest& pod = FewContainers(),
               const NamespaceQuota* quota = nullptr) {
  const std::vector<Candidate> candidates = PickCandidates(7);
  device::PodConstraints constraints;
  constraints.numa_bind = numa_bind;
  size_t fits = 0;
  for (auto _ : state) {
    Decision d = Decide(candidates, pod, constraints, node_policy, gpu_policy, quota);
    benchmark::DoNotOptimize(d);
    fits = 0;
    for (const auto& n : d.nodes) {
      fits += n.fit ? 1 : 0;
    }
  }
  state.counters["fit_nodes"] = static_cast<double>(fits);
  state.counters["candidates"] = kCandidates;
}

// As in `tessera serve`, where each filter brings 500 other nodes out of the 5,000 and the other
// threads (HTTP, informers) have used the caches in between: 64 candidate lists used in turn, and
// 4 MiB written between decisions (outside the timing) so that no node's devices are in the L2.
void BM_Decide_OneContainer_ColdCaches(benchmark::State& state) {
  std::vector<std::vector<Candidate>> lists;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    lists.push_back(PickCandidates(100 + seed));
  }
  tessera::bench::ColdCaches cold_caches;
  const PodRequest pod = OneContainer();
  const device::PodConstraints constraints;
  size_t next = 0;
  for (auto _ : state) {
    state.PauseTiming();
    cold_caches.Evict();
    const std::vector<Candidate>& candidates = lists[next++ % lists.size()];
    state.ResumeTiming();
    Decision d = Decide(candidates, pod, constraints, NodePolicy::kBinpack,
                        GpuPolicy{{GpuPolicyKey::kSpread}});
    benchmark::DoNotOptimize(d);
  }
  state.counters["candidates"] = kCandidates;
}

void BM_Decide_BinpackSpread(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false);
}
void BM_Decide_SpreadBinpack(benchmark::State& state) {
  RunDecide(state, NodePolicy::kSpread, GpuPolicy{{GpuPolicyKey::kBinpack}}, false);
}
void BM_Decide_BinpackNumaChainNumaBind(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}},
            true);
}
void BM_Decide_MostNodesFail(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false, LargeRequest());
}
void BM_Decide_OneContainer(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false, OneContainer());
}
// The same two with a namespace quota with room for them (settled once per pod, Fitter::Prepare).
void BM_Decide_OneContainer_Quota(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false, OneContainer(),
            RoomyQuota());
}
void BM_Decide_BinpackSpread_Quota(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false, FewContainers(),
            RoomyQuota());
}
// Percentage requests, without and with the quota: the check runs on every card that reaches it.
void BM_Decide_OneContainerPercent(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false,
            OneContainerPercent());
}
void BM_Decide_OneContainerPercent_Quota(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false,
            OneContainerPercent(), RoomyQuota());
}
void BM_Decide_FewContainersPercent(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false,
            FewContainersPercent());
}
void BM_Decide_FewContainersPercent_Quota(benchmark::State& state) {
  RunDecide(state, NodePolicy::kBinpack, GpuPolicy{{GpuPolicyKey::kSpread}}, false,
            FewContainersPercent(), RoomyQuota());
}
// A pod no card can hold (40000 MiB on 32 GiB cards): every candidate fails on every device.
// Decide and the failed-node list alone, and followed by what serve adds for such a pod on the
// filter's thread: the verdict (nearest miss over every candidate device, BuildVerdict) and its
// bytes.
PodRequest NothingFits() {
  PodRequest p;
  p.containers = {Req(1, 40000, 0)};
  return p;
}
void RunNothingFits(benchmark::State& state, bool verdict) {
  const std::vector<Candidate> candidates = PickCandidates(7);
  const PodRequest pod = NothingFits();
  const device::PodConstraints constraints;
  size_t bytes = 0;
  for (auto _ : state) {
    Decision d = Decide(candidates, pod, constraints, NodePolicy::kBinpack,
                        GpuPolicy{{GpuPolicyKey::kSpread}});
    benchmark::DoNotOptimize(d);
    // The filter's outcome lists the failed nodes either way.
    std::vector<extender::FailedNode> failed;
    failed.reserve(d.nodes.size());
    for (size_t i = 0; i < d.nodes.size(); ++i) {
      failed.push_back(extender::FailedNodeOf(candidates[i].name, d.nodes[i]));
    }
    benchmark::DoNotOptimize(failed);
    if (!verdict) {
      continue;
    }
    const extender::Verdict v = extender::BuildVerdict({.request = &pod,
                                                        .candidates = candidates,
                                                        .failed = &failed,
                                                        .ledger = nullptr,
                                                        .lock_of = nullptr,
                                                        .withheld = nullptr});
    const std::string json = extender::EncodeVerdict(v);
    bytes = json.size();
    benchmark::DoNotOptimize(json);
  }
  state.counters["candidates"] = kCandidates;
  state.counters["verdict_bytes"] = static_cast<double>(bytes);
}
void BM_Decide_NothingFits(benchmark::State& state) { RunNothingFits(state, false); }
void BM_Decide_NothingFits_Verdict(benchmark::State& state) { RunNothingFits(state, true); }
BENCHMARK(BM_Decide_NothingFits)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_NothingFits_Verdict)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_Decide_OneContainerPercent)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_OneContainerPercent_Quota)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_FewContainersPercent)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_FewContainersPercent_Quota)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_OneContainer)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_OneContainer_Quota)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_BinpackSpread_Quota)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_OneContainer_ColdCaches)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_BinpackSpread)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_MostNodesFail)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_SpreadBinpack)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Decide_BinpackNumaChainNumaBind)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera::schedule

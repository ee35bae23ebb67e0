// Benchmark of the requeue's round (extender/requeue.h, docs/requeue.md) on a 1,000-node x
// 8-GPU cluster whose every card is full, with 5,000 refused pods (one 8000 MiB GPU each,
// priorities 0-9): a round without a gain (the leader's cost every 200 ms: the ledger's changes
// since the last round, none) and a round after a burst of frees on `frees` cards of as many nodes
// (view, comparison and picks; each freed 16384 MiB card takes two pods).
//
//   cmake --preset release && cmake --build build/release --target requeue_bench -j2
//   ./build/release/bench/requeue_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true      (one command line)
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

#include "tessera/extender/requeue.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

constexpr int kNodes = 1000;
constexpr int kGpusPerNode = 8;
constexpr int kRefused = 5000;

std::string Node(int n) { return "gpu-node-" + std::to_string(n) + ".cluster.example.internal"; }
std::string Uuid(int n, int g) {
  return "GPU-" + std::to_string(n) + "-" + std::to_string(g) + "-0fc3eda5-e98b-a25b-5b0d";
}

// The full cluster: every card held by one bound 16000 MiB pod (uid "hold-<n>-<g>").
std::unique_ptr<ledger::Ledger> FullCluster() {
  auto ledger = std::make_unique<ledger::Ledger>();
  for (int n = 0; n < kNodes; ++n) {
    std::vector<std::string> uuids;
    for (int g = 0; g < kGpusPerNode; ++g) {
      uuids.push_back(Uuid(n, g));
    }
    (void)ledger->SetNode(testing::GpuNodeDevices(Node(n), uuids, 16384));
    for (int g = 0; g < kGpusPerNode; ++g) {
      ledger::PodAllocation a;
      a.uid = "hold-" + std::to_string(n) + "-" + std::to_string(g);
      a.ns = "team-" + std::to_string(n % 50);
      a.name = a.uid;
      a.node = a.bound_node = Node(n);
      a.devices = {{{Uuid(n, g), "NVIDIA", 16000, 0}}};
      (void)ledger->Apply(a);
    }
  }
  return ledger;
}

std::vector<std::shared_ptr<const kube::Pod>> RefusedPods() {
  std::vector<std::shared_ptr<const kube::Pod>> out;
  for (int i = 0; i < kRefused; ++i) {
    auto pod = std::make_shared<kube::Pod>();
    pod->meta.ns = "ml-" + std::to_string(i % 20);
    pod->meta.name = "train-" + std::to_string(i);
    pod->meta.uid = "uid-" + std::to_string(i);
    pod->priority = i % 10;
    pod->containers.push_back(testing::GpuContainer("main", "1", "8000", ""));
    out.push_back(std::move(pod));
  }
  return out;
}

void BM_RoundWithoutGain(benchmark::State& state) {
  const std::unique_ptr<ledger::Ledger> ledger = FullCluster();
  CapacityView view;
  Advance(*ledger, {}, &view);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Advance(*ledger, {}, &view));
  }
}
BENCHMARK(BM_RoundWithoutGain)->Unit(benchmark::kMicrosecond);

// A round when `frees` cards of as many nodes freed since the last one (the view is taken back
// to the full cluster outside the timing).
void BM_RoundAfterFrees(benchmark::State& state) {
  const int frees = static_cast<int>(state.range(0));
  const std::unique_ptr<ledger::Ledger> ledger = FullCluster();
  const std::unique_ptr<device::Vendor> vendor =
      device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  const std::vector<std::shared_ptr<const kube::Pod>> pods = RefusedPods();
  CapacityView full;
  Advance(*ledger, {}, &full);
  for (int i = 0; i < frees; ++i) {
    (void)ledger->Remove("hold-" + std::to_string(i * (kNodes / frees)) + "-0");
  }
  size_t picked = 0;
  for (auto _ : state) {
    state.PauseTiming();
    CapacityView view = full;
    state.ResumeTiming();
    const Gains gains = Advance(*ledger, {}, &view);
    bool tried_all = false;
    picked =
        PickRequeues(*vendor, cycle::Config{}, gains, pods, {}, 100000, view, &tried_all).size();
  }
  state.counters["picked"] = static_cast<double>(picked);
}
BENCHMARK(BM_RoundAfterFrees)->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::extender

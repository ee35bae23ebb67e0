// Cost of reading a pod's device request: quantity parsing and request derivation, which run
// for every pod a filter call sees and for every pod the ledger ingests.
#include <string>

#include "benchmark/benchmark.h"

#include "tessera/device/quantity.h"
#include "tessera/device/request.h"

namespace {

void BM_ParseQuantity(benchmark::State& state, const std::string& text) {
  for (auto _ : state) {
    auto q = tessera::device::ParseQuantity(text);
    benchmark::DoNotOptimize(q);
  }
}
BENCHMARK_CAPTURE(BM_ParseQuantity, integer, std::string("4000"));
BENCHMARK_CAPTURE(BM_ParseQuantity, binary, std::string("1536Mi"));
BENCHMARK_CAPTURE(BM_ParseQuantity, fraction, std::string("1.5Gi"));

void BM_DerivePodRequest(benchmark::State& state) {
  tessera::kube::Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  tessera::kube::Container main;
  main.name = "main";
  main.limits = {{"cpu", "2"},
                 {"memory", "8Gi"},
                 {"nvidia.com/gpu", "2"},
                 {"nvidia.com/gpumem", "8000"},
                 {"nvidia.com/gpucores", "50"}};
  tessera::kube::Container sidecar;
  sidecar.name = "sidecar";
  sidecar.limits = {{"cpu", "100m"}};
  pod.containers = {main, sidecar};
  tessera::device::NvidiaConfig config = tessera::device::DefaultNvidiaConfig();
  for (auto _ : state) {
    auto r = tessera::device::DerivePodRequest(pod, config);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_DerivePodRequest);

}  // namespace

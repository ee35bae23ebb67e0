// Decoding a /refit body (extender::DecodeRefitRequest) with many keys: HAMi's plugin sends 8,
// but /refit is unauthenticated, so a caller may send any number (issue #41: 80,000 keys took
// 8.1 s with the decoder that built the object). Each body is HAMi's request plus n unknown
// keys "k<i>":<i>, every 16th of them a case variant of podUID that is decoded, so the work
// per key is the work the decoder really does. Figures: docs/benchmarks.md "/refit decoding".
//
//   cmake --preset release && cmake --build build/release --target refit_bench -j2
//   ./build/release/bench/refit_bench
#include <cstdint>
#include <string>

#include "benchmark/benchmark.h"
#include "fmt/format.h"

#include "tessera/extender/refit.h"

namespace tessera::extender {
namespace {

std::string Body(int64_t keys) {
  std::string body =
      R"({"podUID":"u1","podNamespace":"ml","podName":"p","nodeName":"n1","containerIndex":1,)"
      R"("containerName":"main","deviceType":"NVIDIA","allowedDeviceUUIDs":["GPU-b","GPU-c"])";
  for (int64_t i = 0; i < keys; ++i) {
    if (i % 16 == 0) {
      body += fmt::format(R"(,"{}":"u{}")", (i / 16) % 2 == 0 ? "PODUID" : "poduid", i);
    } else {
      body += fmt::format(R"(,"k{}":{})", i, i);
    }
  }
  body += '}';
  return body;
}

void BM_DecodeRefitRequest(benchmark::State& state) {
  const std::string body = Body(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<RefitRequest> req = DecodeRefitRequest(body);
    if (!req.ok()) {
      state.SkipWithError("the body does not decode");
      break;
    }
    benchmark::DoNotOptimize(req->pod_uid);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(body.size()));
  state.counters["body_bytes"] = static_cast<double>(body.size());
}
BENCHMARK(BM_DecodeRefitRequest)
    ->Arg(8)
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(80000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::extender

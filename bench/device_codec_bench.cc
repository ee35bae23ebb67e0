// Throughput of the HAMi wire codecs on realistic values: an 8-GPU node registration in both
// formats and a pod allocation string (docs/hami-device-plugin.md §2.5 case 2). The ledger decodes
// one allocation per pod watch event, the node registry one registration per node update.
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

#include "tessera/device/codec.h"

namespace tessera::device {
namespace {

std::vector<DeviceInfo> EightGpus() {
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < 8; ++i) {
    DeviceInfo d;
    d.id = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d14" + std::to_string(10 + i);
    d.index = i;
    d.count = 10;
    d.devmem = 81920;
    d.devcore = 100;
    d.type = "NVIDIA A100-SXM4-80GB";
    d.numa = i / 4;
    devices.push_back(d);
  }
  return devices;
}

constexpr char kCase2[] =
    "GPU-dddddddd-0000-0000-0000-000000000004,NVIDIA,2000,20:;;"
    "GPU-aaaaaaaa-0000-0000-0000-000000000001,NVIDIA,3000,30:;"
    "GPU-bbbbbbbb-0000-0000-0000-000000000002,NVIDIA,4000,50:"
    "GPU-cccccccc-0000-0000-0000-000000000003,NVIDIA,4000,50:;";

void BM_DecodeRegisterJson(benchmark::State& state) {
  std::string value = EncodeNodeRegisterJson(EightGpus());
  for (auto _ : state) {
    auto r = DecodeNodeRegister(value);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * value.size()));
}
BENCHMARK(BM_DecodeRegisterJson);

void BM_DecodeRegisterDelimited(benchmark::State& state) {
  std::string value = EncodeNodeRegisterDelimited(EightGpus());
  for (auto _ : state) {
    auto r = DecodeNodeRegister(value);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * value.size()));
}
BENCHMARK(BM_DecodeRegisterDelimited);

void BM_EncodeRegisterJson(benchmark::State& state) {
  std::vector<DeviceInfo> devices = EightGpus();
  for (auto _ : state) {
    std::string s = EncodeNodeRegisterJson(devices);
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(BM_EncodeRegisterJson);

void BM_DecodePodDevices(benchmark::State& state) {
  for (auto _ : state) {
    auto r = DecodePodDevices(kCase2);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_DecodePodDevices);

void BM_EncodePodDevices(benchmark::State& state) {
  PodDevices pod = *DecodePodDevices(kCase2);
  for (auto _ : state) {
    std::string s = EncodePodDevices(pod);
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(BM_EncodePodDevices);

}  // namespace
}  // namespace tessera::device

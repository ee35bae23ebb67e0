// Fuzz target: DecodeNodeScores is total, and what decodes survives the encoder: decode ->
// encode -> decode gives the same matrix over the UUIDs the value names, and PairScoreMatrix
// never reads outside its input.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tessera/device/node_scores.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::device;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<GpuPairScores>> first = DecodeNodeScores(input);
  if (!first.ok()) {
    if (first.status().message().empty()) {
      __builtin_trap();  // every error names what is wrong
    }
    return 0;
  }
  // A registration with every UUID the value names (unique, at most 64).
  std::vector<DeviceInfo> devices;
  auto add = [&devices](const std::string& id) {
    for (const auto& d : devices) {
      if (d.id == id) {
        return;
      }
    }
    if (devices.size() < 64) {
      DeviceInfo d;
      d.id = id;
      devices.push_back(d);
    }
  };
  for (const auto& e : *first) {
    add(e.uuid);
    for (const auto& [key, value] : e.scores) {
      add(key);
    }
  }
  const std::vector<int64_t> matrix = PairScoreMatrix(devices, *first);
  if (!matrix.empty() && matrix.size() != devices.size() * devices.size()) {
    __builtin_trap();
  }
  absl::StatusOr<std::vector<GpuPairScores>> second = DecodeNodeScores(EncodeNodeScores(*first));
  if (!second.ok() || PairScoreMatrix(devices, *second) != matrix) {
    __builtin_trap();
  }
  return 0;
}

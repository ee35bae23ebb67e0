// Fuzz target: DecodePodDevices is total, and what decodes round-trips:
// decode -> encode -> decode yields the same entries, and re-encoding is a fixed point.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/device/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::device;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<PodDevices> first = DecodePodDevices(input);
  if (!first.ok()) {
    if (first.status().message().empty()) {
      __builtin_trap();
    }
    return 0;
  }
  std::string encoded = EncodePodDevices(*first);
  absl::StatusOr<PodDevices> second = DecodePodDevices(encoded);
  if (!second.ok() || *second != *first) {
    __builtin_trap();
  }
  if (EncodePodDevices(*second) != encoded) {
    __builtin_trap();
  }
  return 0;
}

// Fuzz target: DecodeMigAllocations is total, and what decodes round-trips: decode -> encode
// -> decode yields the same allocations, and re-encoding is a fixed point. Also feeds the input
// to DecodeMigProfiles, which must not crash and round-trips the same way.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/device/mig.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::device;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<MigAllocation>> first = DecodeMigAllocations(input);
  if (!first.ok()) {
    if (first.status().message().empty()) {
      __builtin_trap();
    }
  } else {
    std::string encoded = EncodeMigAllocations(*first);
    absl::StatusOr<std::vector<MigAllocation>> second = DecodeMigAllocations(encoded);
    if (!second.ok() || *second != *first || EncodeMigAllocations(*second) != encoded) {
      __builtin_trap();
    }
  }
  absl::StatusOr<std::vector<MigProfile>> profiles = DecodeMigProfiles(input);
  if (profiles.ok()) {
    std::string encoded;
    AppendMigProfilesJson(&encoded, *profiles);
    absl::StatusOr<std::vector<MigProfile>> again = DecodeMigProfiles(encoded);
    if (!again.ok() || *again != *profiles) {
      __builtin_trap();
    }
  } else if (profiles.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}

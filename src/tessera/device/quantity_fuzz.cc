// Fuzz target: ParseQuantity is total, and a parsed quantity's canonical form denotes the same
// value. (The canonical string itself need not be a fixed point: a binary quantity rendered
// without a suffix, such as 1.5Ki -> "1536", reads back as decimal SI, as in Kubernetes.)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/device/quantity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::device::Quantity> q = tessera::device::ParseQuantity(text);
  if (!q.ok()) {
    return 0;
  }
  std::string canonical = q->ToString();
  absl::StatusOr<tessera::device::Quantity> again = tessera::device::ParseQuantity(canonical);
  if (!again.ok() || !(*again == *q)) {
    std::abort();
  }
  // Exercise the accessors; their results must agree with each other.
  absl::StatusOr<int64_t> v = q->AsInt64();
  if (v.ok() && !(tessera::device::Quantity::FromInt64(*v) == *q)) {
    std::abort();
  }
  (void)q->MilliValue();
  return 0;
}

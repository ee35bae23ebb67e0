// Any bytes decode to a verdict or to an error with a message, never a crash; what decodes
// re-encodes within the 1 KiB bound, decodes again to what its encoding holds, and formats.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "absl/time/time.h"

#include "tessera/extender/verdict.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::extender::DecodeVerdict;
  using tessera::extender::EncodeVerdict;
  std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::extender::Verdict> verdict = DecodeVerdict(json);
  if (!verdict.ok()) {
    if (verdict.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  const std::string encoded = EncodeVerdict(*verdict);
  if (encoded.size() > tessera::extender::kMaxVerdictBytes) {
    std::abort();
  }
  absl::StatusOr<tessera::extender::Verdict> back = DecodeVerdict(encoded);
  if (!back.ok() || EncodeVerdict(*back) != encoded) {
    std::abort();
  }
  (void)tessera::extender::FormatVerdict(*back, absl::UnixEpoch());
  return 0;
}

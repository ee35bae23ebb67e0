// Any bytes: DecodeTop gives a view or an error with a message, never a crash; a view filters,
// renders and converts to JSON without one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/explain/top.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::explain::TopView> view = tessera::explain::DecodeTop(body);
  if (!view.ok()) {
    if (view.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  tessera::explain::TopOptions options;
  options.sort =
      size % 2 == 0 ? tessera::explain::TopSort::kFree : tessera::explain::TopSort::kNode;
  options.min_free = static_cast<int64_t>(size);
  const tessera::explain::TopView shown = tessera::explain::FilterTop(*view, options);
  (void)tessera::explain::RenderTopText(shown, absl::UnixEpoch());
  (void)tessera::explain::TopJson(shown).dump();
  return 0;
}

// Any bytes escape to valid UTF-8 without a control character (terminal.h); escaping is stable:
// what it returns escapes to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/explain/terminal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string out = tessera::explain::EscapeForTerminal(text);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto b = static_cast<uint8_t>(out[i]);
    if ((b < 0x20 && b != '\t') || b == 0x7F) {
      std::abort();
    }
  }
  if (tessera::explain::EscapeForTerminal(out) != out) {
    std::abort();  // invalid UTF-8, a C1 or a bidi control survived
  }
  return 0;
}

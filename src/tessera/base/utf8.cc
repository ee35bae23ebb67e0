#include "tessera/base/utf8.h"

namespace tessera::base {

size_t Utf8SequenceLength(std::string_view s) {
  if (s.empty()) {
    return 0;
  }
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = at(0);
  if (lead < 0x80) {
    return 1;
  }
  // The lead byte fixes the length and the range of the first continuation byte, which is how
  // overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above
  // U+10FFFF (F4 90..BF) are refused; the other continuation bytes are 80..BF.
  size_t size = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    size = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    size = 3;
    lo = lead == 0xe0 ? 0xa0 : 0x80;
    hi = lead == 0xed ? 0x9f : 0xbf;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    size = 4;
    lo = lead == 0xf0 ? 0x90 : 0x80;
    hi = lead == 0xf4 ? 0x8f : 0xbf;
  }
  if (size == 0 || s.size() < size || at(1) < lo || at(1) > hi) {
    return 0;
  }
  for (size_t k = 2; k < size; ++k) {
    if (at(k) < 0x80 || at(k) > 0xbf) {
      return 0;
    }
  }
  return size;
}

}  // namespace tessera::base

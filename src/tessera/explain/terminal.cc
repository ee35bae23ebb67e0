#include "tessera/explain/terminal.h"

#include <cstddef>
#include <cstdint>

#include "fmt/format.h"

namespace tessera::explain {
namespace {

// The code point of the UTF-8 sequence at text[i] and its length, or length 0 when the bytes
// there are not a valid sequence (overlong forms, surrogates and values past U+10FFFF included).
struct Decoded {
  char32_t code_point = 0;
  size_t length = 0;
};

Decoded DecodeUtf8(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    return {b0, 1};
  }
  size_t length = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2;
    cp = b0 & 0x1F;
    min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3;
    cp = b0 & 0x0F;
    min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4;
    cp = b0 & 0x07;
    min = 0x10000;
  } else {
    return {};
  }
  if (i + length > text.size()) {
    return {};
  }
  for (size_t k = 1; k < length; ++k) {
    const uint8_t b = byte(i + k);
    if ((b & 0xC0) != 0x80) {
      return {};
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return {};
  }
  return {cp, length};
}

bool IsBidiControl(char32_t cp) {
  return cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string EscapeForTerminal(std::string_view text, Newlines newlines) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const Decoded d = DecodeUtf8(text, i);
    if (d.length == 0) {
      out += fmt::format("\\x{:02x}", static_cast<uint8_t>(text[i]));
      ++i;
      continue;
    }
    const char32_t cp = d.code_point;
    const bool keep_newline = cp == '\n' && newlines == Newlines::kKeep;
    if ((cp < 0x20 && cp != '\t' && !keep_newline) || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if ((cp >= 0x80 && cp <= 0x9F) || IsBidiControl(cp)) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
    } else {
      out.append(text.substr(i, d.length));
    }
    i += d.length;
  }
  return out;
}

}  // namespace tessera::explain

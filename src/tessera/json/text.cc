#include "tessera/json/text.h"

#include <cstddef>
#include <string>

namespace tessera::json {

bool KeyEqualsFold(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    char y = b[i];
    if (x == y) {
      continue;
    }
    if (x >= 'A' && x <= 'Z') {
      x = static_cast<char>(x - 'A' + 'a');
    }
    if (y >= 'A' && y <= 'Z') {
      y = static_cast<char>(y - 'A' + 'a');
    }
    if (x != y) {
      return false;
    }
  }
  return true;
}

bool ExceedsDepth(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        return true;
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

namespace {

// Bytes Go writes as they are: printable ASCII and DEL, other than '"', '\\', '<', '>' and '&'.
constexpr bool IsPlain(unsigned char c) {
  return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&';
}

// Length of the valid UTF-8 sequence that starts s[i] (a byte >= 0x80), or 0 when it is not one.
// The lead byte fixes the length and the range of the first continuation byte, which is how
// overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and runes above U+10FFFF
// (F4 90..BF) are refused; the other continuation bytes are 80..BF.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = at(0);
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
  if (size == 0 || s.size() - i < size || at(1) < lo || at(1) > hi) {
    return 0;
  }
  for (size_t k = 2; k < size; ++k) {
    if (at(k) < 0x80 || at(k) > 0xbf) {
      return 0;
    }
  }
  return size;
}

}  // namespace

void AppendGoString(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    size_t run = i;
    while (run < s.size() && IsPlain(static_cast<unsigned char>(s[run]))) {
      ++run;
    }
    out->append(s.data() + i, run - i);
    i = run;
    if (i == s.size()) {
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      // '"', '\\' and the controls with a short form are written as backslash and a letter; the
      // other controls, '<', '>' and '&' as \u00xx.
      static constexpr std::string_view kShort = "\"\\\b\f\n\r\t";
      static constexpr std::string_view kShortLetter = "\"\\bfnrt";
      const size_t k = kShort.find(static_cast<char>(c));
      if (k != std::string_view::npos) {
        out->push_back('\\');
        out->push_back(kShortLetter[k]);
      } else {
        out->append("\\u00");
        out->push_back(kHex[c >> 4]);
        out->push_back(kHex[c & 0xf]);
      }
      ++i;
      continue;
    }
    const size_t size = Utf8SequenceLength(s, i);
    if (size == 0) {
      out->append("\\ufffd");  // Go replaces each invalid byte with U+FFFD
      ++i;
      continue;
    }
    // U+2028 and U+2029 are E2 80 A8 and E2 80 A9.
    if (size == 3 && c == 0xe2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
        (static_cast<unsigned char>(s[i + 2]) == 0xa8 ||
         static_cast<unsigned char>(s[i + 2]) == 0xa9)) {
      out->append(static_cast<unsigned char>(s[i + 2]) == 0xa8 ? "\\u2028" : "\\u2029");
    } else {
      out->append(s.data() + i, size);
    }
    i += size;
  }
  out->push_back('"');
}

std::string PointerEscape(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace tessera::json

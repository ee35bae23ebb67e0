#include "tessera/json/text.h"

#include <cstddef>
#include <string>

#include "tessera/base/utf8.h"

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
    const size_t size = base::Utf8SequenceLength(s.substr(i));
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

// File: tessera/json/text.h
//
// Small helpers over JSON text shared by Tessera's decoders.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace tessera::json {

// Whether `a` and `b` are equal when ASCII letters are compared without regard to case (other
// bytes compare exactly). This is how Go's encoding/json matches object keys to struct fields,
// so decoders of Go-produced JSON without tags (the scheduler extender types) use it:
// KeyEqualsFold("nodenames", "NodeNames") is true.
bool KeyEqualsFold(std::string_view a, std::string_view b);

// Whether `c` is JSON insignificant whitespace (space, tab, line feed, carriage return).
constexpr bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// True when `text` nests arrays/objects deeper than `max_depth` (brackets inside strings do not
// count). Checked before parsing, so that recursive JSON handling cannot exhaust the stack.
bool ExceedsDepth(std::string_view text, int max_depth);

// Appends `s` to `*out` as a quoted JSON string, escaped exactly as Go's encoding/json writes it
// by default (json.Marshal, HTML escaping on, Go 1.22+):
//   - '"' and '\\' as \" and \\; \b \f \n \r \t in their short forms;
//   - other bytes below 0x20, and '<', '>', '&', as \u00xx (lower-case hex): \u003c \u003e \u0026;
//   - U+2028 and U+2029 as \u2028 and \u2029;
//   - each byte that does not start a valid UTF-8 sequence (as utf8.DecodeRuneInString judges it:
//     no overlong forms, no surrogates, nothing above U+10FFFF) as \ufffd, one per byte;
//   - everything else (DEL and valid multi-byte UTF-8 included) as it is.
// The HAMi annotations and the extender replies must match Go's bytes, hence one copy of this rule.
void AppendGoString(std::string* out, std::string_view s);

// "~" → "~0", "/" → "~1": a map key as one JSON-pointer (RFC 6901) segment.
std::string PointerEscape(std::string_view key);

}  // namespace tessera::json

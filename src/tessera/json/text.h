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

// "~" → "~0", "/" → "~1": a map key as one JSON-pointer (RFC 6901) segment.
std::string PointerEscape(std::string_view key);

}  // namespace tessera::json

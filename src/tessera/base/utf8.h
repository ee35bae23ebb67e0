// File: tessera/base/utf8.h
//
// Utf8SequenceLength: the length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms,
// surrogates or code points above U+10FFFF) at the start of `s`, 1 for an ASCII byte, 0 when `s`
// is empty or starts with no well-formed sequence. The JSON text encoder and the log line writer
// both decide with it which bytes to pass through, so a log line and a JSON document agree on
// what is valid text.
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string_view>

namespace tessera::base {

size_t Utf8SequenceLength(std::string_view s);

}  // namespace tessera::base

// File: tessera/device/codec_internal.h
//
// Text helpers shared by the codec implementation files (codec.cc, time_codec.cc,
// constraints.cc). Not part of the public API.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::device::internal {

// Go strconv.Atoi restricted to int32: optional '+'/'-', then one or more ASCII digits, nothing
// else. nullopt on any other input or on overflow.
std::optional<int32_t> ParseGoInt32(std::string_view text);

// Go strconv.ParseBool: 1,t,T,TRUE,true,True / 0,f,F,FALSE,false,False.
std::optional<bool> ParseGoBool(std::string_view text);

// Splits on `sep`; always returns at least one piece ("" -> {""}).
std::vector<std::string_view> Split(std::string_view text, char sep);

// Removes ASCII whitespace (space, \t, \n, \v, \f, \r) at both ends.
std::string_view TrimAscii(std::string_view text);

// `text` in double quotes for an error message: '"' and '\' escaped, bytes outside printable
// ASCII as \xNN, cut after 64 bytes with "..." appended.
std::string Quote(std::string_view text);

}  // namespace tessera::device::internal

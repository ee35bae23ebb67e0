// File: tessera/explain/terminal.h
//
// Text from the cluster made safe to print on a terminal. What `tessera why` prints comes from
// annotations a pod's owner can write (tessera.io/verdict) and from a server's answer; printed
// raw, an ESC sequence in it could clear the screen, move the cursor, retitle the window or hide
// lines, and a bidi override could make text read as something else. EscapeForTerminal turns
// every such character into visible escape text:
//
//   std::string safe = EscapeForTerminal("GPU-a\x1b[2J");   // "GPU-a\x1b[2J" as 11 visible bytes
//
// Escaped, as `\xHH` (bytes) or `\uHHHH` (code points): C0 controls (U+0000–U+001F) except a
// tab and, with kKeepNewlines, '\n'; DEL (U+007F); C1 controls (U+0080–U+009F); the bidi
// controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069); bytes that are not valid
// UTF-8 (a stray 0x9B is CSI to an 8-bit terminal). Everything else, other UTF-8 included, is
// kept as it is. The output is valid UTF-8 with none of those characters.
//
// Errors: none. Thread safety: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace tessera::explain {

enum class Newlines { kEscape, kKeep };

std::string EscapeForTerminal(std::string_view text, Newlines newlines = Newlines::kEscape);

}  // namespace tessera::explain

// What `tessera why` does to text before printing it (terminal.h).
#include "tessera/explain/terminal.h"

#include <string>

#include <gtest/gtest.h>

namespace tessera::explain {
namespace {

TEST(EscapeForTerminalTest, ControlSequencesBecomeVisibleText) {
  EXPECT_EQ(EscapeForTerminal("GPU-a\x1b[2J\x1b]0;owned\x07"), "GPU-a\\x1b[2J\\x1b]0;owned\\x07");
  EXPECT_EQ(EscapeForTerminal(std::string("a\0b\rc\x7f", 6)), "a\\x00b\\x0dc\\x7f");
  // C1 controls as UTF-8 (U+009B is CSI) and as lone bytes, which are not UTF-8.
  EXPECT_EQ(EscapeForTerminal("x\xc2\x9b"
                              "2Jy"),
            "x\\u009b2Jy");
  EXPECT_EQ(EscapeForTerminal("x\x9b"
                              "2J\xff"),
            "x\\x9b2J\\xff");
  // Bidi overrides and isolates.
  EXPECT_EQ(EscapeForTerminal("ml/\xe2\x80\xaegpj.exe"), "ml/\\u202egpj.exe");
  EXPECT_EQ(EscapeForTerminal("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  // Overlong forms and surrogates are not UTF-8.
  EXPECT_EQ(EscapeForTerminal("\xc0\x9b"), "\\xc0\\x9b");
  EXPECT_EQ(EscapeForTerminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");
}

TEST(EscapeForTerminalTest, NewlinesAreEscapedUnlessKept) {
  EXPECT_EQ(EscapeForTerminal("a\nb\tc"), "a\\x0ab\tc");
  EXPECT_EQ(EscapeForTerminal("a\nb\x1b", Newlines::kKeep), "a\nb\\x1b");
}

TEST(EscapeForTerminalTest, PrintableTextAndOtherUtf8AreKept) {
  const std::string text =
      "node gpu-7 / GPU-0: 3g.20gb (19968 MiB) \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  EXPECT_EQ(EscapeForTerminal(text), text);
  EXPECT_EQ(EscapeForTerminal(""), "");
}

}  // namespace
}  // namespace tessera::explain

#include "tessera/json/text.h"

#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace tessera::json {
namespace {

TEST(KeyEqualsFoldTest, AsciiCaseInsensitive) {
  EXPECT_TRUE(KeyEqualsFold("NodeNames", "nodenames"));
  EXPECT_TRUE(KeyEqualsFold("failedNodes", "FAILEDNODES"));
  EXPECT_TRUE(KeyEqualsFold("", ""));
  EXPECT_FALSE(KeyEqualsFold("Node", "Nodes"));
  EXPECT_FALSE(KeyEqualsFold("Pod", "Pad"));
  // Only ASCII letters fold: '@' (0x40) and '`' (0x60) differ from each other by the case bit.
  EXPECT_FALSE(KeyEqualsFold("@", "`"));
  EXPECT_FALSE(KeyEqualsFold("[", "{"));
  EXPECT_FALSE(KeyEqualsFold("\xc3\x84", "\xc3\xa4"));  // Ä vs ä: not folded
}

TEST(IsJsonSpaceTest, FourCharacters) {
  EXPECT_TRUE(IsJsonSpace(' '));
  EXPECT_TRUE(IsJsonSpace('\n'));
  EXPECT_TRUE(IsJsonSpace('\r'));
  EXPECT_TRUE(IsJsonSpace('\t'));
  EXPECT_FALSE(IsJsonSpace('\v'));
  EXPECT_FALSE(IsJsonSpace('x'));
}

TEST(ExceedsDepthTest, CountsNestingOutsideStringsOnly) {
  EXPECT_TRUE(ExceedsDepth(std::string(5000, '['), 1000));
  EXPECT_FALSE(ExceedsDepth(R"({"a":"[[[[[[[[[[\"[[[["})", 3));
  EXPECT_FALSE(ExceedsDepth(R"({"a":{"b":[1]}})", 3));
  EXPECT_TRUE(ExceedsDepth(R"({"a":{"b":[[1]]}})", 3));
}

TEST(PointerEscapeTest, TildeAndSlash) {
  EXPECT_EQ(PointerEscape("hami.io/mutex~lock"), "hami.io~1mutex~0lock");
  EXPECT_EQ(PointerEscape("nvidia.com/gpu"), "nvidia.com~1gpu");
  EXPECT_EQ(PointerEscape("plain"), "plain");
}

std::string GoString(std::string_view s) {
  std::string out;
  AppendGoString(&out, s);
  return out;
}

// The vectors below are what Go's json.Marshal(string) writes (encoding/json, Go 1.22+).
TEST(AppendGoStringTest, QuotesAndKeepsPlainText) {
  EXPECT_EQ(GoString(""), "\"\"");
  EXPECT_EQ(GoString("GPU-0 nvidia ~/_.:;!?"), "\"GPU-0 nvidia ~/_.:;!?\"");
  std::string out = "x=";
  AppendGoString(&out, "a");
  EXPECT_EQ(out, "x=\"a\"");  // appends, does not replace
}

TEST(AppendGoStringTest, QuoteAndBackslash) { EXPECT_EQ(GoString("\"q\"\\"), R"("\"q\"\\")"); }

TEST(AppendGoStringTest, HtmlCharactersAsUnicodeEscapes) {
  EXPECT_EQ(GoString("<a&b>"), R"("\u003ca\u0026b\u003e")");
}

TEST(AppendGoStringTest, ControlCharacters) {
  // Short forms for \b \f \n \r \t (Go 1.22 added \b and \f), \u00xx with lower-case hex for the
  // other bytes below 0x20; DEL (0x7f) is written as it is.
  EXPECT_EQ(GoString("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  EXPECT_EQ(GoString(std::string_view("\x00\x01\x1b\x1f", 4)), R"("\u0000\u0001\u001b\u001f")");
  EXPECT_EQ(GoString("\x7f"), "\"\x7f\"");
}

TEST(AppendGoStringTest, LineAndParagraphSeparators) {
  EXPECT_EQ(GoString("a\xe2\x80\xa8"
                     "b\xe2\x80\xa9"),
            R"("a\u2028b\u2029")");
  // Their neighbours U+2027 and U+202A are written as they are.
  EXPECT_EQ(GoString("\xe2\x80\xa7\xe2\x80\xaa"), "\"\xe2\x80\xa7\xe2\x80\xaa\"");
}

TEST(AppendGoStringTest, ValidUtf8AsItIs) {
  EXPECT_EQ(GoString("\xc3\xa9"), "\"\xc3\xa9\"");                  // é
  EXPECT_EQ(GoString("\xe6\x97\xa5"), "\"\xe6\x97\xa5\"");          // 日
  EXPECT_EQ(GoString("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");  // U+1F600
  EXPECT_EQ(GoString("\xf4\x8f\xbf\xbf"), "\"\xf4\x8f\xbf\xbf\"");  // U+10FFFF
  EXPECT_EQ(GoString("\xef\xbf\xbd"), "\"\xef\xbf\xbd\"");          // U+FFFD itself
}

TEST(AppendGoStringTest, InvalidUtf8OneReplacementPerByte) {
  EXPECT_EQ(GoString("\xff"), R"("\ufffd")");
  EXPECT_EQ(GoString("\x80"), R"("\ufffd")");                      // lone continuation byte
  EXPECT_EQ(GoString("\xc3"), R"("\ufffd")");                      // truncated sequence
  EXPECT_EQ(GoString("\xc3(x"), R"("\ufffd(x")");                  // bad continuation
  EXPECT_EQ(GoString("\xc0\xaf"), R"("\ufffd\ufffd")");            // overlong '/'
  EXPECT_EQ(GoString("\xe0\x80\xaf"), R"("\ufffd\ufffd\ufffd")");  // overlong, 3 bytes
  EXPECT_EQ(GoString("\xed\xa0\x80"), R"("\ufffd\ufffd\ufffd")");  // surrogate U+D800
  EXPECT_EQ(GoString("\xf0\x8f\xbf\xbf"), R"("\ufffd\ufffd\ufffd\ufffd")");  // overlong, 4 bytes
  EXPECT_EQ(GoString("\xf4\x90\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");  // above U+10FFFF
  EXPECT_EQ(GoString("\xf5\x80\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");
  EXPECT_EQ(GoString("\xe6\x97"), R"("\ufffd\ufffd")");  // truncated at the end
}

}  // namespace
}  // namespace tessera::json

#include "tessera/json/text.h"

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

}  // namespace
}  // namespace tessera::json

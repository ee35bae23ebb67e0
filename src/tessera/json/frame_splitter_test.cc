#include "tessera/json/frame_splitter.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::json {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> SplitAll(std::string_view stream) {
  FrameSplitter splitter;
  std::vector<std::string> frames;
  EXPECT_TRUE(splitter.Feed(stream, &frames).ok());
  EXPECT_FALSE(splitter.InFrame());
  return frames;
}

TEST(FrameSplitterTest, SplitsAtObjectBoundariesNotNewlines) {
  EXPECT_THAT(SplitAll("{\"a\":1}{\"b\":2}\n  {\"c\":\n3}\r\n\t"),
              ElementsAre("{\"a\":1}", "{\"b\":2}", "{\"c\":\n3}"));
}

TEST(FrameSplitterTest, BracesInsideStringsAndEscapes) {
  const std::string a = R"({"msg":"} { [ ] \" \\","x":[{"y":"\\\""}]})";
  const std::string b = R"({"k":"\\"})";
  EXPECT_THAT(SplitAll(a + "\n" + b + "\n"), ElementsAre(a, b));
}

TEST(FrameSplitterTest, ObjectSplitAtEveryByte) {
  const std::string stream =
      "{\"type\":\"ADDED\",\"object\":{\"s\":\"a\\\"}{\"}}\n{\"type\":\"DELETED\",\"o\":[1,{}]}\n";
  const std::vector<std::string> want = SplitAll(stream);
  ASSERT_EQ(want.size(), 2u);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameSplitter splitter;
    std::vector<std::string> frames;
    ASSERT_TRUE(splitter.Feed(std::string_view(stream).substr(0, cut), &frames).ok());
    ASSERT_TRUE(splitter.Feed(std::string_view(stream).substr(cut), &frames).ok());
    EXPECT_EQ(frames, want) << "cut at " << cut;
  }
  // One byte at a time.
  FrameSplitter splitter;
  std::vector<std::string> frames;
  for (char c : stream) {
    ASSERT_TRUE(splitter.Feed(std::string_view(&c, 1), &frames).ok());
  }
  EXPECT_EQ(frames, want);
}

TEST(FrameSplitterTest, RandomChunkingGivesSameFrames) {
  std::string stream;
  std::vector<std::string> want;
  for (int i = 0; i < 200; ++i) {
    std::string obj = "{\"i\":" + std::to_string(i) + ",\"s\":\"" + std::string(i % 7, '}') +
                      "\\\"\",\"a\":[" + std::string(i % 3, '[') + std::string(i % 3, ']') + "]}";
    want.push_back(obj);
    stream += obj;
    stream += (i % 2 == 0) ? "\n" : "";
  }
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    FrameSplitter splitter;
    std::vector<std::string> frames;
    size_t pos = 0;
    while (pos < stream.size()) {
      size_t len = std::uniform_int_distribution<size_t>(0, 300)(rng);
      len = std::min(len, stream.size() - pos);
      ASSERT_TRUE(splitter.Feed(std::string_view(stream).substr(pos, len), &frames).ok());
      pos += len;
    }
    EXPECT_EQ(frames, want);
  }
}

TEST(FrameSplitterTest, PartialFrameIsReported) {
  FrameSplitter splitter;
  std::vector<std::string> frames;
  ASSERT_TRUE(splitter.Feed("{\"a\":1}\n{\"b\":", &frames).ok());
  EXPECT_THAT(frames, ElementsAre("{\"a\":1}"));
  EXPECT_TRUE(splitter.InFrame());
  EXPECT_EQ(splitter.buffered_bytes(), 5u);
  EXPECT_EQ(splitter.stream_offset(), 13u);
  ASSERT_TRUE(splitter.Feed("2}", &frames).ok());
  EXPECT_FALSE(splitter.InFrame());
  EXPECT_THAT(frames, ElementsAre("{\"a\":1}", "{\"b\":2}"));
}

TEST(FrameSplitterTest, GarbageBetweenObjectsIsAnErrorAndSticks) {
  FrameSplitter splitter;
  std::vector<std::string> frames;
  absl::Status s = splitter.Feed("{\"a\":1}\nx{\"b\":2}", &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("0x78 at offset 8"));
  EXPECT_THAT(frames, ElementsAre("{\"a\":1}"));  // the frame before the garbage is kept
  EXPECT_EQ(splitter.Feed("{\"c\":3}", &frames), s);
  EXPECT_EQ(frames.size(), 1u);
  splitter.Reset();
  EXPECT_TRUE(splitter.Feed("{\"c\":3}", &frames).ok());
  EXPECT_EQ(frames.size(), 2u);
}

TEST(FrameSplitterTest, TopLevelArraysAndScalarsAreRejected) {
  for (std::string_view bad : {"[1]", "1", "\"x\"", "}", "null"}) {
    FrameSplitter splitter;
    std::vector<std::string> frames;
    EXPECT_EQ(splitter.Feed(bad, &frames).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(FrameSplitterTest, MaxFrameSize) {
  FrameSplitter splitter(16);
  std::vector<std::string> frames;
  ASSERT_TRUE(splitter.Feed("{\"a\":\"01234567\"}", &frames).ok());  // exactly 16 bytes
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_TRUE(splitter.Feed("{\"a\":\"01234", &frames).ok());
  absl::Status s = splitter.Feed("5678\"}", &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("offset 16 exceeds 16 bytes"));
  EXPECT_EQ(splitter.buffered_bytes(), 0u);
}

}  // namespace
}  // namespace tessera::json

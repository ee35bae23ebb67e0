#include <functional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/base/allocator.h"
#include "tessera/base/backoff.h"
#include "tessera/base/clock.h"
#include "tessera/base/limits.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/base/utf8.h"

namespace tessera {
namespace {

absl::StatusOr<int> Half(int n) {
  if (n % 2 != 0) {
    return absl::InvalidArgumentError("odd");
  }
  return n / 2;
}

absl::StatusOr<int> Quarter(int n) {
  TESSERA_ASSIGN_OR_RETURN(int half, Half(n));
  TESSERA_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int n) {
  TESSERA_RETURN_IF_ERROR(Half(n).status());
  return absl::OkStatus();
}

TEST(AllocatorTest, RetunesOnlyWhenTheOperatorSetNothing) {
#if defined(__GLIBC__)
  EXPECT_TRUE(tessera::ShouldRetuneAllocator(nullptr));
#else
  EXPECT_FALSE(tessera::ShouldRetuneAllocator(nullptr));
#endif
  // Any value, even empty, is the operator's choice.
  EXPECT_FALSE(tessera::ShouldRetuneAllocator(""));
  EXPECT_FALSE(tessera::ShouldRetuneAllocator("glibc.malloc.tcache_count=7"));
  EXPECT_FALSE(tessera::ShouldRetuneAllocator(tessera::kAllocatorTunables));
}

TEST(StatusMacrosTest, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).message(), "odd");
}

TEST(StatusMacrosTest, AnnotateKeepsCodeAndPrefixesMessage) {
  absl::Status s = Annotate(absl::NotFoundError("no such key"), "pod default/x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "pod default/x: no such key");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(LoggingTest, KlogLayoutAndVerbosity) {
  std::vector<std::string> lines;
  LogSink previous =
      SetLogSink([&](LogSeverity, std::string_view line) { lines.emplace_back(line); });
  TESSERA_LOG(kWarning, "node {} has {} free", "gpu-1", 3);
  SetLogVerbosity(0);
  TESSERA_VLOG(2, "hidden");
  SetLogVerbosity(2);
  TESSERA_VLOG(2, "shown");
  SetLogVerbosity(0);
  SetLogSink(std::move(previous));
  ASSERT_EQ(lines.size(), 2u);
  // W1202 13:34:07.494821   12345 base_test.cc:55] node gpu-1 has 3 free
  EXPECT_THAT(lines[0],
              ::testing::MatchesRegex("W[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6} +[0-9]+ "
                                      "base_test\\.cc:[0-9]+\\] node gpu-1 has 3 free"));
  EXPECT_THAT(lines[1], ::testing::EndsWith("] shown"));
}

// Captures the lines emitted while `body` runs, in `format` at verbosity `v`.
std::vector<std::string> Capture(LogFormat format, int v, const std::function<void()>& body) {
  std::vector<std::string> lines;
  LogSink previous =
      SetLogSink([&](LogSeverity, std::string_view line) { lines.emplace_back(line); });
  SetLogFormat(format);
  SetLogVerbosity(v);
  body();
  SetLogVerbosity(0);
  SetLogFormat(LogFormat::kText);
  SetLogSink(std::move(previous));
  return lines;
}

TEST(LoggingTest, StructuredTextQuotesTheMessageAndStringValues) {
  const std::vector<std::string> lines = Capture(LogFormat::kText, 2, [] {
    TESSERA_VLOGS(2, "filter", "pod", "ml/train \"a\"", "candidates", 3, "fits", true);
    TESSERA_VLOGS(3, "hidden", "pod", "x");
  });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], ::testing::MatchesRegex(
                            "I[0-9]{4} [0-9:.]+ +[0-9]+ base_test\\.cc:[0-9]+\\] \"filter\" "
                            "pod=\"ml/train \\\\\"a\\\\\"\" candidates=3 fits=true"));
}

// klog's JSON shape: ts (float seconds), caller, msg, v, then the key/values in order; an error
// line has "err" instead of "v"; every line is one valid JSON object, escapes included.
TEST(LoggingTest, JsonLinesHaveKlogsShape) {
  const double before = static_cast<double>(absl::ToUnixSeconds(absl::Now()));
  const std::vector<std::string> lines = Capture(LogFormat::kJson, 2, [] {
    TESSERA_LOG(kInfo, "node {} has {} free", "gpu-1", 3);
    TESSERA_VLOGS(2, "bind", "pod", "ml/p\n1", "node", "a", "devices", 2);
    TESSERA_LOGS(kError, "watch failed", "err", "UNAVAILABLE: \"x\"", "resource", "pods");
    TESSERA_LOG(kError, "plain error");
    TESSERA_VLOG(3, "hidden");
  });
  ASSERT_EQ(lines.size(), 4u);
  std::vector<nlohmann::ordered_json> j;
  for (const std::string& line : lines) {
    j.push_back(nlohmann::ordered_json::parse(line, nullptr, false));
    ASSERT_FALSE(j.back().is_discarded()) << line;
  }
  EXPECT_TRUE(j[0]["ts"].is_number_float());
  EXPECT_GE(j[0]["ts"].get<double>(), before - 1);
  EXPECT_LE(j[0]["ts"].get<double>(), before + 60);
  EXPECT_THAT(j[0]["caller"].get<std::string>(), ::testing::MatchesRegex("base_test.cc:[0-9]+"));
  EXPECT_EQ(j[0]["msg"], "node gpu-1 has 3 free");
  EXPECT_EQ(j[0]["v"], 0);
  std::vector<std::string> keys;
  for (const auto& [k, value] : j[1].items()) {
    keys.push_back(k);
  }
  EXPECT_THAT(keys, ::testing::ElementsAre("ts", "caller", "msg", "v", "pod", "node", "devices"));
  EXPECT_EQ(j[1]["v"], 2);
  EXPECT_EQ(j[1]["pod"], "ml/p\n1");
  EXPECT_EQ(j[1]["devices"], 2);
  EXPECT_EQ(j[2]["err"], "UNAVAILABLE: \"x\"");
  EXPECT_EQ(j[2]["resource"], "pods");
  EXPECT_FALSE(j[2].contains("v"));
  EXPECT_TRUE(j[3]["err"].is_null());
  EXPECT_EQ(j[3]["msg"], "plain error");
}

// Bytes that are not well-formed UTF-8 (a request path, say) never break a JSON line: each
// becomes U+FFFD; quoted text values escape them as Go does (\xNN). Well-formed UTF-8 stays.
TEST(Utf8Test, SequenceLengthAcceptsWellFormedUtf8Only) {
  EXPECT_EQ(base::Utf8SequenceLength(""), 0u);
  EXPECT_EQ(base::Utf8SequenceLength("a"), 1u);
  EXPECT_EQ(base::Utf8SequenceLength("\xc3\xa9x"), 2u);         // é
  EXPECT_EQ(base::Utf8SequenceLength("\xe2\x82\xac"), 3u);      // €
  EXPECT_EQ(base::Utf8SequenceLength("\xf0\x9f\x98\x80"), 4u);  // U+1F600
  EXPECT_EQ(base::Utf8SequenceLength("\xc0\xaf"), 0u);          // overlong '/'
  EXPECT_EQ(base::Utf8SequenceLength("\xe0\x80\xaf"), 0u);      // overlong
  EXPECT_EQ(base::Utf8SequenceLength("\xed\xa0\x80"), 0u);      // a surrogate
  EXPECT_EQ(base::Utf8SequenceLength("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(base::Utf8SequenceLength("\xe2\x82"), 0u);          // cut short
  EXPECT_EQ(base::Utf8SequenceLength("\xe2\x28\xa1"), 0u);      // a bad continuation
  EXPECT_EQ(base::Utf8SequenceLength("\xff"), 0u);
}

TEST(LoggingTest, BytesThatAreNotUtf8AreReplacedInJsonAndEscapedInText) {
  const std::string bad = "/\xff\xfe/\xc3/\xc0\xaf/\xed\xa0\x80/\xf4\x90\x80\x80/\xe2\x82";
  const std::string good = "/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // é € 😀
  const std::vector<std::string> json = Capture(LogFormat::kJson, 0, [&] {
    TESSERA_LOG(kInfo, "GET {}", bad + good);
    TESSERA_LOGS(kInfo, "request", "path", bad);
  });
  ASSERT_EQ(json.size(), 2u);
  const std::string fffd = "\xef\xbf\xbd";
  const std::string replaced = "/" + fffd + fffd + "/" + fffd + "/" + fffd + fffd + "/" + fffd +
                               fffd + fffd + "/" + fffd + fffd + fffd + fffd + "/" + fffd + fffd;
  for (const std::string& line : json) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
  }
  EXPECT_EQ(nlohmann::json::parse(json[0])["msg"], "GET " + replaced + good);
  EXPECT_EQ(nlohmann::json::parse(json[1])["path"], replaced);
  const std::vector<std::string> text =
      Capture(LogFormat::kText, 0, [&] { TESSERA_LOGS(kInfo, "request", "path", "/\xff" + good); });
  ASSERT_EQ(text.size(), 1u);
  EXPECT_THAT(text[0], ::testing::EndsWith("path=\"/\\xff" + good + "\""));
}

TEST(LoggingTest, ParseLogFormatAcceptsTextAndJsonOnly) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("want text or json"));
}

TEST(RaiseOpenFileLimitTest, RaisesTheSoftLimitToTheHardLimit) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max <= 256) {
    GTEST_SKIP() << "hard limit " << limit.rlim_max << " leaves nothing to raise";
  }
  rlimit lowered = limit;
  lowered.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  absl::StatusOr<uint64_t> now = RaiseOpenFileLimit();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, limit.rlim_max);
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, limit.rlim_max);
}

TEST(FakeClockTest, MovesOnlyWhenTold) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005));
  clock.Set(absl::FromUnixSeconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7));
}

TEST(BackoffTest, GrowsToCapWithoutJitter) {
  Backoff b({.initial = absl::Milliseconds(100),
             .cap = absl::Milliseconds(500),
             .factor = 2,
             .jitter = 0});
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
  EXPECT_EQ(b.Next(), absl::Milliseconds(200));
  EXPECT_EQ(b.Next(), absl::Milliseconds(400));
  EXPECT_EQ(b.Next(), absl::Milliseconds(500));
  EXPECT_EQ(b.Next(), absl::Milliseconds(500));
  EXPECT_EQ(b.attempts(), 5);
  b.Reset();
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

TEST(BackoffTest, JitterStaysInBandAndBelowCap) {
  Backoff b({.initial = absl::Seconds(1), .cap = absl::Seconds(8), .factor = 2, .jitter = 0.5}, 42);
  absl::Duration expected_base = absl::Seconds(1);
  bool varied = false;
  absl::Duration first = absl::ZeroDuration();
  for (int i = 0; i < 50; ++i) {
    absl::Duration d = b.Next();
    EXPECT_GE(d, expected_base * 0.5);
    EXPECT_LE(d, std::min(expected_base * 1.5, absl::Seconds(8)));
    if (i == 0) {
      first = d;
    } else if (i < 3 && d != first * (1 << i)) {
      varied = true;
    }
    expected_base = std::min(expected_base * 2, absl::Seconds(8));
  }
  EXPECT_TRUE(varied);
}

}  // namespace
}  // namespace tessera

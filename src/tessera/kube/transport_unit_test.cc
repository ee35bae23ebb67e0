// Single-threaded tests of the transport's pure parts: status mapping, the rate limiter, the
// retry policy and FakeTransport.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/kube/transport.h"
#include "tessera/testing/fake_transport.h"

namespace tessera::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Response Reply(int code, std::string body = "", HeaderList headers = {}) {
  Response r;
  r.status_code = code;
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

Request Req(std::string method, std::string path) {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  return r;
}

TEST(HttpStatusToStatus, MapsCodesAndKeepsCodeAndBody) {
  const Request get = Req("GET", "/api/v1/pods?watch=true&resourceVersion=5");
  EXPECT_TRUE(HttpStatusToStatus(get, Reply(200)).ok());
  EXPECT_TRUE(HttpStatusToStatus(get, Reply(201)).ok());
  const std::vector<std::pair<int, absl::StatusCode>> cases = {
      {400, absl::StatusCode::kInvalidArgument},  {401, absl::StatusCode::kUnauthenticated},
      {403, absl::StatusCode::kPermissionDenied}, {404, absl::StatusCode::kNotFound},
      {409, absl::StatusCode::kAborted},          {410, absl::StatusCode::kOutOfRange},
      {422, absl::StatusCode::kInvalidArgument},  {429, absl::StatusCode::kResourceExhausted},
      {500, absl::StatusCode::kInternal},         {503, absl::StatusCode::kUnavailable},
      {504, absl::StatusCode::kUnavailable},      {302, absl::StatusCode::kUnknown},
  };
  for (const auto& [code, expected] : cases) {
    absl::Status s = HttpStatusToStatus(get, Reply(code, "body-" + std::to_string(code)));
    EXPECT_EQ(s.code(), expected) << code;
    EXPECT_EQ(HttpStatusCodeOf(s), code);
    EXPECT_EQ(HttpBodyOf(s), "body-" + std::to_string(code));
    EXPECT_THAT(s.message(), HasSubstr("HTTP " + std::to_string(code) + " GET /api/v1/pods:"));
  }
  EXPECT_EQ(HttpStatusCodeOf(absl::UnavailableError("x")), std::nullopt);
  // Long bodies are cut in the message but kept whole in the payload.
  const std::string long_body(10000, 'b');
  absl::Status s = HttpStatusToStatus(get, Reply(500, long_body));
  EXPECT_LT(s.message().size(), 700u);
  EXPECT_EQ(HttpBodyOf(s)->size(), 10000u);
}

TEST(Response, HeadersAndRetryAfter) {
  Response r = Reply(429, "", {{"content-type", "text/plain"}, {"retry-after", "7"}});
  EXPECT_EQ(r.Header("Content-Type"), "text/plain");
  EXPECT_EQ(r.Header("missing"), std::nullopt);
  EXPECT_EQ(r.RetryAfter(), absl::Seconds(7));
  EXPECT_EQ(Reply(429, "", {{"retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"}}).RetryAfter(),
            std::nullopt);
  EXPECT_EQ(Reply(429, "", {{"retry-after", "-1"}}).RetryAfter(), std::nullopt);
}

TEST(RateLimiter, BurstThenSteadyRate) {
  FakeClock clock;
  RateLimiter limiter(2.0, 3, &clock);  // 2 per second, burst 3
  EXPECT_EQ(limiter.Reserve(), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(), absl::Milliseconds(500));   // queued behind the burst
  EXPECT_EQ(limiter.Reserve(), absl::Milliseconds(1000));  // and behind the previous one
  EXPECT_FALSE(limiter.TryAcquire());
  clock.Advance(absl::Seconds(1));  // pays back the two queued reservations
  EXPECT_FALSE(limiter.TryAcquire());
  clock.Advance(absl::Milliseconds(500));
  EXPECT_TRUE(limiter.TryAcquire());
  // A long idle period refills only up to the burst.
  clock.Advance(absl::Hours(1));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.TryAcquire()) << i;
  }
  EXPECT_FALSE(limiter.TryAcquire());
}

TEST(RateLimiter, RateOverManyRequests) {
  FakeClock clock;
  RateLimiter limiter(50.0, 100, &clock);  // the defaults
  int granted = 0;
  // Over 10 simulated seconds, polled every 10 ms: burst + 10 s * 50 qps.
  for (int tick = 0; tick < 1000; ++tick) {
    while (limiter.TryAcquire()) {
      ++granted;
    }
    clock.Advance(absl::Milliseconds(10));
  }
  EXPECT_GE(granted, 100 + 495);
  EXPECT_LE(granted, 100 + 500);
  RateLimiter unlimited(0, 1, &clock);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(unlimited.Reserve(), absl::ZeroDuration());
  }
}

TEST(Retrier, FollowsThePolicy) {
  RetryPolicy policy;
  policy.max_attempts = 4;
  policy.max_retry_after = absl::Seconds(5);
  {
    Retrier get(policy, "GET");
    EXPECT_EQ(get.NextDelay(Reply(429, "", {{"retry-after", "2"}})), absl::Seconds(2));
    EXPECT_EQ(get.NextDelay(Reply(503, "", {{"retry-after", "60"}})), absl::Seconds(5));  // cap
    std::optional<absl::Duration> backoff = get.NextDelay(absl::UnavailableError("reset"));
    ASSERT_TRUE(backoff.has_value());
    EXPECT_GT(*backoff, absl::ZeroDuration());
    EXPECT_EQ(get.NextDelay(Reply(500)), std::nullopt);  // fourth attempt: exhausted
    EXPECT_EQ(get.attempts(), 4);
  }
  {
    Retrier get(policy, "GET");
    EXPECT_EQ(get.NextDelay(Reply(200)), std::nullopt);
    EXPECT_EQ(Retrier(policy, "GET").NextDelay(Reply(404)), std::nullopt);
    EXPECT_EQ(Retrier(policy, "GET").NextDelay(absl::FailedPreconditionError("tls")), std::nullopt);
  }
  {
    Retrier post(policy, "POST");
    EXPECT_EQ(post.NextDelay(Reply(429)).has_value(), true);  // backoff without Retry-After
    EXPECT_EQ(Retrier(policy, "POST").NextDelay(Reply(500)), std::nullopt);
    EXPECT_EQ(Retrier(policy, "PATCH").NextDelay(absl::UnavailableError("x")), std::nullopt);
    EXPECT_TRUE(Retrier(policy, "DELETE").NextDelay(Reply(502)).has_value());
    EXPECT_TRUE(Retrier(policy, "PUT").NextDelay(absl::UnavailableError("x")).has_value());
  }
  {
    RetryPolicy once;
    once.max_attempts = 1;
    EXPECT_EQ(Retrier(once, "GET").NextDelay(Reply(503)), std::nullopt);
  }
}

TEST(Retrier, BackoffGrowsWithJitter) {
  RetryPolicy policy;
  policy.max_attempts = 100;
  policy.backoff = {absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5};
  Retrier r(policy, "GET");
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 8; ++i) {
    delays.push_back(*r.NextDelay(Reply(500)));
  }
  EXPECT_GE(delays[0], absl::Milliseconds(50));
  EXPECT_LE(delays[0], absl::Milliseconds(150));
  EXPECT_GT(delays[4], delays[0]);
  for (absl::Duration d : delays) {
    EXPECT_LE(d, absl::Seconds(2));
  }
}

TEST(Do, RetriesThroughAFakeTransport) {
  FakeTransport fake;
  int calls = 0;
  fake.SetHandler([&](const Request&) -> absl::StatusOr<Response> {
    ++calls;
    if (calls == 1) {
      return absl::UnavailableError("connection reset");
    }
    if (calls == 2) {
      return Reply(429, "", {{"retry-after", "1"}});
    }
    return Reply(200, "done");
  });
  DoOptions options;
  std::vector<absl::Duration> delays;
  options.sleep = [&](absl::Duration d) { delays.push_back(d); };
  absl::StatusOr<Response> r = Do(fake, Req("GET", "/x"), std::move(options));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "done");
  EXPECT_EQ(calls, 3);
  ASSERT_EQ(delays.size(), 2u);
  EXPECT_EQ(delays[1], absl::Seconds(1));
  EXPECT_EQ(fake.requests().size(), 3u);
}

TEST(FakeTransport, QueuedSendsAreAnsweredInOrder) {
  FakeTransport fake;
  std::vector<std::string> got;
  fake.Send(Req("GET", "/a"), [&](absl::StatusOr<Response> r) { got.push_back(r->body); });
  fake.Send(Req("GET", "/b"),
            [&](absl::StatusOr<Response> r) { got.push_back(std::string(r.status().message())); });
  ASSERT_TRUE(fake.WaitForPending(2, absl::Milliseconds(1)));
  EXPECT_EQ(fake.pending()[1].path, "/b");
  EXPECT_TRUE(fake.Reply(Reply(200, "A")));
  EXPECT_TRUE(fake.Reply(absl::UnavailableError("down")));
  EXPECT_FALSE(fake.Reply(Reply(200)));
  EXPECT_THAT(got, ElementsAre("A", "down"));
}

TEST(FakeTransport, StreamsAndCancellation) {
  FakeTransport fake;
  std::string data;
  std::vector<absl::StatusCode> ends;
  StreamHandlers h;
  h.on_data = [&](std::string_view b) { data.append(b); };
  h.on_end = [&](StreamEnd e) { ends.push_back(e.status.code()); };
  const StreamId id = fake.Stream(Req("GET", "/api/v1/pods?watch=true"), std::move(h));
  EXPECT_EQ(fake.WaitForStream(0, absl::Milliseconds(1)), id);
  EXPECT_FALSE(fake.StreamData(id, "early"));  // not open yet
  EXPECT_TRUE(fake.StreamOpen(id));
  EXPECT_TRUE(fake.StreamData(id, "one\n"));
  fake.Cancel(id);
  EXPECT_TRUE(fake.cancel_requested(id));
  EXPECT_TRUE(ends.empty());                   // asynchronous, like the real transport
  EXPECT_FALSE(fake.StreamData(id, "two\n"));  // delivers the cancellation, drops the data
  EXPECT_THAT(ends, ElementsAre(absl::StatusCode::kCancelled));
  EXPECT_EQ(data, "one\n");
  EXPECT_FALSE(fake.StreamClose(id, absl::OkStatus()));
  EXPECT_TRUE(fake.open_streams().empty());

  StreamHandlers h2;
  std::optional<StreamEnd> end;
  h2.on_end = [&](StreamEnd e) { end = std::move(e); };
  const StreamId id2 = fake.Stream(Req("GET", "/w"), std::move(h2));
  EXPECT_TRUE(fake.StreamFailHttp(id2, Reply(410, R"({"reason":"Expired"})")));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(end->error_response->status_code, 410);
}

}  // namespace
}  // namespace tessera::kube

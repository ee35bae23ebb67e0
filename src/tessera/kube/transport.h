// File: tessera/kube/transport.h
//
// The HTTP edge of the Kubernetes client: the `Transport` interface (FakeTransport in
// testing/fake_transport.h provokes every outcome) and `CurlTransport`, its libcurl implementation
// — one I/O thread ("kube-io") drives streams and Send()s over shared connections, Perform() (so
// Do()) runs a blocking exchange on the caller's thread with a pooled handle; requests are rate
// limited by a token bucket (qps/burst). Details: docs/kube-client.md "The transport".
//
//   auto transport = CurlTransport::Create(config, MakeTokenSource(config, Clock::Real()));
//   absl::StatusOr<Response> r = Do(**transport, get);   // get.path = "/api/v1/nodes"
//
// Errors: a completed exchange is a Response whatever its status (HttpStatusToStatus / Do turn
// non-2xx into errors); transport errors are kUnavailable (retryable), kFailedPrecondition (TLS),
// kCancelled (shutting down) and kInvalidArgument (malformed Request).
//
// Thread safety: every method from any thread, callbacks included. CurlTransport's callbacks run
// on the I/O thread one at a time, must be quick and must not block on it (no Do()). Destruction
// completes outstanding requests with kCancelled and joins the thread; not from a callback.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/backoff.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/config.h"

namespace tessera::kube {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Request {
  // GET, HEAD, POST, PUT, PATCH, DELETE.
  std::string method = "GET";
  // Path and query relative to the server, e.g. "/api/v1/pods?limit=500". Must start with '/'.
  std::string path;
  std::string body;
  // Content-Type of `body` (e.g. "application/merge-patch+json"); omitted when empty.
  std::string content_type;
  // Extra request headers. "Accept: application/json" is sent unless one is given here.
  HeaderList headers;
  // Total time allowed. Zero: RestConfig::request_timeout for Send(), no limit for Stream().
  absl::Duration timeout = absl::ZeroDuration();
  // Stream() only: end the stream with kUnavailable ("stalled") when nothing at all arrives for
  // this long (checked every 100 ms; libcurl's low-speed limit of 1 byte/s over the same time
  // is set as well). Zero: no watchdog. Pick it above the server's bookmark interval.
  absl::Duration stall_timeout = absl::ZeroDuration();
};

struct Response {
  int status_code = 0;
  // In arrival order; names lower-cased, values trimmed. The headers of the final response only.
  HeaderList headers;
  std::string body;
  // The HTTP version the exchange used: 10, 11, 20 or 30 (HTTP/1.0, 1.1, 2, 3); 0 when not
  // known (FakeTransport, or no response head). Over https CurlTransport offers HTTP/2 by ALPN
  // and falls back to HTTP/1.1 when the server does not accept it; plain http is always 11.
  int http_version = 0;
  // How many new connections the exchange had to open (CURLINFO_NUM_CONNECTS): 0 when it ran on
  // a connection that was already open, e.g. multiplexed over a shared HTTP/2 connection.
  // Always 0 from FakeTransport. Set on the head a stream's on_open gets, too.
  int connections_opened = 0;

  // The first header called `name` (case-insensitive), if any.
  std::optional<std::string> Header(std::string_view name) const;
  // Retry-After in (non-negative, integral) seconds; nullopt when absent or an HTTP date.
  std::optional<absl::Duration> RetryAfter() const;
};

// The canonical code of a non-2xx HTTP status code (also the `code` of a Kubernetes Status):
//   400/406/415/422 kInvalidArgument, 401 kUnauthenticated, 403 kPermissionDenied, 404 kNotFound,
//   405/501 kUnimplemented, 409 kAborted (conflict or already exists: read the Status body),
//   410 kOutOfRange (expired resource version), 429 kResourceExhausted, 502/503/504 kUnavailable,
//   other 5xx kInternal, other codes kUnknown.
absl::StatusCode StatusCodeForHttp(int code);

// The error for a non-2xx response (code per StatusCodeForHttp), OK for 2xx.
// The message is "HTTP <code> <method> <path>: <first 512 bytes of the body>". The status carries
// the code and the whole body as payloads, read back with HttpStatusCodeOf / HttpBodyOf.
absl::Status HttpStatusToStatus(const Request& request, const Response& response);
// The HTTP status code of an error made by HttpStatusToStatus, else nullopt.
std::optional<int> HttpStatusCodeOf(const absl::Status& status);
// The response body of an error made by HttpStatusToStatus, else nullopt.
std::optional<std::string> HttpBodyOf(const absl::Status& status);

using ResponseCallback = absl::AnyInvocable<void(absl::StatusOr<Response>)>;

// How a stream ended.
struct StreamEnd {
  // OK: the server closed a 2xx stream normally. kCancelled: Cancel(). A transport error as
  // listed above (a stall is kUnavailable). A non-2xx response: HttpStatusToStatus of it.
  absl::Status status;
  // For a non-2xx response: the response, body included (truncated to 1 MiB).
  std::optional<Response> error_response;
};

struct StreamHandlers {
  // Called once with the status code and headers (empty body) when a 2xx head arrives.
  absl::AnyInvocable<void(const Response& head)> on_open;
  // Body bytes (de-chunked) as they arrive; only after on_open. Streams never ask for
  // compression, so that a compressor on the server cannot hold events back.
  absl::AnyInvocable<void(std::string_view bytes)> on_data;
  // Called exactly once, after every other callback of this stream.
  absl::AnyInvocable<void(StreamEnd end)> on_end;
};

using StreamId = uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts `request`; `done` is called once with the outcome.
  virtual void Send(Request request, ResponseCallback done) = 0;
  // Starts a streaming request (a watch). Returns its id for Cancel().
  virtual StreamId Stream(Request request, StreamHandlers handlers) = 0;
  // Ends the stream `id` with kCancelled: no on_data is delivered after on_end. A finished or
  // unknown id is ignored. Asynchronous: on_end may run after Cancel returns.
  virtual void Cancel(StreamId id) = 0;
  // Runs `request` and blocks until its outcome, the one Send's callback would get. The default
  // calls Send and waits; CurlTransport performs the exchange on the calling thread. Must not
  // be called from a callback.
  virtual absl::StatusOr<Response> Perform(Request request);
};

// A client-side token bucket: `burst` tokens, refilled at `qps` per second. Reserve() takes a
// token and returns how long the caller must wait before using it (zero when one was
// available); waiting reservations queue up in order, as golang.org/x/time/rate does.
// qps <= 0 means unlimited. Thread-safe.
class RateLimiter {
 public:
  RateLimiter(double qps, int burst, Clock* clock);
  absl::Duration Reserve();
  // Takes a token only if one is available now.
  bool TryAcquire();

 private:
  void RefillLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double qps_;
  const double burst_;
  Clock* const clock_;
  Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_);
};

// When and how often to retry. Retried outcomes:
//   - 429: always (the server did not process the request), after Retry-After if given, else
//     after the next backoff delay;
//   - idempotent methods only (GET, HEAD, PUT, DELETE, OPTIONS): 5xx (Retry-After if given,
//     else backoff) and kUnavailable transport errors (backoff).
// Retry-After is capped at `max_retry_after`.
struct RetryPolicy {
  int max_attempts = 5;  // Total attempts, the first included; 1 disables retries.
  Backoff::Options backoff = {absl::Milliseconds(200), absl::Seconds(10), 2.0, 0.5};
  absl::Duration max_retry_after = absl::Seconds(30);
};

// The per-request retry state. Not thread-safe; one per logical request.
class Retrier {
 public:
  Retrier(RetryPolicy policy, const std::string& method, uint64_t seed = 0x6b756265);
  // Given the outcome of an attempt, the delay before the next attempt, or nullopt when the
  // outcome is final (success, not retryable, or attempts exhausted).
  std::optional<absl::Duration> NextDelay(const absl::StatusOr<Response>& outcome);
  int attempts() const { return attempts_; }

 private:
  RetryPolicy policy_;
  bool idempotent_;
  Backoff backoff_;
  int attempts_ = 0;
};

struct DoOptions {
  RetryPolicy retry;
  // Sleeps between attempts on the calling thread; tests inject one that records the delay.
  absl::AnyInvocable<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
};

// Sends `request` and blocks until it is final, retrying per `options.retry`. Returns the 2xx
// response, or the last error: a transport error, or HttpStatusToStatus of a non-2xx response.
// Must not be called on the transport's I/O thread.
absl::StatusOr<Response> Do(Transport& transport, const Request& request,
                            DoOptions options = DoOptions());

// The libcurl transport. Create() checks the configuration; the returned transport's thread is
// running.
//
// Perform() (and so Do()) runs the exchange on the calling thread with an easy handle from a
// pool, not on the I/O thread: a blocking call then costs no hand-over to the I/O thread and
// back (two thread wake-ups of the four a loopback request otherwise causes). Each pooled
// handle keeps its own keep-alive connection, so blocking calls made at the same time use
// separate connections (HTTP/2 multiplexing applies to Send and Stream, which share the I/O
// thread's connections). With `max_host_connections` set, Perform goes through the I/O thread
// so that the bound holds. A Perform in flight when the transport is destroyed ends with
// kCancelled; the destructor waits for it.
class CurlTransport : public Transport {
 public:
  struct Options {
    // Every time the transport reads: the rate limiter, its delays, the stall watchdog.
    Clock* clock = Clock::Real();
    std::string user_agent = "tessera/0.1";
    // Upper bound on connections to the server (CURLMOPT_MAX_HOST_CONNECTIONS); requests beyond
    // it wait for a free connection. 0: unlimited. Over HTTP/1.1 every open stream holds a
    // connection of its own, so a bound must exceed the number of concurrent watches.
    int max_host_connections = 0;
  };

  // Errors: kInvalidArgument for a config without server or with half a client key pair.
  static absl::StatusOr<std::unique_ptr<CurlTransport>> Create(RestConfig config,
                                                               std::shared_ptr<TokenSource> tokens,
                                                               Options options);
  static absl::StatusOr<std::unique_ptr<CurlTransport>> Create(
      RestConfig config, std::shared_ptr<TokenSource> tokens) {
    return Create(std::move(config), std::move(tokens), Options());
  }

  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void Send(Request request, ResponseCallback done) override;
  StreamId Stream(Request request, StreamHandlers handlers) override;
  void Cancel(StreamId id) override;
  absl::StatusOr<Response> Perform(Request request) override;

  class Loop;  // Implementation detail (transport.cc).

 private:
  explicit CurlTransport(std::unique_ptr<Loop> loop);
  std::unique_ptr<Loop> loop_;
};

}  // namespace tessera::kube

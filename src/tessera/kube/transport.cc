#include "tessera/kube/transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include <curl/curl.h>
#include <fmt/core.h>
#include <pthread.h>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"

namespace tessera::kube {
namespace {

constexpr char kCodePayload[] = "tessera.io/http-status-code";
constexpr char kBodyPayload[] = "tessera.io/http-body";
constexpr size_t kMaxErrorBody = 1 << 20;
constexpr size_t kMessageBody = 512;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && absl::EqualsIgnoreCase(absl::string_view(a.data(), a.size()),
                                                        absl::string_view(b.data(), b.size()));
}

}  // namespace

absl::StatusCode StatusCodeForHttp(int code) {
  switch (code) {
    case 400:
    case 406:
    case 415:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 409:
      return absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 502:
    case 503:
    case 504:
      return absl::StatusCode::kUnavailable;
    default:
      break;
  }
  if (code >= 500 && code < 600) {
    return absl::StatusCode::kInternal;
  }
  return absl::StatusCode::kUnknown;
}

namespace {

bool IsIdempotent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
         method == "OPTIONS";
}

// Drops the query, which can be long; paths carry no secrets.
std::string PathOnly(const std::string& path) { return path.substr(0, path.find('?')); }

absl::Status CurlError(CURLcode code, const char* errbuf, const Request& request, bool streaming) {
  const std::string detail = errbuf[0] != '\0' ? std::string(errbuf) : curl_easy_strerror(code);
  const std::string prefix = fmt::format("{} {}", request.method, PathOnly(request.path));
  if (streaming && code == CURLE_OPERATION_TIMEDOUT && std::strstr(errbuf, "too slow") != nullptr) {
    return absl::UnavailableError(fmt::format("{}: stream stalled (less than 1 byte/s for {}s)",
                                              prefix, absl::ToInt64Seconds(request.stall_timeout)));
  }
  switch (code) {
    case CURLE_PEER_FAILED_VERIFICATION:
      return absl::FailedPreconditionError(
          fmt::format("{}: TLS: the server certificate is not trusted: {}", prefix, detail));
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
      return absl::FailedPreconditionError(fmt::format("{}: TLS configuration (curl {}): {}",
                                                       prefix, static_cast<int>(code), detail));
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return absl::InvalidArgumentError(fmt::format("{}: {}", prefix, detail));
    case CURLE_OPERATION_TIMEDOUT:
      return absl::UnavailableError(fmt::format("{}: timed out: {}", prefix, detail));
    default:
      return absl::UnavailableError(
          fmt::format("{}: curl {}: {}", prefix, static_cast<int>(code), detail));
  }
}

absl::Status ValidateRequest(const Request& request) {
  if (request.path.empty() || request.path[0] != '/') {
    return absl::InvalidArgumentError(
        fmt::format("request path \"{}\" does not start with '/'", request.path));
  }
  static constexpr const char* kMethods[] = {"GET",   "HEAD",   "POST",   "PUT",
                                             "PATCH", "DELETE", "OPTIONS"};
  for (const char* m : kMethods) {
    if (request.method == m) {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(fmt::format("unsupported HTTP method \"{}\"", request.method));
}

long ToMillis(absl::Duration d) {  // NOLINT(runtime/int): curl's type.
  return static_cast<long>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));  // NOLINT
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Response and errors

std::optional<std::string> Response::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoreCase(key, name)) {
      return value;
    }
  }
  return std::nullopt;
}

std::optional<absl::Duration> Response::RetryAfter() const {
  std::optional<std::string> value = Header("retry-after");
  int64_t seconds = 0;
  if (!value.has_value() || !absl::SimpleAtoi(*value, &seconds) || seconds < 0) {
    return std::nullopt;
  }
  return absl::Seconds(seconds);
}

absl::Status HttpStatusToStatus(const Request& request, const Response& response) {
  if (response.status_code >= 200 && response.status_code < 300) {
    return absl::OkStatus();
  }
  std::string excerpt = response.body.substr(0, kMessageBody);
  while (!excerpt.empty() && (excerpt.back() == '\n' || excerpt.back() == '\r')) {
    excerpt.pop_back();
  }
  absl::Status status(StatusCodeForHttp(response.status_code),
                      fmt::format("HTTP {} {} {}: {}", response.status_code, request.method,
                                  PathOnly(request.path), excerpt));
  status.SetPayload(kCodePayload, absl::Cord(std::to_string(response.status_code)));
  status.SetPayload(kBodyPayload, absl::Cord(response.body));
  return status;
}

std::optional<int> HttpStatusCodeOf(const absl::Status& status) {
  auto payload = status.GetPayload(kCodePayload);
  int code = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &code)) {
    return std::nullopt;
  }
  return code;
}

std::optional<std::string> HttpBodyOf(const absl::Status& status) {
  auto payload = status.GetPayload(kBodyPayload);
  if (!payload.has_value()) {
    return std::nullopt;
  }
  return std::string(*payload);
}

// ---------------------------------------------------------------------------------------------
// RateLimiter

RateLimiter::RateLimiter(double qps, int burst, Clock* clock)
    : qps_(qps),
      burst_(std::max(1, burst)),
      clock_(clock),
      tokens_(std::max(1, burst)),
      last_(clock->Now()) {}

void RateLimiter::RefillLocked(absl::Time now) {
  if (now <= last_) {
    return;
  }
  tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * qps_);
  last_ = now;
}

absl::Duration RateLimiter::Reserve() {
  if (qps_ <= 0) {
    return absl::ZeroDuration();
  }
  MutexLock lock(&mu_);
  RefillLocked(clock_->Now());
  tokens_ -= 1;
  if (tokens_ >= 0) {
    return absl::ZeroDuration();
  }
  return absl::Seconds(-tokens_ / qps_);
}

bool RateLimiter::TryAcquire() {
  if (qps_ <= 0) {
    return true;
  }
  MutexLock lock(&mu_);
  RefillLocked(clock_->Now());
  if (tokens_ < 1) {
    return false;
  }
  tokens_ -= 1;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Retrier and Do

Retrier::Retrier(RetryPolicy policy, const std::string& method, uint64_t seed)
    : policy_(policy), idempotent_(IsIdempotent(method)), backoff_(policy.backoff, seed) {}

std::optional<absl::Duration> Retrier::NextDelay(const absl::StatusOr<Response>& outcome) {
  ++attempts_;
  if (attempts_ >= policy_.max_attempts) {
    return std::nullopt;
  }
  if (outcome.ok()) {
    const int code = outcome->status_code;
    const bool retryable = code == 429 || (idempotent_ && code >= 500 && code < 600);
    if (!retryable) {
      return std::nullopt;
    }
    if (std::optional<absl::Duration> after = outcome->RetryAfter(); after.has_value()) {
      return std::min(*after, policy_.max_retry_after);
    }
    return backoff_.Next();
  }
  if (idempotent_ && outcome.status().code() == absl::StatusCode::kUnavailable) {
    return backoff_.Next();
  }
  return std::nullopt;
}

absl::StatusOr<Response> Transport::Perform(Request request) {
  Mutex mu;
  CondVar cv;
  std::optional<absl::StatusOr<Response>> result;
  Send(std::move(request), [&](absl::StatusOr<Response> r) {
    MutexLock lock(&mu);
    result = std::move(r);
    cv.SignalAll();
  });
  MutexLock lock(&mu);
  while (!result.has_value()) {
    cv.Wait(&mu);
  }
  return *std::move(result);
}

absl::StatusOr<Response> Do(Transport& transport, const Request& request, DoOptions options) {
  Retrier retrier(options.retry, request.method);
  while (true) {
    absl::StatusOr<Response> outcome = transport.Perform(request);
    if (outcome.ok() && outcome->status_code >= 200 && outcome->status_code < 300) {
      return outcome;
    }
    std::optional<absl::Duration> delay = retrier.NextDelay(outcome);
    if (!delay.has_value()) {
      if (!outcome.ok()) {
        return outcome.status();
      }
      return HttpStatusToStatus(request, *outcome);
    }
    TESSERA_VLOG(1, "{} {}: attempt {} gave {}; retrying in {}", request.method,
                 PathOnly(request.path), retrier.attempts(),
                 outcome.ok() ? fmt::format("HTTP {}", outcome->status_code)
                              : std::string(outcome.status().message()),
                 absl::FormatDuration(*delay));
    options.sleep(*delay);
  }
}

// ---------------------------------------------------------------------------------------------
// CurlTransport

namespace {

struct Transfer {
  StreamId id = 0;
  Request request;
  bool streaming = false;
  ResponseCallback done;
  StreamHandlers handlers;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);

  CURL* easy = nullptr;
  curl_slist* header_list = nullptr;
  curl_slist* connect_to = nullptr;
  char errbuf[CURL_ERROR_SIZE] = {};
  Response response;
  Clock* clock = nullptr;     // the transport's; set before the transfer starts
  absl::Time last_activity;   // last header or body byte (the stall watchdog)
  bool opened = false;        // on_open was called (2xx stream)
  bool error_stream = false;  // non-2xx stream: body buffered for the error

  ~Transfer() {
    if (easy != nullptr) {
      curl_easy_cleanup(easy);
    }
    curl_slist_free_all(header_list);
    curl_slist_free_all(connect_to);
  }
};

int HttpVersionNumber(long curl_version) {  // NOLINT(runtime/int): curl's type.
  switch (curl_version) {
    case CURL_HTTP_VERSION_1_0:
      return 10;
    case CURL_HTTP_VERSION_1_1:
      return 11;
    case CURL_HTTP_VERSION_2_0:
      return 20;
    case CURL_HTTP_VERSION_3:
      return 30;
    default:
      return 0;
  }
}

// Copies the negotiated HTTP version and the connection count of the exchange into the response.
void RecordConnectionInfo(Transfer* t) {
  long version = 0;  // NOLINT(runtime/int): curl's type.
  if (curl_easy_getinfo(t->easy, CURLINFO_HTTP_VERSION, &version) == CURLE_OK) {
    t->response.http_version = HttpVersionNumber(version);
  }
  long connects = 0;  // NOLINT(runtime/int): curl's type.
  if (curl_easy_getinfo(t->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK) {
    t->response.connections_opened = static_cast<int>(connects);
  }
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  t->last_activity = t->clock->Now();
  std::string_view line(data, len);
  if (line.rfind("HTTP/", 0) == 0) {
    // A new response (after 1xx or a redirect): only the last one's headers count.
    t->response.headers.clear();
    return len;
  }
  if (line == "\r\n" || line == "\n") {
    long code = 0;  // NOLINT(runtime/int): curl's type.
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200) {
      return len;  // An interim response; the final one follows.
    }
    t->response.status_code = static_cast<int>(code);
    RecordConnectionInfo(t);
    if (t->streaming && !t->opened && !t->error_stream) {
      if (code >= 200 && code < 300) {
        t->opened = true;
        if (t->handlers.on_open) {
          t->handlers.on_open(t->response);
        }
      } else {
        t->error_stream = true;
      }
    }
    return len;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) {
    return len;
  }
  std::string name(line.substr(0, colon));
  absl::AsciiStrToLower(&name);
  std::string value(absl::StripAsciiWhitespace(
      absl::string_view(line.data() + colon + 1, line.size() - colon - 1)));
  t->response.headers.emplace_back(std::move(name), std::move(value));
  return len;
}

size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  if (t->cancelled->load(std::memory_order_acquire)) {
    return 0;  // Aborts the transfer with CURLE_WRITE_ERROR.
  }
  t->last_activity = t->clock->Now();
  if (t->streaming && t->opened) {
    if (t->handlers.on_data) {
      t->handlers.on_data(std::string_view(data, len));
    }
    return len;
  }
  if (t->streaming) {
    const size_t room = kMaxErrorBody - std::min(kMaxErrorBody, t->response.body.size());
    t->response.body.append(data, std::min(room, len));
    return len;
  }
  t->response.body.append(data, len);
  return len;
}

// Perform's progress callback: a non-zero return aborts the exchange (the transport is
// being destroyed).
int OnProgress(void* stop, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(stop)->load(std::memory_order_acquire) ? 1 : 0;
}

void EnsureCurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

class CurlTransport::Loop {
 public:
  Loop(RestConfig config, std::shared_ptr<TokenSource> tokens, Options options)
      : config_(std::move(config)),
        tokens_(std::move(tokens)),
        options_(std::move(options)),
        limiter_(config_.qps, config_.burst, options_.clock) {}

  ~Loop() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      performing_cv_.SignalAll();  // ends Performs waiting for the rate limiter
    }
    stop_.store(true, std::memory_order_release);
    if (multi_ != nullptr) {
      curl_multi_wakeup(multi_);
    }
    if (thread_.joinable()) {
      thread_.join();
    }
    {
      // Performs in flight see stop_ within their progress callback and end.
      MutexLock lock(&mu_);
      while (performing_ > 0) {
        performing_cv_.Wait(&mu_);
      }
    }
    for (CURL* e : idle_easy_) {
      curl_easy_cleanup(e);
    }
    if (multi_ != nullptr) {
      curl_multi_cleanup(multi_);
    }
  }

  // With a bound on connections, blocking calls must take theirs from the loop.
  bool PerformOnLoop() const { return options_.max_host_connections > 0; }

  // Transport::Perform on the calling thread (see transport.h).
  absl::StatusOr<Response> Perform(Request request) {
    {
      MutexLock lock(&mu_);
      if (stopping_) {
        return absl::CancelledError(
            fmt::format("{} {}: transport shut down", request.method, PathOnly(request.path)));
      }
      ++performing_;
    }
    absl::StatusOr<Response> outcome = PerformHere(std::move(request));
    MutexLock lock(&mu_);
    if (--performing_ == 0) {
      performing_cv_.SignalAll();
    }
    return outcome;
  }

  absl::Status Init() {
    EnsureCurlGlobalInit();
    TESSERA_RETURN_IF_ERROR(ParseServer());
    multi_ = curl_multi_init();
    if (multi_ == nullptr) {
      return absl::InternalError("curl_multi_init failed");
    }
    curl_multi_setopt(multi_, CURLMOPT_PIPELINING,
                      static_cast<long>(CURLPIPE_MULTIPLEX));  // NOLINT
    if (options_.max_host_connections > 0) {
      curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS,
                        static_cast<long>(options_.max_host_connections));  // NOLINT
    }
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  StreamId Submit(std::unique_ptr<Transfer> t) {
    const StreamId id = next_id_.fetch_add(1, std::memory_order_relaxed);
    t->id = id;
    t->clock = options_.clock;
    {
      MutexLock lock(&mu_);
      live_.emplace(id, t->cancelled);
      incoming_.push_back(std::move(t));
    }
    curl_multi_wakeup(multi_);
    return id;
  }

  void Cancel(StreamId id) {
    {
      MutexLock lock(&mu_);
      auto it = live_.find(id);
      if (it == live_.end()) {
        return;
      }
      it->second->store(true, std::memory_order_release);
      cancels_.push_back(id);
    }
    curl_multi_wakeup(multi_);
  }

 private:
  absl::Status ParseServer() {
    const std::string& server = config_.server;
    const size_t scheme_end = server.find("://");
    if (server.empty() || scheme_end == std::string::npos) {
      return absl::InvalidArgumentError(fmt::format("server \"{}\" is not an http(s) URL", server));
    }
    const std::string scheme = server.substr(0, scheme_end);
    if (scheme != "https" && scheme != "http") {
      return absl::InvalidArgumentError(fmt::format("server \"{}\" is not an http(s) URL", server));
    }
    https_ = scheme == "https";
    if (config_.client_cert_pem.empty() != config_.client_key_pem.empty()) {
      return absl::InvalidArgumentError("a client certificate needs a client key and vice versa");
    }
    base_url_ = server;
    while (!base_url_.empty() && base_url_.back() == '/') {
      base_url_.pop_back();
    }
    if (!config_.tls_server_name.empty() && https_) {
      // Verify (and send SNI for) tls_server_name while connecting to the configured host:
      // the URL names tls_server_name and CONNECT_TO maps it to the real address.
      const size_t host_begin = scheme_end + 3;
      const size_t path_begin = base_url_.find('/', host_begin);
      const std::string authority =
          base_url_.substr(host_begin, path_begin == std::string::npos ? std::string::npos
                                                                       : path_begin - host_begin);
      const std::string prefix =
          path_begin == std::string::npos ? std::string() : base_url_.substr(path_begin);
      std::string host = authority;
      std::string port = "443";
      const size_t bracket = authority.rfind(']');
      const size_t colon = authority.rfind(':');
      if (colon != std::string::npos && (bracket == std::string::npos || colon > bracket)) {
        host = authority.substr(0, colon);
        port = authority.substr(colon + 1);
      }
      base_url_ = fmt::format("https://{}:{}{}", config_.tls_server_name, port, prefix);
      connect_to_ = fmt::format("{}:{}:{}:{}", config_.tls_server_name, port, host, port);
    }
    return absl::OkStatus();
  }

  void Run() {
    pthread_setname_np(pthread_self(), "kube-io");
    while (true) {
      std::deque<std::unique_ptr<Transfer>> incoming;
      std::vector<StreamId> cancels;
      bool stopping = false;
      {
        MutexLock lock(&mu_);
        incoming.swap(incoming_);
        cancels.swap(cancels_);
        stopping = stopping_;
      }
      if (stopping) {
        for (auto& t : incoming) {
          FinishCancelled(std::move(t), "transport shut down");
        }
        break;
      }
      for (auto& t : incoming) {
        const absl::Duration wait = limiter_.Reserve();
        if (wait <= absl::ZeroDuration()) {
          Start(std::move(t));
        } else {
          delayed_.emplace(options_.clock->Now() + wait, std::move(t));
        }
      }
      for (StreamId id : cancels) {
        CancelNow(id);
      }
      const absl::Time now = options_.clock->Now();
      while (!delayed_.empty() && delayed_.begin()->first <= now) {
        std::unique_ptr<Transfer> t = std::move(delayed_.begin()->second);
        delayed_.erase(delayed_.begin());
        Start(std::move(t));
      }
      int running = 0;
      curl_multi_perform(multi_, &running);
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
        if (msg->msg != CURLMSG_DONE) {
          continue;
        }
        Transfer* raw = nullptr;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &raw);
        const CURLcode code = msg->data.result;
        auto it = active_.find(raw->id);
        if (it == active_.end()) {
          continue;
        }
        std::unique_ptr<Transfer> t = std::move(it->second);
        active_.erase(it);
        curl_multi_remove_handle(multi_, t->easy);
        Finish(std::move(t), code);
      }
      const bool watching = CheckStalls();
      long timeout_ms = -1;  // NOLINT(runtime/int): curl's type.
      curl_multi_timeout(multi_, &timeout_ms);
      const long max_wait = watching ? 100 : 1000;  // NOLINT(runtime/int)
      if (timeout_ms < 0 || timeout_ms > max_wait) {
        timeout_ms = max_wait;
      }
      if (!delayed_.empty()) {
        const int64_t until =
            absl::ToInt64Milliseconds(delayed_.begin()->first - options_.clock->Now()) + 1;
        timeout_ms = std::clamp<long>(static_cast<long>(until), 0, timeout_ms);  // NOLINT
      }
      curl_multi_poll(multi_, nullptr, 0, static_cast<int>(timeout_ms), nullptr);
    }
    // Shutdown: everything outstanding ends with kCancelled. Callbacks may submit more work;
    // Submit keeps queueing it, so drain until the queue stays empty.
    for (auto& [id, t] : active_) {
      curl_multi_remove_handle(multi_, t->easy);
    }
    std::map<StreamId, std::unique_ptr<Transfer>> active;
    active.swap(active_);
    for (auto& [id, t] : active) {
      FinishCancelled(std::move(t), "transport shut down");
    }
    std::multimap<absl::Time, std::unique_ptr<Transfer>> delayed;
    delayed.swap(delayed_);
    for (auto& [when, t] : delayed) {
      FinishCancelled(std::move(t), "transport shut down");
    }
    while (true) {
      std::deque<std::unique_ptr<Transfer>> incoming;
      {
        MutexLock lock(&mu_);
        incoming.swap(incoming_);
      }
      if (incoming.empty()) {
        break;
      }
      for (auto& t : incoming) {
        FinishCancelled(std::move(t), "transport shut down");
      }
    }
  }

  // Ends streams that received nothing for their stall_timeout. libcurl's own low-speed check
  // (also set) averages the speed over a window of about five seconds, so after a burst it
  // fires several seconds late; this one is exact to the loop's 100 ms wake-up. Returns whether
  // any open stream has a watchdog.
  bool CheckStalls() {
    const absl::Time now = options_.clock->Now();
    bool watching = false;
    std::vector<StreamId> stalled;
    for (const auto& [id, t] : active_) {
      if (!t->streaming || t->request.stall_timeout <= absl::ZeroDuration()) {
        continue;
      }
      watching = true;
      if (now - t->last_activity >= t->request.stall_timeout) {
        stalled.push_back(id);
      }
    }
    for (StreamId id : stalled) {
      auto it = active_.find(id);
      std::unique_ptr<Transfer> t = std::move(it->second);
      active_.erase(it);
      curl_multi_remove_handle(multi_, t->easy);
      absl::Status status = absl::UnavailableError(
          fmt::format("{} {}: stream stalled (nothing received for {})", t->request.method,
                      PathOnly(t->request.path), absl::FormatDuration(t->request.stall_timeout)));
      FinishWithStatus(std::move(t), std::move(status));
    }
    return watching;
  }

  void CancelNow(StreamId id) {
    if (auto it = active_.find(id); it != active_.end()) {
      std::unique_ptr<Transfer> t = std::move(it->second);
      active_.erase(it);
      curl_multi_remove_handle(multi_, t->easy);
      FinishCancelled(std::move(t), "cancelled");
      return;
    }
    for (auto it = delayed_.begin(); it != delayed_.end(); ++it) {
      if (it->second->id == id) {
        std::unique_ptr<Transfer> t = std::move(it->second);
        delayed_.erase(it);
        FinishCancelled(std::move(t), "cancelled");
        return;
      }
    }
  }

  void Start(std::unique_ptr<Transfer> t) {
    if (absl::Status configured = Configure(t.get()); !configured.ok()) {
      // Moved, not copied: a Status copy shared with the caller would be released here, in
      // uninstrumented Abseil code that TSan cannot see.
      FinishWithStatus(std::move(t), std::move(configured));
      return;
    }
    const CURLMcode added = curl_multi_add_handle(multi_, t->easy);
    if (added != CURLM_OK) {
      FinishWithStatus(std::move(t), absl::InternalError(fmt::format("curl_multi_add_handle: {}",
                                                                     curl_multi_strerror(added))));
      return;
    }
    const StreamId id = t->id;
    t->last_activity = options_.clock->Now();
    active_.emplace(id, std::move(t));
  }

  // The blocking exchange of Perform, on the calling thread, with a pooled easy handle.
  absl::StatusOr<Response> PerformHere(Request request) {
    const absl::Duration wait = limiter_.Reserve();
    if (wait > absl::ZeroDuration()) {
      TESSERA_VLOG(3, "{} {}: client rate limiter wait {}", request.method, PathOnly(request.path),
                   absl::FormatDuration(wait));
      MutexLock lock(&mu_);
      const absl::Time until = options_.clock->Now() + wait;
      for (absl::Time now = options_.clock->Now(); !stopping_ && now < until;
           now = options_.clock->Now()) {
        performing_cv_.WaitFor(&mu_, absl::ToChronoNanoseconds(until - now));
      }
      if (stopping_) {
        return absl::CancelledError(
            fmt::format("{} {}: transport shut down", request.method, PathOnly(request.path)));
      }
    }
    auto t = std::make_unique<Transfer>();
    t->request = std::move(request);
    t->clock = options_.clock;
    {
      MutexLock lock(&mu_);
      if (!idle_easy_.empty()) {
        t->easy = idle_easy_.back();
        idle_easy_.pop_back();
      }
    }
    if (absl::Status configured = Configure(t.get()); !configured.ok()) {
      return configured;
    }
    CURL* e = t->easy;
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, &OnProgress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, &stop_);
    const CURLcode code = curl_easy_perform(e);
    RecordConnectionInfo(t.get());
    absl::StatusOr<Response> outcome = std::move(t->response);
    if (code == CURLE_ABORTED_BY_CALLBACK && stop_.load(std::memory_order_acquire)) {
      outcome = absl::CancelledError(
          fmt::format("{} {}: transport shut down", t->request.method, PathOnly(t->request.path)));
    } else if (code != CURLE_OK) {
      outcome = CurlError(code, t->errbuf, t->request, /*streaming=*/false);
    }
    // The handle keeps its connection for the next Perform; its options are reset then.
    t->easy = nullptr;
    MutexLock lock(&mu_);
    idle_easy_.push_back(e);
    return outcome;
  }

  // Prepares t->easy (a new handle, or a pooled one reset) for t->request: validation, the
  // bearer token, every option and header. On error the handle (if any) stays in `t`.
  absl::Status Configure(Transfer* t) {
    TESSERA_RETURN_IF_ERROR(ValidateRequest(t->request));
    std::string token;
    if (tokens_ != nullptr) {
      absl::StatusOr<std::string> got = tokens_->Token();
      if (!got.ok()) {
        return Annotate(got.status(), "reading the bearer token");
      }
      token = *std::move(got);
    }
    if (t->easy == nullptr) {
      t->easy = curl_easy_init();
      if (t->easy == nullptr) {
        return absl::InternalError("curl_easy_init failed");
      }
    } else {
      curl_easy_reset(t->easy);
    }
    CURL* e = t->easy;
    const Request& r = t->request;
    const std::string url = base_url_ + r.path;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_PRIVATE, t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &OnWrite);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, options_.user_agent.c_str());
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
                     https_ ? static_cast<long>(CURL_HTTP_VERSION_2TLS)   // NOLINT
                            : static_cast<long>(CURL_HTTP_VERSION_1_1));  // NOLINT
    if (!config_.disable_compression && !t->streaming) {
      // Streams are not compressed: a compressor buffers small events and delays them.
      curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "gzip");  // as client-go asks
    }
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, ToMillis(config_.connect_timeout));
    absl::Duration timeout = r.timeout;
    if (timeout == absl::ZeroDuration() && !t->streaming) {
      timeout = config_.request_timeout;
    }
    if (timeout > absl::ZeroDuration()) {
      curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, ToMillis(timeout));
    }
    if (t->streaming && r.stall_timeout > absl::ZeroDuration()) {
      curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                       static_cast<long>(std::max<int64_t>(  // NOLINT
                           1, absl::ToInt64Seconds(r.stall_timeout))));
    }
    // Method and body.
    if (r.method == "GET") {
      curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    } else if (r.method == "HEAD") {
      curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else {
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r.method.c_str());
      if (!r.body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH") {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r.body.data());
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
      }
    }
    // TLS.
    if (https_) {
      if (config_.insecure_skip_tls_verify) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
      } else {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
      }
      if (!config_.ca_pem.empty()) {
        // The configured CA is the only trust anchor, as in client-go.
        curl_easy_setopt(e, CURLOPT_CAINFO, nullptr);
        curl_easy_setopt(e, CURLOPT_CAPATH, nullptr);
        curl_blob blob{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(),
                       CURL_BLOB_NOCOPY};
        curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &blob);
      }
      if (!config_.client_cert_pem.empty()) {
        curl_blob cert{const_cast<char*>(config_.client_cert_pem.data()),
                       config_.client_cert_pem.size(), CURL_BLOB_NOCOPY};
        curl_blob key{const_cast<char*>(config_.client_key_pem.data()),
                      config_.client_key_pem.size(), CURL_BLOB_NOCOPY};
        curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &cert);
        curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
        curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &key);
        curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
      }
      if (!connect_to_.empty()) {
        t->connect_to = curl_slist_append(nullptr, connect_to_.c_str());
        curl_easy_setopt(e, CURLOPT_CONNECT_TO, t->connect_to);
      }
    }
    // Headers.
    bool has_accept = false;
    curl_slist* h = nullptr;
    for (const auto& [name, value] : r.headers) {
      has_accept = has_accept || EqualsIgnoreCase(name, "accept");
      h = curl_slist_append(h, fmt::format("{}: {}", name, value).c_str());
    }
    if (!has_accept) {
      h = curl_slist_append(h, "Accept: application/json");
    }
    if (!r.content_type.empty()) {
      h = curl_slist_append(h, fmt::format("Content-Type: {}", r.content_type).c_str());
    }
    h = curl_slist_append(h, "Expect:");
    if (!token.empty()) {
      std::string auth = "Authorization: Bearer " + token;
      h = curl_slist_append(h, auth.c_str());
      std::fill(auth.begin(), auth.end(), '\0');
    }
    t->header_list = h;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->header_list);
    return absl::OkStatus();
  }

  void Forget(StreamId id) {
    MutexLock lock(&mu_);
    live_.erase(id);
  }

  void Finish(std::unique_ptr<Transfer> t, CURLcode code) {
    Forget(t->id);
    const bool cancelled = t->cancelled->load(std::memory_order_acquire);
    if (cancelled) {
      FinishCancelled(std::move(t), "cancelled");
      return;
    }
    if (code != CURLE_OK) {
      absl::Status status = CurlError(code, t->errbuf, t->request, t->streaming);
      FinishWithStatus(std::move(t), std::move(status));
      return;
    }
    RecordConnectionInfo(t.get());
    if (!t->streaming) {
      ResponseCallback done = std::move(t->done);
      Response response = std::move(t->response);
      t.reset();
      done(std::move(response));
      return;
    }
    StreamEnd end;
    if (t->error_stream) {
      end.status = HttpStatusToStatus(t->request, t->response);
      end.error_response = std::move(t->response);
    } else if (!t->opened) {
      // A 2xx whose head never reached the header callback's end (cannot happen with curl, but
      // keep the contract: on_open precedes on_end for a successful stream).
      t->opened = true;
      if (t->handlers.on_open) {
        t->handlers.on_open(t->response);
      }
    }
    auto on_end = std::move(t->handlers.on_end);
    t.reset();
    if (on_end) {
      on_end(std::move(end));
    }
  }

  void FinishCancelled(std::unique_ptr<Transfer> t, std::string_view why) {
    absl::Status status = absl::CancelledError(
        fmt::format("{} {}: {}", t->request.method, PathOnly(t->request.path), why));
    FinishWithStatus(std::move(t), std::move(status));
  }

  void FinishWithStatus(std::unique_ptr<Transfer> t, absl::Status status) {
    Forget(t->id);
    if (t->streaming) {
      auto on_end = std::move(t->handlers.on_end);
      t.reset();
      if (on_end) {
        on_end(StreamEnd{std::move(status), std::nullopt});
      }
      return;
    }
    ResponseCallback done = std::move(t->done);
    t.reset();
    done(std::move(status));
  }

  const RestConfig config_;
  const std::shared_ptr<TokenSource> tokens_;
  const Options options_;
  RateLimiter limiter_;
  bool https_ = false;
  std::string base_url_;
  std::string connect_to_;
  CURLM* multi_ = nullptr;
  std::thread thread_;
  std::atomic<StreamId> next_id_{1};

  Mutex mu_;
  CondVar performing_cv_;  // performing_ reached 0, or stopping_ was set
  int performing_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<CURL*> idle_easy_ ABSL_GUARDED_BY(mu_);  // Perform's pool
  std::atomic<bool> stop_{false};                      // stopping_, for Perform's callback
  // The I/O thread's mailbox, drained by its poll loop: no WorkQueue, whose workers wait on a
  // condition variable, not in curl_multi_poll (docs/architecture.md "Conventions").
  std::deque<std::unique_ptr<Transfer>> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<StreamId> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, std::shared_ptr<std::atomic<bool>>> live_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // I/O thread only.
  std::map<StreamId, std::unique_ptr<Transfer>> active_;
  std::multimap<absl::Time, std::unique_ptr<Transfer>> delayed_;
};

absl::StatusOr<std::unique_ptr<CurlTransport>> CurlTransport::Create(
    RestConfig config, std::shared_ptr<TokenSource> tokens, Options options) {
  auto loop = std::make_unique<Loop>(std::move(config), std::move(tokens), std::move(options));
  TESSERA_RETURN_IF_ERROR(loop->Init());
  return std::unique_ptr<CurlTransport>(new CurlTransport(std::move(loop)));
}

CurlTransport::CurlTransport(std::unique_ptr<Loop> loop) : loop_(std::move(loop)) {}

CurlTransport::~CurlTransport() = default;

void CurlTransport::Send(Request request, ResponseCallback done) {
  auto t = std::make_unique<Transfer>();
  t->request = std::move(request);
  t->done = std::move(done);
  loop_->Submit(std::move(t));
}

StreamId CurlTransport::Stream(Request request, StreamHandlers handlers) {
  auto t = std::make_unique<Transfer>();
  t->request = std::move(request);
  t->streaming = true;
  t->handlers = std::move(handlers);
  return loop_->Submit(std::move(t));
}

void CurlTransport::Cancel(StreamId id) { loop_->Cancel(id); }

absl::StatusOr<Response> CurlTransport::Perform(Request request) {
  if (loop_->PerformOnLoop()) {
    return Transport::Perform(std::move(request));  // Send, then wait
  }
  return loop_->Perform(std::move(request));
}

}  // namespace tessera::kube

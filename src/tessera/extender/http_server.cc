#include "tessera/extender/http_server.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "fmt/core.h"
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "tessera/base/allocator.h"
#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/base/status_macros.h"
#include "tessera/http/server.h"

namespace tessera::extender {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kText[] = "text/plain; charset=utf-8";
constexpr char kMetricsType[] = "text/plain; version=0.0.4; charset=utf-8";

// ---- certificates ------------------------------------------------------------------------------

// A parsed certificate pair. Immutable once built; shared by the handshakes that use it.
struct CertPair {
  std::string cert_pem;
  std::string key_pem;
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  STACK_OF(X509) * chain = nullptr;

  CertPair() = default;
  CertPair(const CertPair&) = delete;
  CertPair& operator=(const CertPair&) = delete;
  ~CertPair() {
    X509_free(cert);
    EVP_PKEY_free(key);
    sk_X509_pop_free(chain, X509_free);
  }
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    return absl::InvalidArgumentError(fmt::format("cannot read {}: {}", path, ErrnoText(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<const CertPair>> ParsePair(std::string cert_pem,
                                                          std::string key_pem) {
  auto pair = std::make_shared<CertPair>();
  pair->cert_pem = std::move(cert_pem);
  pair->key_pem = std::move(key_pem);
  BIO* cb = BIO_new_mem_buf(pair->cert_pem.data(), static_cast<int>(pair->cert_pem.size()));
  BIO* kb = BIO_new_mem_buf(pair->key_pem.data(), static_cast<int>(pair->key_pem.size()));
  if (cb == nullptr || kb == nullptr) {
    BIO_free(cb);
    BIO_free(kb);
    return absl::ResourceExhaustedError("out of memory");
  }
  pair->cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  if (pair->cert != nullptr) {
    pair->chain = sk_X509_new_null();
    while (X509* extra = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr)) {
      sk_X509_push(pair->chain, extra);
    }
  }
  pair->key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(cb);
  BIO_free(kb);
  ERR_clear_error();  // the chain loop ends on a "no start line" error
  if (pair->cert == nullptr) {
    return absl::InvalidArgumentError("no PEM certificate in the certificate file");
  }
  if (pair->key == nullptr) {
    return absl::InvalidArgumentError("no PEM private key in the key file");
  }
  if (X509_check_private_key(pair->cert, pair->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the private key does not match the certificate");
  }
  return std::shared_ptr<const CertPair>(std::move(pair));
}

// Holds the serving pair and re-reads the files at most once per interval.
class CertWatcher {
 public:
  CertWatcher(std::string cert_file, std::string key_file, absl::Duration interval, Clock* clock)
      : cert_file_(std::move(cert_file)),
        key_file_(std::move(key_file)),
        interval_(interval),
        clock_(clock) {}

  absl::Status Load() {
    TESSERA_ASSIGN_OR_RETURN(std::string cert_pem, ReadFile(cert_file_));
    TESSERA_ASSIGN_OR_RETURN(std::string key_pem, ReadFile(key_file_));
    absl::StatusOr<std::shared_ptr<const CertPair>> pair =
        ParsePair(std::move(cert_pem), std::move(key_pem));
    if (!pair.ok()) {
      return absl::InvalidArgumentError(fmt::format("certificate {} with key {}: {}", cert_file_,
                                                    key_file_,
                                                    std::string(pair.status().message())));
    }
    MutexLock l(&mu_);
    current_ = *std::move(pair);
    last_check_ = clock_->Now();
    return absl::OkStatus();
  }

  // The pair for a new handshake, after re-reading the files if the interval has passed.
  std::shared_ptr<const CertPair> Current() {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    if (now - last_check_ >= interval_) {
      last_check_ = now;
      Check();
    }
    return current_;
  }

 private:
  void Check() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::string> cert_pem = ReadFile(cert_file_);
    absl::StatusOr<std::string> key_pem = ReadFile(key_file_);
    if (!cert_pem.ok() || !key_pem.ok()) {
      const absl::Status& bad = !cert_pem.ok() ? cert_pem.status() : key_pem.status();
      if (bad.message() != last_error_) {
        last_error_ = std::string(bad.message());
        TESSERA_LOG(kWarning, "TLS certificate reload: {}; keeping the current certificate",
                    last_error_);
      }
      return;
    }
    if (*cert_pem == current_->cert_pem && *key_pem == current_->key_pem) {
      return;
    }
    if (*cert_pem == bad_cert_pem_ && *key_pem == bad_key_pem_) {
      return;  // already reported
    }
    absl::StatusOr<std::shared_ptr<const CertPair>> pair = ParsePair(*cert_pem, *key_pem);
    if (!pair.ok()) {
      bad_cert_pem_ = *std::move(cert_pem);
      bad_key_pem_ = *std::move(key_pem);
      last_error_ = std::string(pair.status().message());
      TESSERA_LOG(kWarning, "TLS certificate reload from {} and {}: {}; keeping the current one",
                  cert_file_, key_file_, last_error_);
      return;
    }
    current_ = *std::move(pair);
    bad_cert_pem_.clear();
    bad_key_pem_.clear();
    last_error_.clear();
    TESSERA_LOG(kInfo, "TLS certificate reloaded from {} and {}", cert_file_, key_file_);
  }

  const std::string cert_file_;
  const std::string key_file_;
  const absl::Duration interval_;
  Clock* const clock_;
  Mutex mu_;
  std::shared_ptr<const CertPair> current_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_);
  std::string bad_cert_pem_ ABSL_GUARDED_BY(mu_);
  std::string bad_key_pem_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// OpenSSL calls this for every handshake, before it picks the certificate: each connection gets
// the pair that is current at its handshake, so a reload never touches a shared SSL_CTX.
int CertCallback(SSL* ssl, void* arg) {
  std::shared_ptr<const CertPair> pair = static_cast<CertWatcher*>(arg)->Current();
  if (pair == nullptr) {
    return 0;
  }
  // Takes its own references to the certificate, key and chain.
  return SSL_use_cert_and_key(ssl, pair->cert, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

// ---- requests ----------------------------------------------------------------------------------

std::string StatusText(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "404 page not found";
    case 405:
      return "method not allowed";
    case 413:
      return fmt::format("request body larger than {} bytes", kMaxRequestBytes);
    default:
      return fmt::format("HTTP {} {}", status, http::ReasonPhrase(status));
  }
}

void SendText(http::Response* res, int status, std::string body) {
  res->status = status;
  res->content_type = kText;
  res->body = std::move(body);
}

void SendJson(http::Response* res, std::string body) {
  res->status = 200;
  res->content_type = kJson;
  res->body = std::move(body);
}

// Metrics scrapes are compressed (when the scraper accepts gzip, as Prometheus does) from this
// size on.
constexpr size_t kGzipMetricsFrom = 1024;
// A /filter, /bind, /refit or /preempt body at least this large is decoded and answered by at most
// kLargeAtOnce threads at a time: each takes tens of MB while it runs (a 60,000-name /filter
// about 50 MB), and kube-scheduler sends one filter at a time anyway.
constexpr size_t kLargeBodyBytes = 256 << 10;
constexpr int kLargeAtOnce = 2;

}  // namespace

RefitResponse Backend::Refit(const RefitRequest& /*request*/) {
  RefitResponse response;
  response.failure_reason = "the NUMA refit is not served by this extender";
  return response;
}

absl::StatusOr<PreemptResult> Backend::Preempt(const PreemptArgs& /*args*/) {
  return absl::UnimplementedError("the preempt verb is not served by this extender");
}

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view address) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(fmt::format("address {}: {}", address, why));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return bad("missing port in address");
  }
  std::string_view host;
  if (!address.empty() && address[0] == '[') {
    const size_t end = address.find(']');
    if (end == std::string_view::npos) {
      return bad("missing ']' in address");
    }
    if (end + 1 != colon) {
      return end + 1 == address.size() ? bad("missing port in address")
                                       : bad("unexpected characters after ']' in address");
    }
    host = address.substr(1, end - 1);
    if (host.find('[') != std::string_view::npos || host.find(']') != std::string_view::npos) {
      return bad("unexpected '[' or ']' in address");
    }
  } else {
    host = address.substr(0, colon);
    if (host.find(':') != std::string_view::npos) {
      return bad("too many colons in address");
    }
    if (host.find('[') != std::string_view::npos || host.find(']') != std::string_view::npos) {
      return bad("unexpected '[' or ']' in address");
    }
  }
  const std::string_view port_text = address.substr(colon + 1);
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(std::string(port_text), &port) || port > 65535) {
    return bad("invalid port");
  }
  return ListenAddress{std::string(host), port};
}

class HttpServer::Impl {
 public:
  Impl(Backend* backend, HttpServerOptions options)
      : backend_(backend), options_(std::move(options)) {
    if (options_.clock == nullptr) {
      options_.clock = Clock::Real();
    }
  }

  ~Impl() {
    Stop();
    SSL_CTX_free(tls_ctx_);
  }

  absl::Status Start() {
    if (started_) {
      return absl::FailedPreconditionError("HttpServer::Start called twice");
    }
    started_ = true;
    TESSERA_ASSIGN_OR_RETURN(ListenAddress main_address, ParseListenAddress(options_.bind_address));
    std::optional<ListenAddress> metrics_address;
    if (!options_.metrics_bind_address.empty()) {
      TESSERA_ASSIGN_OR_RETURN(metrics_address, ParseListenAddress(options_.metrics_bind_address));
    }
    const bool has_cert = !options_.cert_file.empty();
    if (has_cert != !options_.key_file.empty()) {
      return absl::InvalidArgumentError("TLS needs both a certificate file and a key file");
    }
    http::ServerOptions server_options;
    server_options.threads = options_.threads;
    server_options.max_threads = std::max(options_.threads, options_.max_connections);
    server_options.max_connections = options_.max_connections;
    server_options.header_timeout = options_.header_timeout;
    server_options.tls_handshake_timeout = options_.tls_handshake_timeout;
    server_options.thread_name = "extender-http";
    // A large /filter decodes into tens of MB; give them back (docs/serve.md "Listener limits").
    server_options.after_large_request = [this] {
      ReleaseFreeMemory();
      if (options_.after_large_request) {
        options_.after_large_request();
      }
    };
    server_options.max_body_bytes = kMaxRequestBytes;
    server_options.read_timeout = options_.read_timeout;
    server_options.write_timeout = options_.write_timeout;
    server_options.keep_alive_timeout = options_.keep_alive_timeout;
    server_options.error_body = [](http::Response* res) {
      SendText(res, res->status, StatusText(res->status));
    };
    server_options.on_response = [](const http::Request& req, const http::Response& res,
                                    absl::Duration took) {
      TESSERA_VLOG(2, "http {} {} {} {}us", req.method, req.path, res.status,
                   absl::ToInt64Microseconds(took));
    };
    if (has_cert) {
      certs_ = std::make_unique<CertWatcher>(options_.cert_file, options_.key_file,
                                             options_.cert_check_interval, options_.clock);
      TESSERA_RETURN_IF_ERROR(certs_->Load());
      tls_ctx_ = SSL_CTX_new(TLS_server_method());
      if (tls_ctx_ == nullptr) {
        ERR_clear_error();
        return absl::InternalError("TLS server set-up failed");
      }
      SSL_CTX_set_options(tls_ctx_, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
      SSL_CTX_set_min_proto_version(tls_ctx_, TLS1_2_VERSION);
      SSL_CTX_set_cert_cb(tls_ctx_, CertCallback, certs_.get());
      server_options.tls = tls_ctx_;
      tls_ = true;
    }
    http::ServerOptions metrics_options = server_options;
    metrics_options.threads = 2;
    metrics_options.thread_name = "extender-metric";
    metrics_options.tls = nullptr;
    main_ = std::make_unique<http::Server>(
        [this](http::Request& req, http::Response* res) { HandleMain(req, res); },
        std::move(server_options));
    if (absl::Status s = main_->Start(main_address.host, main_address.port); !s.ok()) {
      main_.reset();
      return absl::UnavailableError(
          fmt::format("cannot listen on {}: {}", options_.bind_address, std::string(s.message())));
    }
    if (metrics_address.has_value()) {
      metrics_ = std::make_unique<http::Server>(
          [this](http::Request& req, http::Response* res) { HandleMetrics(req, res); },
          std::move(metrics_options));
      if (absl::Status s = metrics_->Start(metrics_address->host, metrics_address->port); !s.ok()) {
        metrics_.reset();
        Stop();
        return absl::UnavailableError(fmt::format(
            "cannot listen on {}: {}", options_.metrics_bind_address, std::string(s.message())));
      }
    }
    TESSERA_LOG(kInfo, "extender listening on {} ({}, port {}){}", options_.bind_address,
                tls_ ? "https" : "http", main_->port(),
                metrics_ != nullptr ? fmt::format(", metrics on port {}", metrics_->port()) : "");
    return absl::OkStatus();
  }

  void Stop() {
    if (main_ != nullptr) {
      main_->Stop();
    }
    if (metrics_ != nullptr) {
      metrics_->Stop();
    }
  }

  int port() const { return main_ == nullptr ? 0 : main_->port(); }
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }
  bool tls() const { return tls_; }

 private:
  // ---- the main listener (tessera::http) ------------------------------------------------------

  void HandleMain(http::Request& req, http::Response* res) {
    const std::string& p = req.path;
    if (req.method == "POST") {
      if (p == "/filter") {
        Filter(req.body, res);
        return;
      }
      if (p == "/bind") {
        Bind(req.body, res);
        return;
      }
      if (p == "/refit") {
        Refit(req.body, res);
        return;
      }
      if (p == "/preempt") {
        Preempt(req.body, res);
        return;
      }
      if (p == "/webhook" && options_.webhook) {
        auto [status, reply] = options_.webhook(req.Get("Content-Type"), req.body);
        res->status = status;
        res->content_type = kJson;
        res->body = std::move(reply);
        return;
      }
    } else if (req.method == "GET" || req.method == "HEAD") {
      if (p == "/healthz") {
        SendText(res, 200, "ok");
        return;
      }
      if (p == "/readyz") {
        std::string why;
        if (backend_->Ready(&why)) {
          SendText(res, 200, why.empty() ? "ok" : why);
        } else {
          SendText(res, 503, why.empty() ? "not ready" : why);
        }
        return;
      }
    }
    MethodOrNotFound(p, res);
  }

  void MethodOrNotFound(const std::string& p, http::Response* res) const {
    if (p == "/filter" || p == "/bind" || p == "/refit" || p == "/preempt" ||
        (p == "/webhook" && options_.webhook)) {
      res->headers.push_back({"Allow", "POST"});
    } else if (p == "/healthz" || p == "/readyz") {
      res->headers.push_back({"Allow", "GET, HEAD"});
    } else {
      SendText(res, 404, StatusText(404));
      return;
    }
    SendText(res, 405, StatusText(405));
  }

  // Holds one of the kLargeAtOnce slots for a large body while it lives.
  class LargeSlot {
   public:
    LargeSlot(Impl* impl, size_t bytes) : impl_(bytes >= kLargeBodyBytes ? impl : nullptr) {
      if (impl_ != nullptr) {
        MutexLock l(&impl_->large_mu_);
        while (impl_->large_running_ >= kLargeAtOnce) {
          impl_->large_cv_.Wait(&impl_->large_mu_);
        }
        ++impl_->large_running_;
      }
    }
    ~LargeSlot() {
      if (impl_ != nullptr) {
        MutexLock l(&impl_->large_mu_);
        --impl_->large_running_;
        impl_->large_cv_.Signal();
      }
    }
    LargeSlot(const LargeSlot&) = delete;
    LargeSlot& operator=(const LargeSlot&) = delete;

   private:
    Impl* const impl_;
  };

  void Filter(const std::string& body, http::Response* res) {
    if (body.empty()) {
      SendText(res, 400, "Please send a request body");
      return;
    }
    LargeSlot slot(this, body.size());
    absl::StatusOr<FilterArgs> args = DecodeFilterArgs(body);
    if (!args.ok()) {
      if (args.status().message() == kMissingPodMessage) {
        FilterResult result;
        result.error = kMissingPodMessage;
        SendJson(res, EncodeFilterResult(result));
        return;
      }
      SendText(res, 400, std::string(args.status().message()));
      return;
    }
    SendJson(res, EncodeFilterResult(backend_->Filter(*args)));
  }

  void Bind(const std::string& body, http::Response* res) {
    if (body.empty()) {
      SendText(res, 400, "Please send a request body");
      return;
    }
    LargeSlot slot(this, body.size());
    absl::StatusOr<BindArgs> args = DecodeBindArgs(body);
    if (!args.ok()) {
      SendText(res, 400, std::string(args.status().message()));
      return;
    }
    SendJson(res, EncodeBindResult(backend_->Bind(*args)));
  }

  // As HAMi's route: always 200, a body that does not decode is an in-band failure.
  void Refit(const std::string& body, http::Response* res) {
    LargeSlot slot(this, body.size());  // a 1 MiB array of UUIDs decodes into tens of MB
    RefitResponse response;
    if (body.empty()) {
      response.failure_reason = "refit request: empty body";
    } else if (absl::StatusOr<RefitRequest> request = DecodeRefitRequest(body); !request.ok()) {
      response.failure_reason = std::string(request.status().message());
    } else {
      response = backend_->Refit(*request);
    }
    SendJson(res, EncodeRefitResponse(response));
  }

  // kube-scheduler reads only a 200's body; any other status fails its preemption for the pod.
  void Preempt(const std::string& body, http::Response* res) {
    if (body.empty()) {
      SendText(res, 400, "Please send a request body");
      return;
    }
    LargeSlot slot(this, body.size());  // a full-form request carries whole pods
    absl::StatusOr<PreemptArgs> args = DecodePreemptArgs(body);
    if (!args.ok()) {
      SendText(res, 400, std::string(args.status().message()));
      return;
    }
    absl::StatusOr<PreemptResult> result = backend_->Preempt(*args);
    if (!result.ok()) {
      int status = 500;
      switch (result.status().code()) {
        case absl::StatusCode::kInvalidArgument:
          status = 400;
          break;
        case absl::StatusCode::kUnimplemented:
          status = 404;
          break;
        case absl::StatusCode::kUnavailable:
          status = 503;
          break;
        default:
          break;
      }
      SendText(res, status, std::string(result.status().message()));
      return;
    }
    SendJson(res, EncodePreemptResult(*result));
  }

  // ---- the metrics listener ---------------------------------------------------------------

  void HandleMetrics(http::Request& req, http::Response* res) {
    const std::string& p = req.path;
    if (p != "/metrics" && p != "/healthz" && p != "/debug/ledger" && p != "/debug/audit" &&
        p != "/debug/why") {
      SendText(res, 404, StatusText(404));
      return;
    }
    if (req.method != "GET" && req.method != "HEAD") {
      res->headers.push_back({"Allow", "GET, HEAD"});
      SendText(res, 405, StatusText(405));
      return;
    }
    if (p.starts_with("/debug/")) {
      const DebugAccess access = CheckDebugAccess(req);
      if (access.status != 0) {
        if (access.status == 401) {
          res->headers.push_back({"WWW-Authenticate", "Bearer"});
        }
        SendText(res, access.status, access.message + "\n");
        return;
      }
    }
    if (p == "/healthz") {
      SendText(res, 200, "ok");
    } else if (p == "/debug/ledger") {
      SendJson(res, backend_->DebugLedgerJson());
    } else if (p == "/debug/audit") {
      SendJson(res, backend_->DebugAuditJson());
    } else if (p == "/debug/why") {
      absl::StatusOr<WhyRequest> why = ParseWhyQuery(req.query);
      if (!why.ok()) {
        SendText(res, 400, std::string(why.status().message()) + "\n");
        return;
      }
      WhyReply reply = backend_->DebugWhy(*why);
      if (reply.status == 200) {
        SendJson(res, std::move(reply.body));
      } else {
        SendText(res, reply.status, std::move(reply.body));
      }
    } else {
      res->status = 200;
      res->content_type = kMetricsType;
      res->body = options_.metrics ? options_.metrics() : std::string();
      http::GzipIfAccepted(req, res, kGzipMetricsFrom);
    }
  }

  // Whether the caller of a /debug route may read it (HttpServerOptions::debug_access).
  DebugAccess CheckDebugAccess(const http::Request& req) const {
    DebugCaller caller;
    caller.remote_ip = req.remote_ip;
    caller.loopback = http::IsLoopbackIp(req.remote_ip);
    caller.path = req.path;
    caller.verb = "get";
    caller.token = BearerToken(req.Get("Authorization"));
    if (caller.token.empty()) {
      caller.token = BearerToken(req.Get("X-Tessera-Authorization"));
    }
    return options_.debug_access ? options_.debug_access(caller) : LoopbackOnlyDebugAccess(caller);
  }

  // The token of "Bearer TOKEN" (the scheme case-insensitive), else "".
  static std::string_view BearerToken(std::string_view value) {
    constexpr std::string_view kScheme = "bearer ";
    if (value.size() <= kScheme.size()) {
      return {};
    }
    for (size_t i = 0; i < kScheme.size(); ++i) {
      if (absl::ascii_tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) {
        return {};
      }
    }
    value.remove_prefix(kScheme.size());
    while (!value.empty() && value.front() == ' ') {
      value.remove_prefix(1);
    }
    return value;
  }

  Backend* const backend_;
  HttpServerOptions options_;
  Mutex large_mu_;
  CondVar large_cv_;
  int large_running_ ABSL_GUARDED_BY(large_mu_) = 0;
  bool started_ = false;
  bool tls_ = false;
  std::unique_ptr<CertWatcher> certs_;
  SSL_CTX* tls_ctx_ = nullptr;
  std::unique_ptr<http::Server> main_;
  std::unique_ptr<http::Server> metrics_;
};

DebugAccess LoopbackOnlyDebugAccess(const DebugCaller& caller) {
  if (caller.loopback) {
    return {};
  }
  return {403, fmt::format("forbidden: {} is served to loopback callers only (kubectl "
                           "port-forward); tessera serve --debug-auth=kubernetes also serves "
                           "callers with a bearer token the API server authorises",
                           caller.path)};
}

absl::StatusOr<WhyRequest> ParseWhyQuery(std::string_view query) {
  http::Request req;  // for its parameter decoding
  req.query = std::string(query);
  // Each parameter at most once, and only these.
  constexpr std::string_view kKnown[] = {"namespace", "name", "if-deleted", "node", "gpumem"};
  for (std::string_view rest = query; !rest.empty();) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const std::string_view key = pair.substr(0, pair.find('='));
    if (key.empty()) {
      continue;
    }
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return absl::InvalidArgumentError(
          fmt::format("unknown parameter \"{}\" (known: namespace, name, if-deleted, node, "
                      "gpumem)",
                      key.substr(0, 64)));
    }
  }
  WhyRequest why;
  why.ns = req.Param("namespace");
  why.name = req.Param("name");
  if (!kube::IsDnsLabel(why.ns)) {
    return absl::InvalidArgumentError("namespace: a namespace name is required (a DNS label)");
  }
  if (!kube::IsDnsSubdomain(why.name)) {
    return absl::InvalidArgumentError("name: a pod name is required (a DNS subdomain)");
  }
  if (req.HasParam("if-deleted")) {
    const std::string pod = req.Param("if-deleted");
    const size_t slash = pod.find('/');
    why.if_deleted_ns = slash == std::string::npos ? why.ns : pod.substr(0, slash);
    why.if_deleted_name = slash == std::string::npos ? pod : pod.substr(slash + 1);
    if (!kube::IsDnsLabel(why.if_deleted_ns) || !kube::IsDnsSubdomain(why.if_deleted_name)) {
      return absl::InvalidArgumentError("if-deleted: NAME or NAMESPACE/NAME of a pod");
    }
  }
  if (req.HasParam("node")) {
    why.node = req.Param("node");
    if (!kube::IsDnsSubdomain(why.node)) {
      return absl::InvalidArgumentError("node: a node name (a DNS subdomain)");
    }
  }
  if (req.HasParam("gpumem")) {
    if (!absl::SimpleAtoi(req.Param("gpumem"), &why.gpumem) || why.gpumem < 1 ||
        why.gpumem > 1048576) {
      return absl::InvalidArgumentError("gpumem: MiB per device, 1..1048576");
    }
  }
  return why;
}

HttpServer::HttpServer(Backend* backend, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(backend, std::move(options))) {}

HttpServer::~HttpServer() { impl_->Stop(); }

absl::Status HttpServer::Start() { return impl_->Start(); }
void HttpServer::Stop() { impl_->Stop(); }
int HttpServer::port() const { return impl_->port(); }
int HttpServer::metrics_port() const { return impl_->metrics_port(); }
bool HttpServer::tls() const { return impl_->tls(); }

}  // namespace tessera::extender

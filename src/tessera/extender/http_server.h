// File: tessera/extender/http_server.h
//
// HttpServer: the extender's HTTP(S) routes kube-scheduler calls (/filter, /bind, /healthz,
// /readyz, /webhook), and /refit, which HAMi's device plugin calls, in front of a Backend that
// makes the decisions, plus a plain-HTTP metrics listener (/metrics, /healthz, /debug/ledger,
// /debug/audit, /debug/why; /debug only to the callers HttpServerOptions::debug_access admits,
// by default loopback peers). Both run on tessera::http. The route table, limits for hostile
// clients, memory bounds, certificate reload, address syntax and the access log: docs/serve.md
// "The extender's HTTP server".
//
//   HttpServer server(&backend, options);   // options.bind_address, metrics_bind_address, metrics
//   TESSERA_RETURN_IF_ERROR(server.Start());  ...  server.port()  ...  server.Stop();
//
// Errors: Start fails on a bad address, port or certificate pair. Requests: empty body 400, a body
// the decoder rejects 400, over kMaxRequestBytes 413, wrong method 405, unknown path 404; a filter
// without a pod is 200 {"Error":"extender args missing pod"}, as HAMi answers.
//
// Thread safety: Start and Stop must not race with each other or the destructor; port(),
// metrics_port() and tls() from any thread after Start. The Backend and the metrics function are
// called concurrently from the worker pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/extender/refit.h"
#include "tessera/extender/wire.h"

namespace tessera::extender {

// What the server asks. Thread safety: every method is called concurrently from several server
// threads (one per open connection), with no lock held by the server, and must therefore be
// thread-safe; Filter and Bind may block (kube-scheduler waits up to its httpTimeout), but each
// call ties up one server thread while it does. The Backend must outlive the server's Stop().
// GET /debug/why (metrics listener): replay the filter of one pending pod against the live
// ledger, with optional what-ifs. The server validates every field before the Backend sees it.
struct WhyRequest {
  std::string ns, name;
  std::string if_deleted_ns, if_deleted_name;  // --if-deleted: replay without this pod
  std::string node;                            // --node: only this candidate
  int32_t gpumem = 0;                          // --gpumem: MiB per device instead (0: as asked)
};
// The reply: an HTTP status and its body (JSON when 200, else one line of text).
struct WhyReply {
  int status = 404;
  std::string body = "not served\n";
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The reply to one /filter request. Never fails: errors go in FilterResult::error.
  virtual FilterResult Filter(const FilterArgs& args) = 0;
  // The reply to one /bind request; an empty error is success.
  virtual BindResult Bind(const BindArgs& args) = 0;
  // The reply to one /refit request (the NUMA refit, refit.h). Never fails: a refusal is the
  // response's failure_reason. The default refuses every request.
  virtual RefitResponse Refit(const RefitRequest& request);
  // The reply to one /preempt request (the preempt verb, preempt.h). Errors become the HTTP
  // status: InvalidArgument 400, Unimplemented 404, Unavailable 503, any other 500; the message
  // is the body. The default: Unimplemented (the verb is not served).
  virtual absl::StatusOr<PreemptResult> Preempt(const PreemptArgs& args);
  // Whether the extender can answer filter requests now; when not, *why says what it waits for
  // (the body of the 503). When ready, *why may describe the replica (the body of the 200).
  virtual bool Ready(std::string* why) = 0;
  // A JSON document describing the ledger, for operators.
  virtual std::string DebugLedgerJson() = 0;
  // A JSON document describing the last audit and resync of the self-healing accounting
  // (docs/self-healing.md). The default: nothing has run.
  virtual std::string DebugAuditJson() { return "{\"audit\":null,\"resync\":null}\n"; }
  // GET /debug/why (WhyRequest). The default: not served.
  virtual WhyReply DebugWhy(const WhyRequest& /*request*/) { return {}; }
};

// Who asks for a /debug route of the metrics listener (HttpServerOptions::debug_access).
struct DebugCaller {
  std::string_view remote_ip;  // the peer's address (http::Request::remote_ip)
  bool loopback = false;       // whether remote_ip is a loopback address
  // The bearer token of "Authorization: Bearer T", else of "X-Tessera-Authorization: Bearer T"
  // (the API server's service proxy strips Authorization); "" when neither carries one.
  std::string_view token;
  std::string_view path;  // "/debug/ledger"
  std::string_view verb;  // "get" (GET and HEAD)
};
// The answer: status 0 serves the route; else the HTTP status (401, 403, 503...) and its
// one-line text.
struct DebugAccess {
  int status = 0;
  std::string message;
};

// The default of HttpServerOptions::debug_access: loopback peers are served, any other caller
// gets 403 whatever it sends.
DebugAccess LoopbackOnlyDebugAccess(const DebugCaller& caller);

// The WhyRequest of a /debug/why query string's parameters, or InvalidArgument naming the bad
// one: namespace (a DNS label) and name (a DNS subdomain) required; if-deleted NAME or NS/NAME;
// node a DNS subdomain; gpumem 1..1048576; any other parameter is refused.
absl::StatusOr<WhyRequest> ParseWhyQuery(std::string_view query);

struct HttpServerOptions {
  // "host:port" of the extender routes (HAMi's --http_bind).
  std::string bind_address = "127.0.0.1:8080";
  // PEM files; both empty → plain HTTP, both set → HTTPS (HAMi's --cert_file / --key_file).
  std::string cert_file;
  std::string key_file;
  // How often, at most, the certificate files are re-read.
  absl::Duration cert_check_interval = absl::Seconds(5);
  // Measures cert_check_interval; nullptr means Clock::Real(). Must outlive the server.
  Clock* clock = nullptr;
  // "host:port" of the metrics listener; empty for none.
  std::string metrics_bind_address = ":9395";
  // The /metrics body (Prometheus text format); called concurrently; nullptr serves "".
  std::function<std::string()> metrics;
  // Decides, before each /debug request of the metrics listener (the ledger lists every GPU
  // pod), whether its caller may read it; called concurrently. nullptr: only loopback peers
  // (inside the pod's network namespace: kubectl port-forward) are served, others get 403.
  // /metrics and /healthz are never checked.
  std::function<DebugAccess(const DebugCaller&)> debug_access;
  // POST /webhook: called concurrently with the request's Content-Type and body (capped like
  // every body); returns the HTTP status and the application/json body. nullptr: 404.
  std::function<std::pair<int, std::string>(std::string_view content_type, std::string_view body)>
      webhook;
  // Worker threads of the main listener kept while idle (the metrics listener keeps 2). Each
  // open connection holds one while it is open; both pools grow up to max_connections.
  size_t threads = 16;
  // The cap on open connections of each listener (see http::ServerOptions::max_connections).
  size_t max_connections = 4096;
  // The overall deadlines of a request head and of a TLS handshake.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration tls_handshake_timeout = absl::Seconds(10);
  // Called (concurrently) after a request or reply of 256 KiB or more, once the server has
  // returned the allocator's free memory; nullptr: nothing. The service trims again a second
  // later, for what its background threads free after the reply.
  std::function<void()> after_large_request;
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  // How long an idle keep-alive connection is kept.
  absl::Duration keep_alive_timeout = absl::Seconds(60);
};

// A parsed listen address. `host` is empty for "all interfaces" (":9395").
struct ListenAddress {
  std::string host;
  int port = 0;

  friend bool operator==(const ListenAddress&, const ListenAddress&) = default;
};

// Parses "host:port", ":port" or "[ipv6]:port" as Go's net.SplitHostPort does; the port must be
// a decimal number in 0..65535. InvalidArgument otherwise ("missing port in address",
// "too many colons in address", ...).
absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view address);

class HttpServer {
 public:
  // `backend` must outlive the server.
  HttpServer(Backend* backend, HttpServerOptions options);
  // Stops the server.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds both listeners and starts serving. InvalidArgument for a bad address or an unusable
  // certificate pair; Unavailable when a port cannot be bound (e.g. in use). On error nothing is
  // left running. Call at most once.
  absl::Status Start();
  // Stops accepting, closes the listeners and joins every server thread: in-flight requests
  // finish first, idle keep-alive connections are closed. Idempotent.
  void Stop();

  // The bound ports (0 before Start, and for a metrics listener that is not configured).
  int port() const;
  int metrics_port() const;
  // Whether the main listener serves HTTPS.
  bool tls() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::extender

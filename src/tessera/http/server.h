// File: tessera/http/server.h
//
// http::Server: a small HTTP/1.1 server (RFC 9112) for request/response APIs, under the extender
// and apisim: a worker thread per open connection (a pool that may grow), keep-alive and
// pipelining, Content-Length and chunked bodies, 100-continue, deadlines, a connection cap, and
// optional TLS over the caller's SSL_CTX. One read and one write per ordinary request (why not
// cpp-httplib, and every limit: docs/serve.md "The HTTP server").
//
//   http::Server server([](http::Request& req, http::Response* res) { res->body = "ok"; },
//   options); TESSERA_RETURN_IF_ERROR(server.Start("127.0.0.1", 0));   // then server.port();
//   server.Stop();
//
// Errors: Start returns Unavailable when nothing can be bound. Malformed or oversized requests
// are answered by the server itself (400, 413, 431, 501, 505; 503 over the connection cap) and the
// connection is closed; the handler never sees them.
//
// Thread safety: Start and Stop must not race with each other or the destructor; port() from any
// thread after Start. The handler and ServerOptions callbacks run concurrently on the workers
// (one request at a time per connection).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace tessera::http {

namespace internal {
struct ServerPeer;
}  // namespace internal

struct Header {
  std::string name;   // as sent; compare case-insensitively
  std::string value;  // without leading and trailing blanks
};

struct Request {
  std::string method;     // as sent ("GET"; methods are case-sensitive)
  std::string target;     // the request-target as sent ("/api?x=1")
  std::string path;       // target before '?', percent-decoded
  std::string query;      // target after '?' as sent ("" when there is none)
  int minor_version = 1;  // HTTP/1.<minor_version>
  std::vector<Header> headers;
  std::string body;  // the body, de-chunked
  // The peer's IP address as text ("127.0.0.1", "::1"; an IPv4-mapped IPv6 peer as IPv4), ""
  // when unknown. Set by Server for each request (access checks such as loopback-only routes).
  std::string remote_ip;

  // The first value of header `name` (case-insensitive), "" when absent.
  std::string_view Get(std::string_view name) const;
  bool Has(std::string_view name) const;
  // The first value of query parameter `name` (decoded: %XX and '+' as a space), "" when
  // absent; whether it is present ("?a" and "?a=" both are).
  std::string Param(std::string_view name) const;
  bool HasParam(std::string_view name) const;
};

// Where a streamed reply's body goes (Response::stream).
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // Sends `data` (nothing when empty) as one chunk; false once the client is gone or a write
  // timed out (then stop streaming).
  virtual bool Write(std::string_view data) = 0;
  // Whether the client has closed or reset the connection; does not wait.
  virtual bool ClientGone() = 0;
};

struct Response {
  int status = 200;
  std::string content_type;     // the Content-Type header; none when empty
  std::vector<Header> headers;  // more headers (not Content-Length or Connection)
  std::string body;
  bool close = false;  // close the connection after this reply
  // When set, the body is streamed instead of `body`: after the head (Transfer-Encoding:
  // chunked; to an HTTP/1.0 client the raw bytes, then the connection closes) the server calls
  // stream() on the handler's thread. Returning true ends the body and keeps the connection;
  // false closes it.
  std::function<bool(StreamWriter& writer)> stream;
};

// The handler fills *response for request; it may take (move) request.body.
using Handler = std::function<void(Request& request, Response* response)>;

struct ServerOptions {
  // Worker threads started by Start and kept while idle. Each open connection holds one worker
  // while it is open (waiting for its next request included).
  size_t threads = 16;
  // When larger than `threads`: a worker is added whenever a connection waits and no worker is
  // free, up to this many; a worker beyond `threads` that has been idle for
  // idle_worker_timeout ends. Otherwise the pool stays at `threads`, and further connections
  // wait in a queue for a free worker.
  size_t max_threads = 0;
  absl::Duration idle_worker_timeout = absl::Seconds(30);
  // The cap on open connections (served or queued); 0: no cap. A connection that arrives when
  // every worker is taken (at max(threads, max_threads)) or the cap is reached first sheds
  // idle connections: the one that has waited longest for a request (a keep-alive connection
  // between requests, or a new one that has not sent a byte) is closed; with none idle, the
  // stalled one whose request began longest ago (stalled_request_after). When neither is left
  // and the cap is reached, the new connection is answered 503 and closed.
  size_t max_connections = 0;
  // The name of the worker threads (`top -H`, perf); at most 15 characters.
  std::string thread_name = "http";
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 64 << 10;
  // How long a read may wait for progress within a request, and a write for buffer space. A
  // body grows with the bytes received (never allocated up front from its Content-Length).
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  // How long an idle connection waits for its next request.
  absl::Duration keep_alive_timeout = absl::Seconds(60);
  // The overall deadline of a request head: from its first byte (for a connection's first
  // request: from the connection's start) to its end, however the bytes trickle in; the
  // connection is then closed without a reply. Enforced to within one read tick
  // (min(read_timeout, keep_alive_timeout, header_timeout, body_timeout, 1 s)). Zero: none.
  absl::Duration header_timeout = absl::Seconds(10);
  // The overall deadline of a request body (Content-Length or chunked): from the end of its
  // head to its last byte, however the bytes trickle in; the connection is then closed without
  // a reply. Enforced to within one read tick. Zero: none (read_timeout still applies per read).
  absl::Duration body_timeout = absl::Seconds(10);
  // A connection whose request (head or body) began at least this long ago and has not yet
  // arrived whole is stalled: at the cap, when no connection is idle, the one with the oldest
  // such request is shed (closed without a reply) for the new connection. A request being
  // handled or answered is never shed.
  absl::Duration stalled_request_after = absl::Milliseconds(250);
  // The overall deadline of a TLS handshake, from the connection's start. Zero: none.
  absl::Duration tls_handshake_timeout = absl::Seconds(10);
  // Serve HTTPS with this context (the caller keeps it alive until after Stop); nullptr: HTTP.
  SSL_CTX* tls = nullptr;
  // Fills the body of a reply the server makes by itself (400, 413, 431, 501, 505; `response`
  // arrives with status set). nullptr: the reason phrase as text/plain.
  std::function<void(Response* response)> error_body;
  // After a request whose body or reply has at least large_request_bytes, the connection frees
  // its request and reply buffers (else each keeps the largest it has seen) and then calls
  // after_large_request (nullptr: nothing), e.g. to hand the allocator's free memory back to
  // the system (ReleaseFreeMemory, base/allocator.h).
  size_t large_request_bytes = 256 << 10;
  std::function<void()> after_large_request;
  // Called after each reply is written (or failed to write): the request (method and path
  // empty when its request line was unreadable or too long), the reply, and the time since the
  // request's first byte was read. nullptr: nothing.
  std::function<void(const Request& request, const Response& response, absl::Duration took)>
      on_response;
};

// Decodes %XX escapes (and, when `plus_is_space`, '+' as a space, as in a query); a malformed
// escape stays as it is.
std::string PercentDecode(std::string_view text, bool plus_is_space);

// Compresses `response`'s body with gzip (Content-Encoding: gzip, Vary: Accept-Encoding) when
// `request` accepts gzip and the body has at least `min_bytes`; a streamed reply, or one that
// already has a Content-Encoding, is left alone. Returns whether it compressed.
bool GzipIfAccepted(const Request& request, Response* response, size_t min_bytes);

// Whether `ip` (Request::remote_ip) is a loopback address: 127.0.0.0/8 or ::1. "" is not.
bool IsLoopbackIp(std::string_view ip);

// The reason phrase of an HTTP status ("OK", "Not Found"; "Unknown" for codes it does not know).
std::string_view ReasonPhrase(int status);

class Server {
 public:
  Server(Handler handler, ServerOptions options);
  // Stops the server.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts accepting. `host` empty: all interfaces (IPv6 with IPv4 mapped
  // when the host has IPv6, else IPv4); a name is resolved. Port 0 picks a free port. Unavailable
  // when nothing could be bound (the message carries the system's reason, e.g. "Address already
  // in use"); on error nothing is left running. Call at most once.
  absl::Status Start(const std::string& host, int port);
  // Stops accepting, lets requests being handled finish and closes every connection; joins all
  // threads. Idempotent.
  void Stop();

  // The bound port (0 before Start).
  int port() const;

 private:
  friend struct internal::ServerPeer;  // the tests' view of its connections (server_internal.h)
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::http

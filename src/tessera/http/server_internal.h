// File: tessera/http/server_internal.h
//
// The connection loop of tessera::http::Server over an abstract byte stream (connection.cc), for
// the server itself, its tests and its fuzz target, and the header-value helpers it shares with
// message.cc. Not an API.
//
// Thread safety: a Stream is used by one thread at a time; ServeConnection may run concurrently
// for different streams.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "absl/time/time.h"

#include "tessera/http/server.h"

namespace tessera::http::internal {

class Stream {
 public:
  // Read's results other than a byte count.
  static constexpr long kClosed = 0;     // the peer closed its side
  static constexpr long kFailed = -1;    // an error; the connection is unusable
  static constexpr long kTimedOut = -2;  // nothing arrived within one tick (see ServeConnection)

  virtual ~Stream() = default;
  // Reads at most `n` (> 0) bytes into `buf`; returns how many (> 0) or one of the above.
  virtual long Read(char* buf, size_t n) = 0;
  // Writes `a` and then `b` completely; false when that failed.
  virtual bool Write(std::string_view a, std::string_view b) = 0;
  // Whether the peer has closed or reset the connection; does not wait.
  virtual bool PeerGone() { return false; }
};

// What a connection's worker publishes for the acceptor, which picks the connection to shed at
// the cap (steady-clock nanoseconds; 0: not in that state; -1: claimed by the acceptor, shed).
struct ConnectionState {
  // Since when the connection has waited for a request with nothing buffered.
  std::atomic<int64_t> idle_since{0};
  // Since when it has been reading a request (the request's first byte) that has not yet
  // arrived whole; 0 again once it has, before the handler runs.
  std::atomic<int64_t> request_since{0};
};

// Serves requests read from `stream` until the peer closes, a read or write fails or times out,
// a request head passes options.header_timeout or a body options.body_timeout, a reply closes
// the connection, or `stopping` is true after a reply. Each kTimedOut from Read counts as `tick`
// of waiting (zero: Read never times out). `state` (may be null): idle_since is set to now() in
// nanoseconds whenever the connection waits for a request with nothing buffered and to 0 when
// bytes of a request arrive, and request_since as its comment says; the caller sets
// idle_since's initial value (the connection's start). `now` (null: steady_clock::now)
// measures the deadlines, from the call for the first request. Returns true when it ended by
// refusing a request (400, 413, 431, 501, 505): the client may still be sending it.
using SteadyNow = std::function<std::chrono::steady_clock::time_point()>;
bool ServeConnection(Stream& stream, const Handler& handler, const ServerOptions& options,
                     absl::Duration tick, const std::atomic<bool>& stopping,
                     ConnectionState* state = nullptr, const SteadyNow& now = nullptr);

// What a test may learn of a running Server's connections, to wait for a state instead of
// sleeping.
struct ServerPeer {
  // How many of `server`'s open connections wait for a request with nothing buffered (idle, so
  // the first a new connection sheds at the cap), not counting those already shed.
  static size_t IdleConnections(Server& server);
  // How many are reading a request that has begun and not arrived whole, not counting those
  // already shed.
  static size_t StalledRequests(Server& server);
};

// Header-value text, shared by the connection loop (connection.cc) and the request and reply
// vocabulary (message.cc).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);
bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix);
// `s` without leading and trailing spaces and tabs.
std::string_view TrimBlanks(std::string_view s);
// Whether the comma-separated list `value` holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token);
// The value of hex digit `c`, or -1.
int HexValue(char c);

// Parses a request head (request line and header lines up to, not including, the empty line;
// lines end in CRLF or LF) into `request`'s method, target, path, query, minor_version and
// headers. Returns 0 or the status to refuse it with (400, 505).
int ParseRequestHead(std::string_view head, Request* request);

}  // namespace tessera::http::internal

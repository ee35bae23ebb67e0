// File: tessera/apisim/server.h
//
// The HTTP(S) face of the simulator: the Kubernetes REST paths over a Store, discovery
// (/version, /api, /apis, resource lists, /openapi/v3), health (/healthz /readyz /livez), an
// optional bearer token, and the fault-injection API under /simulator/v1 (docs/apisim.md).
//
// Server::Start binds (port 0 = a free port), starts serving on its own threads and returns;
// Stop() (also run by the destructor) ends every watch and joins the threads. Each connection
// gets its own worker thread, so every open watch holds one.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/apisim/store.h"
#include "tessera/base/clock.h"

namespace tessera::apisim {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port
  bool tls_self_signed = false;
  std::string tls_cert_file;  // with tls_key_file: serve HTTPS with this certificate
  std::string tls_key_file;
  std::string token;       // non-empty: require "Authorization: Bearer <token>" (else 401)
  std::string state_file;  // non-empty: loaded by Start when it exists; SaveState writes it
  size_t watch_history = 10000;
  absl::Duration bookmark_interval = absl::Seconds(60);
  absl::Duration reap_interval = absl::Milliseconds(100);
  size_t max_body_bytes = size_t{3} * 1024 * 1024;  // larger requests get 413
  size_t max_threads = 4096;
  Clock* clock = Clock::Real();  // the store's and the watch heartbeat's time
};

class Server {
 public:
  // Errors: InvalidArgument for inconsistent options or an unreadable state file,
  // Unavailable when the address cannot be bound, Internal for TLS set-up failures.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void Stop();

  int port() const;
  // "http://127.0.0.1:PORT" or "https://127.0.0.1:PORT".
  std::string url() const;
  // The serving certificate (PEM) when TLS is on, else empty.
  const std::string& ca_pem() const;
  Store& store();

  // Writes the store to options.state_file (FailedPrecondition when none is configured).
  absl::Status SaveState();
  // A kubeconfig (YAML) for this server: its URL, CA data and token.
  std::string Kubeconfig() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::apisim

// File: tessera/serve/listeners.h
//
// Listeners: serve's two HTTP listeners (extender/http_server.h) — the extender's (/filter,
// /bind, /refit, the admission webhook, /readyz, /debug) and the metrics' — with who may read
// /debug (--debug-auth: a DebugGate, and for "kubernetes" the API server's reviews) and the
// webhook's identity. Routes and limits: docs/serve.md "Endpoints", "Listener limits".
//
// Errors: Start returns HttpServer::Start's (InvalidArgument for bad certificates or addresses,
// Unavailable when a port cannot be bound). Thread safety: Start, Stop and the destructor from
// one thread; the ports from any.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"

#include "tessera/base/clock.h"
#include "tessera/device/device_config.h"
#include "tessera/extender/http_server.h"
#include "tessera/kube/transport.h"
#include "tessera/serve/debug_auth.h"
#include "tessera/serve/service.h"

namespace tessera::serve {

class Listeners {
 public:
  // Every pointer must outlive the object; the functions are called concurrently.
  struct Parts {
    extender::Backend* backend = nullptr;
    kube::Transport* transport = nullptr;  // the reviews of --debug-auth=kubernetes
    Clock* clock = nullptr;
    device::NvidiaConfig nvidia;  // the webhook's device configuration
    std::string self_username;    // the webhook's scheduler identity ("": nobody)
    std::function<std::string()> metrics;
    std::function<void()> after_large_request;
  };
  Listeners(const ServeOptions& options, Parts parts);

  absl::Status Start();
  // Stops accepting and joins every server thread.
  void Stop() { http_->Stop(); }
  // The last line of startup: where each listener is and who reads /debug.
  void LogListening() const;

  int port() const { return http_->port(); }
  int metrics_port() const { return http_->metrics_port(); }

 private:
  // For LogListening.
  const std::string http_bind_;
  const std::string metrics_bind_address_;
  const DebugAuthMode debug_auth_;
  // Used by http_'s workers, so declared before it.
  std::unique_ptr<DebugReviewer> debug_reviewer_;
  std::unique_ptr<DebugGate> debug_gate_;
  std::unique_ptr<extender::HttpServer> http_;
};

}  // namespace tessera::serve

// File: tessera/serve/connection.h
//
// Connection: serve's way to the API server — the client configuration (--kubeconfig,
// $KUBECONFIG or in-cluster, with --kube-qps and --kube-burst), the pooled transport with
// serve's user agent, the ApiClient every part shares, and the user the API server knows this
// scheduler's writes by (--self-username, else the subject of the client's service-account
// token), which the admission webhook lets write the scheduler-owned annotations. Logs the
// API server and the webhook's writers.
//
// Errors: Open returns the client configuration's error, annotated, or the transport's.
// Thread safety: the transport and client are thread-safe; the rest is set once by Open.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

#include "tessera/kube/client.h"
#include "tessera/kube/transport.h"
#include "tessera/serve/service.h"

namespace tessera::serve {

struct Connection {
  static absl::StatusOr<Connection> Open(const ServeOptions& options);

  std::unique_ptr<kube::CurlTransport> transport;
  std::unique_ptr<kube::ApiClient> client;  // over `transport`
  // The client configuration's namespace.
  std::string ns;
  // "" when neither given nor derived: nobody writes as the scheduler.
  std::string self_username;
};

}  // namespace tessera::serve

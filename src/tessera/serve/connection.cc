#include "tessera/serve/connection.h"

#include <utility>

#include "absl/strings/str_join.h"

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/extender/webhook.h"
#include "tessera/kube/config.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::serve {

absl::StatusOr<Connection> Connection::Open(const ServeOptions& options) {
  absl::StatusOr<kube::RestConfig> rest = kube::LoadRestConfig(options.kube);
  if (!rest.ok()) {
    return Annotate(rest.status(), "kubernetes client configuration");
  }
  rest->qps = options.kube_qps;
  rest->burst = options.kube_burst;
  TESSERA_LOG(kInfo, "serve: API server {}", rest->DebugString());
  kube::CurlTransport::Options transport_options;
  transport_options.user_agent = "tessera/" TESSERA_VERSION " (serve)";
  std::shared_ptr<kube::TokenSource> tokens = kube::MakeTokenSource(*rest, Clock::Real());
  Connection c;
  TESSERA_ASSIGN_OR_RETURN(c.transport,
                           kube::CurlTransport::Create(*rest, tokens, transport_options));
  c.ns = rest->namespace_;
  c.self_username = options.self_username;
  if (c.self_username.empty()) {
    absl::StatusOr<std::string> token =
        tokens != nullptr ? tokens->Token() : absl::NotFoundError("no bearer token");
    absl::StatusOr<std::string> user =
        token.ok() ? extender::ServiceAccountUsername(*token) : token.status();
    if (user.ok()) {
      c.self_username = *std::move(user);
    } else {
      TESSERA_LOG(kWarning,
                  "serve: --self-username not given and not derived from the client's token ({}): "
                  "the webhook lets no request write scheduler-owned annotations as the scheduler",
                  std::string(user.status().message()));
    }
  }
  TESSERA_LOG(kInfo,
              "serve: webhook: scheduler-owned annotations written by {}; the device "
              "plugin's by [{}]",
              c.self_username.empty() ? "nobody" : c.self_username,
              absl::StrJoin(options.trusted_annotation_writers, ", "));
  c.client = std::make_unique<kube::ApiClient>(c.transport.get());
  return c;
}

}  // namespace tessera::serve

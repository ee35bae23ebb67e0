#include "tessera/serve/listeners.h"

#include <utility>

#include "tessera/base/logging.h"
#include "tessera/extender/webhook.h"

namespace tessera::serve {

Listeners::Listeners(const ServeOptions& options, Parts parts)
    : http_bind_(options.http_bind),
      metrics_bind_address_(options.metrics_bind_address),
      debug_auth_(options.debug_auth) {
  extender::HttpServerOptions http_options;
  http_options.bind_address = options.http_bind;
  http_options.cert_file = options.cert_file;
  http_options.key_file = options.key_file;
  http_options.clock = parts.clock;  // paces the certificate reload
  http_options.metrics_bind_address = options.metrics_bind_address;
  http_options.metrics = std::move(parts.metrics);
  if (options.debug_auth == DebugAuthMode::kKubernetes) {
    debug_reviewer_ = NewKubeDebugReviewer(parts.transport);
  }
  debug_gate_ = std::make_unique<DebugGate>(options.debug_auth, debug_reviewer_.get(), parts.clock);
  http_options.debug_access = [gate = debug_gate_.get()](const extender::DebugCaller& caller) {
    return gate->Check(caller);
  };
  http_options.threads = options.http_threads;
  http_options.max_connections = options.max_connections;
  // What the writer and event threads free after a large request's reply stays in their
  // arenas until the next trim: housekeeping trims once more (base/allocator.h).
  http_options.after_large_request = std::move(parts.after_large_request);
  extender::WebhookOptions webhook{
      .scheduler_name = options.scheduler_name,
      .force_overwrite_default_scheduler = options.force_overwrite_default_scheduler,
      .nvidia = std::move(parts.nvidia),
      .self_username = std::move(parts.self_username),
      .trusted_annotation_writers = options.trusted_annotation_writers};
  http_options.webhook = [webhook](std::string_view content_type, std::string_view body) {
    extender::WebhookReply reply = extender::HandleAdmissionReview(content_type, body, webhook);
    return std::make_pair(reply.http_status, std::move(reply.body));
  };
  http_ = std::make_unique<extender::HttpServer>(parts.backend, http_options);
}

absl::Status Listeners::Start() { return http_->Start(); }

void Listeners::LogListening() const {
  TESSERA_LOG(kInfo, "serve: extender on {} (port {}), metrics on {} (port {}); /debug for {}",
              http_bind_, http_->port(), metrics_bind_address_, http_->metrics_port(),
              debug_auth_ == DebugAuthMode::kKubernetes
                  ? "loopback peers and callers the API server authorises (--debug-auth=kubernetes)"
                  : "loopback peers only (--debug-auth=loopback)");
}

}  // namespace tessera::serve

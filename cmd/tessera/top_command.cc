// `tessera top`: node → device → pods, as serve's ledger holds them (explain/top.h).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/base/clock.h"
#include "tessera/base/status_macros.h"
#include "tessera/explain/top.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"

namespace tessera::cmd {
namespace {

struct TopCommandOptions {
  std::string server;  // serve's metrics listener, e.g. http://127.0.0.1:9395
  std::string file;    // a saved /debug/ledger document; "-" = stdin
  std::string service = "tessera-system/tessera-metrics:metrics";
  std::string kubeconfig;
  std::string context;
  std::string node;
  std::string namespace_;
  int64_t min_free = 0;
  std::string sort = "node";
  std::string output = "text";
  int64_t now_unix = 0;
  Clock* clock = Clock::Real();  // "now" without --now
};

int Fail(const absl::Status& status, int code) {
  fmt::print(stderr, "tessera top: {}\n", std::string(status.message()));
  return code;
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), {});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(fmt::format("--file {}: cannot be read", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// GET `path` from `config.server`: serve directly (--server) or the API server's service proxy.
// Through the proxy (with_credentials) the kubeconfig's bearer token, if it has one, also goes
// in X-Tessera-Authorization: the API server strips Authorization before proxying, and serve
// with --debug-auth=kubernetes reviews that token (docs/serve.md "Who reads /debug").
absl::StatusOr<std::string> Get(kube::RestConfig config, const std::string& path,
                                bool with_credentials) {
  config.connect_timeout = absl::Seconds(10);
  config.request_timeout = absl::Seconds(30);
  kube::CurlTransport::Options options;
  options.user_agent = "tessera/" TESSERA_VERSION " (top)";
  std::shared_ptr<kube::TokenSource> tokens =
      with_credentials ? kube::MakeTokenSource(config, Clock::Real()) : nullptr;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<kube::CurlTransport> transport,
                           kube::CurlTransport::Create(config, tokens, options));
  kube::Request request;
  request.path = path;
  if (tokens != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(std::string token, tokens->Token());
    request.headers.emplace_back("X-Tessera-Authorization", "Bearer " + token);
  }
  kube::DoOptions once;
  once.retry.max_attempts = 2;
  absl::StatusOr<kube::Response> response = kube::Do(*transport, request, std::move(once));
  if (!response.ok()) {
    return Annotate(response.status(), fmt::format("GET {}{}", config.server, path));
  }
  return std::move(response->body);
}

// "NS/NAME:PORT" → the service proxy path of serve's /debug/ledger.
absl::StatusOr<std::string> ProxyPath(const std::string& service) {
  const size_t slash = service.find('/');
  const size_t colon = service.rfind(':');
  if (slash == std::string::npos || colon == std::string::npos || colon < slash || slash == 0 ||
      colon == slash + 1 || colon + 1 == service.size()) {
    return absl::InvalidArgumentError(
        fmt::format("--service {}: want NAMESPACE/NAME:PORT, e.g. "
                    "tessera-system/tessera-metrics:metrics",
                    service));
  }
  return fmt::format("/api/v1/namespaces/{}/services/{}:{}/proxy/debug/ledger",
                     service.substr(0, slash), service.substr(slash + 1, colon - slash - 1),
                     service.substr(colon + 1));
}

int RunTop(const TopCommandOptions& opts) {
  if (!opts.server.empty() && !opts.file.empty()) {
    return Fail(absl::InvalidArgumentError("give --server or --file, not both"), kExitUsage);
  }
  absl::StatusOr<std::string> body;
  if (!opts.file.empty()) {
    body = ReadAll(opts.file);
    if (!body.ok()) {
      return Fail(body.status(), kExitUsage);
    }
  } else if (!opts.server.empty()) {
    kube::RestConfig config;
    config.server = opts.server;
    body = Get(config, "/debug/ledger", /*with_credentials=*/false);
  } else {
    absl::StatusOr<std::string> path = ProxyPath(opts.service);
    if (!path.ok()) {
      return Fail(path.status(), kExitUsage);
    }
    kube::KubeconfigOptions kc;
    kc.path = opts.kubeconfig;
    kc.context = opts.context;
    absl::StatusOr<kube::RestConfig> rest = kube::LoadKubeconfig(kc);
    if (!rest.ok()) {
      return Fail(Annotate(rest.status(),
                           "a kubeconfig is needed to reach serve through the API "
                           "server's service proxy ($KUBECONFIG, else "
                           "~/.kube/config; or give --server URL)"),
                  kExitUsage);
    }
    body = Get(*rest, *path, /*with_credentials=*/true);
  }
  if (!body.ok()) {
    return Fail(body.status(), kExitFailure);
  }
  absl::StatusOr<explain::TopView> view = explain::DecodeTop(*body);
  if (!view.ok()) {
    return Fail(Annotate(view.status(), "reading serve's /debug/ledger"), kExitFailure);
  }
  explain::TopOptions filter;
  filter.node = opts.node;
  filter.ns = opts.namespace_;
  filter.min_free = opts.min_free;
  filter.sort = opts.sort == "free" ? explain::TopSort::kFree : explain::TopSort::kNode;
  const explain::TopView shown = explain::FilterTop(*std::move(view), filter);
  const std::string out =
      opts.output == "json"
          ? explain::TopJson(shown).dump(2) + "\n"
          : explain::RenderTopText(shown, opts.now_unix != 0 ? absl::FromUnixSeconds(opts.now_unix)
                                                             : opts.clock->Now());
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace

void AddTopCommand(CLI::App& app, Runner* run) {
  auto opts = std::make_shared<TopCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "top",
      "Show every node's GPUs and the pods holding them, as tessera serve's ledger has them "
      "(its /debug/ledger, the snapshot /metrics reads): memory, cores and shares used and "
      "free, reservations with the time they have left, and the ledger's problems (orphans, "
      "conflicts, unreadable allocations). Reaches serve through the API server's service "
      "proxy (--service; needs get on services/proxy, and with serve's --debug-auth=kubernetes "
      "a kubeconfig bearer token allowed to get /debug/ledger), or directly with --server "
      "(kubectl port-forward: serve admits loopback peers). Also a "
      "kubectl plugin: `kubectl tessera top`. Exit code 0, 1 when serve cannot be read, 2 on "
      "bad input.");
  sub->add_option("--server", opts->server,
                  "serve's metrics listener, e.g. http://127.0.0.1:9395 (after `kubectl "
                  "port-forward -n tessera-system svc/tessera-metrics 9395`)");
  sub->add_option("--service", opts->service,
                  "serve's metrics Service as NAMESPACE/NAME:PORT, reached through the API "
                  "server's service proxy when --server and --file are not given")
      ->capture_default_str();
  sub->add_option("--file", opts->file,
                  "a /debug/ledger document saved earlier (- reads standard input)");
  sub->add_option("--kubeconfig", opts->kubeconfig,
                  "kubeconfig for the service proxy; default: $KUBECONFIG, else ~/.kube/config");
  sub->add_option("--context", opts->context, "the kubeconfig context to use");
  sub->add_option("--node", opts->node, "only this node");
  sub->add_option("-n,--namespace", opts->namespace_,
                  "only the GPUs holding pods of this namespace, and only those pods");
  sub->add_option("--min-free", opts->min_free,
                  "only GPUs with at least this much memory free, in MiB")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--sort", opts->sort,
                  "node (by name) or free (most free memory first, nodes and their GPUs)")
      ->check(CLI::IsMember({"node", "free"}))
      ->capture_default_str();
  sub->add_option("-o,--output", opts->output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  sub->add_option("--now", opts->now_unix,
                  "the time reservations are measured against (Unix "
                  "seconds; default: now); for reproducible output")
      ->group("");
  sub->callback([run, opts] { *run = [opts] { return RunTop(*opts); }; });
}

}  // namespace tessera::cmd

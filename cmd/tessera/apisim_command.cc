// `tessera apisim`: the Kubernetes API server simulator (docs/apisim.md).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <signal.h>

#include "absl/strings/numbers.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/apisim/server.h"
#include "tessera/base/logging.h"

namespace tessera::cmd {
namespace {

struct ApisimFlags {
  std::string listen = "127.0.0.1:0";
  bool tls_self_signed = false;
  std::string tls_cert;
  std::string tls_key;
  std::string token;
  std::string state;
  size_t watch_history = 10000;
  std::string kubeconfig;
};

int RunApisim(const ApisimFlags& f) {
  apisim::ServerOptions o;
  size_t colon = f.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(f.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    fmt::print(stderr, "apisim: --listen wants HOST:PORT, got \"{}\"\n", f.listen);
    return kExitUsage;
  }
  o.host = f.listen.substr(0, colon);
  o.port = port;
  o.tls_self_signed = f.tls_self_signed;
  o.tls_cert_file = f.tls_cert;
  o.tls_key_file = f.tls_key;
  o.token = f.token;
  o.state_file = f.state;
  o.watch_history = f.watch_history;

  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<std::unique_ptr<apisim::Server>> server = apisim::Server::Start(o);
  if (!server.ok()) {
    fmt::print(stderr, "apisim: {}\n", std::string(server.status().message()));
    return absl::IsInvalidArgument(server.status()) ? kExitUsage : kExitFailure;
  }
  if (!f.kubeconfig.empty()) {
    std::ofstream kc(f.kubeconfig, std::ios::trunc);
    kc << (*server)->Kubeconfig();
    if (!kc) {
      fmt::print(stderr, "apisim: cannot write kubeconfig {}\n", f.kubeconfig);
      return kExitFailure;
    }
  }
  fmt::print("listening on {}\n", (*server)->url());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  TESSERA_LOG(kInfo, "apisim: signal {}, stopping", sig);
  // Stop serving first: every write answered so far is then in the store, and none is answered
  // after the save (a write acknowledged and then lost would let a restarted server hand out its
  // resourceVersion again, which a real API server never does).
  (*server)->Stop();
  int rc = kExitOk;
  if (!f.state.empty()) {
    absl::Status s = (*server)->SaveState();
    if (!s.ok()) {
      fmt::print(stderr, "apisim: saving state: {}\n", std::string(s.message()));
      rc = kExitFailure;
    }
  }
  return rc;
}

}  // namespace

void AddApisimCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<ApisimFlags>();
  CLI::App* sub = app.add_subcommand(
      "apisim",
      "Serve a protocol-faithful Kubernetes API server simulator (pods, nodes, namespaces, "
      "events, leases, configmaps, resourcequotas) with fault injection");
  sub->add_option("--listen", flags->listen, "HOST:PORT to listen on (port 0 = a free port)")
      ->capture_default_str();
  auto* self = sub->add_flag("--tls-self-signed", flags->tls_self_signed,
                             "Serve HTTPS with a freshly generated self-signed certificate");
  auto* cert = sub->add_option("--tls-cert", flags->tls_cert, "Serve HTTPS with this PEM cert")
                   ->excludes(self);
  auto* key = sub->add_option("--tls-key", flags->tls_key, "PEM private key for --tls-cert")
                  ->excludes(self);
  cert->needs(key);
  key->needs(cert);
  sub->add_option("--token", flags->token, "Require this bearer token (401 otherwise)");
  sub->add_option("--state", flags->state,
                  "Load objects from FILE at start (if it exists) and save them on SIGTERM");
  sub->add_option("--watch-history", flags->watch_history,
                  "Events kept for watch resume and paged lists; older revisions get 410")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{10000000}));
  sub->add_option("--write-kubeconfig", flags->kubeconfig,
                  "Write a kubeconfig for this server (URL, CA, token) to FILE");
  sub->callback([run, flags] { *run = [flags] { return RunApisim(*flags); }; });
}

}  // namespace tessera::cmd

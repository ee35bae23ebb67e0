// `tessera emulate`: a cluster file's nodes and pods on a real API server, with HAMi's device
// plugin and the kubelet of every node emulated (src/tessera/sim/cluster_emulation.h,
// docs/e2e.md "A cluster file"). A development subcommand: not in tessera-scheduler.
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <time.h>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/base/clock.h"
#include "tessera/base/logging.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/cluster_emulation.h"

namespace tessera::cmd {
namespace {

struct EmulateFlags {
  std::string kubeconfig;
  std::string cluster;
  bool check = false;
};

int RunEmulate(const EmulateFlags& f) {
  // Block the stop signals before any thread starts; this thread waits for them below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<sim::ClusterPlan> plan = sim::LoadClusterPlan(f.cluster);
  if (!plan.ok()) {
    fmt::print(stderr, "tessera emulate: {}\n", std::string(plan.status().message()));
    return kExitUsage;
  }
  for (const std::string& w : plan->warnings) {
    TESSERA_LOG(kWarning, "{}", w);
  }
  if (f.check) {
    // One line per node: its name, then its GPUs' UUIDs (tools/controlplane.sh reads these).
    for (const sim::PlannedNode& n : plan->nodes) {
      std::vector<std::string> ids;
      for (const device::DeviceInfo& d : n.devices) {
        ids.push_back(d.id);
      }
      fmt::print("{} {}\n", n.name, absl::StrJoin(ids, " "));
    }
    return kExitOk;
  }
  if (f.kubeconfig.empty()) {
    fmt::print(stderr, "tessera emulate: --kubeconfig FILE is required (or --check)\n");
    return kExitUsage;
  }
  kube::KubeconfigOptions ko;
  ko.path = f.kubeconfig;
  absl::StatusOr<kube::RestConfig> config = kube::LoadKubeconfig(ko);
  if (!config.ok()) {
    fmt::print(stderr, "tessera emulate: {}\n", std::string(config.status().message()));
    return kExitUsage;
  }
  config->qps = 0;  // many emulated nodes' worth of clients: no client-side limit
  config->request_timeout = absl::Seconds(20);
  config->connect_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<kube::CurlTransport>> transport =
      kube::CurlTransport::Create(*config, kube::MakeTokenSource(*config, Clock::Real()));
  if (!transport.ok()) {
    fmt::print(stderr, "tessera emulate: {}\n", std::string(transport.status().message()));
    return kExitFailure;
  }
  kube::ApiClient::Options co;
  co.retry.max_attempts = 3;
  co.retry.backoff = {absl::Milliseconds(50), absl::Milliseconds(500), 2.0, 0.5};
  co.retry.max_retry_after = absl::Seconds(1);
  kube::ApiClient client(transport->get(), std::move(co));

  sim::ClusterEmulation emulation(*std::move(plan), transport->get(), &client);
  std::atomic<bool> done{false};
  absl::Status result;
  std::thread worker([&] {
    result = emulation.Setup();
    if (result.ok()) {
      TESSERA_LOG(kInfo, "cluster {} set up; emulating until SIGTERM", f.cluster);
      result = emulation.Run();
    }
    done.store(true);
  });
  const struct timespec poll = {0, 100L * 1000 * 1000};
  while (!done.load()) {
    int sig = sigtimedwait(&stop, nullptr, &poll);
    if (sig == SIGTERM || sig == SIGINT) {
      TESSERA_LOG(kInfo, "{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      emulation.RequestStop();
    }
  }
  worker.join();
  if (!result.ok()) {
    fmt::print(stderr, "tessera emulate: {}\n", std::string(result.message()));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

void AddEmulateCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<EmulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "emulate",
      "Bring a cluster file's nodes and pods to life on a real API server: create them, then "
      "run HAMi's device plugin and the kubelet of every node (register, Ready, Allocate, "
      "Pending → Running, graceful deletions finished) until SIGTERM. A bad file is exit 2 "
      "before anything is written. docs/e2e.md \"A cluster file\"");
  sub->add_option("--cluster", flags->cluster,
                  "The cluster file: `kubectl get nodes,pods -A -o yaml` output (YAML or JSON), as "
                  "`tessera explain --cluster` reads it; every Node needs "
                  "hami.io/node-nvidia-register (either format)")
      ->required();
  sub->add_option("--kubeconfig", flags->kubeconfig,
                  "Kubeconfig of the API server (needs to create namespaces, ServiceAccounts, "
                  "nodes and pods and to patch them: an admin)");
  sub->add_flag("--check", flags->check,
                "Only check the file: print one line per node (its name, then its GPUs' UUIDs) "
                "and exit; no API call");
  sub->callback([run, flags] { *run = [flags] { return RunEmulate(*flags); }; });
}

}  // namespace tessera::cmd

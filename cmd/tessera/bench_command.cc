// `tessera bench`: end-to-end benchmarks whose figures docs/benchmarks.md records.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "bench/serve/serve_bench.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace tessera::cmd {
namespace {

struct BenchServeFlags {
  bench::ServeBenchOptions options;
  std::string duration = "15s";
  bool json = false;
};

int RunBenchServe(const BenchServeFlags& f) {
  bench::ServeBenchOptions o = f.options;
  if (!absl::ParseDuration(f.duration, &o.duration) || o.duration <= absl::ZeroDuration()) {
    fmt::print(stderr, "tessera bench serve: --duration: want a positive duration, got \"{}\"\n",
               f.duration);
    return kExitUsage;
  }
  absl::StatusOr<bench::ServeBenchResult> r = bench::RunServeBench(o);
  if (!r.ok()) {
    fmt::print(stderr, "tessera bench serve: {}\n", std::string(r.status().message()));
    return absl::IsInvalidArgument(r.status()) ? kExitUsage : kExitFailure;
  }
  std::fputs((f.json ? bench::ServeBenchJson(*r) + "\n" : bench::ServeBenchText(*r)).c_str(),
             stdout);
  return kExitOk;
}

}  // namespace

void AddBenchCommand(CLI::App& app, Runner* run) {
  CLI::App* bench = app.add_subcommand("bench", "End-to-end benchmarks (see docs/benchmarks.md)");
  bench->require_subcommand(1);
  auto flags = std::make_shared<BenchServeFlags>();
  CLI::App* serve = bench->add_subcommand(
      "serve",
      "tessera serve over loopback against an in-process apisim holding a synthetic cluster: "
      "/filter latency, filter+bind pairs per second, and a full-recompute baseline (HAMi's "
      "algorithm) in the same run");
  serve->add_option("--nodes", flags->options.nodes, "GPU nodes")->capture_default_str();
  serve->add_option("--gpus-per-node", flags->options.gpus_per_node, "GPUs per node")
      ->capture_default_str();
  serve->add_option("--pods", flags->options.pods, "Bound GPU pods already in the cluster")
      ->capture_default_str();
  serve
      ->add_option("--candidates", flags->options.candidates,
                   "Node names per /filter call (kube-scheduler sends 500 at 5,000 nodes)")
      ->capture_default_str();
  serve
      ->add_option("--clients", flags->options.clients,
                   "Concurrent filter+bind clients (kube-scheduler binds asynchronously)")
      ->capture_default_str();
  serve
      ->add_option("--pair-attempts", flags->options.pair_attempts,
                   "Filter+bind attempts per pod when the extender refuses the bind (another "
                   "client's pod holds the node lock), as kube-scheduler requeues it; 1: none")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve
      ->add_option("--duration", flags->duration,
                   "Measuring time: a third for filter latency, the rest for pairs")
      ->capture_default_str();
  serve
      ->add_option("--baseline-calls", flags->options.baseline_calls,
                   "Full-recompute filters timed for the baseline")
      ->capture_default_str();
  serve
      ->add_option("--resync-filters", flags->options.resync_min_filters,
                   "Filters to time while resync passes (a paged LIST of every pod and node) run; "
                   "0 skips the phase")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--resync-pace", flags->options.resync_pace,
                   "The resync's pause after each LIST page, in multiples of the page's time "
                   "(serve's default 3; 0: pages back to back)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  serve
      ->add_option("--node-policy", flags->options.node_policy,
                   "The service's node policy (binpack makes concurrent binds contend for the "
                   "same nodes' locks)")
      ->capture_default_str();
  serve
      ->add_flag("--avoid-busy-nodes", flags->options.avoid_busy_nodes,
                 "The service's --avoid-busy-nodes (default true; =false: the node policy alone)")
      ->capture_default_str();
  serve
      ->add_option("--pending-mem-percent", flags->options.pending_mem_percent,
                   "The measured pods ask this percentage of a card's memory (0: 1,000 MiB)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  serve
      ->add_option("--quota-headroom", flags->options.quota_headroom,
                   "A ResourceQuota on the pods' namespace, this many times what the namespace "
                   "could hold at most (0: no quota)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  serve->add_flag("--json", flags->json, "Print the figures as one JSON object");
  serve->callback([run, flags] { *run = [flags] { return RunBenchServe(*flags); }; });
}

}  // namespace tessera::cmd

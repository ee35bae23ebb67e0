// File: tessera/sim/simulation.h
//
// One `tessera simulate` run: starts `tessera apisim` (HTTPS with a token, --state) and
// `tessera serve` as child processes of `binary`, creates the scenario's nodes, runs the
// emulators (workload, kube-scheduler, device plugins, kubelet) and the fault schedule for the
// scenario's duration, lets the cluster drain, and judges the run with the Oracle.
//
//   SimulationOptions o{.scenario = *LoadScenario("quick"), .binary = "/proc/self/exe"};
//   absl::StatusOr<RunResult> r = RunSimulation(o);
//   if (r.ok() && r->violations.empty()) ...
//
// Work runs on a small pool of worker threads fed by a timed task queue; all API traffic goes
// through one CurlTransport to apisim (HTTP/2 over TLS) and one to the extender. The oracle
// samples once a second on its own thread: a paged LIST of pods and nodes from apisim and a
// scrape of Tessera's /metrics.
//
// Errors: FailedPrecondition when a child cannot start (the message names its log file);
// other errors of the set-up. Violations are results, not errors.
//
// Thread safety: RunSimulation is self-contained; run one at a time per working directory.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/sim/oracle.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

struct SimulationOptions {
  Scenario scenario;
  std::string binary = "/proc/self/exe";
  std::string work_dir;        // kubeconfig, state, certificates, child logs; empty: a temp dir
  std::string scheduler_args;  // split on spaces, appended to `tessera serve`
  FILE* progress = stderr;     // progress output; nullptr: none
  bool progress_bar = false;   // a redrawn bar (terminal) instead of periodic lines
  int workers = 6;
};

struct FaultRecord {
  absl::Duration at;  // from the start of the workload
  std::string kind;
  std::string detail;
};

struct Sample {
  absl::Duration at;
  int64_t truth_mib = 0;
  int64_t exported_mib = -1;     // -1: /metrics not readable
  int64_t diverging = 0;         // devices differing in this sample
  int64_t diverging_shares = 0;  // pod shares (pod × device) differing in this sample
  int64_t live_pods = 0;
};

struct RunResult {
  std::string scenario;
  uint64_t seed = 0;
  absl::Duration duration, elapsed;
  int nodes = 0, gpus = 0;
  int64_t created = 0, scheduled = 0, unschedulable = 0, unschedulable_attempts = 0;
  int64_t deleted = 0, completed = 0, bind_errors = 0, filter_errors = 0;
  int64_t full_nodes_filters = 0, allocations = 0;
  absl::Duration filter_p50, filter_p99;
  std::vector<FaultRecord> faults;
  std::vector<Divergence> divergences;
  int64_t transient_divergences = 0;
  std::vector<Violation> violations;
  std::vector<Sample> samples;
  int64_t observations = 0, compared = 0;
  absl::Time start;
  std::string work_dir;
  std::string scheduler_args;
};

absl::StatusOr<RunResult> RunSimulation(const SimulationOptions& options);

// The summary table printed at the end.
std::string SummaryTable(const RunResult& r);
// summary.json.
std::string SummaryJson(const RunResult& r);
// report.html: self-contained (inline SVG and CSS, no script, no network).
std::string ReportHtml(const RunResult& r);

}  // namespace tessera::sim

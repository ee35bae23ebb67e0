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
// A scenario's `compare` section is run by the caller: RunSimulation again with the comparison's
// scheduler args (`tessera simulate` does so in the work subdirectory "comparison"), and both
// results handed to the renderers below.
//
// Work runs on a small pool of worker threads fed by a timed task queue; all API traffic goes
// through one CurlTransport to apisim (HTTP/2 over TLS) and one to the extender. The oracle
// samples once a second on its own thread: a paged LIST of pods and nodes from apisim and a
// scrape of Tessera's /metrics.
//
// With ControlPlaneKind::kReal the run uses the real control plane instead: tools/controlplane.sh
// up (in WORK_DIR/controlplane, `--etcd-compaction-interval 2s`) starts etcd, kube-apiserver,
// kube-scheduler and serve (the scheduler args appended to serve's command line, then serve
// restarted); the workload, device plugins and kubelets run against that kube-apiserver with its
// admin kubeconfig, the real kube-scheduler schedules through serve (no emulated scheduler), a
// poll of the pods sees the bindings and graceful deletions, and the faults map onto real ones
// (docs/simulate.md). With `hami_bin`, HAMi's own scheduler takes serve's place as the extender
// and the fault target, and the oracle reads its /metrics. The control plane is always stopped at
// the end (`down`), and no process of it may survive.
//
// Errors: FailedPrecondition when a child cannot start (the message names its log file);
// other errors of the set-up. Violations are results, not errors.
//
// Thread safety: RunSimulation is self-contained; run one at a time per working directory.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/sim/oracle.h"
#include "tessera/sim/preemption_oracle.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

// Which API server and scheduler a run uses (docs/simulate.md, "The real control plane").
enum class ControlPlaneKind {
  kApisim,  // `tessera apisim` and serve as children; the emulated kube-scheduler
  kReal,    // tools/controlplane.sh up: etcd, kube-apiserver, kube-scheduler, serve
};

struct SimulationOptions {
  Scenario scenario;
  ControlPlaneKind control_plane = ControlPlaneKind::kApisim;
  std::string controlplane_script;  // kReal: tools/controlplane.sh (FindControlPlaneScript)
  // kReal: HAMi's own scheduler binary as kube-scheduler's extender in serve's place
  // (RealControlPlane::UseHami; `scheduler_args` are then its flags); empty: serve.
  std::string hami_bin;
  std::string binary = "/proc/self/exe";
  std::string work_dir;        // kubeconfig, state, certificates, child logs (created if missing);
                               // empty: a new temp dir
  std::string scheduler_args;  // split on spaces, appended to `tessera serve` (or HAMi's)
  std::string label;           // names the run in the summary and the report; may be empty
  FILE* progress = stderr;     // progress output; nullptr: none
  bool progress_bar = false;   // a redrawn bar (terminal) instead of periodic lines
  int workers = 6;
  Clock* clock = Clock::Real();  // every time the run reads (the waits themselves are real)
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
  int64_t requeued = -1;  // Tessera's tessera_pending_pods_requeued_total; -1: not exported
};

// When a pod of the run was created, first refused, bound (InfiniteFuture: never), and whether
// it went away unbound (deleted while pending).
struct PodTimes {
  absl::Time created = absl::InfiniteFuture(), refused = absl::InfiniteFuture();
  absl::Time bound = absl::InfiniteFuture();
  bool gone_unbound = false;
};

// Issue #35's measure: the pods refused and still pending while a fault's divergence was open
// (the scheduler's ledger wrong), and when each was bound. The repair is taken as one sampling
// interval before the first observation that found part of what the fault broke healed, so each
// time is at least the true time from the start of the repair to the binding.
struct RepairWaits {
  int64_t refused_while_wrong = 0;
  int64_t bound_before_repair = 0;  // bound while it still diverged (other capacity)
  int64_t still_pending = 0;        // pending at the end: the repair never came, the pod did not
                                    // fit after it, or it was not retried
  std::vector<double> seconds;      // the others: from the repair to the binding, ascending
};
// `divergences` with a fault's cause and the `transient` spans (healed by the next sample) are
// the times the ledger was wrong.
// Tessera's requeue writes over the run, from the samples: the last count and the most in one
// sampling interval, per second (0, 0 when the scheduler does not export the counter).
struct RequeueWrites {
  int64_t total = 0;
  double peak_per_second = 0;
};
RequeueWrites ComputeRequeueWrites(const std::vector<Sample>& samples);

RepairWaits ComputeRepairWaits(const std::vector<Divergence>& divergences,
                               const std::vector<std::pair<absl::Time, absl::Time>>& transient,
                               const std::vector<PodTimes>& pods, absl::Duration sampling);

struct RunResult {
  std::string scenario;
  std::string control_plane = "apisim";     // "apisim" or "real"
  std::string scheduler = "tessera serve";  // the scheduler under test: or "HAMi (BINARY)"
  // Faults of the schedule that this control plane cannot inject (apisim-only on the real
  // one), with the reason; not in `faults`.
  std::vector<FaultRecord> skipped_faults;
  std::string label;  // SimulationOptions::label
  uint64_t seed = 0;
  absl::Duration duration, elapsed;
  absl::Duration window;  // the scenario's convergence window
  int nodes = 0, gpus = 0;
  int64_t created = 0, scheduled = 0, unschedulable = 0, unschedulable_attempts = 0;
  int64_t deleted = 0, completed = 0, bind_errors = 0, filter_errors = 0;
  int64_t full_nodes_filters = 0, allocations = 0;
  // Bound pods of the workload deleted by someone else (the scheduler's evictions).
  int64_t evicted = 0;
  // Scenarios with priorities on apisim: the preemption oracle's counts (its violations are in
  // `violations`); nullopt when not judged.
  std::optional<PreemptionFindings> preemption;
  // Filter answers without a node whose first reason names ResourceQuotaNotFit (a scenario's
  // namespace quota refusing the pod).
  int64_t quota_refusals = 0;
  // MIG (scenarios with mig_share): pods bound to a MIG node, the instances the device plugins
  // realised for them, and filter answers without a node where some node failed the pod as
  // CardMigTopologyInfeasible (no free placement of an adequate profile).
  int64_t mig_pods = 0, mig_instances = 0, mig_refusals = 0;
  absl::Duration filter_p50, filter_p99;
  std::vector<FaultRecord> faults;
  std::vector<Divergence> divergences;
  int64_t transient_divergences = 0;
  std::vector<std::pair<absl::Time, absl::Time>> transient_fault_spans;  // Oracle's
  std::vector<Violation> violations;
  std::vector<Sample> samples;
  RepairWaits repair_waits;
  int64_t observations = 0, compared = 0;
  absl::Time start;
  std::string work_dir;
  std::string scheduler_args;
  bool interrupted = false;  // SimulationInterrupted() ended it early
};

absl::StatusOr<RunResult> RunSimulation(const SimulationOptions& options);

// Set (a signal handler may: it is lock-free) to end the runs early: the workload stops, the run
// is torn down (the real control plane stopped too) and returns with RunResult::interrupted; a
// control-plane script that is still starting is killed (the run then fails with Cancelled).
std::atomic<bool>& SimulationInterrupted();

// Divergences that outlived the convergence window (violations of invariant 2): what a
// comparison run with self-healing off is expected to show.
int64_t OutlivedWindow(const RunResult& r);
// Over-commit violations (invariant 1).
int64_t OverCommits(const RunResult& r);
// The verdict of `tessera simulate` (exit 0 when true): the primary run met both invariants and
// the comparison run, if any, never over-committed a device. The comparison's divergences are
// what it is run to show, not failures.
bool Succeeded(const RunResult& primary, const RunResult* comparison);

// The rendering of a run, or with `comparison` of both runs side by side, each labelled with
// its RunResult::label and scheduler args, with its own verdict, divergences and chart.
// The summary table printed at the end.
std::string SummaryTable(const RunResult& primary, const RunResult* comparison = nullptr);
// summary.json: the primary run's figures at the top level (as without a comparison), the
// comparison's in the same shape under "comparison".
std::string SummaryJson(const RunResult& primary, const RunResult* comparison = nullptr);
// report.html: self-contained (inline SVG and CSS, no script, no network).
std::string ReportHtml(const RunResult& primary, const RunResult* comparison = nullptr);

}  // namespace tessera::sim

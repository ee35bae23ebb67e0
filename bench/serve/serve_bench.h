// File: bench/serve/serve_bench.h
//
// `tessera bench serve`: the extender measured end to end over loopback, as kube-scheduler sees
// it, against an in-process apisim holding a synthetic cluster (tessera/sim/synthetic.h).
//
//   ServeBenchOptions o;  o.nodes = 5000;  o.pods = 100000;
//   absl::StatusOr<ServeBenchResult> r = RunServeBench(o);
//   std::puts(ServeBenchJson(*r).c_str());
//
// Phases, in one process and one run:
//   1. populate apisim; start the Service (its informers LIST and WATCH over HTTP); measure
//      the initial sync and the resident memory the Service added;
//   2. filter latency: one client posts /filter for pending pods with `candidates` node names
//      drawn at random (256 lists drawn before the clock starts, used in turn), sequentially, for a
//      third of `duration` (each call is a real decision: patch, reservation, event);
//   2a. the floor: the same client posts, for a sixth of `duration`, /filter for a pod that
//      requests no managed device (passed through: no decision, patch or event), with the same
//      candidate names — the round trip, HTTP server and decoding the real filter also pays;
//   2b. filter latency during a resync: the same sequential client while the Service runs resync
//      passes (a paged LIST of every pod and node from apisim, compared with the informers'
//      stores) on another thread, until at least `resync_min_filters` filters were timed during
//      passes; with the pass's own duration and LIST request count;
//   3. filter+bind pairs: `clients` clients each filter and then bind fresh pending pods for the
//      rest of `duration`; after each bind the client plays the device plugin and releases the
//      node lock (an apisim store call, not counted in the pair). A bind the extender refuses
//      (another client's pod still holds the node's lock, say) is retried as kube-scheduler
//      requeues the pod: filter and bind again, up to `pair_attempts` times in all, each retry
//      counted; a pair that fails every attempt is a pair error;
//   4. baseline: HAMi's algorithm for the same filter — usage of every node rebuilt from every
//      pod (Ledger::Recompute over the projected pods) and then the same decision — timed in
//      process for `baseline_calls` calls. The ratio is baseline p50 over Tessera's /filter p50,
//      so it counts Tessera's HTTP, patch and event costs against it and none against HAMi.
//
// Thread safety: RunServeBench is not reentrant (it uses loopback ports and the process's RSS).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/accounting/resyncer.h"

namespace tessera::bench {

struct ServeBenchOptions {
  int nodes = 5000;
  int gpus_per_node = 8;
  int pods = 100000;
  int candidates = 500;
  absl::Duration duration = absl::Seconds(15);
  int clients = 4;  // concurrent filter+bind clients in phase 3
  // Phase 3: attempts per pod when the extender refuses its bind (1: no retry).
  int pair_attempts = 3;
  int baseline_calls = 15;
  // Phase 2b: filters to time during resync passes (0: skip the phase).
  int resync_min_filters = 300;
  // Phase 2b: the resync's pacing (ServeOptions::resync_pace; 0 lists the pages back to back).
  double resync_pace = accounting::ResyncOptions{}.pace;
  // The service's default node policy. Spread by default: with binpack every client converges
  // on the same hot nodes and the pairs measure node-lock contention (one bind per node at a
  // time, as in HAMi) rather than the extender.
  std::string node_policy = "spread";
  // ServeOptions::avoid_busy_nodes (serve --avoid-busy-nodes).
  bool avoid_busy_nodes = true;
  // > 0: the pending pods (phases 2 and 3) ask this percentage of a card's memory instead of
  // 1,000 MiB (a percentage makes the namespace quota check depend on the card).
  int pending_mem_percent = 0;
  // > 0: a ResourceQuota "gpu" in the pods' namespace whose limits.nvidia.com/gpumem and
  // limits.nvidia.com/gpucores are this many times what the namespace could hold at most (the
  // bound pods plus every pending pod on a whole card at 100 % cores), so that every pod fits
  // and /filter pays for the check alone. 0: no quota (the namespace is unlimited).
  double quota_headroom = 0;
  uint64_t seed = 42;
};

struct ServeBenchResult {
  int nodes = 0, gpus = 0, pods = 0, candidates = 0;
  double sync_seconds = 0;
  int64_t filters = 0;
  double filter_p50_ms = 0, filter_p99_ms = 0, filter_max_ms = 0;
  int64_t pairs = 0;
  double pairs_per_second = 0;
  int64_t pair_errors = 0;
  // Phase 3: filter+bind attempts repeated after a refused bind (pairs that needed them count
  // once in `pairs`).
  int64_t pair_retries = 0;
  double bind_p50_ms = 0, bind_p99_ms = 0;
  double baseline_filter_p50_ms = 0;
  double baseline_ratio = 0;
  double rss_mib = 0;  // resident memory the Service added (informers, ledger, caches)
  // Phase 2a: the round trip of a /filter that makes no decision (a pod without devices, same
  // candidate names): what the machine and the HTTP path cost before any scheduling.
  int64_t floor_calls = 0;
  double floor_p50_ms = 0, floor_p99_ms = 0;
  // Phase 2b.
  int64_t resync_passes = 0;
  double resync_seconds = 0;         // the first pass
  int64_t resync_list_requests = 0;  // the first pass
  int64_t resync_corrections = 0;    // all passes (0 expected: nothing was lost)
  int64_t filters_during_resync = 0;
  double filter_during_resync_p50_ms = 0, filter_during_resync_p99_ms = 0;
  // Load-independent companions of the latencies: CPU time per phase-2 /filter call of every
  // thread but the client's (the service and the in-process apisim serving its patches and
  // events), CPU time per baseline call, and their ratio.
  double filter_cpu_ms = 0;
  double baseline_cpu_ms = 0;
  double baseline_cpu_ratio = 0;
  // CPU time per phase-3 pair of every thread in the process: the service, apisim and the
  // bench's own clients. On a machine whose cores they share, pairs per second cannot exceed
  // cores / pair_cpu_ms.
  double pair_cpu_ms = 0;
  // Context switches per phase-3 pair, voluntary and involuntary, of every thread: the thread
  // hand-overs a pair causes (each costs a wake-up), less noisy than its CPU time.
  double pair_context_switches = 0;
};

// Errors: InvalidArgument for options out of range; any set-up failure (ports, sync timeout).
absl::StatusOr<ServeBenchResult> RunServeBench(const ServeBenchOptions& options);

// {"nodes":…,"gpus":…,"pods":…,"candidates":…,"filter_p50_ms":…,"filter_p99_ms":…,
//  "pairs_per_second":…,"baseline_filter_p50_ms":…,"baseline_ratio":…,"rss_mib":…, …}
std::string ServeBenchJson(const ServeBenchResult& result);
// A few lines for people.
std::string ServeBenchText(const ServeBenchResult& result);

}  // namespace tessera::bench

// File: tessera/sim/scenario.h
//
// A `tessera simulate` scenario: the cluster, the workload, the fault schedule and the oracle's
// convergence window, read from YAML (format: docs/simulate.md). The scenarios of scenarios/
// are also compiled into the binary (EmbeddedScenario), so `--scenario quick` works anywhere.
//
//   absl::StatusOr<Scenario> s = LoadScenario("quick");   // embedded name, else a file path
//
// Errors: InvalidArgument naming the key for bad YAML, unknown keys, bad durations or values;
// NotFound for a name that is neither embedded nor a readable file.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/sim/emulators.h"

namespace tessera::sim {

enum class FaultKind {
  kDropEvents,     // apisim drops watch events of `event_type` for `duration`
  kSeverWatches,   // every watch stream cut
  kCompact,        // history compacted (resumes get 410 → relist)
  kWatchOutage,    // watches severed and refused (500) for `duration`; then, with `compact`,
                   // the history is compacted so the watches must relist
  kApisimRestart,  // SIGTERM (state saved), started again on the same port
  kTesseraKill,    // SIGKILL, restarted after `duration`
  kNodeDelete,     // `count` nodes deleted (their pods force-deleted)
  kPluginStop,     // one node's device plugin stops reporting and allocating for `duration`
  kErrorStorm,     // `probability` of requests fail with `code` (429/500) for `duration`
};
std::string_view FaultKindName(FaultKind k);

// Serve flags as one space-separated string (runs of spaces collapsed), so that two argument
// lists can be compared.
std::string NormalizeSchedulerArgs(const std::string& args);

struct FaultSpec {
  FaultKind kind;
  absl::Duration at;                            // first time, from the start of the workload
  absl::Duration every = absl::ZeroDuration();  // repeat period; zero: once
  absl::Duration duration = absl::Seconds(5);   // for faults with an extent
  std::string event_type = "DELETED";           // drop_events: ADDED, MODIFIED, DELETED, ""
  double probability = 1.0;                     // drop_events, error_storm
  int code = 500;                               // error_storm
  int count = 1;                                // node_delete
  int delete_burst = 0;                         // pods deleted right after the fault begins
  bool compact = true;                          // watch_outage: compact when it ends
  // drop_events: delete_burst of bound pods only, with gracePeriodSeconds=0 (one DELETED, no
  // update)
  bool force = false;
};

// A second run of the same scenario (same seed: the same pod shapes and fault schedule) with
// other flags for `tessera serve`, reported beside the primary run: e.g. seed-bug with
// self-healing off, to show the divergence that the primary run heals.
struct Comparison {
  std::string scheduler_args;             // required; differs from Scenario::scheduler_args
  std::string label = "comparison";       // what the comparison run is, e.g. "self-healing off"
  std::string primary_label = "primary";  // what the primary run is (with its own args)
};

// A namespace of the workload and its quota's spec.hard limits (nullopt: not set).
struct QuotaNamespace {
  std::string name;
  std::optional<int64_t> gpumem;    // limits.nvidia.com/gpumem, MiB
  std::optional<int64_t> gpucores;  // limits.nvidia.com/gpucores, percent
};

struct Scenario {
  std::string name;
  std::string description;
  uint64_t seed = 1;
  absl::Duration duration = absl::Seconds(30);  // workload and faults
  absl::Duration drain = absl::Seconds(10);     // after: no new work, faults cleared, oracle runs
  absl::Duration window = absl::Seconds(10);    // convergence window
  std::string scheduler_args;                   // default --scheduler-args
  std::optional<Comparison> compare;            // run again with other serve flags

  // cluster
  int nodes = 20;
  int gpus_per_node = 8;
  int slots = 10;
  double delimited_share = 0.3;  // nodes with the v2.5 plugin (delimited + handshake)
  std::vector<std::string> gpu_types = {"NVIDIA-A100", "NVIDIA-H100"};
  std::vector<int> devmem_mib = {40960, 81920};
  // MIG (docs/simulate.md "MIG"): this share of the nodes run HAMi v2.10's plugin in `mig`
  // mode — every card registered (JSON) with mode "mig" and the `migProfiles` of its model
  // (device::MigProfilesOf); the models of mig_models (names of device::MigGpuModels, e.g.
  // "A100-40GB") are taken in turn. A MIG node is never a delimited (v2.5) node.
  double mig_share = 0;
  std::vector<std::string> mig_models = {"A100-40GB"};
  // Whether node `index` (0-based) runs the v2.5 plugin: node i is delimited when
  // floor((i+1)·delimited_share) grows, which spreads them evenly.
  bool IsDelimitedNode(int index) const;
  // Which nodes are MIG nodes: round(nodes·mig_share) of them, spread evenly over the nodes
  // that are not delimited (ParseScenario refuses a share that does not fit there).
  std::vector<bool> MigNodes() const;

  // workload
  double create_rate = 30;  // pods per second
  int max_pods = 1000;      // total created
  double delete_rate = 2;   // random deletions of live pods per second
  absl::Duration lifetime_min = absl::Seconds(5);
  absl::Duration lifetime_max = absl::Seconds(20);
  double full_nodes_share = 0.1;  // pods also filtered with full Nodes
  std::map<Shape, double> shapes = {{Shape::kMemory, 1}};
  // Pod priorities (docs/simulate.md "Preemption"): value → weight; each pod draws one and gets
  // spec.priority with priorityClassName "sim-priority-<value>" (created on the real control
  // plane). Empty: no priority set (and no draw, so other scenarios' pods are unchanged).
  std::map<int32_t, double> priorities;

  std::vector<FaultSpec> faults;

  // Namespace quota (docs/simulate.md "Namespace quota"): pod sim-N is created in
  // namespaces[N mod size], each with a ResourceQuota "gpu" of its limits. Empty: every pod in
  // "default", no quota.
  std::vector<QuotaNamespace> namespaces;
  // The namespace of `pod` ("sim-000042"): "default" without namespaces.
  std::string NamespaceOf(std::string_view pod) const;
};

absl::StatusOr<Scenario> ParseScenario(const std::string& yaml_text);
// An embedded scenario's name, else a file.
absl::StatusOr<Scenario> LoadScenario(const std::string& name_or_path);
// Embedded scenario texts by name (generated from scenarios/*.yaml at build time).
const std::map<std::string, std::string>& EmbeddedScenarios();

}  // namespace tessera::sim

// File: tessera/sim/run_book.h
//
// RunBook is the shared record of one `tessera simulate` run: the pods the workload created and
// the stage each has reached, the nodes with their device plugins, the counters that become the
// RunResult, and the last fault injected (the cause the oracle gives a divergence). The pod
// pipeline, the fault injector, the observer and the real control plane's kubelet read and write
// it; it has no rules of its own beyond the few lookups below.
//
// Thread safety: every field is guarded by `mutex`; hold it for each access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

#include "tessera/base/mutex.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/simulation.h"

namespace tessera::sim {

// The namespace of the workload's pods when the scenario has no quota namespaces.
inline constexpr char kNamespace[] = "default";

enum class Stage { kCreating, kPending, kBound, kRunning, kSucceeded, kDeleting, kGone };

struct SimPod {
  std::string name, uid, json, node;
  Stage stage = Stage::kCreating;
  bool full_nodes = false;
  bool ever_unschedulable = false;
  int tries = 0;
  absl::Time created_at = absl::InfiniteFuture();  // created in the API server
  absl::Time refused_at = absl::InfiniteFuture();  // first found unschedulable
  absl::Time bound_at = absl::InfiniteFuture();    // bound to its node
  absl::Time left_at = absl::InfiniteFuture();     // stopped holding its node's devices
};

struct SimNode {
  std::string name;
  std::string json;  // with the registration, for full-Nodes filters
  std::unique_ptr<DevicePlugin> plugin;
  bool alive = true;
  bool mig = false;      // its cards registered in mig mode
  bool stopped = false;  // plugin_stop
  absl::Time next_report;
};

struct RunBook {
  Mutex mutex;
  std::map<std::string, SimPod> pods ABSL_GUARDED_BY(mutex);
  std::vector<std::string> pod_names ABSL_GUARDED_BY(mutex);
  std::vector<SimNode> nodes ABSL_GUARDED_BY(mutex);
  std::map<std::string, size_t> node_index ABSL_GUARDED_BY(mutex);
  SchedulingQueue queue ABSL_GUARDED_BY(mutex);
  std::vector<double> filter_ms ABSL_GUARDED_BY(mutex);
  RunResult result ABSL_GUARDED_BY(mutex);
  std::string last_fault ABSL_GUARDED_BY(mutex);
  absl::Time last_fault_at ABSL_GUARDED_BY(mutex) = absl::InfinitePast();
  bool workload_on ABSL_GUARDED_BY(mutex) = true;
  int64_t diverging_now ABSL_GUARDED_BY(mutex) = 0;
  std::set<std::string> terminating ABSL_GUARDED_BY(mutex);  // kReal: the kubelet is on it

  // nullptr when no node has that name.
  SimNode* NodeByName(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    auto it = node_index.find(name);
    return it == node_index.end() ? nullptr : &nodes[it->second];
  }
  // The names of the nodes not deleted by a fault.
  std::vector<std::string> AliveNodes() ABSL_LOCKS_EXCLUDED(mutex) {
    MutexLock l(&mutex);
    std::vector<std::string> out;
    for (const SimNode& n : nodes) {
      if (n.alive) {
        out.push_back(n.name);
      }
    }
    return out;
  }
  // A fault injected at `now` (the run started at result.start): in the result and as the
  // cause of what the oracle sees next.
  void RecordFault(absl::Time now, std::string kind, std::string detail)
      ABSL_LOCKS_EXCLUDED(mutex) {
    MutexLock l(&mutex);
    result.faults.push_back({now - result.start, kind, std::move(detail)});
    last_fault = std::move(kind);
    last_fault_at = now;
  }
};

}  // namespace tessera::sim

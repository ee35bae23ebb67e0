// File: tessera/sim/cluster_emulation.h
//
// `tessera emulate`: the nodes and pods of a cluster file (what `kubectl get nodes,pods -A -o
// yaml` writes, as `tessera explain --cluster` reads it) brought to life on a real API server,
// with HAMi's device plugin and the kubelet of every node played by the emulators of
// emulators.h:
//
//   PlanCluster   checks the file and turns it into API objects (pure; every error before any
//                 call to the API server, so bad input changes nothing);
//   ClusterEmulation::Setup   namespaces and their `default` ServiceAccounts, the nodes (created,
//                 status with capacity/allocatable and Ready, the not-ready taint removed,
//                 registered by the device plugin in the file's format), then the pods;
//   ClusterEmulation::Run     the device plugins and kubelets: Allocate for pods bound to an
//                 emulated node (bind-phase=success), Pending → Running, graceful deletions
//                 finished (Succeeded, then the kubelet's DELETE with grace 0), and the v2.5
//                 plugins' `Reported` handshake every 30 s.
//
// Fidelity notes (docs/e2e.md "A cluster file"): every object is rebuilt from what Tessera reads
// of it (kube::Pod / kube::Node, decoded as from the API server): names, the labels and
// annotations the decoder keeps (node labels; hami.io/ and nvidia.com/ annotations and pod
// labels), containers' resources, privileged, schedulerName, spec.nodeName, node allocatable;
// the file's images, commands and other fields are not kept (containers get the pause image). A pod
// bound in the file is created with spec.nodeName set and the webhook's opt-out label (see
// ClusterPlan), then started by its node's kubelet.
//
// Thread safety: PlanCluster is pure. ClusterEmulation is driven by one thread (Setup, then Run);
// RequestStop may be called from any thread (a signal handler's flag poller).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/device/model.h"
#include "tessera/kube/client.h"
#include "tessera/kube/manifest.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/emulators.h"

namespace tessera::sim {

struct PlannedNode {
  std::string name;
  device::RegisterFormat format = device::RegisterFormat::kJson;
  std::vector<device::DeviceInfo> devices;
  int64_t gpus = 0;         // allocatable nvidia.com/gpu: the file's, else the sum of split counts
  std::string node_json;    // the POST body (labels and annotations of the file, no status)
  std::string status_json;  // what the kubelet reports: capacity, allocatable (no conditions)
};

struct PlannedPod {
  std::string ns, name;
  std::string node;  // spec.nodeName in the file; empty: kube-scheduler places it
  kube::PodPhase phase = kube::PodPhase::kPending;
  std::string json;  // the POST body
  // Unbound pods: a merge patch of the annotations the scheduler writes (hami.io/vgpu-node,
  // bind-phase, bind-time, vgpu-devices-allocated, vgpu-devices-to-allocate), which `json` then
  // leaves out; empty when the file has none, and for bound pods.
  std::string scheduler_patch;
};

// A pod bound in the file is created as the file has it — bound (spec.nodeName in the POST body)
// and with every HAMi annotation — plus the label `hami.io/webhook: ignore`, the opt-out of the
// webhook's objectSelector: the file's pod already went through admission when its cluster
// created it, and Tessera's webhook (as HAMi's) refuses a CREATE that is bound or carries the
// scheduler's annotations. Not created unbound and then bound with a Binding: kube-scheduler
// would pick an unbound pod of Tessera's scheduler up at once and filter it again, overwriting
// the allocation the file records (a race no ordering of our calls closes). So Tessera sees the
// file's object in one event: bound, with its allocation.
// An unbound pod is created without the annotations the scheduler writes (the webhook refuses
// them) and given them with a merge patch right after (`scheduler_patch`); kube-scheduler may
// place it meanwhile, as it would place any pending pod.
struct ClusterPlan {
  std::vector<std::string> namespaces;  // of the pods, sorted, unique
  std::vector<PlannedNode> nodes;       // file order
  std::vector<PlannedPod> pods;         // file order
  std::vector<std::string> warnings;    // the loader's, plus dropped node annotations
};

// InvalidArgument naming `source` and the object for: no node; a node whose register annotation
// is missing or does not decode; an allocatable nvidia.com/gpu that is not a whole number; two
// nodes or two pods of the same name; a pod without containers or with an invalid name or
// namespace; a pod bound to a node the file does not have (no kubelet would run it).
absl::StatusOr<ClusterPlan> PlanCluster(const kube::Manifests& manifests, std::string_view source);
// LoadManifestFile + PlanCluster.
absl::StatusOr<ClusterPlan> LoadClusterPlan(const std::string& path);

// The kubelet's report of a node at `now`: capacity = allocatable (the plan's), Ready.
std::string NodeStatusJson(const PlannedNode& node, absl::Time now);

struct EmulationCounters {
  int64_t registered = 0;  // register writes (first registrations and handshake reports)
  int64_t allocated = 0;   // pods whose Allocate calls completed (bind-phase=success)
  int64_t started = 0;     // Pending → Running
  int64_t ended = 0;       // set Succeeded/Failed as the file says
  int64_t deleted = 0;     // graceful deletions finished
  int64_t errors = 0;      // API calls that failed (retried on a later pass)
};

class ClusterEmulation {
 public:
  struct Options {
    absl::Duration tick = absl::Milliseconds(200);         // one pass over the pods
    absl::Duration report_every = absl::Seconds(30);       // v2.5 handshake reports
    absl::Duration allocate_patience = absl::Seconds(30);  // a bound pod with nothing to allocate
    Clock* clock = Clock::Real();                          // registrations, reports, ticks
  };

  // `transport` and `client` (over the same server) must outlive this.
  ClusterEmulation(ClusterPlan plan, kube::Transport* transport, kube::ApiClient* client,
                   Options options);
  ClusterEmulation(ClusterPlan plan, kube::Transport* transport, kube::ApiClient* client)
      : ClusterEmulation(std::move(plan), transport, client, Options()) {}

  // Namespaces, ServiceAccounts, nodes (ready and registered), pods. Objects that exist already
  // are taken over (a node's status and registration are written again; a pod is left as it
  // is), so a restarted emulate (`tools/controlplane.sh restart DIR emulators`) carries on.
  absl::Status Setup();
  // Until RequestStop: watches every pod (an informer over all namespaces) and runs Step on the
  // pods of the emulated nodes every tick.
  absl::Status Run();
  void RequestStop() { stop_.store(true); }

  // One pass of every node's plugin and kubelet over `pods` (those bound to emulated nodes;
  // others are ignored). Public for tests.
  void Step(const std::vector<kube::Pod>& pods, absl::Time now);

  EmulationCounters counters() const { return counters_; }

 private:
  void HandlePod(const kube::Pod& pod, DevicePlugin& plugin, absl::Time now);

  const ClusterPlan plan_;
  kube::Transport* const transport_;
  kube::ApiClient* const client_;
  const Options options_;
  std::atomic<bool> stop_{false};
  std::map<std::string, std::unique_ptr<DevicePlugin>> plugins_;  // by node
  std::map<std::string, absl::Time> next_report_;                 // delimited nodes
  std::map<std::string, kube::PodPhase> file_phase_;              // "ns/name" → phase to reach
  std::set<std::string> allocated_;                               // uids whose allocation completed
  std::set<std::string> started_;                                 // uids set Running
  std::set<std::string> ended_;                                   // uids set terminal
  std::map<std::string, absl::Time> waiting_;  // uid → first pass that found nothing to allocate
  EmulationCounters counters_;
};

}  // namespace tessera::sim

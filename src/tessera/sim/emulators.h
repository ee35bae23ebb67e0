// File: tessera/sim/emulators.h
//
// The parts of a Kubernetes GPU cluster that `tessera simulate` plays around the real
// `tessera serve` and `tessera apisim`. Each talks to the API server over its real HTTP API
// through kube::ApiClient (or raw kube::Request for verbs the client does not type):
//
//   Workload       pod manifests in a mix of shapes (whole GPU, memory MiB, percentage, cores,
//                  multi-GPU, multi-container, NUMA-bound, type-constrained, MIG-sized);
//   DevicePlugin   HAMi's NVIDIA device plugin of one node: registers the node's GPUs (v2.5's
//                  delimited format with the `Reported` handshake, or v2.8+'s JSON), and for a
//                  bound pod does what the kubelet's Allocate calls make the plugin do
//                  (docs/hami-device-plugin.md §1–3): find the pod through the node lock,
//                  consume hami.io/vgpu-devices-to-allocate one container entry per call (G1
//                  compacting on delimited nodes, G3 index-preserving on JSON nodes), then
//                  bind-phase=success and release the lock; with `mig` cards it is v2.10's
//                  plugin in mig mode and realises each container's MIG reservations;
//   Kubelet        pod phases (Pending → Running → Succeeded) and graceful deletion;
//   ExtenderClient kube-scheduler's side of the extender protocol (/filter with NodeNames or
//                  full Nodes, /bind), and SchedulingQueue, its backoff for unschedulable pods.
//
// Every call is blocking (kube::Do with a short retry policy); callers run them on worker
// threads. Errors are the client's (client.h); the caller retries on its own schedule.
//
// Thread safety: Workload, Kubelet and ExtenderClient are stateless apart from construction
// and may be used from any thread. DevicePlugin serialises its Allocate calls internally (as
// HAMi HEAD's applyMutex does). SchedulingQueue is not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/mig.h"
#include "tessera/device/model.h"
#include "tessera/kube/client.h"
#include "tessera/kube/transport.h"

namespace tessera::sim {

// ---- raw API calls --------------------------------------------------------------------------

// Few quick retries: the emulators re-queue failed work themselves.
kube::DoOptions QuickRetry();
// POST a pod (JSON); returns the created object's JSON. An AlreadyExists (a retried create that
// had succeeded) returns the existing object.
absl::StatusOr<std::string> CreatePod(kube::Transport& t, std::string_view ns,
                                      std::string_view name, const std::string& json);
// DELETE a pod; grace < 0: the server's default (the pod's terminationGracePeriodSeconds).
// NotFound is OK (already gone).
absl::Status DeletePod(kube::Transport& t, std::string_view ns, std::string_view name,
                       int grace = -1);
// Merge patch of status.phase.
absl::Status SetPodPhase(kube::Transport& t, std::string_view ns, std::string_view name,
                         std::string_view phase);
absl::Status CreateNode(kube::Transport& t, const std::string& json);
absl::Status DeleteNode(kube::Transport& t, std::string_view name);
// What a kubelet and the node lifecycle controller do for a node on a real API server, which
// ignores `status` on create and taints a new node not-ready (TaintNodesByCondition): a merge
// patch of the status subresource (`status_json`: capacity, allocatable, conditions), then the
// node's taints removed.
absl::Status MakeNodeReady(kube::Transport& t, std::string_view name,
                           const std::string& status_json);
// What kube-controller-manager would create: a namespace's `default` ServiceAccount, which the
// ServiceAccount admission plugin requires of every pod. AlreadyExists is OK.
absl::Status CreateDefaultServiceAccount(kube::Transport& t, std::string_view ns);
// A namespace, and a ResourceQuota `name` in it whose spec.hard is `hard` (key, quantity). An
// AlreadyExists (a retried create) is success.
absl::Status CreateNamespace(kube::Transport& t, std::string_view ns);
// The PriorityClass PriorityClassName(value) of `value` (a real API server's Priority admission
// wants the class of a pod's priorityClassName). An AlreadyExists is success.
absl::Status CreatePriorityClass(kube::Transport& t, int32_t value);
absl::Status CreateResourceQuota(kube::Transport& t, std::string_view ns, std::string_view name,
                                 const std::vector<std::pair<std::string, std::string>>& hard);

// ---- workload -------------------------------------------------------------------------------

// kMig: a MIG-sized request (`nvidia.com/vgpu-mode: mig`, memory of one profile or a little
// under it), which only a `mig` card takes.
enum class Shape {
  kWhole,
  kMemory,
  kPercent,
  kCores,
  kMultiGpu,
  kMultiContainer,
  kNuma,
  kTyped,
  kMig
};
inline constexpr int kShapeCount = 9;
std::string_view ShapeName(Shape s);
std::optional<Shape> ParseShape(std::string_view name);

class Workload {
 public:
  // `weights` by Shape (missing: 0; all zero: memory only); `typed_gpu` the type a
  // type-constrained pod asks for (nvidia.com/use-gputype); `priorities` value → weight (empty:
  // none set).
  Workload(std::map<Shape, double> weights, std::string scheduler_name, std::string typed_gpu,
           const std::map<int32_t, double>& priorities = {});

  Shape Pick(std::mt19937_64& rng) const;
  // The pod manifest (JSON) of `shape`, Pending, schedulerName set, sizes (and with priorities
  // a priority, as spec.priority and priorityClassName "sim-priority-<value>") drawn from `rng`.
  std::string PodJson(Shape shape, std::string_view ns, std::string_view name,
                      std::mt19937_64& rng) const;

 private:
  std::vector<double> cumulative_;
  std::vector<std::pair<int32_t, double>> priorities_;  // value, cumulative weight
  std::string scheduler_name_;
  std::string typed_gpu_;
};

// The PriorityClass a workload pod of `priority` names.
std::string PriorityClassName(int32_t priority);

// ---- device plugin --------------------------------------------------------------------------

struct AllocateResult {
  std::string ns, name;   // the pod the lock named (or the fallback found)
  int calls = 0;          // Allocate calls made (one per GPU container)
  bool success = false;   // bind-phase=success written and the lock released
  int mig_instances = 0;  // MIG instances realised (runtime identity written back)
  // Why the plugin failed the pod (bind-phase=failed written, the lock released): a MIG
  // reservation it cannot realise. Empty otherwise.
  std::string failure;
};

// What HAMi v2.10's plugin checks of one container's MIG reservations before it creates the
// instances (plugin/util.go GetContainerDeviceStrArray, migmgr.go): `allocations` are the pod's,
// `container` the entry's index (init containers first), `devices` its device entry. The
// container's reservations, sorted by deviceIndex, must be as many as its devices, each naming
// that device's card, and each profile and placement must be one the card registers. Returns
// the indices into `allocations` in deviceIndex order, or FailedPrecondition with HAMi's text
// ("container 0 has 1 MIG reservations, requested 2 devices", "scheduler selected invalid
// placement ...").
absl::StatusOr<std::vector<size_t>> ContainerMigReservations(
    const std::vector<device::MigAllocation>& allocations, int container,
    const device::ContainerDevices& devices, const std::vector<device::DeviceInfo>& cards);

class DevicePlugin {
 public:
  DevicePlugin(std::string node, device::RegisterFormat format,
               std::vector<device::DeviceInfo> devices);

  const std::string& node() const { return node_; }
  device::RegisterFormat format() const { return format_; }
  const std::vector<device::DeviceInfo>& devices() const { return devices_; }

  // The register value in the plugin's format.
  std::string RegisterValue() const;
  // Writes the registration (delimited: with `hami.io/node-handshake: Reported <now>`), as one
  // merge patch. The JSON plugin writes only when the value changed since its last write.
  absl::Status Register(kube::ApiClient& client, absl::Time now);

  // One kubelet admission of `ns/name` (just bound to this node): the Allocate calls for its
  // GPU containers, then completion. Finds the pod as the plugin does: the node lock first,
  // then (no lock) the pod itself if it is Pending, bind-phase allocating and annotated for
  // this node. FailedPrecondition when nothing is pending (retry later), errors of the API.
  // On a node with `mig` cards each call also realises the container's instances as HAMi
  // v2.10's plugin does: ContainerMigReservations, then migUUID, gpuInstanceID and
  // computeInstanceID written into hami.io/vgpu-mig-allocations (the whole value, a merge patch
  // with the pod's resourceVersion as precondition), before the entry is erased. A reservation
  // it cannot realise fails the pod (result.failure). Instance ids: gpuInstanceID counts up per
  // card from 1 (NVML reuses ids; nothing here reads them back), computeInstanceID 0, migUUID
  // derived from the card and the id.
  absl::StatusOr<AllocateResult> Allocate(kube::ApiClient& client, std::string_view ns,
                                          std::string_view name);

 private:
  const std::string node_;
  const device::RegisterFormat format_;
  const std::vector<device::DeviceInfo> devices_;
  const bool has_mig_;  // a `mig` card: the plugin realises MIG reservations
  // Writes the runtime identity of allocations[indices] into the pod's annotation.
  absl::Status RealiseMig(kube::ApiClient& client, const AllocateResult& result, kube::Pod& pod,
                          std::vector<device::MigAllocation>& allocations,
                          const std::vector<size_t>& indices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // bind-phase=failed and the lock released (HAMi's PodAllocationFailed).
  absl::Status Fail(kube::ApiClient& client, const AllocateResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the node lock if `result`'s pod owns it.
  absl::Status ReleaseLock(kube::ApiClient& client, const AllocateResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  std::string last_written_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> last_gpu_instance_ ABSL_GUARDED_BY(mu_);  // by card UUID
};

// Consumes the first non-empty container entry of a to-allocate value, as the plugin's erase
// does: G1 (`compact`: empty entries dropped first, `;A:;B:C:;` → `;B:C:;`) or G3 (index kept,
// one more trailing `;` per call, `;A:;B:C:;` → `;;B:C:;;`). Returns the new value, or
// NotFound when no entry is left, InvalidArgument when it does not decode.
absl::StatusOr<std::string> EraseNextEntry(std::string_view value, bool compact,
                                           int* devices = nullptr);
// Whether any device entry is left (the plugin's "contains NVIDIA" completion test).
bool AllocationPending(std::string_view to_allocate);

// ---- kubelet --------------------------------------------------------------------------------

class Kubelet {
 public:
  // Pending → Running (the containers started).
  static absl::Status Start(kube::Transport& t, std::string_view ns, std::string_view name);
  // Running → Succeeded (a job ended, or the containers stopped after a graceful delete; the
  // API server removes a pod being deleted once it is terminal).
  static absl::Status Finish(kube::Transport& t, std::string_view ns, std::string_view name);
  // A lifetime in [lo, hi].
  static absl::Duration Lifetime(absl::Duration lo, absl::Duration hi, std::mt19937_64& rng);
};

// ---- kube-scheduler -------------------------------------------------------------------------

struct FilterOutcome {
  std::string node;                         // empty: unschedulable
  std::string failed_reason;                // first FailedNodes reason when unschedulable
  std::vector<std::string> failed_reasons;  // every FailedNodes reason, in the reply's order
  absl::Duration latency;
};

class ExtenderClient {
 public:
  // `clock` times the answers (FilterOutcome::latency).
  explicit ExtenderClient(kube::Transport* transport, Clock* clock = Clock::Real())
      : transport_(transport), clock_(clock) {}
  // POST /filter with NodeNames (nodeCacheCapable) — the scheduling call.
  absl::StatusOr<FilterOutcome> Filter(const std::string& pod_json,
                                       const std::vector<std::string>& nodes);
  // POST /filter with full `Nodes` (a non-cache-capable scheduler): answered without side
  // effects; returns the chosen node's name.
  absl::StatusOr<FilterOutcome> FilterNodes(const std::string& pod_json,
                                            const std::vector<std::string>& node_json);
  // POST /bind. An `Error` in the reply is kAborted with its text.
  absl::Status Bind(std::string_view ns, std::string_view name, std::string_view uid,
                    std::string_view node);

 private:
  absl::StatusOr<std::string> Post(std::string path, std::string body);
  kube::Transport* transport_;
  Clock* const clock_;
};

// kube-scheduler's queue for the pods that did not schedule (v1.37.2, docs/requeue.md): a pod
// the extender refused waits among the unschedulable pods until an event moves it — any
// assigned-pod or node change (the extender's registration queues on every event), or an update
// of the pod itself — or the flush after `unschedulable_timeout`; an event that came during its
// attempt moves it at once. A moved pod backs off (1 s doubling to 10 s per attempt, from the
// attempt) unless that has passed; a backing-off pod is taken when its backoff ends, or as soon
// as no pod is ready (SchedulerPopFromBackoffQ, on by default: the backoff queue is popped when
// the active queue is empty). Every call returns the pods to try now; Pump must be called often
// (the emulation: every 50 ms). Times are the caller's.
class SchedulingQueue {
 public:
  struct Options {
    absl::Duration initial = absl::Seconds(1);                // podInitialBackoffSeconds
    absl::Duration max = absl::Seconds(10);                   // podMaxBackoffSeconds
    absl::Duration unschedulable_timeout = absl::Minutes(5);  // podMaxInUnschedulablePodsDuration
  };
  using Now = std::vector<std::string>;  // the pods to try now

  SchedulingQueue() : SchedulingQueue(Options{}) {}
  explicit SchedulingQueue(Options options) : options_(options) {}

  // `key` is ready for an attempt (new, or due by a timer of the caller's).
  void Ready(const std::string& key);
  // An attempt of `key` begins at `now`: the token to pass to Refused.
  uint64_t Attempt(const std::string& key, absl::Time now);
  // The attempt begun with `token` refused the pod: it waits for an event, unless one came
  // during the attempt.
  Now Refused(const std::string& key, uint64_t token, absl::Time now);
  // The backoff of `key` after its attempts so far: the delay before the next attempt after a
  // failure that is not a refusal (an error), which waits for no event.
  absl::Duration Backoff(const std::string& key) const;
  // An event that moves every waiting pod.
  Now ClusterEvent(absl::Time now);
  // The pending pod `key` itself was updated: it moves if it waits.
  Now PodUpdated(const std::string& key, absl::Time now);
  // Moves the pods that waited `unschedulable_timeout` (kube-scheduler checks every 30 s).
  Now Flush(absl::Time now);
  // The backing-off pods due now.
  Now Pump(absl::Time now) { return Take(now); }
  // The pod scheduled or went away.
  void Forget(const std::string& key) {
    pods_.erase(key);
    ready_.erase(key);
  }
  int attempts(const std::string& key) const;
  size_t waiting() const;

 private:
  enum class State { kTrying, kWaiting, kBackoff, kReady };
  struct Pod {
    int attempts = 0;
    absl::Time last_attempt;
    State state = State::kTrying;
    absl::Time waiting_since;
  };
  absl::Duration BackoffOf(int attempts) const;
  absl::Time BackoffEnd(const Pod& pod) const { return pod.last_attempt + BackoffOf(pod.attempts); }
  // The backing-off pods that may run: those whose backoff ended, or all when none is ready.
  Now Take(absl::Time now);

  Options options_;
  uint64_t events_ = 0;  // events seen: an attempt's token is the count at its start
  std::map<std::string, Pod> pods_;
  std::set<std::string> ready_;  // the active queue: due now, not yet attempted
};

}  // namespace tessera::sim

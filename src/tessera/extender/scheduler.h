// File: tessera/extender/scheduler.h
//
// The filter and bind logic of `tessera serve`, over the ledger (tessera/ledger/ledger.h) and the
// Kubernetes client. The HTTP layer decodes the extender JSON (wire.h) and calls these.
//
//   Scheduler scheduler(options, {&ledger, &client, clock, lookup});
//   FilterResult r = scheduler.Filter(args);   // always a reply; errors go in r.error
//   BindResult b = scheduler.Bind(bind_args);  // empty b.error = bound
//
// Filter (hami-protocol.md §4.2, §2.2):
//   1. The pod's request (Vendor::DecodeRequest). A pod that asks for no managed device passes
//      through untouched: the input is echoed, nothing is written, no event (HAMi HEAD).
//   1b. The pod must still be pending: the request's copy and the API server's (the lookup's
//      copy of the same uid, else a GET) must be unbound, not being deleted and not finished,
//      and the uid must be the stored pod's. A request naming a running pod would otherwise
//      rewrite its annotations and free the devices it uses.
//   2. Under one mutex shared by every filter and bind re-check: the pod's earlier reservation is
//      released, the ledger snapshot of the CANDIDATE nodes only is read, schedule::Decide picks
//      the node and devices, and the decision is reserved (Ledger::Reserve, expiring after
//      reservation_ttl). Two filters can therefore never reserve the same capacity.
//   3. Outside the mutex: one JSON merge patch writes hami.io/vgpu-node, hami.io/vgpu-time,
//      hami.io/vgpu-devices-to-allocate and hami.io/vgpu-devices-allocated (the same string),
//      plus the label hami.io/vgpu-node, with metadata.uid as a precondition (the API server
//      refuses the patch when the pod of that name is another one). The patch is written BEHIND the
//      reply (by a pool of `patch_threads` writers) unless `write_behind` is false: the decision is
//      already held by the reservation, and nothing reads the annotations before bind — the device
//      plugin acts only on a bound pod, and Bind first waits for the pod's patch to land (and uses
//      the pod the patch returned). So /filter answers in the time of the decision, not of an API
//      round trip. If the patch fails the reservation is undone (unless a newer filter of the same
//      pod has replaced it) and the pod's bind fails with the patch's error; kube-scheduler then
//      retries the pod. Patches of one pod never overtake each other: a re-filter waits for the
//      pod's earlier patch. With write_behind false the patch is written before the reply and a
//      failure is the filter's error.
//   4. Reply: NodeNames = [the winner] or, when nothing fits, NodeNames = [] and FailedNodes with
//      HAMi's reason strings ("node unregistered", "1/2 CardInsufficientMemory, ...").
//   Events (best effort, asynchronous): FilteringSucceed "find fit node(<n>), <k> nodes not fit,
//   <m> nodes fit(<n1>:<score>,...)"; FilteringFailed, one per reason "<k> nodes <Reason>(<nodes>)"
//   or the error text. Messages stay within kEventMessageLimit bytes (node lists are cut).
//
//   A request that carries full `Nodes` (nodeCacheCapable: false) is answered in the `Nodes` form
//   (the chosen node's raw JSON) WITHOUT side effects: no reservation, no patch, no event. This is
//   HAMi HEAD's behaviour (§3): that form is what the cluster autoscaler sends to simulate
//   scheduling on template nodes that may not exist, and reserving or annotating for those would
//   hold capacity and mislabel the pod. HAMi's chart runs kube-scheduler nodeCacheCapable: true,
//   so real scheduling always uses NodeNames. Nodes the ledger knows are decided on their ledger
//   usage; nodes it does not know are decoded from the request (their registration annotation)
//   with zero usage.
//
// Bind (§4.8), for a pod whose reservation or annotations name the bind node:
//   0. One bind per pod at a time: a bind of a pod (namespace/name) that another bind call is
//      handling is refused at once ("in_progress"), changing nothing.
//   1. The pod comes from the lookup (the informer store), or from GET when the lookup misses or
//      its copy predates the filter's annotations. Refused, changing nothing (no API write, no
//      reservation released): names that are not Kubernetes names; a pod naming another
//      scheduler (spec.schedulerName != scheduler_name, when scheduler_name is set); a pod
//      asking for no managed device (HAMi binds those itself; kube-scheduler binds them when
//      managedResources is set, as the shipped configuration does); a pod already bound or
//      being deleted; a node without a device registration in the ledger.
//   2. The node lock (node_lock.h) with --node-lock-timeout. The holder's state (gone,
//      terminal, bound to which node, bind-phase) comes from the lookup, and from a GET when the
//      lookup misses or a takeover rests on it. A lock another pod holds is waited for, up to
//      node_lock_retry_timeout (HAMi --node-lock-retry-timeout), before the bind fails.
//   3. Re-check, under the filter mutex: the pod's reservation is replaced by one for the
//      devices of its hami.io/vgpu-devices-allocated annotation (fresh TTL), and every device it
//      names must still be within its capacity (slots, memory, cores) with everything else the
//      ledger holds. This is also the policy for a pod whose reservation EXPIRED: it re-reserves
//      and binds if its devices are still free, and fails with "devices no longer free" if not —
//      never a silent re-decision, since the annotations the device plugin will read already name
//      those devices.
//   4. POST the Binding (with the pod UID as precondition), carrying the annotations
//      hami.io/bind-phase=allocating and hami.io/bind-time=<unix seconds>, which the API server
//      merges into the pod in the same write (HAMi patches them first, then binds: one write
//      more, and an "allocating" pod left behind when the binding fails).
//   Any failure after step 1 releases the lock if this bind took it (not when it found the lock
//   already the pod's: an earlier bind of the same pod holds it for the device plugin) and the
//   reservation — except a binding refused because the pod is bound already (a duplicate
//   bind): its devices are in use, so the reservation stays until the pod is observed bound —
//   records BindingFailed and returns the error; success records BindingSucceed and keeps the
//   reservation, which the ledger ends when it observes the pod bound (and the device plugin
//   removes the lock).
//
// Reservations and bind. From the re-check (step 3) until the informer observes the pod bound,
// the pod's reservation is what holds its devices, so it must not expire in between: a bind
// that is in progress, or whose Binding the API accepted, keeps its reservation past the TTL
// (ExpireReservations skips it). It ends as every reservation does when the pod is observed
// bound, terminal or deleted, or when a relist or resync finds the pod gone
// (ReleaseAbsent); a bound pod never observed keeps it at most `bound_hold` after its bind.
// Without this, a reservation expiring between the binding POST and the informer's MODIFIED
// event (a slow watch under load, or a TTL shorter than bind's round trips) freed the devices
// of a running pod and the next filter placed another pod on the same share.
//
// ExpireReservations(now) is the hook for the lead's periodic loop.
//
// ReleaseAbsent(list_started, present) ends, after a full LIST of the pods (a relist or a
// resync pass), every reservation made before that LIST started whose pod the LIST did not
// return (`present(uid)` false): a pod created, filtered, bound and deleted while the watch was
// down leaves no tombstone, and its reservation would otherwise live until the TTL. A
// reservation made after the LIST's start may belong to a pod the LIST missed and stays.
//
// Thread safety: Filter, Bind, ExpireReservations and stats may be called concurrently from any
// thread. The ledger, client, clock and lookup must be thread-safe and outlive the Scheduler.
// Events are written by one background thread (drained by the destructor or FlushEvents).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/node_lock.h"
#include "tessera/extender/wire.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::extender {

// A pod by namespace and name from a local cache (the informer store), or nullopt on a miss.
using PodLookup =
    std::function<std::optional<kube::Pod>(std::string_view ns, std::string_view name)>;

// A latency distribution: count, sum and cumulative buckets (upper bounds in seconds).
struct LatencyStats {
  static constexpr double kBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                       0.025,  0.05,  0.1,    0.25,  1.0};
  static constexpr size_t kBuckets = sizeof(kBounds) / sizeof(kBounds[0]);
  uint64_t count = 0;
  double sum_seconds = 0;
  double max_seconds = 0;
  uint64_t buckets[kBuckets] = {};  // buckets[i]: observations <= kBounds[i] (cumulative)

  void Observe(absl::Duration d);
};

// What the lead exports. Counters are totals since construction.
struct Stats {
  // Filter outcomes: "fit", "no_fit", "pass_through", "simulated" (a Nodes request), "error".
  std::map<std::string, uint64_t> filter_outcomes;
  // Per failed candidate node: its reason names ("CardInsufficientMemory", "node unregistered").
  std::map<std::string, uint64_t> filter_node_reasons;
  // Bind outcomes: "bound", "in_progress", "pod_not_found", "not_ours", "node_unregistered",
  // "no_allocation",
  // "lock_held", "lock_error", "devices_not_free", "patch_failed", "binding_rejected", "error".
  std::map<std::string, uint64_t> bind_outcomes;
  // Lock acquisitions by NodeLockOutcomeName, and 409s retried while locking.
  std::map<std::string, uint64_t> lock_outcomes;
  uint64_t lock_conflicts_retried = 0;
  // Binds that met a held lock and waited for it (node_lock_retry_timeout): "acquired" or
  // "timed_out"; and how long the acquired ones waited.
  std::map<std::string, uint64_t> lock_waits;
  LatencyStats lock_wait_latency;
  LatencyStats filter_latency;
  LatencyStats patch_latency;   // the filter's annotation patch (behind the reply or not)
  uint64_t patch_failures = 0;  // whole Filter calls (API patch included)
  LatencyStats decide_latency;  // the serialised snapshot → decide → reserve step of a Filter
  LatencyStats bind_latency;
  uint64_t reservations_in_flight = 0;  // live ledger reservations at the time of stats()
  uint64_t reservations_expired = 0;    // ended by ExpireReservations
  uint64_t events_sent = 0;
  uint64_t events_failed = 0;   // the API refused or failed (logged)
  uint64_t events_dropped = 0;  // the queue was full
};

class Scheduler {
 public:
  // The longest event message, in bytes: the limit the events.k8s.io API puts on a note (the
  // core/v1 API has none). A node list past it is cut ("... <n> more)"), any other message
  // ends "...". HAMi's FilteringSucceed lists every fitting node: 500 candidates made ~9 KB.
  static constexpr size_t kEventMessageLimit = 1024;

  struct Options {
    // The event source component (--scheduler-name).
    std::string scheduler_name = "hami-scheduler";
    device::NodePolicy node_policy = device::NodePolicy::kBinpack;
    device::GpuPolicy gpu_policy;  // spread
    absl::Duration node_lock_timeout = absl::Minutes(5);
    // How long a bind that meets a lock held by another pod keeps trying it before it fails
    // (HAMi --node-lock-retry-timeout); zero: it fails at once.
    absl::Duration node_lock_retry_timeout = absl::ZeroDuration();
    // At most this many binds take a node lock at once with that wait; one beyond them fails at
    // once if it meets a held lock. A waiting bind holds an HTTP worker (and its connection),
    // so this keeps workers free for /filter.
    int max_lock_waiters = 8;
    absl::Duration reservation_ttl = absl::Minutes(5);
    // Required; must outlive the Scheduler.
    const device::Vendor* vendor = nullptr;
    // Retry of the lock patch on 409 (its timeout and wait are node_lock_timeout and
    // node_lock_retry_timeout).
    NodeLockOptions lock;
    // Events queued beyond this are dropped (counted).
    size_t event_queue_limit = 1000;
    // Filter's annotation patch is written behind the reply (see above) by this many writers.
    bool write_behind = true;
    int patch_threads = 4;
    // How long Bind waits for the pod's filter patch to land.
    absl::Duration patch_wait = absl::Seconds(30);
    // How long after an accepted Binding the pod's reservation is kept, past its TTL, while
    // the informer has not observed the pod bound.
    absl::Duration bound_hold = absl::Minutes(10);
  };
  struct Deps {
    ledger::Ledger* ledger = nullptr;
    kube::ApiClient* client = nullptr;
    Clock* clock = nullptr;
    PodLookup lookup;  // may be null: every lookup goes to the API
  };

  Scheduler(Options options, Deps deps);
  ~Scheduler();  // drains the event queue
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // `outcome`, when given, receives the filter's outcome as Stats::filter_outcomes names it.
  FilterResult Filter(const FilterArgs& args, std::string* outcome = nullptr);
  // `outcome`, when given, receives the bind's outcome as Stats::bind_outcomes names it.
  BindResult Bind(const BindArgs& args, std::string* outcome = nullptr);

  // Ends every reservation past its expiry (Ledger::ExpireReservations) and returns them,
  // except those of pods whose bind is in progress or bound but not yet observed (see above).
  std::vector<ledger::Reservation> ExpireReservations(absl::Time now);

  // Ends every reservation made before `list_started` (its expiry minus reservation_ttl is
  // earlier) whose pod `present` does not know, and returns them. `present` is called under
  // the scheduler's decision lock and must not call the scheduler.
  std::vector<ledger::Reservation> ReleaseAbsent(
      absl::Time list_started, const std::function<bool(std::string_view uid)>& present);

  Stats stats() const;

  // Blocks until every event queued so far has been sent (or failed). For tests and shutdown.
  void FlushEvents();

 private:
  // One filter's annotation patch, from the decision until Bind consumes it.
  struct PendingPatch {
    uint64_t seq = 0;
    bool done = false;
    absl::Status status;           // when done
    std::optional<kube::Pod> pod;  // the patched pod, when done and ok
    absl::Time created;
  };
  struct PatchJob {
    std::string ns, name, uid;
    uint64_t seq = 0;
    kube::MetadataPatch patch;
    std::shared_ptr<PendingPatch> pending;
  };

  struct Event {
    kube::Pod pod;  // ns, name, uid are used
    std::string reason;
    std::string message;
    bool warning = false;
  };

  FilterResult FilterNodes(const FilterArgs& args, const device::PodRequest& request,
                           const device::PodConstraints& constraints);
  // *still_held is set when the binding was refused because the pod is bound already: its
  // reservation then stays (see "Reservations and bind").
  absl::Status BindManaged(const kube::Pod& pod, const BindArgs& args, std::string* outcome,
                           bool* still_held);
  // Whether the API server has pod (same uid) bound to a node now; false on any error.
  bool StillBound(const kube::Pod& pod);
  // Replaces the pod's reservation by `devices` on `node` and checks every device is within
  // capacity; on failure nothing stays reserved.
  absl::Status Recheck(const kube::Pod& pod, std::string_view node,
                       const device::PodDevices& devices, int32_t init_count);
  // The state of the pod a node lock names: from the lookup unless `fresh`, else a GET.
  absl::StatusOr<NodeLockHolder> LockHolder(std::string_view ns, std::string_view name, bool fresh);
  // Filter step 1b: OK when `claimed` and the stored pod of its name are the same pending pod.
  absl::Status CheckPending(const kube::Pod& claimed);
  absl::StatusOr<kube::Pod> FindPod(std::string_view ns, std::string_view name);
  void Record(const kube::Pod& pod, std::string reason, std::string message, bool warning);
  void EventLoop();
  void PatchLoop();
  // Writes one filter patch and settles its reservation; returns the patch's status.
  absl::Status WritePatch(const PatchJob& job, std::optional<kube::Pod>* patched);
  // Waits for the pod's pending filter patch (if any) and takes it out of the table.
  // nullopt: none pending.
  std::optional<std::shared_ptr<PendingPatch>> TakePatch(const std::string& uid);
  // Counts the outcome and, when `outcome_out` is given, stores it there.
  void CountFilter(std::string_view outcome, absl::Duration took,
                   std::string* outcome_out = nullptr);
  void CountBind(std::string_view outcome, absl::Duration took);

  const Options options_;
  ledger::Ledger* const ledger_;
  kube::ApiClient* const client_;
  Clock* const clock_;
  const PodLookup lookup_;

  // Serialises snapshot → decide → reserve (and the bind re-check) across all callers.
  Mutex decide_mu_;
  // uid → sequence number of the pod's latest reservation made by Filter (to undo only our own).
  absl::flat_hash_map<std::string, uint64_t> filter_seq_ ABSL_GUARDED_BY(decide_mu_);
  // Pods whose bind re-reserved their devices: the bind is in progress (InfiniteFuture) or its
  // Binding was accepted at the time given and the informer has not yet observed the pod bound.
  // ExpireReservations keeps their reservations (see "Reservations and bind" above).
  absl::flat_hash_map<std::string, absl::Time> binding_ ABSL_GUARDED_BY(decide_mu_);
  // "ns/name" of every pod a Bind call is handling: a second bind of the same pod meanwhile is
  // refused at once, so that its failure can never release what the first one holds.
  absl::flat_hash_set<std::string> binds_in_flight_ ABSL_GUARDED_BY(decide_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(decide_mu_) = 0;

  // Binds in the lock step with a wait allowed (see max_lock_waiters).
  std::atomic<int> lock_waiters_{0};

  mutable Mutex stats_mu_;
  Stats stats_ ABSL_GUARDED_BY(stats_mu_);

  Mutex events_mu_;
  CondVar events_cv_;
  std::deque<Event> events_ ABSL_GUARDED_BY(events_mu_);
  bool events_busy_ ABSL_GUARDED_BY(events_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(events_mu_) = false;
  int64_t last_event_nanos_ ABSL_GUARDED_BY(events_mu_) = 0;
  std::thread event_thread_;

  Mutex patch_mu_;
  // Two conditions, so that a finished patch wakes only the binds waiting for one, and a new
  // job only one idle writer (one shared condition woke every idle writer twice per patch).
  CondVar patch_work_cv_;  // patch_queue_ non-empty, or patch_stopping_
  CondVar patch_done_cv_;  // some PendingPatch became done
  // uid → the pod's latest filter patch (pending, or done and not yet consumed by Bind).
  absl::flat_hash_map<std::string, std::shared_ptr<PendingPatch>> patches_
      ABSL_GUARDED_BY(patch_mu_);
  std::deque<PatchJob> patch_queue_ ABSL_GUARDED_BY(patch_mu_);
  bool patch_stopping_ ABSL_GUARDED_BY(patch_mu_) = false;
  std::vector<std::thread> patch_threads_;
};

}  // namespace tessera::extender

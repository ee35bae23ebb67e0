// File: tessera/extender/scheduler.h
//
// Scheduler answers kube-scheduler's /filter and /bind for `tessera serve` (docs/hami-protocol.md
// §4.2, §4.8) over the ledger (tessera/ledger/ledger.h) and the Kubernetes client. The HTTP
// layer decodes the extender JSON (wire.h) and calls these. The steps of each call, and how
// reservations survive a bind, are in docs/serve.md ("Filter and bind").
//
//   Scheduler scheduler(options, {&ledger, &client, clock, lookup});
//   FilterOutcome f;
//   FilterResult r = scheduler.Filter(args, &f);   // always a reply; errors go in r.error
//   BindOutcome b;
//   BindResult br = scheduler.Bind(bind_args, &b);  // empty br.error = bound
//
// Filter decides under one lock shared by every filter and bind re-check, so two filters never
// reserve the same capacity; its annotation patch goes to a PatchWriter (patch_writer.h) and
// its events to an EventRecorder (event_recorder.h), and a filter that finds no node hands its
// verdict (verdict.h) to a VerdictWriter (verdict_writer.h), all owned here. Bind takes the pod's
// patch, HAMi's node lock (node_lock.h), re-checks the devices and posts the Binding.
//
// Errors: Filter and Bind never return a Status: a failure is the reply's error text (what
// kube-scheduler shows), and the typed outcome says which failure it was.
//
// Thread safety: Filter, Bind, ExpireReservations and ReleaseAbsent may be called concurrently
// from any thread. The ledger, client, clock and lookup must be thread-safe and outlive the
// Scheduler. The destructor writes the queued patches and sends the queued events.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

#include "tessera/accounting/quota_book.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/busy_nodes.h"
#include "tessera/extender/event_recorder.h"
#include "tessera/extender/node_lock.h"
#include "tessera/extender/patch_writer.h"
#include "tessera/extender/refit.h"
#include "tessera/extender/verdict_writer.h"
#include "tessera/extender/wire.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {

// A pod by namespace and name from a local cache (the informer store), or nullopt on a miss.
using PodLookup =
    std::function<std::optional<kube::Pod>(std::string_view ns, std::string_view name)>;

// What a Filter call did. kube-scheduler's framework gives a Status a code plus its reasons;
// this is the same for the extender: the code, and for kNoFit the reason of every node.
enum class FilterCode : uint8_t {
  kFit,          // a node was chosen (reserved and patched, unless the request was simulated)
  kNoFit,        // no candidate fits: FailedNodes carries HAMi's reasons
  kPassThrough,  // the pod asks for no managed device: the input is echoed, nothing written
  kError,        // the reply carries an error
};
// "fit", "no_fit", "pass_through", "error" (logs and tests).
std::string_view FilterCodeName(FilterCode code);

// The typed failures of the decision cycle (cycle/diagnosis.h), under the names this library's
// outcomes, verdicts and metrics have always used.
using cycle::FailedNode;
using cycle::FailedNodeOf;
using cycle::kNodeFailureCount;
using cycle::NodeFailure;
using cycle::NodeFailureLabel;

struct FilterOutcome {
  FilterCode code = FilterCode::kError;
  // A Nodes request (nodeCacheCapable: false): decided without reservation, patch or event.
  bool simulated = false;
  // kNoFit: every candidate (once, however often the request names it), in candidate order;
  // empty for other codes.
  std::vector<FailedNode> failed_nodes;
  // The namespace quota refused a card: "namespace ml: limits.nvidia.com/gpumem 40000, used
  // 36000 + 8000 asked" (schedule::QuotaMissText); empty otherwise.
  std::string quota;
  // The request body's pod asked for other devices or constraints than the stored pod of its
  // uid (a forged or stale body); the stored pod was decided on. Always false when simulated.
  bool stale_body = false;
};

// What a Bind call did. Refusals change nothing; failures release what the bind took.
enum class BindCode : uint8_t {
  kBound,
  kInProgress,        // another bind of the pod is in progress (refused)
  kPodNotFound,       // the pod is gone, or was recreated under its name
  kNotOurs,           // another scheduler's pod, or one asking for no managed device (refused)
  kNodeUnregistered,  // the node has no device registration (refused)
  kNoAllocation,      // the pod carries no filter decision for this node
  kLockHeld,          // another pod holds the node lock
  kLockError,         // the node lock could not be read or written
  kDevicesNotFree,    // the re-check found the devices taken
  kPatchFailed,       // the filter's annotation patch failed
  kBindingRejected,   // the pod is bound or being deleted already, or the Binding failed
  kError,             // invalid names, an unreadable request, an API error, a patch in flight
};
// "bound", "in_progress", "pod_not_found", "not_ours", "node_unregistered", "no_allocation",
// "lock_held", "lock_error", "devices_not_free", "patch_failed", "binding_rejected", "error".
std::string_view BindCodeName(BindCode code);

struct BindOutcome {
  BindCode code = BindCode::kError;
  // The node lock step, when the bind got that far.
  std::optional<NodeLockOutcome> lock;  // how the lock was had (when it was)
  int lock_conflicts = 0;               // 409s retried while taking it
  // The lock was held by another pod and this bind waited for it (node_lock_retry_timeout):
  // then either acquired after `lock_waited` or gave up (code kLockHeld).
  bool lock_wait = false;
  absl::Duration lock_waited;
  std::string lock_version;  // the node's resourceVersion after the lock step
};

class Scheduler {
 public:
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
    // Filter's annotation patch is written behind the reply (patch_writer.h) by this many
    // writers; with write_behind false it is written before the reply and a failure is the
    // filter's error.
    bool write_behind = true;
    int patch_threads = 16;
    // How long Bind waits for the pod's filter patch to land.
    absl::Duration patch_wait = absl::Seconds(30);
    // How long after an accepted Binding the pod's reservation is kept, past its TTL, while
    // the informer has not observed the pod bound.
    absl::Duration bound_hold = absl::Minutes(10);
    // Filter prefers fitting nodes no other pod's bind occupies (busy_nodes.h; false: HAMi's
    // choice whatever the locks, --avoid-busy-nodes). `node_lock` reads a node's
    // hami.io/mutex.lock and resourceVersion from the informer; null: only this replica's
    // decisions count.
    bool avoid_busy_nodes = true;
    BusyNodes::LockOf node_lock;
    // After a successful bind its node counts as busy until the informer's copy of the node is
    // as new as the bind's lock write, at most this long (under load the node's watch events
    // trail the API calls by seconds).
    absl::Duration busy_after_bind = absl::Seconds(30);
    // A filter that leaves a pod without a node writes its verdict (verdict.h) through a
    // VerdictWriter while is_leader() holds (null: always); false: never.
    bool verdicts = true;
    std::function<bool()> is_leader;
    // For the verdict: whether a registered node withholds its devices
    // (VerdictInput::withheld); null: none does.
    std::function<bool(std::string_view node)> withheld;
    // Called after a filter (not a simulated one) refused `pod` on every node it was sent, with
    // those nodes' names (self-preemption, self_preempt.h). Null: nobody is told.
    std::function<void(const kube::Pod& pod, std::vector<std::string> nodes)> refused;
  };
  struct Deps {
    ledger::Ledger* ledger = nullptr;
    kube::ApiClient* client = nullptr;
    Clock* clock = nullptr;
    PodLookup lookup;  // may be null: every lookup goes to the API
    // Namespace quota limits (docs/quota.md); null: no namespace is limited. Must outlive the
    // Scheduler.
    const accounting::QuotaBook* quotas = nullptr;
  };

  Scheduler(Options options, Deps deps);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // `outcome`, when given, receives what the call did.
  FilterResult Filter(const FilterArgs& args, FilterOutcome* outcome = nullptr);
  BindResult Bind(const BindArgs& args, BindOutcome* outcome = nullptr);

  // POST /refit (refit.h): moves one container's pending allocation onto the cards kubelet
  // allows, under the decision lock Filter holds (the lock is also held across the annotation
  // patch, so no filter can take the chosen capacity meanwhile). Never fails: a refusal is the
  // response's failure_reason; once the pod is known, every outcome but "already allowed" is
  // also a NumaRefitSucceed/NumaRefitFailed event. Rules: docs/serve.md "NUMA refit".
  RefitResponse Refit(const RefitRequest& request);

  // Ends every reservation past its expiry (Ledger::ExpireReservations) and returns them,
  // except those of pods whose bind is in progress or bound but not yet observed (kept up to
  // bound_hold after the Binding). The hook for the lead's periodic loop.
  std::vector<ledger::Reservation> ExpireReservations(absl::Time now);

  // After a full LIST of the pods (a relist or a resync pass): ends every reservation made
  // before `list_started` (its expiry minus reservation_ttl is earlier) whose pod `present`
  // does not know, and returns them. `present` is called under the scheduler's decision lock
  // and must not call the scheduler.
  std::vector<ledger::Reservation> ReleaseAbsent(
      absl::Time list_started, const std::function<bool(std::string_view uid)>& present);

  // Holds the share a preemption frees for `pod` (docs/preemption.md "The nominated
  // reservation"): until reservation_ttl passes, every filter first checks whether `pod` now
  // fits on one of `nodes` (its victims gone) and, when it does, reserves that fit for it — an
  // ordinary reservation from then on — before deciding for anyone else. Replaces the pod's
  // earlier nomination; ends when the pod's own filter reserves, or it is bound, deleted or
  // expires.
  void Nominate(const kube::Pod& pod, std::vector<std::string> nodes);
  // Settles the nominations now (the requeue's round, before it requeues anyone) and returns
  // the reservations made.
  std::vector<ledger::Reservation> SettleNominations();
  // Why preemption did not help pod `uid` (Verdict::preemption), for the verdict of its next
  // refusal; an empty note forgets it. Notes of pods no longer refused are dropped by
  // ExpireReservations.
  void NotePreemption(std::string_view uid, std::string note);
  // How many nominations wait for their share; whether pod `uid` has one.
  size_t Nominated() const;
  bool IsNominated(std::string_view uid) const;

  // The event sender (Flush, counts): for tests and shutdown.
  EventRecorder& events() { return events_; }
  // The verdicts of pending pods (counts for the metric, Retain for housekeeping).
  VerdictWriter& verdicts() { return verdicts_; }

 private:
  // A Nodes request (nodeCacheCapable: false): the cycle over the live ledger, nothing reserved.
  FilterResult FilterNodes(const FilterArgs& args, const kube::Pod& pod,
                           const cycle::Decoded& decoded, FilterOutcome* outcome);
  // *still_held is set when the binding was refused because the pod is bound already: its
  // reservation then stays (docs/serve.md, "Reservations and bind").
  absl::Status BindManaged(const kube::Pod& pod, const BindArgs& args, BindOutcome* outcome,
                           bool* still_held);
  // Posts the Binding at the resourceVersion of `pod`, the copy whose decision was checked. A 409
  // is answered by a GET: a pod bound meanwhile sets *bound_already; one whose decision changed
  // (another replica filtered it again) is refused; an unrelated change is bound again at the new
  // version.
  absl::Status PostBinding(const kube::Pod& pod, std::string_view node,
                           const kube::ApiClient::Annotations& annotations, bool* bound_already);
  // OK when the allocation the pod carries (`alloc`, and its to-allocate annotation, which the
  // device plugin hands out) is the decision of the filter's live reservation, or when there is
  // no reservation; FailedPrecondition naming the annotation that was changed otherwise.
  absl::Status CheckDecided(const kube::Pod& pod, const ledger::PodAllocation& alloc);
  // Replaces the pod's reservation by `devices` (and their MIG placements `mig`) on `node` and
  // checks every device is within capacity and no MIG card it uses or its placements name fails
  // closed or has overlapping placements; on failure nothing stays reserved.
  absl::Status Recheck(const kube::Pod& pod, std::string_view node,
                       const device::PodDevices& devices, int32_t init_count,
                       const std::vector<device::MigAllocation>& mig);
  // The state of the pod a node lock names: from the lookup unless `fresh`, else a GET.
  absl::StatusOr<NodeLockHolder> LockHolder(std::string_view ns, std::string_view name, bool fresh);
  // Filter step 2 (docs/serve.md): OK when `claimed` (the request's pod) and the stored pod of
  // its name are the same pending pod. `*stored` is the cache's copy when it has `claimed`'s uid;
  // otherwise the API server's copy is read into it. Returns the resourceVersion of the stored
  // copy checked (the filter patch's precondition).
  absl::StatusOr<std::string> CheckPending(const kube::Pod& claimed,
                                           std::optional<kube::Pod>* stored);
  absl::StatusOr<kube::Pod> FindPod(std::string_view ns, std::string_view name);
  // PatchWriter's settle: ends the filter's reservation when its patch failed (unless a newer
  // filter of the pod replaced it).
  void SettlePatch(const PatchWriter::Job& job, const absl::Status& status);
  // The verdict of a filter that found no node (the cycle's diagnosis), offered to verdicts_
  // (verdict.h).
  void OfferVerdict(const kube::Pod& pod, const device::PodRequest& request,
                    const std::vector<schedule::Candidate>& candidates,
                    const cycle::Diagnosis& diagnosis, std::string_view checked_version);

  // A preemptor waiting for its victims to leave (Nominate).
  struct Nomination {
    kube::Pod pod;
    std::vector<std::string> nodes;
    absl::Time expires_at;
  };
  // Reserves for each nomination whose pod fits on one of its nodes now, except the pod
  // `deciding` (its own filter decides); drops those that ended.
  std::vector<ledger::Reservation> SettleNominationsLocked(absl::Time now,
                                                           std::string_view deciding)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(decide_mu_);

  const Options options_;
  ledger::Ledger* const ledger_;
  const accounting::QuotaBook* const quotas_;
  kube::ApiClient* const client_;
  Clock* const clock_;
  const PodLookup lookup_;
  // The decision cycle's defaults and quotas (Filter, FilterNodes).
  const cycle::Config cycle_config_{options_.node_policy, options_.gpu_policy, quotas_};

  // Serialises snapshot → decide → reserve (and the bind re-check) across all callers.
  mutable Mutex decide_mu_;
  // uid → sequence number of the pod's latest reservation made by Filter (to undo only our own).
  absl::flat_hash_map<std::string, uint64_t> filter_seq_ ABSL_GUARDED_BY(decide_mu_);
  // Pods whose bind re-reserved their devices: the bind is in progress (InfiniteFuture) or its
  // Binding was accepted at the time given and the informer has not yet observed the pod bound.
  // ExpireReservations keeps their reservations (docs/serve.md, "Reservations and bind").
  absl::flat_hash_map<std::string, absl::Time> binding_ ABSL_GUARDED_BY(decide_mu_);
  // "ns/name" of every pod a Bind call is handling: a second bind of the same pod meanwhile is
  // refused at once, so that its failure can never release what the first one holds.
  absl::flat_hash_set<std::string> binds_in_flight_ ABSL_GUARDED_BY(decide_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(decide_mu_) = 0;
  // Preemptor uid → its nomination (Nominate).
  absl::flat_hash_map<std::string, Nomination> nominations_ ABSL_GUARDED_BY(decide_mu_);
  // A settle with neither a new nomination, a capacity change (the ledger's version at the last
  // settle's start) nor an expiry due since has nothing to do: the filters skip it.
  bool nominations_changed_ ABSL_GUARDED_BY(decide_mu_) = false;
  uint64_t settled_version_ ABSL_GUARDED_BY(decide_mu_) = 0;
  absl::Time next_nomination_expiry_ ABSL_GUARDED_BY(decide_mu_) = absl::InfiniteFuture();
  // Pod uid → why preemption did not help it (NotePreemption).
  mutable Mutex notes_mu_;
  absl::flat_hash_map<std::string, std::string> preemption_notes_ ABSL_GUARDED_BY(notes_mu_);

  // Binds in the lock step with a wait allowed (see max_lock_waiters).
  std::atomic<int> lock_waiters_{0};
  BusyNodes busy_;

  // Declared last: destroyed first, so the writers finish (and settle) while the rest lives.
  EventRecorder events_;
  VerdictWriter verdicts_;
  PatchWriter patches_;
};

}  // namespace tessera::extender

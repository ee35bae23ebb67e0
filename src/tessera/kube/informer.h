// File: tessera/kube/informer.h
//
// Informer<T> (T = Pod, Node or ResourceQuota): a Reflector feeding a Store, with event handlers
// delivered in order on one worker thread — client-go's shared informer with one listener. The
// store is updated before each handler runs; a relist replaces it wholesale, whatever the
// resourceVersions. Reconcile() takes a list its caller LISTed from the API server and repairs
// the store against it (the resync layer), or relists when that list proves the API server went
// back in time. Delivery order, tombstones, the resourceVersion rule of Reconcile and rollbacks:
// docs/kube-client.md "The informer" and "Rollbacks".
//
//   Informer<Pod> pods(&client, opts, {.on_add = ..., .on_update = ..., .on_delete = ...});
//   pods.Start();  pods.WaitForSync(absl::Seconds(30));  pods.store().ListByNode("node-a");
//
// Errors: API errors are retried by the reflector (counters()); an exception escaping a handler
// terminates the process (an event is never skipped silently). Time comes from the injected
// Clock; after advancing a FakeClock call Wake().
//
// Thread safety: Start, Stop, HasSynced, WaitForSync, Wake, counters and store() from any thread
// (Stop not from a handler). The worker is a WorkQueue thread named "inf-<name>", joined by Stop.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/base/work_queue.h"
#include "tessera/kube/client.h"
#include "tessera/kube/reflector.h"
#include "tessera/kube/store.h"

namespace tessera::kube {

template <typename T>
struct EventHandlers {
  std::function<void(const T& obj, bool in_initial_list)> on_add;
  std::function<void(const T& old_obj, const T& new_obj)> on_update;
  std::function<void(const T& obj, bool final_state_unknown)> on_delete;
  // After every LIST (the first and each relist) has been delivered: `list_started` is when the
  // LIST was sent (its snapshot is no older), `initial` whether it was the first. The store then
  // holds exactly the LIST's objects. Optional.
  std::function<void(absl::Time list_started, bool initial)> on_listed;
};

struct InformerCounters {
  ReflectorCounters reflector;
  int64_t adds = 0;
  int64_t updates = 0;     // resync re-deliveries excluded
  int64_t deletes = 0;     // tombstones excluded
  int64_t tombstones = 0;  // deletions found by a relist
  int64_t resyncs = 0;     // resync passes
  int64_t reconciles = 0;  // Reconcile() passes run
  int64_t reconcile_missing = 0;
  int64_t reconcile_stale = 0;
  int64_t reconcile_gone = 0;
  int64_t reconcile_rollbacks = 0;  // Reconcile() passes that found a rollback and relisted
};

// What one Reconcile() did.
struct ReconcileResult {
  bool ran = false;  // false: the informer stopped, or had not synced, before it could run
  size_t listed = 0;
  size_t stored = 0;  // objects in the store before the repairs
  int64_t missing = 0;
  int64_t stale = 0;
  int64_t gone = 0;
  int64_t undecided = 0;  // objects skipped because a resourceVersion is not an integer
  // The list proved that the API server went back in time (an etcd restore): nothing was
  // repaired by resourceVersion, the informer relists instead (its relist replaces the store).
  bool rolled_back = false;
  // One line per repair (at most 100): "<kind> <key> uid=<uid> rv=<stored>→<listed>"; for a
  // rollback one line "rollback ..." with the evidence.
  std::vector<std::string> details;
};

template <typename T>
class Informer : private ReflectorSink<T> {
 public:
  struct Options {
    std::string name = "informer";
    ReflectorOptions reflector;
    // Zero: no resync. Otherwise at least one second.
    absl::Duration resync_period = absl::ZeroDuration();
    Clock* clock = Clock::Real();
  };

  // `client` must outlive the informer.
  Informer(ApiClient* client, Options options, EventHandlers<T> handlers);
  ~Informer() override;
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Has the worker start the first LIST. Call at most once.
  void Start();
  // Cancels the watch, stops delivering, and joins the worker. Idempotent.
  void Stop();

  bool HasSynced() const { return synced_.load(std::memory_order_acquire); }
  // Waits (real time) until HasSynced() or `timeout`; returns HasSynced().
  bool WaitForSync(absl::Duration timeout) const;
  // Makes the worker re-read the clock now (for fake clocks), then run `then` (if given) after
  // every task queued before: a test's proof that nothing else was due. `then` is destroyed
  // unrun when the informer stops first.
  void Wake(absl::AnyInvocable<void()> then = nullptr);

  const Store<T>& store() const { return store_; }
  InformerCounters counters() const;

  // Queues a comparison of `listed` — every object of a complete LIST (with the informer's
  // selectors) made by the caller from the API server, at resourceVersion
  // `list_resource_version` — with the store, run on the worker thread in order with the watch
  // deliveries; see "Reconcile" above for the repairs.
  // `done` runs on the worker thread with what was repaired; when the informer stops first it
  // is destroyed without being called (callers that wait must also watch for their own stop).
  // A Reconcile before HasSynced() repairs nothing (ran = false). Callers should pass lists in
  // the order they were taken (as one resyncer thread does). `seen_before_list` is
  // counters().reflector.last_resource_version read before the LIST was sent ("": unknown); a
  // list below it, or a list contradicting what the informer delivered at or below the list's
  // revision, shows that the API server went back in time: then the informer relists
  // (ReconcileResult::rolled_back) instead of repairing.
  void Reconcile(std::vector<T> listed, std::string list_resource_version,
                 std::string seen_before_list, absl::AnyInvocable<void(ReconcileResult)> done);
  void Reconcile(std::vector<T> listed, std::string list_resource_version,
                 absl::AnyInvocable<void(ReconcileResult)> done) {
    Reconcile(std::move(listed), std::move(list_resource_version), {}, std::move(done));
  }

 private:
  // The worker's clock check (the queue's tick): runs due retries and resyncs, and returns how
  // long the worker may wait for a task.
  absl::Duration Tick();
  void OnReplace(std::vector<T> items, const std::string& resource_version,
                 absl::Time list_started) override;
  void OnEvent(WatchEvent<T> event) override;
  void MaybeResync(absl::Time now);
  ReconcileResult DoReconcile(std::vector<T> listed, const std::string& list_rv,
                              const std::string& seen_before_list);
  // Evidence in `listed` (at revision `list_rv`) that the API server went back in time, or "".
  std::string RollbackEvidence(const std::vector<T>& listed, const std::string& list_rv,
                               const std::string& seen_before_list) const;
  void NoteDeleted(const T& obj, uint64_t rv);
  template <typename F>
  void Count(F f) {
    MutexLock lock(&counters_mu_);
    f(counters_);
  }

  const Options options_;
  const EventHandlers<T> handlers_;
  Store<T> store_;
  std::atomic<bool> started_{false};  // before queue_: its worker reads it from the start
  // The worker, from construction (idle until Start); its tick runs the reflector's retries and
  // the resync between tasks. kDiscard: Stop ends delivery after the running task. Shared with
  // the reflector's `post`, which transport callbacks copy and may call after Stop (refused).
  const std::shared_ptr<WorkQueue> queue_;
  Reflector<T> reflector_;
  std::atomic<bool> synced_{false};
  absl::Time next_resync_ = absl::InfiniteFuture();  // worker only
  // uids this informer delivered as deleted, with the revision known to cover the deletion, in
  // delivery order (worker only). Pruned by Reconcile (entries its list already reflects), by a
  // relist (uids it lists, revisions above it) and bounded in size.
  std::deque<std::pair<uint64_t, std::string>> deleted_uids_;
  absl::flat_hash_map<std::string, uint64_t> deleted_uid_set_;  // uid → its revision above

  mutable Mutex sync_mu_;
  mutable CondVar sync_cv_;

  mutable Mutex counters_mu_;
  InformerCounters counters_ ABSL_GUARDED_BY(counters_mu_);
};

extern template class Informer<Pod>;
extern template class Informer<Node>;
extern template class Informer<ResourceQuota>;

using PodInformer = Informer<Pod>;
using NodeInformer = Informer<Node>;
using ResourceQuotaInformer = Informer<ResourceQuota>;

}  // namespace tessera::kube

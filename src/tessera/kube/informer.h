// File: tessera/kube/informer.h
//
// Informer<T> (T = Pod or Node): a Reflector (reflector.h) feeding a Store (store.h), with event
// handlers delivered in order on one worker thread. It is the C++ counterpart of a client-go
// shared informer with one listener:
//
//   Informer<Pod>::Options opts;  opts.name = "pods";  opts.resync_period = absl::Hours(1);
//   Informer<Pod> pods(&client, opts, {.on_add = ..., .on_update = ..., .on_delete = ...});
//   pods.Start();
//   pods.WaitForSync(absl::Seconds(30));
//   for (auto& p : pods.store().ListByNode("node-a")) { ... }
//
// Delivery (all on the worker thread, in the order the server produced the changes):
//   - a LIST (the first and every relist): first every object that was in the store but is not
//     in the new list, as on_delete(last known object, final_state_unknown = true) — each such
//     tombstone is delivered exactly once, as the object then leaves the store; then every listed
//     object, as on_update(old, new) when its key was known and on_add(obj, in_initial_list)
//     otherwise (in_initial_list is true for the first LIST only);
//   - a watch event: ADDED / MODIFIED as on_add or on_update depending on whether the key is
//     known; DELETED as on_delete(obj, false) with the event's object (the last state);
//   - every `resync_period` (if non-zero), on_update(obj, obj) for every cached object.
//   - a Reconcile() (below): its repairs, as on_add / on_update / on_delete(obj, true).
//   The store is updated before the handler runs, so a handler sees the store with its change.
// HasSynced() is true once the first LIST has been delivered to the handlers.
// Handlers must not block for long (they delay the informer, not other informers) and must not
// call Stop(). An exception escaping a handler terminates the process: an event is never
// skipped silently.
//
// Reconcile (the resync layer of docs/self-healing.md): a caller that LISTed the objects from the
// API server itself hands the complete list and its resourceVersion L to Reconcile(); the
// worker thread compares it with the store, between two watch deliveries, and repairs:
//   missing — a listed object whose key the store lacks: stored and delivered as on_add(obj,
//             false), unless its uid was deleted by a delivery this informer made (a watch
//             DELETED or a relist tombstone) since the last Reconcile that covered it: then the
//             deletion is newer than the list and the object stays gone;
//   stale   — a listed object whose stored copy has an older resourceVersion (or, with a
//             different uid, is an older object under the same key): stored and delivered as
//             on_update(stored, listed);
//   gone    — a stored object whose key the list lacks and whose resourceVersion is <= L:
//             it existed no later than L and not at L, so it was deleted; removed and
//             delivered as on_delete(stored, final_state_unknown = true). A stored object newer
//             than L was created (or changed) after the LIST and is kept.
// The ordering rule: resourceVersions are compared as unsigned integers. Kubernetes documents
// them as opaque, but every etcd-backed API server (and apisim) uses one monotonically
// increasing revision for all objects, which is what this relies on. A resourceVersion that is
// not an integer makes the object undecidable: it is skipped (counted as `undecided`), never
// repaired. So a repair never rolls back what the watch delivered after the LIST.
//
// Time is read from the injected Clock (backoff, watch timeouts, resync). With a FakeClock,
// call Wake() after advancing it so the worker looks again without waiting for its next poll.
//
// Thread safety: Start, Stop, HasSynced, WaitForSync, Wake, counters and store() may be called
// from any thread (not from a handler for Stop). The worker thread is named after
// options.name ("inf-" prefix, at most 15 characters) and joined by Stop / the destructor.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
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
  // One line per repair (at most 100): "<kind> <key> uid=<uid> rv=<stored>→<listed>".
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

  // Starts the worker thread, which starts the first LIST. Call at most once.
  void Start();
  // Cancels the watch, stops delivering, and joins the worker. Idempotent.
  void Stop();

  bool HasSynced() const { return synced_.load(std::memory_order_acquire); }
  // Waits (real time) until HasSynced() or `timeout`; returns HasSynced().
  bool WaitForSync(absl::Duration timeout) const;
  // Makes the worker re-read the clock now (for fake clocks).
  void Wake();

  const Store<T>& store() const { return store_; }
  InformerCounters counters() const;

  // Queues a comparison of `listed` — every object of a complete LIST made by the caller from
  // the API server, at resourceVersion `list_resource_version` — with the store, run on the
  // worker thread in order with the watch deliveries; see "Reconcile" above for the repairs.
  // `done` runs on the worker thread with what was repaired; when the informer stops first it
  // is destroyed without being called (callers that wait must also watch for their own stop).
  // A Reconcile before HasSynced() repairs nothing (ran = false). Callers should pass lists in
  // the order they were taken (as one resyncer thread does).
  void Reconcile(std::vector<T> listed, std::string list_resource_version,
                 absl::AnyInvocable<void(ReconcileResult)> done);

 private:
  using Task = absl::AnyInvocable<void()>;
  struct Mailbox {
    Mutex mu;
    CondVar cv;
    std::deque<Task> tasks ABSL_GUARDED_BY(mu);
    bool closed ABSL_GUARDED_BY(mu) = false;
    bool wake ABSL_GUARDED_BY(mu) = false;
  };

  void Run();
  void OnReplace(std::vector<T> items, const std::string& resource_version,
                 absl::Time list_started) override;
  void OnEvent(WatchEvent<T> event) override;
  void MaybeResync(absl::Time now);
  ReconcileResult DoReconcile(std::vector<T> listed, const std::string& list_rv);
  void NoteDeleted(const T& obj, uint64_t rv);
  template <typename F>
  void Count(F f) {
    MutexLock lock(&counters_mu_);
    f(counters_);
  }

  const Options options_;
  const EventHandlers<T> handlers_;
  Store<T> store_;
  std::shared_ptr<Mailbox> mailbox_;
  Reflector<T> reflector_;
  std::atomic<bool> synced_{false};
  absl::Time next_resync_ = absl::InfiniteFuture();  // worker only
  // uids this informer delivered as deleted, with the revision known to cover the deletion, in
  // delivery order (worker only). Pruned by Reconcile (entries its list already reflects) and
  // bounded in size.
  std::deque<std::pair<uint64_t, std::string>> deleted_uids_;
  absl::flat_hash_set<std::string> deleted_uid_set_;

  Mutex thread_mu_;
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  bool started_ ABSL_GUARDED_BY(thread_mu_) = false;

  mutable Mutex sync_mu_;
  mutable CondVar sync_cv_;

  mutable Mutex counters_mu_;
  InformerCounters counters_ ABSL_GUARDED_BY(counters_mu_);
};

extern template class Informer<Pod>;
extern template class Informer<Node>;

using PodInformer = Informer<Pod>;
using NodeInformer = Informer<Node>;

}  // namespace tessera::kube

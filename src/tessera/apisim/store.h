// File: tessera/apisim/store.h
//
// The in-memory object store behind `tessera apisim`: Kubernetes semantics without etcd.
//
// - One revision counter for every resource. Each write (create, update, patch, binding,
//   delete, the simulated kubelet finishing a graceful delete) takes the next revision, stamps
//   it into the object's metadata.resourceVersion and appends one event to a bounded history.
//   Objects are kept serialised; a write parses once (nlohmann) and serialises once, reads and
//   watch fan-out only copy text.
// - The history serves watches from a resourceVersion and consistent paged lists: a LIST page
//   at revision R is the current state with every later change undone. Revisions older than the
//   history (or compacted away with Compact()) answer 410 Expired.
// - Pods get the API server's graceful deletion: a bound, non-terminal pod gets
//   deletionTimestamp and disappears when its grace period ends (Reap) or it turns terminal.
// - Fault injection that acts on the data path: dropped watch events (lost for every watcher,
//   also on resume), paused watches, severed watch streams, and a rollback (Snapshot, then
//   Restore: what an etcd snapshot restore does to the API server).
//
// Errors are absl::Status values built by ApiError(); HttpCodeOf()/ReasonOf() recover the
// Kubernetes Status code and reason (404 NotFound, 409 AlreadyExists/Conflict, 410 Expired,
// 400 BadRequest, 422 Invalid, 504 Timeout, ...). ToStatusJson() renders the Status body.
//
// Thread safety: every Store method may be called from any thread. WatchStream is used by one
// thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json_fwd.hpp"

#include "tessera/apisim/patch.h"
#include "tessera/apisim/selector.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"

namespace tessera::apisim {

// ---- errors -------------------------------------------------------------------------------

struct ApiErrorDetails {
  std::string name;
  std::string group;
  std::string kind;  // the resource, as the API server puts it ("pods")
  int retry_after_seconds = 0;
  std::string cause_reason;  // details.causes[0].reason, when set
  std::string cause_message;
  std::string cause_field;
  std::string list_continue;  // the Status's metadata.continue (an expired token's successor)
};

// An error as the API server reports it. `code` is the HTTP status, `reason` the Status reason.
absl::Status ApiError(int code, std::string_view reason, std::string_view message,
                      const ApiErrorDetails& details = {});
// 500 for a status that did not come from ApiError.
int HttpCodeOf(const absl::Status& status);
std::string ReasonOf(const absl::Status& status);
int RetryAfterOf(const absl::Status& status);
// {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",...}
std::string ToStatusJson(const absl::Status& status);

// ---- resources ----------------------------------------------------------------------------

struct ResourceInfo {
  std::string group;    // "" for the core group
  std::string version;  // "v1"
  std::string name;     // plural, e.g. "pods"
  std::string singular;
  std::string kind;
  bool namespaced = true;
  bool has_status = false;  // a /status subresource exists and the main resource ignores status
  std::vector<std::string> short_names;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  std::string list_kind() const { return kind + "List"; }
};

// Every served resource, in discovery order.
const std::vector<ResourceInfo>& Resources();
// nullptr when the group/version/resource is not served.
const ResourceInfo* FindResource(std::string_view group, std::string_view version,
                                 std::string_view name);

// ---- options --------------------------------------------------------------------------------

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;        // "", "0" or a revision
  std::string resource_version_match;  // "", "Exact", "NotOlderThan"
  std::string continue_token;
  int64_t limit = 0;
};

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  std::string resource_version;
  std::string resource_version_match;
  bool allow_bookmarks = false;
  bool send_initial_events = false;
  bool send_initial_events_set = false;
  // <= 0: the API server default, 1800 s x rand[1,2).
  double timeout_seconds = 0;
};

struct WriteOptions {
  bool dry_run = false;
};

struct DropRule {
  std::string resource;  // "" = any
  std::string type;      // "ADDED" | "MODIFIED" | "DELETED" | "" = any
  double probability = 1.0;
  int64_t count = -1;  // events still to drop; < 0 = unlimited
};

// The fault configuration (PUT /simulator/v1/faults). Request failures and latency are applied
// by the HTTP layer; the store applies the watch faults.
struct Faults {
  std::vector<DropRule> drop_watch_events;
  bool pause_watches = false;
  double fail_probability = 0;
  int fail_code = 500;
  std::vector<std::string> fail_verbs;  // empty = every verb
  int latency_ms = 0;
  uint64_t seed = 1;
};

struct StoreOptions {
  size_t watch_history = 10000;  // events kept for watch resume and paged lists
  absl::Duration bookmark_interval = absl::Seconds(60);
  absl::Duration too_large_rv_wait = absl::Seconds(3);
};

// ---- the store ----------------------------------------------------------------------------

// One stored object version. Immutable once published.
struct StoredObject {
  std::string key;  // "namespace/name" or "name"
  std::string ns;
  std::string name;
  uint64_t rv = 0;
  std::string json;   // compact, with metadata.resourceVersion == rv
  size_t rv_pos = 0;  // where the revision digits sit in `json`
  size_t rv_len = 0;
  Fields labels;
  Fields fields;  // the selectable fields of the resource
  bool has_deletion = false;
  bool has_finalizers = false;
  bool terminal = false;  // pods: phase Succeeded or Failed

  // `json` with the revision replaced by `rv`.
  std::string JsonWithRv(uint64_t new_rv) const;
};
using ObjectPtr = std::shared_ptr<const StoredObject>;

enum class EventType { kAdded, kModified, kDeleted };

class Store;

// One open watch. Next() blocks for at most `max_wait` and returns what to send.
class WatchStream {
 public:
  enum class Step {
    kData,   // `out` holds one or more complete lines to send
    kIdle,   // nothing yet; call again (lets the caller notice a dead client)
    kEnd,    // finish the stream cleanly (timeout, or after an ERROR event in `out`)
    kAbort,  // break the connection without a clean end (severed, server stopping)
  };
  ~WatchStream();
  Step Next(std::string* out, absl::Duration max_wait);

 private:
  friend class Store;
  WatchStream() = default;

  Store* store_ = nullptr;
  const ResourceInfo* resource_ = nullptr;
  size_t resource_index_ = 0;
  std::string ns_;
  LabelSelector labels_;
  FieldSelector fields_;
  bool bookmarks_ = false;
  uint64_t cursor_ = 0;
  uint64_t sever_generation_ = 0;
  absl::Time deadline_;
  absl::Time next_bookmark_;
  bool final_bookmark_sent_ = false;
  bool send_initial_end_ = false;   // the k8s.io/initial-events-end bookmark is due
  std::vector<ObjectPtr> initial_;  // synthetic ADDED events still to send
  size_t initial_pos_ = 0;
  std::string pending_error_;  // an ERROR event to send, after which the stream ends
  bool ended_ = false;
};

class Store {
 public:
  explicit Store(StoreOptions options = {}, Clock* clock = Clock::Real());
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Creates the default namespaces (default, kube-system, kube-public, kube-node-lease) when
  // missing.
  void EnsureDefaultNamespaces();

  // GET of one object: its JSON, or 404.
  absl::StatusOr<std::string> Get(const ResourceInfo& r, std::string_view ns,
                                  std::string_view name);
  // LIST: the `<Kind>List` JSON. `ns` empty = all namespaces (or a cluster-scoped resource).
  absl::StatusOr<std::string> List(const ResourceInfo& r, std::string_view ns,
                                   const ListOptions& options);
  // POST: the created object. `ns` must name an existing namespace for namespaced resources.
  absl::StatusOr<std::string> Create(const ResourceInfo& r, std::string_view ns,
                                     std::string_view body, const WriteOptions& w = {});
  // PUT on the object (`subresource` "") or its status ("status").
  absl::StatusOr<std::string> Update(const ResourceInfo& r, std::string_view ns,
                                     std::string_view name, std::string_view subresource,
                                     std::string_view body, const WriteOptions& w = {});
  absl::StatusOr<std::string> Patch(const ResourceInfo& r, std::string_view ns,
                                    std::string_view name, std::string_view subresource,
                                    PatchType type, std::string_view body,
                                    const WriteOptions& w = {});
  // DELETE with an optional DeleteOptions body. Returns the object as it is after the call
  // (with deletionTimestamp while a graceful delete is pending).
  absl::StatusOr<std::string> Delete(const ResourceInfo& r, std::string_view ns,
                                     std::string_view name, std::string_view body,
                                     const WriteOptions& w = {});
  // POST pods/{name}/eviction (a policy/v1 Eviction): 429 TooManyRequests when the pod's one
  // PodDisruptionBudget allows no disruption (500 when several select it), else that budget's
  // status.disruptionsAllowed is spent and the pod deleted with the Eviction's deleteOptions;
  // the 201 Status. A finished pod, or one being deleted, is deleted without a budget check.
  absl::StatusOr<std::string> Evict(std::string_view ns, std::string_view name,
                                    std::string_view body, const WriteOptions& w = {});
  // The evictions of bound pods so far, for `tessera simulate`'s preemption oracle, each with the
  // pods of the victim's node just before it (bound there, or pending with an annotation naming
  // the node: a scheduler's reservation): {"evictions":[{"namespace","name","uid","node","at",
  // "resourceVersion","nodePods":[pod, ...]}]} (docs/apisim.md "Eviction"). The newest 10,000.
  std::string EvictionsJson();
  // POST pods/{name}/binding: the 201 Status.
  absl::StatusOr<std::string> Bind(std::string_view ns, std::string_view name,
                                   std::string_view body, const WriteOptions& w = {});
  // Opens a watch. Errors found before the stream starts (bad selector or options, 504 for a
  // revision from the future) are returned; a revision too old yields a stream whose first
  // Next() sends an ERROR event with 410 Expired.
  absl::StatusOr<std::unique_ptr<WatchStream>> Watch(const ResourceInfo& r, std::string_view ns,
                                                     const WatchOptions& options);

  // Plays the kubelet: deletes pods whose grace period has ended. Returns how many.
  int Reap();

  // Fault injection.
  void SetFaults(const Faults& faults);
  Faults GetFaults();
  // Whether the faults set make requests slow or fail (latency_ms or fail_probability): read
  // without the store's lock, so that a request need not take it to learn there are none.
  bool RequestFaultsSet() const { return request_faults_set_.load(std::memory_order_acquire); }
  // Breaks every open watch stream (they end without a clean close). Returns how many.
  int SeverWatches();
  // Forgets all history: any earlier revision now answers 410. Returns the compacted revision.
  uint64_t Compact();
  // Remembers every object, the pending graceful deletions and the revision (replacing an
  // earlier snapshot), as an etcd snapshot does. Returns the snapshot's revision.
  uint64_t Snapshot();
  // Rolls the store back to the snapshot, as restoring etcd from it and restarting the API
  // server does: the objects and graceful deletions are the snapshot's again, the revision
  // counter goes back to the snapshot's plus `bump_revision` (etcdutl's --bump-revision), the
  // history is forgotten (every earlier revision answers 410, as the restarted API server's new
  // watch cache does) and every open watch breaks. Objects written after the snapshot get
  // their snapshot state and revision back (revisions go backwards), those created after it
  // are gone, those deleted after it are back with their uid. Returns the revision after the
  // restore; FailedPrecondition when no snapshot was taken. The snapshot is kept (a second
  // Restore rolls back again).
  absl::StatusOr<uint64_t> Restore(uint64_t bump_revision = 0);
  // Ends every watch (server shutdown).
  void Shutdown();

  uint64_t CurrentRevision();
  // {"resourceVersion":..,"compactedRevision":..,"objects":{"pods":N,..},"watchesOpen":..,...}
  std::string StatsJson();

  // Persists every object and the revision (atomic rename), and restores them. A loaded state
  // keeps the saved revision; history starts empty.
  absl::Status SaveState(const std::string& path);
  absl::Status LoadState(const std::string& path);

 private:
  friend class WatchStream;
  struct Event {
    uint64_t rv = 0;
    EventType type = EventType::kAdded;
    size_t resource = 0;
    ObjectPtr obj;   // the new state; for DELETED the last state stamped with `rv`
    ObjectPtr prev;  // the state before; nullptr for ADDED
    bool dropped = false;
  };
  size_t IndexOf(const ResourceInfo& r) const;
  // The pods of `node` now, for an eviction record (EvictionsJson): node, at, resourceVersion,
  // nodePods.
  nlohmann::ordered_json NodeSnapshot(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ObjectPtr> Lookup(size_t r, std::string_view ns, std::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Commit(size_t r, EventType type, ObjectPtr obj, ObjectPtr prev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes `obj` (built at revision rv_ + 1) as the new state of `old`, then deletes it when
  // its deletion is complete. Returns the JSON answered.
  std::string Finish(size_t r, const ObjectPtr& old, const ObjectPtr& obj, const WriteOptions& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(size_t r, const ObjectPtr& old) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `doc` is the new object as written (a JSON object), `prev` the parsed `old`.
  absl::StatusOr<std::string> UpdateLocked(size_t r, const ObjectPtr& old,
                                           std::string_view subresource, nlohmann::ordered_json doc,
                                           const nlohmann::ordered_json& prev,
                                           const WriteOptions& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls fn for each object of resource `r` in namespace `ns` (all when empty) as of revision
  // `at`, in key order from `start`; stops when fn returns false.
  template <typename Fn>
  void ForEachAt(size_t r, std::string_view ns, uint64_t at, std::string_view start, Fn fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WaitForRevision(uint64_t rv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every watcher (of every resource) is woken when the StoreLock held is released.
  void WakeEveryWatcherLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the whole history (a compaction, a load): every watcher that had not sent all of its
  // resource's events expires. (A load then marks every earlier revision gone.)
  void ForgetHistoryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ShouldDrop(const ResourceInfo& r, EventType type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Holds mu_ like MutexLock and, after unlocking, wakes the watchers of every resource a
  // Commit under it changed. Waking them under the lock made each one block on mu_ at once
  // (a futex wait and a wake-up more per watch event, perf of `tessera bench serve`). Every
  // method of the store takes mu_ through it (WatchStream, which never commits, excepted), so
  // that no write path can forget the wake-up.
  class ABSL_SCOPED_LOCKABLE StoreLock {
   public:
    explicit StoreLock(Store* s) ABSL_EXCLUSIVE_LOCK_FUNCTION(s->mu_);
    ~StoreLock() ABSL_UNLOCK_FUNCTION();
    StoreLock(const StoreLock&) = delete;
    StoreLock& operator=(const StoreLock&) = delete;

   private:
    Store* const s_;
  };

  const StoreOptions options_;
  Clock* const clock_;

  Mutex mu_;
  // Bit r: resource r changed since mu_ was taken; StoreLock wakes its watchers on release.
  uint64_t wake_pending_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled on every change (WaitForRevision waits on it).
  CondVar changed_;
  // One per resource: a watcher sleeps on its resource's and is woken only by events of that
  // resource (and by faults, severing and shutdown), as kube-apiserver's per-resource watch
  // cache does. A single shared condition woke every watcher on every write: on the 2-core
  // bench machine those useless wake-ups were a large part of the simulator's CPU.
  std::unique_ptr<CondVar[]> changed_by_resource_;
  // Per resource: the revision of its newest event, and of its newest event that was trimmed
  // from history_ (by its size limit or a compaction; after a load, the loaded revision). A
  // watch from an older revision, or a watcher behind it, gets 410: events of other resources
  // do not count.
  std::vector<uint64_t> newest_rv_by_resource_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> trimmed_rv_by_resource_ ABSL_GUARDED_BY(mu_);
  std::vector<std::map<std::string, ObjectPtr, std::less<>>> objects_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> history_ ABSL_GUARDED_BY(mu_);
  uint64_t rv_ ABSL_GUARDED_BY(mu_) = 0;
  // Every event with a revision above this one is in history_ (lists and watches from older
  // revisions answer 410).
  uint64_t oldest_rv_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::pair<absl::Time, std::string>> deadlines_ ABSL_GUARDED_BY(mu_);
  Faults faults_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> request_faults_set_{false};
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);      // fault decisions (seeded)
  std::mt19937_64 uid_rng_ ABSL_GUARDED_BY(mu_);  // uids and generated names
  uint64_t sever_generation_ ABSL_GUARDED_BY(mu_) = 0;
  struct Saved {
    uint64_t rv = 0;
    std::vector<std::map<std::string, ObjectPtr, std::less<>>> objects;
    std::set<std::pair<absl::Time, std::string>> deadlines;
  };
  std::optional<Saved> snapshot_ ABSL_GUARDED_BY(mu_);  // Snapshot(), for Restore()
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t events_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::string> evictions_ ABSL_GUARDED_BY(mu_);  // EvictionsJson's records
  uint64_t watches_severed_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> watches_open_{0};
  std::atomic<uint64_t> watches_started_{0};
  std::atomic<uint64_t> watch_events_sent_{0};
  std::atomic<uint64_t> expired_answers_{0};
};

}  // namespace tessera::apisim

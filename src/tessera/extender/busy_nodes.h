// File: tessera/extender/busy_nodes.h
//
// BusyNodes: which nodes another GPU pod's bind occupies, from its filter decision until the
// device plugin's Allocate releases HAMi's node lock. Only one pod per node may be between bind
// and Allocate, so a pod sent to a busy node has its bind refused and is scheduled again; the
// filter prefers fitting nodes that are not busy (schedule::Candidate::busy, docs/serve.md
// "Busy nodes").
//
//   BusyNodes busy(lock_of, standing, holder_done, absl::Minutes(5));
//   busy.Decided(uid, "gpu-1", now + ttl);            // Filter chose gpu-1 for the pod
//   busy.Busy("gpu-1", {uid2, "ml", "other"}, now);   // true: another pod's bind comes
//   busy.Bound(uid, "gpu-1", "4711", now + 30s);      // bound; its lock write made version 4711
//   busy.Ended(uid);                                   // or: its bind failed
//
// A node is busy for pod P when another pod's decision names it and has neither ended, nor
// passed its `until`, nor (before its bind) stopped `standing` (its reservation is gone: the pod
// was deleted); when another pod was bound to it and the informer's copy of the node (`lock_of`)
// is older than that bind's lock write (compared as integer resourceVersions; until `until`
// when they are not integers); or when that copy's hami.io/mutex.lock names another pod (or no
// pod: a legacy lock) that is neither gone nor finished (`holder_done`: a bind takes such a lock
// over) and is younger than the lock timeout. A lock value that does not parse is busy (a bind
// would fail on it too). Thread safety: internally synchronised.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "tessera/base/mutex.h"

namespace tessera::extender {

class BusyNodes {
 public:
  // The pod asking.
  struct Pod {
    std::string_view uid, ns, name;
  };
  // The informer's copy of a node: its hami.io/mutex.lock ("" for none) and resourceVersion.
  struct NodeView {
    std::string lock;
    std::string resource_version;
  };
  // The copy of `node`; a node the informer does not hold is {}. Null: only decisions count.
  using LockOf = std::function<NodeView(std::string_view node)>;
  // Whether pod `uid`'s decision still stands (the ledger holds its reservation). Called under
  // this object's lock. Null: until Ended or `until`.
  using Standing = std::function<bool(std::string_view uid)>;

  // Whether the pod ns/name a lock names is gone or finished, as a cache knows it. Null: never.
  using HolderDone = std::function<bool(std::string_view ns, std::string_view name)>;

  BusyNodes(LockOf lock_of, Standing standing, HolderDone holder_done, absl::Duration lock_timeout);

  // Pod `uid` is decided onto `node` until `until` (its reservation's expiry); replaces the
  // pod's earlier decision.
  void Decided(std::string_view uid, std::string_view node, absl::Time until);
  // The pod was bound to `node` after a lock write that left the node at resourceVersion
  // `version`: busy, whatever `standing` says, until the informer's copy is that new or `until`.
  void Bound(std::string_view uid, std::string_view node, std::string_view version,
             absl::Time until);
  // The pod's decision no longer occupies its node (its bind failed, or it fits nowhere now).
  void Ended(std::string_view uid);
  // Drops decisions that no longer occupy anything. The hook for a periodic loop.
  void Purge(absl::Time now);

  bool Busy(std::string_view node, const Pod& pod, absl::Time now) const;
  // Decisions held (purged or not): for tests and /debug.
  size_t decisions() const;

 private:
  struct Decision {
    std::string uid;
    absl::Time until;
    bool bound = false;
    std::string version = {};  // bound: the node's resourceVersion after its lock write
  };
  void AddLocked(std::string_view uid, std::string_view node, Decision d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(std::string_view uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `d` occupies its node at `now`; `view` is the informer's copy of that node.
  bool HoldsLocked(const Decision& d, const NodeView& view, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  NodeView View(std::string_view node) const;

  const LockOf lock_of_;
  const Standing standing_;
  const HolderDone holder_done_;
  const absl::Duration lock_timeout_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Decision>> by_node_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> node_of_ ABSL_GUARDED_BY(mu_);  // uid → node
};

}  // namespace tessera::extender

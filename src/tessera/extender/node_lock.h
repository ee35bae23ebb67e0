// File: tessera/extender/node_lock.h
//
// HAMi's node lock (hami-protocol.md §2.1.3, §2.7, §4.8): the node annotation
// hami.io/mutex.lock = "<RFC3339 time>,<pod namespace>,<pod name>" (legacy: a bare time) marks
// the one pod per node that is between bind and the device plugin's Allocate. The scheduler
// takes it in bind; the device plugin removes it after Allocate; a failed bind removes it again.
//
//   absl::StatusOr<NodeLockResult> lock = AcquireNodeLock(client, "gpu-1", "ml", "train-0",
//                                                         clock->Now(), options, owner_exists);
//   ...
//   ReleaseNodeLock(client, "gpu-1", "ml", "train-0", options);  // only on failure
//
// Acquire (HAMi HEAD semantics), from a fresh GET of the node:
//   * no lock                                → write ours;
//   * ours (same ns/name)                    → re-entrant: acquired without a write
//                                              (rewritten with a fresh time once it has expired);
//   * older than `timeout` (legacy included) → taken over (one patch replaces it);
//   * its owner pod no longer exists         → taken over (owner_exists answered false);
//   * otherwise                              → kAborted "node <n> is locked by <ns>/<name> since
//                                              <t>" and nothing is written. An owner_exists error
//                                              counts as "exists" (we never steal on doubt).
//   * a value that does not parse            → kFailedPrecondition naming the annotation (HAMi
//                                              also refuses; an operator must remove it).
// Every write is a JSON merge patch carrying the GET's resourceVersion as a precondition, so two
// schedulers cannot both win; a 409 Conflict re-reads the node and tries again, at most
// `max_attempts` times with backoff between attempts (then kAborted). Other API errors are
// returned as they are.
//
// Release removes the annotation (merge patch, value null, with the resourceVersion
// precondition and the same 409 retry) only when the lock names ns/name. A lock held by anyone
// else — a legacy bare-time lock included, which Tessera never writes — is left alone and the
// call succeeds. (HAMi HEAD lets anyone remove a legacy lock; Tessera does not, since at the
// time of a release such a lock can only belong to another scheduler's bind.)
//
// Expiry compares the time written in the annotation with `now` (wall clock), as HAMi does;
// a lock written "in the future" by a skewed clock is simply young.
//
// Thread safety: free functions; safe to call concurrently (the API server arbitrates).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/backoff.h"
#include "tessera/kube/client.h"

namespace tessera::extender {

struct NodeLockOptions {
  // A lock older than this is taken over (HAMi --node-lock-timeout, default 5m).
  absl::Duration timeout = absl::Minutes(5);
  // Attempts of the GET + PATCH round when the PATCH answers 409 (HAMi: 5 steps).
  int max_attempts = 5;
  // Delay between attempts (HAMi: 100 ms, ×2, jitter 0.5).
  Backoff::Options backoff = {absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5};
  // Sleeps between attempts; null: absl::SleepFor. Tests inject a recorder.
  std::function<void(absl::Duration)> sleep;
  // A local copy of the node (the informer's), or nullopt. When the copy shows NO lock, the
  // first attempt patches against its resourceVersion instead of a fresh GET: a stale copy
  // only costs a 409 and a normal GET-based retry. A copy that shows any lock is never
  // trusted; the decision is then made from a GET. Null: always GET.
  std::function<std::optional<kube::Node>(std::string_view node)> cached;
};

// Whether the pod ns/name exists (true), is gone (false), or cannot be told (an error).
using OwnerExists = std::function<absl::StatusOr<bool>(std::string_view ns, std::string_view name)>;

enum class NodeLockOutcome {
  kAcquired,         // there was no lock
  kReentered,        // the lock was already ours (nothing written unless it had expired)
  kTookOverExpired,  // an expired lock (ours, another pod's or a legacy one) was replaced
  kTookOverOrphan,   // a young lock whose owner pod no longer exists was replaced
};

struct NodeLockResult {
  NodeLockOutcome outcome = NodeLockOutcome::kAcquired;
  std::string value;     // the lock value now on the node
  std::string previous;  // the value found (empty when there was none)
  int conflicts = 0;     // 409s retried
};

// "acquired", "reentered", "took_over_expired", "took_over_orphan".
std::string_view NodeLockOutcomeName(NodeLockOutcome outcome);

// Takes the lock of `node` for pod ns/name at `now` (see the file comment). `owner_exists` may
// be null: then a young lock is never taken over for a missing owner.
absl::StatusOr<NodeLockResult> AcquireNodeLock(kube::ApiClient* client, std::string_view node,
                                               std::string_view ns, std::string_view name,
                                               absl::Time now, const NodeLockOptions& options,
                                               const OwnerExists& owner_exists);

// Removes the lock of `node` if pod ns/name holds it. OK when it was removed, absent or held by
// someone else; the error of the GET or PATCH otherwise (a vanished node is OK: NotFound).
absl::Status ReleaseNodeLock(kube::ApiClient* client, std::string_view node, std::string_view ns,
                             std::string_view name, const NodeLockOptions& options);

}  // namespace tessera::extender

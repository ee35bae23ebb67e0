// File: tessera/extender/node_lock.h
//
// HAMi's node lock (docs/hami-protocol.md §2.1.3, §2.7, §4.8): the node annotation
// hami.io/mutex.lock = "<RFC3339 time>,<ns>,<name>" marks the one pod per node between bind and
// the device plugin's Allocate. Bind takes it (AcquireNodeLock / AcquireNodeLockWaiting, which
// waits up to --node-lock-retry-timeout for a held lock); the plugin removes it; a failed bind
// releases it (ReleaseNodeLock, only a lock naming that pod, only if NodeLockResult::took).
//
//   absl::StatusOr<NodeLockResult> lock = AcquireNodeLockWaiting(client, "gpu-1", "ml", "train-0",
//                                                                *clock, options, holder);
//
// Errors: kAborted when another pod holds the lock (or its holder cannot be checked: never steal
// on doubt) or 409s persist; kFailedPrecondition for a value that does not parse; other API errors
// as they are. Takeover and expiry rules: docs/serve.md "The node lock in detail".
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
#include "tessera/base/clock.h"
#include "tessera/kube/client.h"

namespace tessera::extender {

struct NodeLockOptions {
  // A lock older than this is taken over (HAMi --node-lock-timeout, default 5m).
  absl::Duration timeout = absl::Minutes(5);
  // A lock older than this that the holder's cached state keeps is confirmed with a fresh read
  // of the holder (its DELETED event may have been lost: the informer's copy then says present
  // until a resync). Zero: only takeovers are confirmed.
  absl::Duration confirm_after = absl::Seconds(10);
  // Attempts of the GET + PATCH round when the PATCH answers 409 (HAMi: 5 steps).
  int max_attempts = 5;
  // Delay between attempts (HAMi: 100 ms, ×2, jitter 0.5).
  Backoff::Options backoff = {absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5};
  // AcquireNodeLockWaiting: how long a refused lock is tried again (HAMi
  // --node-lock-retry-timeout); zero or less: not at all.
  absl::Duration wait = absl::ZeroDuration();
  // The pauses between those tries. HAMi polls every 100 ms; this starts there and backs off,
  // since every try is a GET of the node (and maybe of the holder pod).
  Backoff::Options wait_backoff = {absl::Milliseconds(100), absl::Seconds(1), 1.5, 0.2};
  // During a pause, the `cached` copy of the node is looked at every this often (no API call);
  // when its lock value changes (the device plugin released it), the pause ends and the lock is
  // tried at once. Zero, or no `cached`: the pauses run their full length.
  absl::Duration wait_watch = absl::Milliseconds(10);
  // Sleeps between attempts; null: absl::SleepFor. Tests inject a recorder (or advance a fake
  // clock); a service injects a sleep that its shutdown cuts short.
  std::function<void(absl::Duration)> sleep;
  // AcquireNodeLockWaiting stops waiting (its refusal says so) once this returns true, e.g. when
  // the service shuts down. Null: never.
  std::function<bool()> stopping;
  // A local copy of the node (the informer's), or nullopt. When the copy shows NO lock, the
  // first attempt patches against its resourceVersion instead of a fresh GET: a stale copy
  // only costs a 409 and a normal GET-based retry. A copy that shows any lock is never
  // trusted; the decision is then made from a GET. Null: always GET.
  std::function<std::optional<kube::Node>(std::string_view node)> cached;
};

// What is known about the pod a lock names.
struct NodeLockHolder {
  bool gone = false;       // the API server has no such pod
  bool terminal = false;   // status.phase Succeeded or Failed
  bool running = false;    // status.phase Running: its containers started, so it is past Allocate
  std::string node_name;   // spec.nodeName; empty while unbound
  std::string bind_phase;  // hami.io/bind-phase ("allocating", "success", "failed" or empty)
  bool fresh = false;      // read from the API server for this question, not from a cache
};

// Looks up the pod ns/name. With `fresh` the answer must come from the API server; otherwise a
// cache may answer. An error means the state cannot be told.
using HolderLookup = std::function<absl::StatusOr<NodeLockHolder>(
    std::string_view ns, std::string_view name, bool fresh)>;

enum class NodeLockOutcome {
  kAcquired,           // there was no lock
  kReentered,          // the lock was already ours and young: nothing written
  kRenewed,            // the lock was already ours but expired: rewritten with a fresh time
  kTookOverExpired,    // an expired lock (legacy, or a holder not waiting for Allocate)
  kTookOverOrphan,     // the holder pod no longer exists
  kTookOverTerminal,   // the holder pod is Succeeded or Failed
  kTookOverElsewhere,  // the holder pod is bound to another node
};

// "acquired", "reentered", "renewed", "took_over_expired", "took_over_orphan",
// "took_over_terminal", "took_over_elsewhere".
std::string_view NodeLockOutcomeName(NodeLockOutcome outcome);

// The decision about the lock value `current` (null: no lock) found on `node`, for pod ns/name
// at `now` (the rules of the file comment). Pure: `holder` is the holder's state when the caller
// has looked it up, else null; the decision then asks for it (kAskHolder) when it matters.
struct NodeLockDecision {
  enum class Action {
    kWrite,      // write our lock; `outcome` says why
    kKeep,       // the lock is ours already; nothing to write (`outcome` kReentered)
    kAskHolder,  // the holder's state decides: call again with it
    kRefuse,     // `refusal`: kAborted (held) or kFailedPrecondition (unparsable)
  };
  Action action = Action::kRefuse;
  NodeLockOutcome outcome = NodeLockOutcome::kAcquired;
  absl::Status refusal;
};
NodeLockDecision DecideNodeLock(std::string_view node, const std::string* current,
                                std::string_view ns, std::string_view name, absl::Time now,
                                absl::Duration timeout,
                                const absl::StatusOr<NodeLockHolder>* holder);

struct NodeLockResult {
  NodeLockOutcome outcome = NodeLockOutcome::kAcquired;
  // Whether this call took the lock from nobody or from another holder. False when the pod
  // held it already (kReentered, kRenewed): then it belongs to an earlier bind of the same
  // pod, and a failure of this bind must not release it.
  bool took = true;
  std::string value;             // the lock value now on the node
  std::string resource_version;  // the node's after the lock write (or as read, when kept)
  std::string previous;          // the value found (empty when there was none)
  int conflicts = 0;             // 409s retried
  int refusals = 0;              // AcquireNodeLockWaiting: tries refused before this one succeeded
  absl::Duration waited;         // AcquireNodeLockWaiting: time spent waiting for the lock
};

// Takes the lock of `node` for pod ns/name at `now` (see the file comment). `holder` may be
// null: then a young lock of another pod is never taken over, and an expired one always is.
absl::StatusOr<NodeLockResult> AcquireNodeLock(kube::ApiClient* client, std::string_view node,
                                               std::string_view ns, std::string_view name,
                                               absl::Time now, const NodeLockOptions& options,
                                               const HolderLookup& holder);

// AcquireNodeLock at clock->Now(), tried again while it is refused (kAborted) until
// `options.wait` has passed on `clock`, with `options.sleep` between tries (cut short when the
// cached copy's lock changes, see `wait_watch`). The final refusal is kAborted with the last
// try's message and how long it waited. Other errors end the wait.
absl::StatusOr<NodeLockResult> AcquireNodeLockWaiting(kube::ApiClient* client,
                                                      std::string_view node, std::string_view ns,
                                                      std::string_view name, const Clock& clock,
                                                      const NodeLockOptions& options,
                                                      const HolderLookup& holder);

// Removes the lock of `node` if pod ns/name holds it. OK when it was removed, absent or held by
// someone else; the error of the GET or PATCH otherwise (a vanished node is OK: NotFound).
absl::Status ReleaseNodeLock(kube::ApiClient* client, std::string_view node, std::string_view ns,
                             std::string_view name, const NodeLockOptions& options);

// The lock timeout given by HAMi's environment variable HAMI_NODELOCK_EXPIRE (its chart sets it
// from scheduler.nodeLockExpire), for `tessera serve` without --node-lock-timeout: `env` (null or
// empty: unset) as a Go duration such as "5m", "90s" or "1h30m". Unset gives `fallback`; a value
// that is not a positive finite duration gives `fallback` too and says why in `*warning` (HAMi
// logs and keeps 5m likewise); `warning` is cleared otherwise.
absl::Duration NodeLockTimeoutFromEnv(const char* env, absl::Duration fallback,
                                      std::string* warning);

}  // namespace tessera::extender

#include "tessera/extender/node_lock.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include <fmt/core.h>

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"

namespace tessera::extender {
namespace {

std::string TimeText(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

void Sleep(const NodeLockOptions& options, absl::Duration d) {
  if (options.sleep) {
    options.sleep(d);
  } else {
    absl::SleepFor(d);
  }
}

bool IsConflict(const absl::Status& status) { return absl::IsAborted(status); }

// The lock value on the cached copy of `node` ("" when it shows none), or nullopt without one.
std::optional<std::string> CachedLock(const NodeLockOptions& options, std::string_view node) {
  if (!options.cached) {
    return std::nullopt;
  }
  std::optional<kube::Node> copy = options.cached(node);
  if (!copy) {
    return std::nullopt;
  }
  return std::string(copy->meta.annotations.Get(device::kNodeLockAnnotation));
}

bool RestsOnHolder(NodeLockOutcome outcome) {
  return outcome == NodeLockOutcome::kTookOverExpired ||
         outcome == NodeLockOutcome::kTookOverOrphan ||
         outcome == NodeLockOutcome::kTookOverTerminal ||
         outcome == NodeLockOutcome::kTookOverElsewhere;
}

// DecideNodeLock with the holder looked up when the decision needs it; a takeover that rests on
// a cached holder state, and a refusal of a lock older than confirm_after, confirmed with a
// fresh one.
NodeLockDecision Decide(std::string_view node, const std::string* current, std::string_view ns,
                        std::string_view name, absl::Time now, const NodeLockOptions& options,
                        const HolderLookup& holder);

}  // namespace

std::string_view NodeLockOutcomeName(NodeLockOutcome outcome) {
  switch (outcome) {
    case NodeLockOutcome::kAcquired:
      return "acquired";
    case NodeLockOutcome::kReentered:
      return "reentered";
    case NodeLockOutcome::kRenewed:
      return "renewed";
    case NodeLockOutcome::kTookOverExpired:
      return "took_over_expired";
    case NodeLockOutcome::kTookOverOrphan:
      return "took_over_orphan";
    case NodeLockOutcome::kTookOverTerminal:
      return "took_over_terminal";
    case NodeLockOutcome::kTookOverElsewhere:
      return "took_over_elsewhere";
  }
  return "acquired";
}

NodeLockDecision DecideNodeLock(std::string_view node, const std::string* current,
                                std::string_view ns, std::string_view name, absl::Time now,
                                absl::Duration timeout,
                                const absl::StatusOr<NodeLockHolder>* holder) {
  using Action = NodeLockDecision::Action;
  auto write = [](NodeLockOutcome outcome) {
    return NodeLockDecision{Action::kWrite, outcome, absl::OkStatus()};
  };
  auto refuse = [](absl::Status why) {
    return NodeLockDecision{Action::kRefuse, NodeLockOutcome::kAcquired, std::move(why)};
  };
  if (current == nullptr) {
    return write(NodeLockOutcome::kAcquired);
  }
  absl::StatusOr<device::NodeLock> lock = device::ParseNodeLock(*current);
  if (!lock.ok()) {
    return refuse(absl::FailedPreconditionError(
        fmt::format("node {} has an unparsable {} annotation \"{}\" ({}); remove it by hand", node,
                    device::kNodeLockAnnotation, *current, std::string(lock.status().message()))));
  }
  const bool expired = now - lock->time > timeout;
  if (device::NodeLockOwnedBy(*lock, ns, name)) {
    return expired ? write(NodeLockOutcome::kRenewed)
                   : NodeLockDecision{Action::kKeep, NodeLockOutcome::kReentered, absl::OkStatus()};
  }
  const std::string held = fmt::format(
      "node {} is locked by {} since {} (timeout {})", node,
      lock->legacy ? std::string("a legacy lock") : fmt::format("{}/{}", lock->ns, lock->name),
      TimeText(lock->time), absl::FormatDuration(timeout));
  if (lock->legacy) {
    return expired ? write(NodeLockOutcome::kTookOverExpired) : refuse(absl::AbortedError(held));
  }
  if (holder == nullptr) {
    return NodeLockDecision{Action::kAskHolder, NodeLockOutcome::kAcquired, absl::OkStatus()};
  }
  if (!holder->ok()) {
    return refuse(absl::AbortedError(fmt::format("{}; cannot tell whether {}/{} still needs it: {}",
                                                 held, lock->ns, lock->name,
                                                 std::string(holder->status().message()))));
  }
  const NodeLockHolder& h = **holder;
  if (h.gone) {
    return write(NodeLockOutcome::kTookOverOrphan);
  }
  if (h.terminal) {
    return write(NodeLockOutcome::kTookOverTerminal);
  }
  if (!h.node_name.empty() && h.node_name != node) {
    return write(NodeLockOutcome::kTookOverElsewhere);
  }
  if (!expired) {
    return refuse(absl::AbortedError(held));
  }
  if (h.node_name == node && !h.running && h.bind_phase == device::kBindPhaseAllocating) {
    return refuse(absl::AbortedError(fmt::format(
        "node {}: the lock of {}/{} (since {}) is older than the timeout {}, but {}/{} is still "
        "waiting for the device plugin's Allocate ({}={}), so it keeps the lock",
        node, lock->ns, lock->name, TimeText(lock->time), absl::FormatDuration(timeout), lock->ns,
        lock->name, device::kBindPhaseAnnotation, h.bind_phase)));
  }
  return write(NodeLockOutcome::kTookOverExpired);
}

namespace {

NodeLockDecision Decide(std::string_view node, const std::string* current, std::string_view ns,
                        std::string_view name, absl::Time now, const NodeLockOptions& options,
                        const HolderLookup& holder) {
  NodeLockDecision d = DecideNodeLock(node, current, ns, name, now, options.timeout, nullptr);
  if (d.action != NodeLockDecision::Action::kAskHolder) {
    return d;
  }
  absl::StatusOr<device::NodeLock> lock = device::ParseNodeLock(*current);  // parsed above
  if (!holder) {
    // Nobody to ask: the holder counts as present and unbound (young: held; expired: free).
    NodeLockHolder present;
    present.fresh = true;
    const absl::StatusOr<NodeLockHolder> unknown = present;
    return DecideNodeLock(node, current, ns, name, now, options.timeout, &unknown);
  }
  absl::StatusOr<NodeLockHolder> h = holder(lock->ns, lock->name, /*fresh=*/false);
  d = DecideNodeLock(node, current, ns, name, now, options.timeout, &h);
  const bool takeover = d.action == NodeLockDecision::Action::kWrite && RestsOnHolder(d.outcome);
  const bool old_and_held =
      d.action == NodeLockDecision::Action::kRefuse && absl::IsAborted(d.refusal) &&
      options.confirm_after > absl::ZeroDuration() && now - lock->time > options.confirm_after;
  if ((takeover || old_and_held) && h.ok() && !h->fresh) {
    h = holder(lock->ns, lock->name, /*fresh=*/true);
    d = DecideNodeLock(node, current, ns, name, now, options.timeout, &h);
  }
  if (!h.ok()) {
    TESSERA_LOG(kWarning, "node {}: cannot tell whether lock holder {}/{} still needs it: {}", node,
                lock->ns, lock->name, std::string(h.status().message()));
  }
  return d;
}

}  // namespace

absl::StatusOr<NodeLockResult> AcquireNodeLock(kube::ApiClient* client, std::string_view node,
                                               std::string_view ns, std::string_view name,
                                               absl::Time now, const NodeLockOptions& options,
                                               const HolderLookup& holder) {
  Backoff backoff(options.backoff);
  NodeLockResult result;
  const int attempts = options.max_attempts < 1 ? 1 : options.max_attempts;
  absl::Status last;
  bool used_copy = false;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    // A conflict on the cached copy only means the copy was stale: retry at once from a GET.
    if (attempt > 0 && !(attempt == 1 && used_copy)) {
      Sleep(options, backoff.Next());
    }
    absl::StatusOr<kube::Node> got = absl::NotFoundError("no cached node");
    if (attempt == 0 && options.cached) {
      if (std::optional<kube::Node> copy = options.cached(node);
          copy && !copy->meta.resource_version.empty() &&
          !copy->meta.annotations.Contains(device::kNodeLockAnnotation)) {
        got = *std::move(copy);
        used_copy = true;
      }
    }
    if (!got.ok()) {
      got = client->GetNode(node);
    }
    if (!got.ok()) {
      return got.status();
    }
    const std::string* current = got->meta.annotations.Find(device::kNodeLockAnnotation);
    result.previous = current != nullptr ? *current : std::string();
    NodeLockDecision d = Decide(node, current, ns, name, now, options, holder);
    if (d.action == NodeLockDecision::Action::kRefuse) {
      return d.refusal;
    }
    result.outcome = d.outcome;
    result.took =
        d.outcome != NodeLockOutcome::kReentered && d.outcome != NodeLockOutcome::kRenewed;
    if (d.action == NodeLockDecision::Action::kKeep) {
      result.value = result.previous;
      result.resource_version = got->meta.resource_version;
      return result;
    }
    result.value = device::FormatNodeLock(now, ns, name);
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), result.value);
    patch.resource_version = got->meta.resource_version;
    absl::StatusOr<kube::Node> patched = client->PatchNodeMetadata(node, patch);
    if (patched.ok()) {
      result.resource_version = patched->meta.resource_version;
      return result;
    }
    if (!IsConflict(patched.status())) {
      return patched.status();
    }
    ++result.conflicts;
    last = patched.status();
  }
  return absl::AbortedError(fmt::format("node {}: lock not taken after {} conflicting attempts: {}",
                                        node, attempts, std::string(last.message())));
}

absl::StatusOr<NodeLockResult> AcquireNodeLockWaiting(kube::ApiClient* client,
                                                      std::string_view node, std::string_view ns,
                                                      std::string_view name, const Clock& clock,
                                                      const NodeLockOptions& options,
                                                      const HolderLookup& holder) {
  const absl::Time start = clock.Now();
  Backoff backoff(options.wait_backoff);
  int refusals = 0;
  for (;;) {
    absl::StatusOr<NodeLockResult> r =
        AcquireNodeLock(client, node, ns, name, clock.Now(), options, holder);
    const absl::Duration waited = clock.Now() - start;
    if (r.ok()) {
      r->refusals = refusals;
      r->waited = waited;
      return r;
    }
    if (!absl::IsAborted(r.status())) {
      return r.status();
    }
    const absl::Duration left = options.wait - waited;
    if (left <= absl::ZeroDuration()) {
      if (refusals == 0) {
        return r.status();  // no waiting configured
      }
      return absl::AbortedError(fmt::format("{}; gave up after waiting {} ({} tries)",
                                            std::string(r.status().message()),
                                            absl::FormatDuration(waited), refusals + 1));
    }
    if (options.stopping && options.stopping()) {
      return absl::AbortedError(fmt::format("{}; stopped waiting after {}: shutting down",
                                            std::string(r.status().message()),
                                            absl::FormatDuration(waited)));
    }
    if (refusals == 0) {
      TESSERA_VLOG(1, "node {}: {}/{} waits up to {} for the lock: {}", node, ns, name,
                   absl::FormatDuration(options.wait), std::string(r.status().message()));
    }
    ++refusals;
    const absl::Duration pause = std::min(backoff.Next(), left);
    const std::optional<std::string> seen = CachedLock(options, node);
    if (!seen || options.wait_watch <= absl::ZeroDuration()) {
      Sleep(options, pause);
      continue;
    }
    // Watch the local copy instead of sleeping blind: the lock is usually released well
    // within a pause, and a try costs API calls.
    for (absl::Duration slept; slept < pause;) {
      const absl::Duration step = std::min(options.wait_watch, pause - slept);
      Sleep(options, step);
      slept += step;
      if (CachedLock(options, node) != seen || (options.stopping && options.stopping())) {
        break;
      }
    }
  }
}

absl::Status ReleaseNodeLock(kube::ApiClient* client, std::string_view node, std::string_view ns,
                             std::string_view name, const NodeLockOptions& options) {
  Backoff backoff(options.backoff);
  const int attempts = options.max_attempts < 1 ? 1 : options.max_attempts;
  absl::Status last;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      Sleep(options, backoff.Next());
    }
    absl::StatusOr<kube::Node> got = client->GetNode(node);
    if (absl::IsNotFound(got.status())) {
      return absl::OkStatus();
    }
    if (!got.ok()) {
      return got.status();
    }
    const std::string* current = got->meta.annotations.Find(device::kNodeLockAnnotation);
    if (current == nullptr) {
      return absl::OkStatus();
    }
    absl::StatusOr<device::NodeLock> lock = device::ParseNodeLock(*current);
    if (!lock.ok() || !device::NodeLockOwnedBy(*lock, ns, name)) {
      return absl::OkStatus();  // not ours: leave it
    }
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), std::nullopt);
    patch.resource_version = got->meta.resource_version;
    absl::StatusOr<kube::Node> patched = client->PatchNodeMetadata(node, patch);
    if (patched.ok() || absl::IsNotFound(patched.status())) {
      return absl::OkStatus();
    }
    if (!IsConflict(patched.status())) {
      return patched.status();
    }
    last = patched.status();
  }
  return absl::AbortedError(
      fmt::format("node {}: lock not released after {} conflicting attempts: {}", node, attempts,
                  std::string(last.message())));
}

absl::Duration NodeLockTimeoutFromEnv(const char* env, absl::Duration fallback,
                                      std::string* warning) {
  warning->clear();
  if (env == nullptr || *env == '\0') {
    return fallback;
  }
  absl::Duration d;
  if (!absl::ParseDuration(env, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    *warning = fmt::format(
        "HAMI_NODELOCK_EXPIRE=\"{}\" is not a positive duration such as 5m or 90s; using {}", env,
        absl::FormatDuration(fallback));
    return fallback;
  }
  return d;
}

}  // namespace tessera::extender

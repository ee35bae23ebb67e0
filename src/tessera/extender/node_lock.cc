#include "tessera/extender/node_lock.h"

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

// What to do with the lock found on the node.
struct Plan {
  bool write = false;  // false: nothing to write (re-entrant)
  NodeLockOutcome outcome = NodeLockOutcome::kAcquired;
};

absl::StatusOr<Plan> PlanAcquire(std::string_view node, const std::string* current,
                                 std::string_view ns, std::string_view name, absl::Time now,
                                 const NodeLockOptions& options, const OwnerExists& owner_exists) {
  if (current == nullptr) {
    return Plan{true, NodeLockOutcome::kAcquired};
  }
  absl::StatusOr<device::NodeLock> lock = device::ParseNodeLock(*current);
  if (!lock.ok()) {
    return absl::FailedPreconditionError(
        fmt::format("node {} has an unparsable {} annotation \"{}\" ({}); remove it by hand", node,
                    device::kNodeLockAnnotation, *current, std::string(lock.status().message())));
  }
  const bool expired = now - lock->time > options.timeout;
  if (device::NodeLockOwnedBy(*lock, ns, name)) {
    return expired ? Plan{true, NodeLockOutcome::kTookOverExpired}
                   : Plan{false, NodeLockOutcome::kReentered};
  }
  if (expired) {
    return Plan{true, NodeLockOutcome::kTookOverExpired};
  }
  if (!lock->legacy && owner_exists) {
    absl::StatusOr<bool> exists = owner_exists(lock->ns, lock->name);
    if (exists.ok() && !*exists) {
      return Plan{true, NodeLockOutcome::kTookOverOrphan};
    }
    if (!exists.ok()) {
      TESSERA_LOG(kWarning, "node {}: cannot tell whether lock owner {}/{} exists: {}", node,
                  lock->ns, lock->name, std::string(exists.status().message()));
    }
  }
  const std::string owner =
      lock->legacy ? std::string("a legacy lock") : fmt::format("{}/{}", lock->ns, lock->name);
  return absl::AbortedError(fmt::format("node {} is locked by {} since {} (timeout {})", node,
                                        owner, TimeText(lock->time),
                                        absl::FormatDuration(options.timeout)));
}

}  // namespace

std::string_view NodeLockOutcomeName(NodeLockOutcome outcome) {
  switch (outcome) {
    case NodeLockOutcome::kAcquired:
      return "acquired";
    case NodeLockOutcome::kReentered:
      return "reentered";
    case NodeLockOutcome::kTookOverExpired:
      return "took_over_expired";
    case NodeLockOutcome::kTookOverOrphan:
      return "took_over_orphan";
  }
  return "acquired";
}

absl::StatusOr<NodeLockResult> AcquireNodeLock(kube::ApiClient* client, std::string_view node,
                                               std::string_view ns, std::string_view name,
                                               absl::Time now, const NodeLockOptions& options,
                                               const OwnerExists& owner_exists) {
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
    absl::StatusOr<Plan> plan = PlanAcquire(node, current, ns, name, now, options, owner_exists);
    if (!plan.ok()) {
      return plan.status();
    }
    result.outcome = plan->outcome;
    if (!plan->write) {
      result.value = result.previous;
      return result;
    }
    result.value = device::FormatNodeLock(now, ns, name);
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), result.value);
    patch.resource_version = got->meta.resource_version;
    absl::StatusOr<kube::Node> patched = client->PatchNodeMetadata(node, patch);
    if (patched.ok()) {
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

}  // namespace tessera::extender

#include "tessera/extender/patch_writer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"

namespace tessera::extender {

PatchWriter::PatchWriter(Options options, kube::ApiClient* client, Settle settle,
                         StillApplies still_applies)
    : options_(options),
      client_(client),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      settle_(std::move(settle)),
      still_applies_(std::move(still_applies)),
      queue_({.name = "sched-patch", .threads = options_.threads}) {
  TESSERA_CHECK(client_ != nullptr);
}

PatchWriter::~PatchWriter() { queue_.Stop(); }  // the writers empty the queue first

void PatchWriter::Submit(Job job) {
  TESSERA_CHECK(options_.threads > 0);
  // The pod's earlier patch (a re-filter) lands first, so the last decision wins.
  (void)Take(job.uid);
  auto slot = std::make_shared<Slot>();
  slot->created = job.created;
  {
    MutexLock l(&mu_);
    slots_[job.uid] = slot;
  }
  Queued q{std::move(job), std::move(slot), clock_->Now()};
  TESSERA_CHECK(queue_.Push([this, q = std::move(q)]() mutable { WriteQueued(std::move(q)); }));
}

absl::StatusOr<kube::Pod> PatchWriter::Write(const Job& job) { return WriteAndSettle(job); }

absl::StatusOr<kube::Pod> PatchWriter::WritePatch(const Job& job) {
  constexpr int kWrites = 3;
  kube::MetadataPatch patch = job.patch;
  for (int write = 1;; ++write) {
    absl::StatusOr<kube::Pod> patched = client_->PatchPodMetadata(job.ns, job.name, patch);
    if (patched.ok() || !absl::IsAborted(patched.status()) || !patch.resource_version ||
        !still_applies_ || write == kWrites) {
      return patched;
    }
    // The pod changed since the filter read it: look again before writing at its new version.
    absl::StatusOr<kube::Pod> current = client_->GetPod(job.ns, job.name);
    if (!current.ok()) {
      return current.status();
    }
    if (current->meta.uid != job.uid) {
      return absl::FailedPreconditionError(
          fmt::format("pod {} has uid {}, not {}: it was recreated", current->Key(),
                      current->meta.uid, job.uid));
    }
    TESSERA_RETURN_IF_ERROR(still_applies_(*current));
    patch.resource_version = current->meta.resource_version;
  }
}

absl::StatusOr<kube::Pod> PatchWriter::WriteAndSettle(const Job& job) {
  absl::StatusOr<kube::Pod> patched = WritePatch(job);
  absl::Status status = patched.status();
  if (!status.ok()) {
    status = absl::Status(status.code(), fmt::format("patch pod {}/{} annotations: {}", job.ns,
                                                     job.name, std::string(status.message())));
  }
  if (settle_) {
    settle_(job, status);
  }
  if (!status.ok()) {
    return status;
  }
  return patched;
}

void PatchWriter::WriteQueued(Queued q) {
  const size_t backlog = queue_.size();
  const absl::Time started = clock_->Now();
  absl::StatusOr<kube::Pod> patched = WriteAndSettle(q.job);
  // Where a bind's wait for its patch goes: the queue (too few writers) or the write itself
  // (the client's rate limiter and the round trip; the transport's --v 3 log splits those).
  TESSERA_VLOG(2, "patch of {}/{}: queued {}, written in {} ({} more queued)", q.job.ns, q.job.name,
               absl::FormatDuration(started - q.queued),
               absl::FormatDuration(clock_->Now() - started), backlog);
  if (!patched.ok()) {
    TESSERA_LOG(kWarning, "filter of {}/{}: {} (its bind will fail and be retried)", q.job.ns,
                q.job.name, std::string(patched.status().message()));
  }
  MutexLock l(&mu_);
  if (patched.ok()) {
    q.slot->pod = *std::move(patched);
  } else {
    q.slot->code = patched.status().code();
    q.slot->message = std::string(patched.status().message());
  }
  q.slot->done = true;
  done_cv_.SignalAll();
}

std::optional<PatchWriter::Landed> PatchWriter::Take(const std::string& uid) {
  MutexLock l(&mu_);
  auto it = slots_.find(uid);
  if (it == slots_.end()) {
    return std::nullopt;
  }
  std::shared_ptr<Slot> slot = it->second;
  const absl::Time deadline = clock_->Now() + options_.wait;
  while (!slot->done) {
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) {
      return Landed{};  // still in flight: the caller reports it
    }
    // A fake clock moves without notifying anyone: look at it often.
    const absl::Duration step =
        clock_ == Clock::Real() ? left : std::min(left, absl::Milliseconds(10));
    done_cv_.WaitFor(&mu_, absl::ToChronoMilliseconds(step) + std::chrono::milliseconds(1));
  }
  bool consumed = false;  // this call removed the slot: the pod is moved out, not copied
  if (auto again = slots_.find(uid); again != slots_.end() && again->second == slot) {
    slots_.erase(again);
    consumed = true;
  }
  Landed landed;
  landed.done = true;
  landed.status = absl::Status(slot->code, slot->message);
  landed.pod = consumed ? std::exchange(slot->pod, std::nullopt) : slot->pod;
  return landed;
}

void PatchWriter::DropLanded(absl::Time cutoff) {
  MutexLock l(&mu_);
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto current = it++;
    if (current->second->done && current->second->created <= cutoff) {
      slots_.erase(current);
    }
  }
}

}  // namespace tessera::extender

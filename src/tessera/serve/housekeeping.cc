#include "tessera/serve/housekeeping.h"

#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "tessera/base/allocator.h"
#include "tessera/base/logging.h"
#include "tessera/extender/verdict.h"

namespace tessera::serve {

void Inbox::Queue(std::vector<accounting::NodePatch> patches) {
  if (patches.empty()) {
    return;
  }
  MutexLock lock(&mu_);
  for (accounting::NodePatch& p : patches) {
    patches_.push_back(std::move(p));
  }
  cv_.SignalAll();
}

std::optional<std::vector<accounting::NodePatch>> Inbox::Wait(absl::Duration period) {
  MutexLock lock(&mu_);
  if (patches_.empty() && !stopping_) {
    cv_.WaitFor(&mu_, absl::ToChronoMilliseconds(period));
  }
  if (stopping_) {
    return std::nullopt;
  }
  std::vector<accounting::NodePatch> patches;
  patches.swap(patches_);
  return patches;
}

void Inbox::Pause(absl::Duration d) {
  MutexLock lock(&mu_);
  if (!stopping_) {
    cv_.WaitFor(&mu_, absl::ToChronoNanoseconds(d));
  }
}

bool Inbox::stopping() const {
  MutexLock lock(&mu_);
  return stopping_;
}

bool Inbox::Stop() {
  MutexLock lock(&mu_);
  if (stopping_) {
    return false;
  }
  stopping_ = true;
  cv_.SignalAll();
  return true;
}

Housekeeping::Housekeeping(Parts parts, Options options) : parts_(parts), options_(options) {}

Housekeeping::~Housekeeping() { Stop(); }

void Housekeeping::Start() {
  loop_ = std::thread([this] { Loop(); });
}

void Housekeeping::Stop() {
  parts_.inbox->Stop();
  if (loop_.joinable()) {
    loop_.join();
  }
}

void Housekeeping::Loop() {
  while (std::optional<std::vector<accounting::NodePatch>> patches =
             parts_.inbox->Wait(options_.period)) {
    Round(*std::move(patches));
  }
}

void Housekeeping::Round(std::vector<accounting::NodePatch> patches) {
  if (trim_again_.exchange(false)) {
    ReleaseFreeMemory();
  }
  const absl::Time now = parts_.clock->Now();
  const bool leader = parts_.leadership->Tick(now);
  if (parts_.informers->nodes().HasSynced()) {
    std::vector<accounting::NodePatch> due = parts_.registry->Tick(now);
    patches.insert(patches.end(), std::make_move_iterator(due.begin()),
                   std::make_move_iterator(due.end()));
  }
  // Handshake writes: the only background writer, the leader's job.
  parts_.leadership->WriteHandshakes(patches, leader);
  parts_.repairs->Expired(parts_.scheduler->ExpireReservations(now));
  if (leader) {
    parts_.scheduler->SettleNominations();  // the filters settle them too; this shows them
  }
  parts_.informers->ExportMetrics(parts_.metrics);
  UpdatePendingPods(leader);
  if (!logged_synced_ && parts_.informers->Synced()) {
    logged_synced_ = true;
    TESSERA_LOGS(kInfo, "informers synced", "pods", parts_.informers->pods().store().size(),
                 "nodes", parts_.informers->nodes().store().size(), "after",
                 absl::FormatDuration(parts_.clock->Now() - options_.started));
  }
  AuditIfDue(now, leader);
}

void Housekeeping::UpdatePendingPods(bool leader) {
  extender::VerdictWriter& verdicts = parts_.scheduler->verdicts();
  if (!leader) {
    verdicts.Clear();  // the leader counts; a follower's entries would double them
  } else {
    const kube::Store<kube::Pod>& pods = parts_.informers->pods().store();
    verdicts.Retain([&pods](std::string_view uid) {
      std::shared_ptr<const kube::Pod> pod = pods.GetByUid(uid);
      return pod != nullptr && pod->node_name.empty() && !pod->Deleting() && !pod->Terminal();
    });
  }
  const std::map<std::string, int64_t> counts = verdicts.CountByReason();
  for (std::string_view reason : extender::PendingReasons()) {
    auto it = counts.find(std::string(reason));
    parts_.metrics->SetPendingPods(reason, it == counts.end() ? 0 : it->second);
  }
}

void Housekeeping::AuditIfDue(absl::Time now, bool leader) {
  if (options_.audit_period <= absl::ZeroDuration() || !parts_.informers->Synced()) {
    return;
  }
  if (next_audit_ == absl::InfinitePast()) {
    next_audit_ = now + options_.audit_period;
  } else if (now >= next_audit_) {
    next_audit_ = now + options_.audit_period;
    parts_.repairs->Audited(parts_.auditor->Run(now), leader, &parts_.scheduler->events());
  }
}

}  // namespace tessera::serve

// The nominated reservation (docs/preemption.md "The nominated reservation"): the share a
// preemption frees is reserved for its preemptor before any other filter decides; and the notes
// of preemptions that did not help, for the verdict.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tessera/base/logging.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {

void Scheduler::Nominate(const kube::Pod& pod, std::vector<std::string> nodes) {
  if (pod.meta.uid.empty() || nodes.empty()) {
    return;
  }
  const absl::Time expires_at = clock_->Now() + options_.reservation_ttl;
  MutexLock l(&decide_mu_);
  nominations_changed_ = true;
  next_nomination_expiry_ = std::min(next_nomination_expiry_, expires_at);
  nominations_.insert_or_assign(
      pod.meta.uid, Nomination{.pod = pod, .nodes = std::move(nodes), .expires_at = expires_at});
}

std::vector<ledger::Reservation> Scheduler::SettleNominations() {
  const absl::Time now = clock_->Now();
  MutexLock l(&decide_mu_);
  return SettleNominationsLocked(now, "");
}

size_t Scheduler::Nominated() const {
  MutexLock l(&decide_mu_);
  return nominations_.size();
}

void Scheduler::NotePreemption(std::string_view uid, std::string note) {
  MutexLock l(&notes_mu_);
  if (note.empty()) {
    preemption_notes_.erase(absl::string_view(uid.data(), uid.size()));
  } else {
    preemption_notes_.insert_or_assign(std::string(uid), std::move(note));
  }
}

bool Scheduler::IsNominated(std::string_view uid) const {
  MutexLock l(&decide_mu_);
  return nominations_.contains(absl::string_view(uid.data(), uid.size()));
}

std::vector<ledger::Reservation> Scheduler::SettleNominationsLocked(absl::Time now,
                                                                    std::string_view deciding) {
  std::vector<ledger::Reservation> reserved;
  // Read first: a change made while the nominations are tried is seen by the next settle.
  const uint64_t version = ledger_->CapacityVersion();
  if (!nominations_changed_ && version == settled_version_ && now < next_nomination_expiry_) {
    return reserved;  // nothing freed, nothing new, nothing expired since the last settle
  }
  nominations_changed_ = false;
  settled_version_ = version;
  next_nomination_expiry_ = absl::InfiniteFuture();
  for (auto it = nominations_.begin(); it != nominations_.end();) {
    auto current = it++;
    const std::string& uid = current->first;
    Nomination& n = current->second;
    next_nomination_expiry_ = std::min(next_nomination_expiry_, n.expires_at);
    if (uid == deciding) {
      continue;
    }
    // The pod as the informer has it now: a nomination ends with the pod it was made for.
    std::optional<kube::Pod> pod;
    if (lookup_) {
      pod = lookup_(n.pod.meta.ns, n.pod.meta.name);
    }
    const bool gone = lookup_ && (!pod || pod->meta.uid != uid || !internal::NotPending(*pod).ok());
    if (gone || n.expires_at <= now) {
      TESSERA_VLOGS(1, "nomination ended", "pod", n.pod.Key(), "why",
                    gone ? "the pod is bound, finished or gone" : "its victims never left");
      nominations_.erase(current);
      continue;
    }
    if (ledger_->HasReservation(uid)) {
      continue;  // a filter of its own holds a share; the nomination waits behind it
    }
    const kube::Pod& decided = pod ? *pod : n.pod;
    cycle::Decoded decoded = cycle::Decode(*options_.vendor, decided, cycle::DecodeMode::kFilter);
    if (decoded.code != cycle::DecodeCode::kRequest) {
      nominations_.erase(current);
      continue;
    }
    std::vector<schedule::Candidate> candidates(n.nodes.size());
    for (size_t i = 0; i < n.nodes.size(); ++i) {
      candidates[i].name = n.nodes[i];
    }
    const cycle::Result run = cycle::Run(cycle_config_,
                                         {.pod = &decided,
                                          .request = &decoded.request,
                                          .constraints = &decoded.constraints,
                                          .ledger = ledger_,
                                          .reserve_in = ledger_,
                                          .expiry = now + options_.reservation_ttl,
                                          .diagnose = false},
                                         &candidates);
    if (!run.decision.winner) {
      continue;  // its victims still hold the share
    }
    if (!run.reserved.ok()) {
      TESSERA_LOGS(kWarning, "the share freed for a preemptor could not be reserved", "pod",
                   decided.Key(), "err", internal::Message(run.reserved));
      nominations_.erase(current);
      continue;
    }
    std::optional<ledger::Reservation> r = ledger_->ReservationOf(uid);
    nominations_.erase(current);
    if (!r) {
      continue;
    }
    const std::string text = ledger::DecisionText(
        {.node = r->node, .devices = r->devices, .init_count = r->init_count, .mig = r->mig});
    TESSERA_LOGS(kInfo, "the share preemption freed is reserved for its preemptor", "pod",
                 decided.Key(), "node", r->node, "devices", text);
    events_.Record(decided.meta, "PreemptionShareReserved",
                   fmt::format("the GPU share freed on {} is held for this pod: {}", r->node, text),
                   EventType::kNormal);
    reserved.push_back(*std::move(r));
  }
  return reserved;
}

}  // namespace tessera::extender

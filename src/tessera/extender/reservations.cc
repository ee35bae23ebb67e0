// How the Scheduler's reservations end besides a new filter or a bind (docs/serve.md,
// "Reservations and bind"): a failed filter patch (SettlePatch), expiry (ExpireReservations) and a
// LIST that no longer has the pod (ReleaseAbsent).
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"

#include "tessera/base/logging.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {

using internal::Message;

void Scheduler::SettlePatch(const PatchWriter::Job& job, const absl::Status& status) {
  {
    MutexLock l(&decide_mu_);
    auto it = filter_seq_.find(job.uid);
    if (it != filter_seq_.end() && it->second == job.seq) {
      filter_seq_.erase(it);
      if (!status.ok()) {
        ledger_->Release(job.uid);
        busy_.Ended(job.uid);
      }
    }
  }
  if (!status.ok() && options_.write_behind) {
    // Written behind the reply: the filter's event is this. (Otherwise the filter fails.)
    kube::ObjectMeta subject;
    subject.ns = job.ns;
    subject.name = job.name;
    subject.uid = job.uid;
    events_.Record(subject, "FilteringFailed", Message(status), EventType::kWarning);
  }
}

std::vector<ledger::Reservation> Scheduler::ExpireReservations(absl::Time now) {
  busy_.Purge(now);
  std::vector<ledger::Reservation> expired;
  {
    MutexLock l(&decide_mu_);
    // Binds whose reservation has ended (the pod was observed bound or gone) or that were
    // never observed within bound_hold are forgotten; the rest keep their reservation.
    for (auto it = binding_.begin(); it != binding_.end();) {
      auto current = it++;
      const bool stale =
          current->second != absl::InfiniteFuture() && current->second + options_.bound_hold <= now;
      if (stale || !ledger_->HasReservation(current->first)) {
        if (stale) {
          TESSERA_LOG(kWarning,
                      "pod uid {} was bound at {} but never observed bound: its reservation "
                      "is no longer kept",
                      current->first, absl::FormatTime(current->second));
        }
        binding_.erase(current);
      }
    }
    absl::flat_hash_set<std::string> keep;
    for (const auto& [uid, since] : binding_) {
      keep.insert(uid);
    }
    expired = ledger_->ExpireReservations(now, [&keep](std::string_view uid) {
      return keep.contains(absl::string_view(uid.data(), uid.size()));
    });
  }
  // Landed patches of pods that were never bound.
  patches_.DropLanded(now - options_.reservation_ttl);
  // Preemption notes of pods no longer refused (bound, gone, or no longer remembered).
  bool notes = false;
  {
    MutexLock l(&notes_mu_);
    notes = !preemption_notes_.empty();
  }
  if (notes) {
    uint64_t latest = 0;
    absl::flat_hash_set<std::string> refused;
    for (auto& [uid, offer] : verdicts_.UidsAndOffers(&latest)) {
      refused.insert(std::move(uid));
    }
    MutexLock l(&notes_mu_);
    for (auto it = preemption_notes_.begin(); it != preemption_notes_.end();) {
      auto current = it++;
      if (!refused.contains(current->first)) {
        preemption_notes_.erase(current);
      }
    }
  }
  for (const ledger::Reservation& r : expired) {
    TESSERA_VLOG(1, "reservation of {}/{} on {} expired", r.ns, r.name, r.node);
  }
  return expired;
}

std::vector<ledger::Reservation> Scheduler::ReleaseAbsent(
    absl::Time list_started, const std::function<bool(std::string_view uid)>& present) {
  std::vector<ledger::Reservation> released;
  MutexLock l(&decide_mu_);
  for (const ledger::Reservation& r : ledger_->Reservations()) {
    if (r.expires_at - options_.reservation_ttl >= list_started || present(r.uid)) {
      continue;
    }
    if (ledger_->Release(r.uid)) {
      filter_seq_.erase(r.uid);
      binding_.erase(r.uid);
      released.push_back(r);
    }
  }
  return released;
}

}  // namespace tessera::extender

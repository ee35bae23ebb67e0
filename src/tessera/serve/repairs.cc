#include "tessera/serve/repairs.h"

#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/logging.h"
#include "tessera/serve/debug_json.h"

namespace tessera::serve {

Repairs::Repairs(Clock* clock, metrics::Registry* metrics) : clock_(clock), metrics_(metrics) {}

void Repairs::Note(std::string_view layer, std::string what) {
  constexpr size_t kMaxRepairs = 200;
  MutexLock lock(&mu_);
  recent_.push_back({clock_->Now(), std::string(layer), std::move(what)});
  while (recent_.size() > kMaxRepairs) {
    recent_.pop_front();
  }
}

void Repairs::Count(std::string_view layer, const std::map<std::string, int64_t>& counts) {
  MutexLock lock(&mu_);
  for (const auto& [what, n] : counts) {
    totals_[std::string(layer)][what] += n;
  }
}

void Repairs::ReleaseAbsentReservations(extender::Scheduler* scheduler,
                                        const kube::Store<kube::Pod>& pods, absl::Time list_started,
                                        std::string_view layer) {
  std::vector<ledger::Reservation> released = scheduler->ReleaseAbsent(
      list_started, [&pods](std::string_view uid) { return pods.GetByUid(uid) != nullptr; });
  if (released.empty()) {
    return;
  }
  Count(layer, {{"absent_reservation", static_cast<int64_t>(released.size())}});
  for (const ledger::Reservation& r : released) {
    Note(layer,
         fmt::format("absent_reservation {}/{} uid={} node={}", r.ns, r.name, r.uid, r.node));
    TESSERA_LOG(kInfo,
                "reservation of pod {}/{} on node {} ended: the pod is not in a list taken "
                "after it was made",
                r.ns, r.name, r.node);
  }
}

void Repairs::Expired(const std::vector<ledger::Reservation>& expired) {
  if (expired.empty()) {
    return;
  }
  metrics_->RecordReservationsExpired(static_cast<int64_t>(expired.size()));
  Count("expiry", {{"reservation", static_cast<int64_t>(expired.size())}});
  for (const ledger::Reservation& r : expired) {
    Note("expiry", fmt::format("reservation {}/{} uid={} node={}", r.ns, r.name, r.uid, r.node));
    TESSERA_LOG(kInfo, "reservation of pod {}/{} on node {} expired (no bind observed)", r.ns,
                r.name, r.node);
  }
}

void Repairs::Resynced(const accounting::ResyncReport& report) {
  for (const auto& [kind, n] : report.corrections) {
    metrics_->RecordResyncCorrections(kind, n);
  }
  Count("resync", report.corrections);
  for (const std::string& line : report.details) {
    Note("resync", line);
  }
}

void Repairs::Audited(const accounting::AuditReport& report, bool leader,
                      extender::EventRecorder* events) {
  int64_t total = 0;
  for (const auto& [cause, n] : report.corrections) {
    metrics_->RecordAuditCorrections(cause, n);
    total += n;
  }
  const ledger::Problems& p = report.problems;
  metrics_->SetLedgerProblems("conflict", static_cast<int64_t>(p.conflicts.size()));
  metrics_->SetLedgerProblems("orphan", static_cast<int64_t>(p.orphans.size()));
  metrics_->SetLedgerProblems("unregistered", static_cast<int64_t>(p.unregistered.size()));
  metrics_->SetLedgerProblems("unreadable", static_cast<int64_t>(p.unreadable.size()));
  metrics_->SetLedgerProblems("foreign_allocation", static_cast<int64_t>(report.foreign.size()));
  metrics_->SetLedgerProblems("mig", static_cast<int64_t>(p.mig.size()));
  metrics_->SetLedgerProblems("rewritten", static_cast<int64_t>(p.rewritten.size()));
  metrics_->RecordAllocationRewrites(static_cast<int64_t>(report.new_rewrites.size()));
  for (const ledger::Rewritten& r : report.new_rewrites) {
    Note("audit", fmt::format("rewritten {}/{} uid={}: kept node {} [{}], annotations "
                              "say node {} [{}]",
                              r.ns, r.name, r.uid, r.kept.node, ledger::DecisionText(r.kept),
                              r.observed.node, ledger::DecisionText(r.observed)));
    if (leader) {  // one event per rewrite, from the replica that writes
      kube::ObjectMeta pod;
      pod.ns = r.ns;
      pod.name = r.name;
      pod.uid = r.uid;
      events->Record(pod, "AllocationRewritten",
                     fmt::format("the pod's allocation was changed after it was bound; the "
                                 "scheduler keeps its decision: node {} [{}] (the annotations now "
                                 "say node {} [{}])",
                                 r.kept.node, ledger::DecisionText(r.kept),
                                 r.observed.node.empty() ? "-" : r.observed.node,
                                 ledger::DecisionText(r.observed)),
                     extender::EventType::kWarning);
    }
  }
  Count("audit", report.corrections);
  for (const std::string& line : report.details) {
    Note("audit", line);
  }
  TESSERA_VLOG(1, "audit: {} pods, {} nodes, {} corrections, {}", report.pods, report.nodes, total,
               absl::FormatDuration(report.took));
}

std::string Repairs::DebugAuditJson(const accounting::Auditor& auditor,
                                    const accounting::Resyncer& resyncer,
                                    const ledger::Ledger& ledger, absl::Duration audit_period,
                                    absl::Duration resync_period) const {
  const accounting::AuditReport audit = auditor.last();
  nlohmann::json audit_doc = AuditJson(audit);
  if (audit_doc.is_object()) {
    audit_doc["problems"] = ProblemsJson(audit.problems);
  }
  nlohmann::json recent = nlohmann::json::array();
  nlohmann::json totals = nlohmann::json::object();
  {
    MutexLock lock(&mu_);
    for (const Repair& r : recent_) {
      recent.push_back({{"at", DebugTime(r.at)}, {"layer", r.layer}, {"what", r.what}});
    }
    for (const auto& [layer, counts] : totals_) {
      totals[layer] = counts;
    }
  }
  nlohmann::json doc = {{"audit_period_s", absl::ToDoubleSeconds(audit_period)},
                        {"resync_period_s", absl::ToDoubleSeconds(resync_period)},
                        {"audit", std::move(audit_doc)},
                        {"resync", ResyncJson(resyncer.last(), resync_period)},
                        {"problems", ProblemsJson(ledger.FindProblems())},
                        {"totals", std::move(totals)},
                        {"recent", std::move(recent)}};
  return doc.dump(2) + "\n";
}

}  // namespace tessera::serve

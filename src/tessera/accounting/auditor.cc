#include "tessera/accounting/auditor.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include <fmt/core.h>

#include "tessera/accounting/projection.h"
#include "tessera/base/logging.h"

namespace tessera::accounting {
namespace {

constexpr size_t kMaxDetails = 100;

std::string_view CauseOf(ledger::DiffKind kind) {
  switch (kind) {
    case ledger::DiffKind::kStale:
      return "stale_record";
    case ledger::DiffKind::kMissing:
      return "missing_record";
    case ledger::DiffKind::kChanged:
      return "changed_record";
  }
  return "changed_record";
}

std::string Devices(const std::optional<ledger::PodAllocation>& record) {
  if (!record) {
    return "none";
  }
  if (record->unreadable) {
    return "allocation unreadable";
  }
  std::string out;
  for (const auto& container : record->devices) {
    for (const device::ContainerDevice& d : container) {
      out += fmt::format("{}{} {}MiB {}%", out.empty() ? "" : ", ", d.uuid, d.usedmem, d.usedcores);
    }
  }
  return out.empty() ? "no devices" : out;
}

absl::flat_hash_map<std::string, ledger::PodAllocation> RecordsOf(
    const ledger::Ledger& ledger, const absl::flat_hash_set<std::string>& uids) {
  absl::flat_hash_map<std::string, ledger::PodAllocation> out;
  for (ledger::PodAllocation& r : ledger.Records()) {
    if (uids.contains(r.uid)) {
      std::string uid = r.uid;
      out.emplace(std::move(uid), std::move(r));
    }
  }
  return out;
}

}  // namespace

Auditor::Auditor(const device::Vendor* vendor, ledger::Ledger* ledger, PodFeed* feed,
                 PodSource pods, PodByUid pod_by_uid, NodeSource registrations,
                 AuditorOptions options)
    : vendor_(vendor),
      ledger_(ledger),
      feed_(feed),
      pods_(std::move(pods)),
      pod_by_uid_(std::move(pod_by_uid)),
      registrations_(std::move(registrations)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

AuditReport Auditor::Run(absl::Time now) {
  const absl::Time start = clock_->Now();
  AuditReport report;
  report.at = now;
  const std::vector<std::shared_ptr<const kube::Pod>> pods = pods_();
  const std::vector<std::shared_ptr<const device::NodeDevices>> nodes = registrations_();
  report.pods = pods.size();
  report.nodes = nodes.size();
  std::vector<ledger::PodAllocation> records;
  records.reserve(pods.size());
  // uid → the resourceVersion the audit's truth was computed from.
  absl::flat_hash_map<std::string, std::string> listed_rv;
  for (const auto& pod : pods) {
    listed_rv[pod->meta.uid] = pod->meta.resource_version;
    // The feed's projection, failing closed: an unreadable allocation blocks its node.
    ledger::PodAllocation record = accounting::ProjectPodForLedger(*vendor_, *pod);
    if (!options_.scheduler_name.empty() && !pod->scheduler_name.empty() &&
        pod->scheduler_name != options_.scheduler_name && !pod->node_name.empty() &&
        !pod->Terminal() && (!record.node.empty() || record.unreadable)) {
      report.foreign.push_back(ForeignAllocation{pod->meta.uid, pod->meta.ns, pod->meta.name,
                                                 pod->scheduler_name, pod->node_name});
    }
    records.push_back(std::move(record));
  }
  // The pinned decisions are an input: a bound pod's rewritten annotations are not the truth
  // (Ledger::Recompute applies Apply's rule), so the audit does not "repair" a decision away.
  std::unique_ptr<ledger::Ledger> fresh =
      ledger::Ledger::Recompute(nodes, records, ledger_->Reservations(), ledger_->Pinned());
  const ledger::LedgerDiff diff = Diff(*ledger_, *fresh);

  auto note = [&](std::string_view cause, std::string line) {
    ++report.corrections[std::string(cause)];
    TESSERA_LOG(kWarning, "audit correction ({}): {}", cause, line);
    if (report.details.size() < kMaxDetails) {
      report.details.push_back(fmt::format("{}: {}", cause, line));
    }
  };

  // Namespace quota usage before the repairs: what a filter would have checked quotas against.
  for (const ledger::NamespaceDiff& n : diff.namespaces) {
    report.quota.push_back(QuotaCorrection{n.ns, n.a, n.b, {}});
  }

  // Namespaces with a counted record or node correction: their quota usage change is counted.
  absl::flat_hash_set<std::string> corrected_ns;
  bool node_corrected = false;

  // Pods: repair each differing uid from the store's current object; count real changes only.
  absl::flat_hash_set<std::string> uids;
  for (const ledger::RecordDiff& d : diff.records) {
    if (!d.reservation) {
      uids.insert(d.uid);
    }
  }
  if (!uids.empty()) {
    const auto before = RecordsOf(*ledger_, uids);
    for (const ledger::RecordDiff& d : diff.records) {
      if (d.reservation) {
        continue;
      }
      std::shared_ptr<const kube::Pod> current = pod_by_uid_(d.uid);
      feed_->Reconcile(d.uid, current.get());
    }
    const auto after = RecordsOf(*ledger_, uids);
    for (const ledger::RecordDiff& d : diff.records) {
      if (d.reservation) {
        continue;
      }
      auto b = before.find(d.uid);
      auto a = after.find(d.uid);
      std::optional<ledger::PodAllocation> was, now_is;
      if (b != before.end()) {
        was = b->second;
      }
      if (a != after.end()) {
        now_is = a->second;
      }
      if (was == now_is) {
        continue;  // a delivery that raced with the audit had already fixed it
      }
      // The store moved since the audit listed it: the difference is (or may be) a delivery
      // whose handler had not run yet (the store is updated before the handler). Reconcile
      // applied the newer object, which is harmless, but it is not an apply-layer bug: not
      // counted. A real one is found again by the next audit.
      std::shared_ptr<const kube::Pod> current = pod_by_uid_(d.uid);
      auto listed = listed_rv.find(d.uid);
      const bool moved = (current == nullptr) != (listed == listed_rv.end()) ||
                         (current != nullptr && current->meta.resource_version != listed->second);
      if (moved) {
        TESSERA_VLOG(1, "audit: pod {}/{} changed while audited; applied its current state", d.ns,
                     d.name);
        continue;
      }
      // Node and devices of the same records (before and after the repair), never the diff's
      // node with the repaired devices.
      corrected_ns.insert(d.ns);
      note(CauseOf(d.kind),
           fmt::format("pod {}/{} (uid {}): held on node {} [{}], truth node {} [{}]", d.ns, d.name,
                       d.uid, was && !was->node.empty() ? was->node : "-", Devices(was),
                       now_is && !now_is->node.empty() ? now_is->node : "-", Devices(now_is)));
    }
  }

  // Nodes: the registry's registration is the truth.
  absl::flat_hash_map<std::string, std::shared_ptr<const device::NodeDevices>> by_name;
  for (const auto& n : nodes) {
    by_name[n->node] = n;
  }
  absl::flat_hash_set<std::string> renewed;
  for (const ledger::NodeDiff& d : diff.nodes) {
    auto it = by_name.find(d.node);
    if (it != by_name.end()) {
      (void)ledger_->SetNode(it->second);
    } else {
      ledger_->RemoveNode(d.node);
    }
    renewed.insert(d.node);
    node_corrected = true;
    note("node", fmt::format("node {}: registered in the ledger {}, in the registry {}", d.node,
                             d.registered_a, d.registered_b));
  }
  // Usage that differs without a record or node difference would be a bug of the ledger's own
  // bookkeeping (the property tests hold it to Recompute): counted and logged, not repaired.
  if (diff.records.empty()) {
    for (const ledger::UsageDiff& u : diff.usage) {
      if (renewed.contains(u.node)) {
        continue;
      }
      note("usage", fmt::format("node {} device {}: used {} / {} MiB / {} cores, truth {} / {} "
                                "MiB / {} cores",
                                u.node, u.uuid, u.a.used, u.a.usedmem, u.a.usedcores, u.b.used,
                                u.b.usedmem, u.b.usedcores));
    }
  }
  for (QuotaCorrection& q : report.quota) {
    q.after = ledger_->UsageOf(q.ns);
    if (q.after != q.filter && (node_corrected || corrected_ns.contains(q.ns))) {
      note("quota", fmt::format("namespace {}: quota usage {} MiB / {} cores, truth {} MiB / {} "
                                "cores",
                                q.ns, q.filter.usedmem, q.filter.usedcores, q.truth.usedmem,
                                q.truth.usedcores));
    }
  }
  report.problems = ledger_->FindProblems();
  std::sort(report.foreign.begin(), report.foreign.end(),
            [](const ForeignAllocation& x, const ForeignAllocation& y) { return x.uid < y.uid; });
  report.took = clock_->Now() - start;
  MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> seen;
  for (const ForeignAllocation& f : report.foreign) {
    if (!foreign_seen_.contains(f.uid)) {
      TESSERA_LOG(kWarning,
                  "pod {}/{} on node {} carries a GPU allocation but names scheduler {}: counted, "
                  "but not written by this scheduler",
                  f.ns, f.name, f.node, f.scheduler);
    }
    seen.insert(f.uid);
  }
  foreign_seen_ = std::move(seen);
  // Unrealised MIG reservations count only past their deadline (the plugin realises an instance
  // within seconds of the bind; the first audits after it must not report it).
  absl::flat_hash_map<std::string, absl::Time> since;
  std::vector<ledger::MigProblem> mig;
  for (ledger::MigProblem& p : report.problems.mig) {
    if (p.kind != ledger::MigProblemKind::kUnrealised) {
      mig.push_back(std::move(p));
      continue;
    }
    std::string key = p.uid + "\n" + p.uuid + "\n" + p.why;
    auto it = unrealised_since_.find(key);
    const absl::Time first = it == unrealised_since_.end() ? now : it->second;
    since.emplace(std::move(key), first);
    if (now - first >= options_.mig_realise_deadline) {
      mig.push_back(std::move(p));
    }
  }
  report.problems.mig = std::move(mig);
  unrealised_since_ = std::move(since);
  absl::flat_hash_map<std::string, ledger::Decision> rewritten;
  for (const ledger::Rewritten& r : report.problems.rewritten) {
    auto it = rewritten_seen_.find(r.uid);
    if (it == rewritten_seen_.end() || it->second != r.observed) {
      TESSERA_LOG(kWarning,
                  "pod {}/{} (uid {}): its allocation was rewritten after it was bound; the ledger "
                  "keeps the decision, node {} [{}], not the annotations' node {} [{}]",
                  r.ns, r.name, r.uid, r.kept.node, ledger::DecisionText(r.kept),
                  r.observed.node.empty() ? "-" : r.observed.node,
                  ledger::DecisionText(r.observed));
      report.new_rewrites.push_back(r);
    }
    rewritten.emplace(r.uid, r.observed);
  }
  rewritten_seen_ = std::move(rewritten);
  last_ = report;
  return report;
}

AuditReport Auditor::last() const {
  MutexLock lock(&mu_);
  return last_;
}

}  // namespace tessera::accounting

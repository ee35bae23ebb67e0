#include "tessera/cycle/preempt.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace tessera::cycle {

HoldersByNode HoldersByNode::Of(const ledger::Ledger& ledger) {
  HoldersByNode out;
  ledger::FullSnapshot full = ledger.Full();
  for (ledger::NodeView& view : full.nodes) {
    std::string name = view.devices->node;
    out.nodes_[name].devices = std::move(view.devices);
  }
  absl::flat_hash_set<std::string> pinned_uids;
  for (ledger::PodAllocation& pin : ledger.Pinned()) {
    if (!pin.node.empty()) {
      pinned_uids.insert(pin.uid);
      out.nodes_[pin.node].pinned.push_back(std::move(pin));
    }
  }
  for (ledger::PodAllocation& record : ledger.Records()) {
    if (!record.node.empty()) {
      out.nodes_[record.node].records.push_back(std::move(record));
    }
  }
  for (ledger::Reservation& reservation : ledger.Reservations()) {
    out.nodes_[reservation.node].reservations.push_back(std::move(reservation));
  }
  return out;
}

const HoldersByNode::OnNode* HoldersByNode::Find(std::string_view node) const {
  auto it = nodes_.find(absl::string_view(node.data(), node.size()));
  return it == nodes_.end() ? nullptr : &it->second;
}

namespace {

// What the node holds without the pods in `gone` (and without the preemptor itself).
std::unique_ptr<ledger::Ledger> WhatIf(const HoldersByNode::OnNode& on, std::string_view self,
                                       const absl::flat_hash_set<std::string>& gone) {
  std::vector<ledger::PodAllocation> records;
  records.reserve(on.records.size());
  for (const ledger::PodAllocation& r : on.records) {
    if (r.uid != self && !gone.contains(r.uid)) {
      records.push_back(r);
    }
  }
  std::vector<ledger::Reservation> reservations;
  for (const ledger::Reservation& r : on.reservations) {
    if (r.uid != self) {
      reservations.push_back(r);
    }
  }
  return ledger::Ledger::Recompute({on.devices}, records, reservations, on.pinned);
}

// Whether a victim is given back before another (kube-scheduler's reprieve order).
bool ReprieveFirst(const PotentialVictim* a, const PotentialVictim* b) {
  return std::make_tuple(!a->violates_pdb, -static_cast<int64_t>(a->priority), a->start_unix,
                         std::string_view(a->uid)) <
         std::make_tuple(!b->violates_pdb, -static_cast<int64_t>(b->priority), b->start_unix,
                         std::string_view(b->uid));
}

}  // namespace

std::optional<NodeVictims> VictimsOn(const Config& config, const Input& in,
                                     const HoldersByNode& holders, std::string_view node,
                                     const PotentialVictims& potential,
                                     const absl::flat_hash_set<std::string>& evicted) {
  const HoldersByNode::OnNode* on = holders.Find(node);
  if (on == nullptr || on->devices == nullptr) {
    return std::nullopt;
  }
  const std::string& self = in.pod->meta.uid;
  std::vector<const PotentialVictim*> candidates;
  absl::flat_hash_set<std::string> gone = evicted;
  for (const ledger::PodAllocation& r : on->records) {
    if (r.bound_node != node || r.terminal || r.deleted || r.uid == self ||
        evicted.contains(r.uid)) {
      continue;
    }
    auto it = potential.find(r.uid);
    if (it != potential.end() && it->second.priority < in.pod->priority) {
      candidates.push_back(&it->second);
      gone.insert(r.uid);
    }
  }

  // The namespace's usage elsewhere stays; on this node it is what the what-if holds.
  const schedule::NamespaceQuota live_quota = PreCheck(config, in);
  const ledger::NamespaceUsage all_here =
      WhatIf(*on, self, /*gone=*/{}).get()->UsageOf(in.pod->meta.ns);
  auto fits = [&](const absl::flat_hash_set<std::string>& without) {
    std::unique_ptr<ledger::Ledger> what_if = WhatIf(*on, self, without);
    const ledger::NamespaceUsage left = what_if->UsageOf(in.pod->meta.ns);
    schedule::NamespaceQuota quota = live_quota;
    quota.usedmem -= all_here.usedmem - left.usedmem;
    quota.usedcores -= all_here.usedcores - left.usedcores;
    Input view = in;
    view.ledger = what_if.get();
    view.unknown = nullptr;
    std::vector<schedule::Candidate> one(1);
    one[0].name = std::string(node);
    Snapshot(view, &one);
    return Place(config, view, one, quota);
  };

  schedule::Decision decision = fits(gone);
  if (!decision.winner) {
    return std::nullopt;
  }
  std::sort(candidates.begin(), candidates.end(), ReprieveFirst);
  NodeVictims out;
  for (const PotentialVictim* v : candidates) {
    gone.erase(v->uid);
    schedule::Decision still = fits(gone);
    if (still.winner) {
      decision = std::move(still);
      continue;
    }
    gone.insert(v->uid);
    out.victims.push_back(*v);
    out.pdb_violations += v->violates_pdb ? 1 : 0;
  }
  out.decision = std::move(decision);
  return out;
}

}  // namespace tessera::cycle

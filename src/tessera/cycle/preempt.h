// File: tessera/cycle/preempt.h
//
// The preemption stage of the decision cycle: on one node, the victims whose removal lets a pod
// fit on concrete devices — kube-scheduler's victim rule (remove every lower-priority pod, then
// give back the most important first) run through the cycle's own stages on a what-if copy of
// the node's ledger. The rule and why: docs/preemption.md.
//
//   HoldersByNode holders = HoldersByNode::Of(ledger);
//   std::optional<NodeVictims> v = VictimsOn(config, in, holders, "n1", potential, evicted);
//   if (v) { ... v->victims: the pods to evict, fewest PDB violations, lowest priorities ... }
//
// Errors: none; nullopt when the pod fits on that node not even with every potential victim
// gone (or the node is not registered). Thread safety: free functions over immutable inputs;
// HoldersByNode is a snapshot, safe to share once built.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "tessera/cycle/cycle.h"
#include "tessera/ledger/ledger.h"

namespace tessera::cycle {

// The ledger's holders grouped by node, taken at one instant (records, reservations and pins
// are read one after the other, so a pod may move between them; a what-if is advisory).
class HoldersByNode {
 public:
  struct OnNode {
    std::shared_ptr<const device::NodeDevices> devices;  // null: not registered
    std::vector<ledger::PodAllocation> records;          // whose allocation names this node
    std::vector<ledger::Reservation> reservations;
    std::vector<ledger::PodAllocation> pinned;
  };

  static HoldersByNode Of(const ledger::Ledger& ledger);
  // The node's holders, or null when the ledger knows nothing of it.
  const OnNode* Find(std::string_view node) const;

 private:
  absl::flat_hash_map<std::string, OnNode> nodes_;
};

// A pod that may be evicted for the preemptor, as the caller knows it (the pod informer).
struct PotentialVictim {
  std::string uid;
  std::string ns;
  std::string name;
  int32_t priority = 0;
  int64_t start_unix = 0;     // status.startTime (0: unknown, treated as the oldest)
  bool violates_pdb = false;  // its eviction would take a PodDisruptionBudget below its minimum
};

// Keyed by uid.
using PotentialVictims = absl::flat_hash_map<std::string, PotentialVictim>;

struct NodeVictims {
  std::vector<PotentialVictim> victims;  // in the order they were tried (VictimsOn)
  int64_t pdb_violations = 0;            // how many of `victims` violate a budget
  schedule::Decision decision;           // where the pod would go once they are gone
};

// The victims on `node` for the pod of `in` (its request and constraints; in.ledger the live
// ledger, read for the namespace quota only). Candidates are the pods bound to the node (a record
// whose allocation and spec.nodeName both name it, not terminal, not deleted) that are in
// `potential` with a priority below in.pod's. Pods in `evicted` (uids kube-scheduler already
// proposes to evict on that node) count as gone and are not returned. All candidates are removed;
// if the pod then fits, each is given back in turn — those that violate a PodDisruptionBudget
// first, then by priority descending, start time ascending, uid — and stays only if the pod still
// fits without it. The fit is the cycle's own (Snapshot, PreCheck, Place) on a ledger recomputed
// from the node's holders without the removed pods; the namespace quota's usage drops by the
// removed pods of the pod's namespace. nullopt: the pod does not fit even with all removed.
std::optional<NodeVictims> VictimsOn(const Config& config, const Input& in,
                                     const HoldersByNode& holders, std::string_view node,
                                     const PotentialVictims& potential,
                                     const absl::flat_hash_set<std::string>& evicted);

}  // namespace tessera::cycle

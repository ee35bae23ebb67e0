// File: tessera/schedule/score.h
//
// Node scoring and the filter decision: which candidate node a pod goes to and with which
// devices (HAMi v2.10, docs/hami-protocol.md §4.2 step 3–5 and §4.5). Pure: no I/O, no clock.
//
//   Decision d = Decide(candidates, request, constraints, NodePolicy::kBinpack, GpuPolicy{});
//   if (d.winner) { /* annotate the pod with d.devices on candidates[*d.winner].name */ }
//
// Thread safety: Decide and ComputeNodeScore are thread-compatible (they only read their
// arguments); concurrent calls need no locking.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/device/model.h"
#include "tessera/schedule/fit.h"

namespace tessera::schedule {

// Reasons for nodes that never reach the device fit (HAMi's strings).
inline constexpr std::string_view kNodeUnregistered = "node unregistered";
inline constexpr std::string_view kNodeUsageUnavailable = "node usage unavailable";

// HAMi v2.10 ComputeDefaultScore over every device of the node, with usage BEFORE the pod:
//   10 * (ΣUsed/ΣCount + ΣUsedcores/ΣTotalcore + ΣUsedmem/ΣTotalmem), 0 if any sum of totals
// is 0 (or the snapshot is malformed).
double ComputeNodeScore(const device::NodeSnapshot& node);

// One candidate node of a filter call. `snapshot` is nullopt when the node is not registered
// (has no device registration): it fails with "node unregistered".
struct Candidate {
  std::string name;
  std::optional<device::NodeSnapshot> snapshot;
  // Another pod's bind is in flight on this node (HAMi's node lock held or about to be): a bind
  // here now would be refused. Not HAMi's input; the live filter sets it (busy_nodes.h).
  bool busy = false;
};

// The verdict on one candidate.
struct NodeResult {
  std::string_view node;  // views Candidate::name: valid while the candidates live
  bool fit = false;
  double score = 0;  // ComputeNodeScore (0 for unregistered nodes)
  // Why the node failed: the parts of the first failing container, sorted (empty on success
  // and for unregistered / unavailable nodes); Strings() gives the "n/m Reason" texts.
  ReasonParts reasons;
  int failed_container = -1;  // -1 when fit, or when the failure is not a container's
  // The failure as HAMi writes it: reasons joined with ", ", or "node unregistered" /
  // "node usage unavailable". Empty when fit.
  std::string reason;
};

// The decision for one pod over a list of candidates.
struct Decision {
  // The pod asks for no device (PodRequest::Empty()): HAMi passes the input nodes through
  // untouched, so every candidate is marked fit, nothing is scored, winner is empty.
  bool no_request = false;
  std::optional<size_t> winner;    // index into the candidates (and `nodes`)
  device::PodDevices devices;      // the winner's devices, one entry per container (init first)
  device::PodMigReservations mig;  // their MIG instances, parallel to `devices` (Fitter)
  std::vector<NodeResult> nodes;   // one per candidate, in candidate order
  // The namespace quota refused a card on some node: the smallest such ask (Fitter::quota_miss).
  std::optional<QuotaMiss> quota_miss;
};

// Decides where the pod goes. The effective policies are the pod's annotations
// (constraints.node_policy / gpu_policy) or else the defaults. Every registered candidate is
// scored (ComputeNodeScore, before placement) and fitted (Fitter); among the fitting nodes
// binpack picks the highest score and spread the lowest; equal scores go to the node name
// ascending, then candidate position ascending. A fitting node that is not busy beats every busy
// one; with no busy candidate (HAMi's case) the choice is HAMi's.
// With a limited `quota` every card is also checked against the namespace's quota (quota.h).
Decision Decide(const std::vector<Candidate>& candidates, const device::PodRequest& request,
                const device::PodConstraints& constraints, device::NodePolicy default_node_policy,
                const device::GpuPolicy& default_gpu_policy, const NamespaceQuota* quota = nullptr);

}  // namespace tessera::schedule

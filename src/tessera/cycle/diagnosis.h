// File: tessera/cycle/diagnosis.h
//
// The diagnosis of a decision cycle that found no node: every candidate that failed, typed
// (FailedNode: its devices' reasons, or a node-level failure), and the namespace quota's refusal
// as /filter's event writes it. The verdict (extender/verdict.h) is built from it; the filter's
// FailedNodes, events and metric labels read it. Stages and callers: docs/decision-cycle.md.
//
//   Diagnosis d = Diagnose(candidates, decision, quota);
//   for (size_t k = 0; k < d.failed.size(); ++k) { d.failed[k]; decision.nodes[d.at[k]]; }
//
// Errors: none. Thread safety: pure functions over their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/schedule/fit.h"
#include "tessera/schedule/quota.h"
#include "tessera/schedule/score.h"

namespace tessera::cycle {

// Why one candidate node did not fit.
enum class NodeFailure : uint8_t {
  kDevices,           // its devices: FailedNode::parts gives the reasons, "1/2 Card..."
  kUnregistered,      // no device registration: "node unregistered"
  kUsageUnavailable,  // "node usage unavailable"
  kBlocked,           // a running pod's allocation does not decode (schedule::NodeBlockedReason)
};
inline constexpr size_t kNodeFailureCount = 4;
// The reason as a bounded label: "node unregistered", "node usage unavailable",
// schedule::kNodeBlockedReasonPrefix (no pod name); "" for kDevices (its parts name themselves).
std::string_view NodeFailureLabel(NodeFailure failure);

struct FailedNode {
  std::string node;
  NodeFailure failure = NodeFailure::kDevices;
  schedule::ReasonParts parts;  // kDevices: per reason, how many devices failed for it
};

// The typed reason of candidate `name` that failed, from the fields schedule::Decide fills.
FailedNode FailedNodeOf(std::string_view name, const schedule::NodeResult& result);

struct Diagnosis {
  // When no node was picked: every candidate that failed, once however often the candidates
  // name it, in candidate order. Empty when a node was picked (or the pod passes through).
  std::vector<FailedNode> failed;
  std::vector<size_t> at;  // parallel to `failed`: the index of its first candidate
  // The namespace quota refused a card on some node (even when another node was picked):
  // "namespace ml: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked"
  // (schedule::QuotaMissText); empty when no quota refused one.
  std::string quota;
};

// The diagnosis of `decision` over `candidates` (parallel to decision.nodes), whose namespace
// quota bound was `quota`.
Diagnosis Diagnose(const std::vector<schedule::Candidate>& candidates,
                   const schedule::Decision& decision, const schedule::NamespaceQuota& quota);

}  // namespace tessera::cycle

#include "tessera/cycle/diagnosis.h"

#include "absl/container/flat_hash_set.h"

namespace tessera::cycle {

std::string_view NodeFailureLabel(NodeFailure failure) {
  switch (failure) {
    case NodeFailure::kDevices:
      return "";
    case NodeFailure::kUnregistered:
      return schedule::kNodeUnregistered;
    case NodeFailure::kUsageUnavailable:
      return schedule::kNodeUsageUnavailable;
    case NodeFailure::kBlocked:
      return schedule::kNodeBlockedReasonPrefix;
  }
  return "";
}

FailedNode FailedNodeOf(std::string_view name, const schedule::NodeResult& r) {
  FailedNode f;
  f.node = std::string(name);
  if (!r.reasons.empty()) {
    f.parts = r.reasons;
  } else if (r.reason == schedule::kNodeUnregistered) {
    f.failure = NodeFailure::kUnregistered;
  } else if (r.reason == schedule::kNodeUsageUnavailable) {
    f.failure = NodeFailure::kUsageUnavailable;
  } else if (r.reason.starts_with(schedule::kNodeBlockedReasonPrefix)) {
    f.failure = NodeFailure::kBlocked;
  }
  return f;
}

Diagnosis Diagnose(const std::vector<schedule::Candidate>& candidates,
                   const schedule::Decision& decision, const schedule::NamespaceQuota& quota) {
  Diagnosis d;
  if (decision.quota_miss) {
    d.quota = schedule::QuotaMissText(quota, *decision.quota_miss);
  }
  if (decision.winner) {
    return d;
  }
  absl::flat_hash_set<std::string_view> seen;
  for (size_t i = 0; i < decision.nodes.size(); ++i) {
    const schedule::NodeResult& r = decision.nodes[i];
    if (r.fit || !seen.insert(candidates[i].name).second) {
      continue;
    }
    d.failed.push_back(FailedNodeOf(candidates[i].name, r));
    d.at.push_back(i);
  }
  return d;
}

}  // namespace tessera::cycle

#include "tessera/schedule/score.h"

#include <cstdint>

namespace tessera::schedule {

double ComputeNodeScore(const device::NodeSnapshot& node) {
  if (node.devices == nullptr || node.usage.size() != node.devices->devices.size()) {
    return 0;
  }
  int64_t count = 0;
  int64_t totalcore = 0;
  int64_t totalmem = 0;
  int64_t used = 0;
  int64_t usedcores = 0;
  int64_t usedmem = 0;
  const auto& devs = node.devices->devices;
  for (size_t i = 0; i < devs.size(); ++i) {
    count += devs[i].count;
    totalcore += devs[i].devcore;
    totalmem += devs[i].devmem;
    used += node.usage[i].used;
    usedcores += node.usage[i].usedcores;
    usedmem += node.usage[i].usedmem;
  }
  if (count == 0 || totalcore == 0 || totalmem == 0) {
    return 0;
  }
  return 10.0 * (static_cast<double>(used) / static_cast<double>(count) +
                 static_cast<double>(usedcores) / static_cast<double>(totalcore) +
                 static_cast<double>(usedmem) / static_cast<double>(totalmem));
}

Decision Decide(const std::vector<Candidate>& candidates, const device::PodRequest& request,
                const device::PodConstraints& constraints, device::NodePolicy default_node_policy,
                const device::GpuPolicy& default_gpu_policy) {
  Decision decision;
  decision.nodes.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    decision.nodes[i].node = candidates[i].name;
  }
  if (request.Empty()) {
    decision.no_request = true;
    for (auto& n : decision.nodes) {
      n.fit = true;
    }
    return decision;
  }
  const device::NodePolicy node_policy = constraints.node_policy.value_or(default_node_policy);
  const device::GpuPolicy& gpu_policy =
      constraints.gpu_policy.has_value() ? *constraints.gpu_policy : default_gpu_policy;
  const bool binpack = node_policy == device::NodePolicy::kBinpack;

  Fitter fitter;
  fitter.Prepare(request, constraints, gpu_policy);
  std::optional<size_t> best;
  for (size_t i = 0; i < candidates.size(); ++i) {
    NodeResult& out = decision.nodes[i];
    const auto& snapshot = candidates[i].snapshot;
    if (!snapshot.has_value()) {
      out.reason = kNodeUnregistered;
      continue;
    }
    const bool fit = fitter.Fit(*snapshot, /*want_usage_after=*/false);
    out.score = fitter.node_score();  // == ComputeNodeScore(*snapshot), from the same pass
    if (!fit) {
      out.failed_container = fitter.failed_container();
      if (out.failed_container < 0) {
        out.reason = kNodeUsageUnavailable;
      } else {
        out.reasons = fitter.reasons();
        out.reasons.JoinTo(&out.reason);
      }
      continue;
    }
    out.fit = true;
    if (!best.has_value()) {
      best = i;
      continue;
    }
    const NodeResult& b = decision.nodes[*best];
    bool better = binpack ? out.score > b.score : out.score < b.score;
    if (out.score == b.score && out.node < b.node) {
      better = true;  // ties: node name ascending (then candidate order: `best` came first)
    }
    if (better) {
      best = i;
    }
  }
  if (best.has_value()) {
    decision.winner = best;
    const auto& snapshot = *candidates[*best].snapshot;
    fitter.Fit(
        snapshot,
        /*want_usage_after=*/false);  // re-run on the winner only, to materialise its devices
    decision.devices = fitter.BuildPodDevices(snapshot);
  }
  return decision;
}

}  // namespace tessera::schedule

#include "tessera/schedule/score.h"

#include <cstdint>
#include <vector>

namespace tessera::schedule {

double ComputeNodeScore(const device::NodeSnapshot& node) {
  if (node.devices == nullptr || node.usage.size() != node.devices->devices.size()) {
    return 0;
  }
  NodeUsageTotals totals;
  const auto& devs = node.devices->devices;
  for (size_t i = 0; i < devs.size(); ++i) {
    totals.Add(devs[i], node.usage[i]);
  }
  return totals.Score();
}

namespace {

// The candidates' device lists lie scattered over the heap and are mostly out of the caches
// when a filter comes (other threads ran in between): the first read of a DeviceInfo was half of
// the fit's time (perf of `tessera bench serve`). A node's list is fetched a few nodes ahead, and
// its type strings (outside the DeviceInfo when longer than 15 bytes) one node ahead, when the
// list has arrived, so that the misses overlap the fits of the nodes before.
constexpr size_t kPrefetchDistance = 3;

// GCC deletes a loop whose body is only __builtin_prefetch (it has no side effect, and C++ lets
// such loops go): the empty asm statement keeps each prefetch.
inline void PrefetchLine(const void* p) {
  __builtin_prefetch(p);
  asm volatile("" : : "r"(p));
}

const std::vector<device::DeviceInfo>* DevicesOf(const std::vector<Candidate>& candidates,
                                                 size_t i) {
  if (i >= candidates.size() || !candidates[i].snapshot || !candidates[i].snapshot->devices) {
    return nullptr;
  }
  return &candidates[i].snapshot->devices->devices;
}

void Prefetch(const std::vector<Candidate>& candidates, size_t i) {
  if (const std::vector<device::DeviceInfo>* devices =
          DevicesOf(candidates, i + kPrefetchDistance)) {
    const char* first = reinterpret_cast<const char*>(devices->data());
    const size_t bytes = devices->size() * sizeof(device::DeviceInfo);
    for (size_t at = 0; at < bytes; at += 64) {
      PrefetchLine(first + at);
    }
  }
  if (const std::vector<device::DeviceInfo>* devices = DevicesOf(candidates, i + 1)) {
    for (const device::DeviceInfo& d : *devices) {
      PrefetchLine(d.type.data());
    }
  }
}

}  // namespace

Decision Decide(const std::vector<Candidate>& candidates, const device::PodRequest& request,
                const device::PodConstraints& constraints, device::NodePolicy default_node_policy,
                const device::GpuPolicy& default_gpu_policy, const NamespaceQuota* quota) {
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
  fitter.Prepare(request, constraints, gpu_policy, quota);
  std::optional<size_t> best;
  for (size_t i = 0; i < candidates.size(); ++i) {
    Prefetch(candidates, i);
    NodeResult& out = decision.nodes[i];
    const auto& snapshot = candidates[i].snapshot;
    if (!snapshot.has_value()) {
      out.reason = kNodeUnregistered;
      continue;
    }
    if (!snapshot->blocked_by.empty()) {
      out.reason = NodeBlockedReason(snapshot->blocked_by);  // holder rule 6: not scored
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
    if (candidates[i].busy != candidates[*best].busy) {
      better = candidates[*best].busy;  // a node free to bind first, whatever the scores
    }
    if (better) {
      best = i;
    }
  }
  decision.quota_miss = fitter.quota_miss();
  if (best.has_value()) {
    decision.winner = best;
    const auto& snapshot = *candidates[*best].snapshot;
    fitter.Fit(
        snapshot,
        /*want_usage_after=*/false);  // re-run on the winner only, to materialise its devices
    decision.devices = fitter.BuildPodDevices(snapshot);
    decision.mig = fitter.BuildMigReservations(snapshot);
  }
  return decision;
}

}  // namespace tessera::schedule

// File: tessera/schedule/vendors/nvidia_topology.h
//
// NVIDIA's topology-aware choice (HAMi's computeWorstSingleCard / computeBestCombination): under
// the topology-aware policy the walk collects every passing card, and with more than the
// container's Nums of them the node's pair scores (NodeDevices::pair_scores) choose. For one GPU:
// the card with the lowest sum of scores towards the other candidates; for several: the subset
// with the highest sum of pair scores, every subset tried up to kMaxTopologySubsets (fit.h), then
// greedily. First in visiting order on ties.
//
// Internal to tessera::schedule. Thread safety: holds scratch; one per Fitter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/device/model.h"
#include "tessera/schedule/fit.h"

namespace tessera::schedule {

class TopologyChooser {
 public:
  // Keeps in *taken (more than nums devices, in visiting order) the nums devices HAMi would
  // choose, in visiting order.
  void Select(const device::NodeDevices& node, int32_t nums, std::vector<Fitter::Taken>* taken);

 private:
  // Enumerates the subsets of *taken_ of size best_subset_.size() in index order (subset_ holds
  // the first `depth` members, whose pair sum is `sum`); keeps the best in best_subset_.
  void BestSubset(const device::NodeDevices& node, size_t start, size_t depth, int64_t sum);
  // The greedy choice beyond kMaxTopologySubsets, into best_subset_.
  void GreedySubset(const device::NodeDevices& node, size_t want);

  std::vector<Fitter::Taken>* taken_ = nullptr;  // Select's
  std::vector<Fitter::Taken> picked_;            // the chosen subset of *taken_
  std::vector<int32_t> subset_;                  // the subset being tried (*taken_ indices)
  std::vector<int32_t> best_subset_;             // the best subset so far
  std::vector<bool> in_subset_;                  // greedy: membership by *taken_ index
  int64_t subset_best_ = 0;                      // the pair sum of best_subset_
  bool subset_found_ = false;                    // best_subset_ holds a subset
};

}  // namespace tessera::schedule

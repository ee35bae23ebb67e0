// NVIDIA's topology-aware choice among the passing cards. See nvidia_topology.h.
#include "tessera/schedule/vendors/nvidia_topology.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tessera::schedule {
namespace {

// Go's int arithmetic: two's complement, wrapping on overflow.
int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// C(k, n), or `cap` + 1 when it exceeds `cap`.
uint64_t SubsetsUpTo(size_t k, size_t n, uint64_t cap) {
  n = std::min(n, k - n);
  uint64_t c = 1;
  for (size_t i = 1; i <= n; ++i) {
    c = c * (k - n + i) / i;  // exact: C(k-n+i, i) at each step
    if (c > cap) {
      return cap + 1;
    }
  }
  return c;
}

}  // namespace

void TopologyChooser::BestSubset(const device::NodeDevices& node, size_t start, size_t depth,
                                 int64_t sum) {
  const size_t want = best_subset_.size();
  if (depth == want) {
    if (!subset_found_ || sum > subset_best_) {  // strict: the first subset keeps a tie
      subset_found_ = true;
      subset_best_ = sum;
      best_subset_ = subset_;
    }
    return;
  }
  const size_t k = taken_->size();
  for (size_t i = start; i + (want - depth) <= k; ++i) {
    // The pairs (earlier member, i), each read from the earlier member's scores.
    int64_t next = sum;
    const auto dev = static_cast<size_t>((*taken_)[i].device);
    for (size_t m = 0; m < depth; ++m) {
      next = WrapAdd(next, node.PairScore(static_cast<size_t>((*taken_)[subset_[m]].device), dev));
    }
    subset_[depth] = static_cast<int32_t>(i);
    BestSubset(node, i + 1, depth + 1, next);
  }
}

void TopologyChooser::GreedySubset(const device::NodeDevices& node, size_t want) {
  const size_t k = taken_->size();
  auto pair = [&](size_t a, size_t b) {  // a before b in visiting order
    return node.PairScore(static_cast<size_t>((*taken_)[a].device),
                          static_cast<size_t>((*taken_)[b].device));
  };
  // The best pair first, then the card that adds the most to the chosen ones.
  size_t best_a = 0;
  size_t best_b = 1;
  for (size_t a = 0; a < k; ++a) {
    for (size_t b = a + 1; b < k; ++b) {
      if (pair(a, b) > pair(best_a, best_b)) {
        best_a = a;
        best_b = b;
      }
    }
  }
  in_subset_.assign(k, false);
  in_subset_[best_a] = true;
  in_subset_[best_b] = true;
  for (size_t size = 2; size < want; ++size) {
    bool found = false;
    size_t pick = 0;
    int64_t pick_gain = 0;
    for (size_t c = 0; c < k; ++c) {
      if (in_subset_[c]) {
        continue;
      }
      int64_t gain = 0;
      for (size_t m = 0; m < k; ++m) {
        if (in_subset_[m]) {
          gain = WrapAdd(gain, m < c ? pair(m, c) : pair(c, m));
        }
      }
      if (!found || gain > pick_gain) {
        found = true;
        pick = c;
        pick_gain = gain;
      }
    }
    in_subset_[pick] = true;
  }
  best_subset_.clear();
  for (size_t c = 0; c < k; ++c) {
    if (in_subset_[c]) {
      best_subset_.push_back(static_cast<int32_t>(c));
    }
  }
}

void TopologyChooser::Select(const device::NodeDevices& node, int32_t nums,
                             std::vector<Fitter::Taken>* taken) {
  taken_ = taken;
  const size_t k = taken_->size();
  const auto want = static_cast<size_t>(nums);
  if (node.pair_scores.empty()) {
    // Every score is 0: the worst card and the best subset are the first in visiting order.
    taken_->resize(want);
    return;
  }
  if (want == 1) {
    // HAMi computeWorstSingleCard: the lowest sum towards the other candidates; first on a tie.
    size_t worst = 0;
    int64_t worst_sum = 0;
    for (size_t c = 0; c < k; ++c) {
      int64_t sum = 0;
      for (size_t d = 0; d < k; ++d) {
        if (d != c) {
          sum = WrapAdd(sum, node.PairScore(static_cast<size_t>((*taken_)[c].device),
                                            static_cast<size_t>((*taken_)[d].device)));
        }
      }
      if (c == 0 || sum < worst_sum) {
        worst = c;
        worst_sum = sum;
      }
    }
    (*taken_)[0] = (*taken_)[worst];
    taken_->resize(1);
    return;
  }
  // HAMi generateCombinations + computeBestCombination: every subset in index order, the
  // highest pair sum, the first on a tie. Beyond kMaxTopologySubsets subsets, greedily.
  best_subset_.resize(want);
  if (SubsetsUpTo(k, want, kMaxTopologySubsets) <= kMaxTopologySubsets) {
    subset_.resize(want);
    subset_found_ = false;
    subset_best_ = 0;
    BestSubset(node, 0, 0, 0);
  } else {
    GreedySubset(node, want);
  }
  picked_.clear();
  for (int32_t c : best_subset_) {
    picked_.push_back((*taken_)[static_cast<size_t>(c)]);
  }
  taken_->swap(picked_);
}

}  // namespace tessera::schedule

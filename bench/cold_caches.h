// File: bench/cold_caches.h
//
// For benchmarks of the filter's hot path as `tessera serve` runs it: between two filters the
// HTTP, informer and API threads have used the caches, so the nodes a filter reads are mostly
// out of them. Call between iterations, outside the timing:
//
//   state.PauseTiming();  cold_caches.Evict();  state.ResumeTiming();
//
// Thread safety: one ColdCaches per thread.
#pragma once

#include <cstddef>
#include <vector>

#include "benchmark/benchmark.h"

namespace tessera::bench {

class ColdCaches {
 public:
  // Writes one byte per line of a 4 MiB buffer: more than a core's L2 (2 MiB here).
  void Evict() {
    for (size_t i = 0; i < scrub_.size(); i += 64) {
      scrub_[i] = static_cast<char>(scrub_[i] + 1);
    }
    benchmark::ClobberMemory();
  }

 private:
  std::vector<char> scrub_ = std::vector<char>(size_t{4} << 20);
};

}  // namespace tessera::bench

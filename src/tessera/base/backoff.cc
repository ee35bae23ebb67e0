#include "tessera/base/backoff.h"

#include <algorithm>

namespace tessera {

Backoff::Backoff(Options options, uint64_t seed)
    : options_(options), current_(options.initial), rng_(seed) {
  options_.jitter = std::clamp(options_.jitter, 0.0, 1.0);
  if (options_.factor < 1.0) {
    options_.factor = 1.0;
  }
}

absl::Duration Backoff::Next() {
  ++attempts_;
  absl::Duration base = std::min(current_, options_.cap);
  current_ = std::min(current_ * options_.factor, options_.cap);
  if (options_.jitter <= 0) {
    return base;
  }
  std::uniform_real_distribution<double> dist(1.0 - options_.jitter, 1.0 + options_.jitter);
  return std::min(base * dist(rng_), options_.cap);
}

void Backoff::Reset() {
  current_ = options_.initial;
  attempts_ = 0;
}

}  // namespace tessera

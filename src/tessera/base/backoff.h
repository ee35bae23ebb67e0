// File: tessera/base/backoff.h
//
// Exponential backoff with jitter, as client-go's wait.Backoff: each Next() returns
// min(cap, initial * factor^n) scaled by a random factor in [1 - jitter, 1 + jitter], then
// clamped to `cap`. Reset() returns to `initial` (call it after a period of health).
//
//   Backoff b(Backoff::Options{.initial = absl::Milliseconds(100), .cap = absl::Seconds(30)});
//   while (!TryAgain().ok()) clock->SleepFor(b.Next());
//
// Thread safety: not thread-safe; each retry loop owns its Backoff.
#pragma once

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace tessera {

class Backoff {
 public:
  struct Options {
    absl::Duration initial = absl::Milliseconds(100);
    absl::Duration cap = absl::Seconds(30);
    double factor = 2.0;
    // Fraction of each delay that is randomised, in [0, 1].
    double jitter = 0.5;
  };

  explicit Backoff(Options options, uint64_t seed = 0x7e55e7a);

  // The delay before the next attempt.
  absl::Duration Next();
  // Back to the initial delay.
  void Reset();
  // Number of Next() calls since construction or the last Reset().
  int attempts() const { return attempts_; }

 private:
  Options options_;
  absl::Duration current_;
  int attempts_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace tessera

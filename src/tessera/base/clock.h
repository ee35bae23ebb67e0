// File: tessera/base/clock.h
//
// Clock is the only way Tessera code reads time, so tests drive time with FakeClock instead of
// sleeping. The pure core (device, ledger, schedule) never reads a clock at all: callers pass
// the time in as an argument.
//
// Thread safety: RealClock and FakeClock are safe for concurrent use.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "tessera/base/mutex.h"

namespace tessera {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time now.
  virtual absl::Time Now() const = 0;
  // The process-wide real clock (never deleted).
  static Clock* Real();
};

// A clock that moves only when told to. Starts at `start` (default: 2026-01-01T00:00:00Z).
class FakeClock : public Clock {
 public:
  FakeClock();
  explicit FakeClock(absl::Time start);
  absl::Time Now() const override;
  void Advance(absl::Duration d);
  void Set(absl::Time t);

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

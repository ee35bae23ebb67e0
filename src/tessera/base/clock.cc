#include "tessera/base/clock.h"

namespace tessera {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* Clock::Real() {
  static Clock* clock = new RealClock();
  return clock;
}

FakeClock::FakeClock() : FakeClock(absl::FromUnixSeconds(1767225600)) {}
FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::Set(absl::Time t) {
  MutexLock lock(&mu_);
  now_ = t;
}

}  // namespace tessera

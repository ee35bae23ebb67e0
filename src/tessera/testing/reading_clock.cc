#include "tessera/testing/reading_clock.h"

namespace tessera::testing {

absl::Time ReadingClock::Now() const {
  const absl::Time now = time_->Now();
  {
    MutexLock l(&mu_);
    ++reads_[std::this_thread::get_id()];
  }
  read_.SignalAll();
  return now;
}

bool ReadingClock::WaitForReads(std::thread::id thread, int reads, absl::Duration timeout) const {
  // Real time: the reads are made by another thread, which a fake clock does not pace.
  Clock* const real = Clock::Real();
  const absl::Time deadline = real->Now() + timeout;
  MutexLock l(&mu_);
  while (reads_[thread] < reads) {
    const absl::Duration left = deadline - real->Now();
    if (left <= absl::ZeroDuration()) {
      return false;
    }
    read_.WaitFor(&mu_, absl::ToChronoNanoseconds(left));
  }
  return true;
}

void ReadingClock::ForgetReads() {
  MutexLock l(&mu_);
  reads_.clear();
}

}  // namespace tessera::testing

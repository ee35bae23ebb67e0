// File: tessera/testing/reading_clock.h
//
// Test-only (library tessera::testing_objects). ReadingClock tells the time of another clock (by
// default the real one) and counts each thread's reads of it, so that a test can wait until a
// thread has reached a wait that reads the clock first, instead of sleeping and hoping it has:
//
//   testing::ReadingClock clock;  // passed to the code under test
//   std::thread t([&] { component.WaitForSomething(); });
//   ASSERT_TRUE(clock.WaitForReads(t.get_id(), 2));  // t read the clock twice: it is waiting
//
// A read counts once its time has been taken: after WaitForReads, a FakeClock's Advance is seen
// by that thread's next read, never by the one counted.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <map>
#include <thread>

#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"

namespace tessera::testing {

class ReadingClock : public Clock {
 public:
  // `time` must outlive this clock.
  explicit ReadingClock(Clock* time = Clock::Real()) : time_(time) {}

  absl::Time Now() const override;

  // Blocks until `thread` has read the clock at least `reads` times (then true) or `timeout`
  // of real time has passed (then false).
  bool WaitForReads(std::thread::id thread, int reads,
                    absl::Duration timeout = absl::Seconds(10)) const;
  // Forgets every read so far (a later thread may get the id of a finished one).
  void ForgetReads();

 private:
  Clock* const time_;
  mutable Mutex mu_;
  mutable CondVar read_;
  mutable std::map<std::thread::id, int> reads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::testing

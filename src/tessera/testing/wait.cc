#include "tessera/testing/wait.h"

#include "absl/time/clock.h"

#include "tessera/base/clock.h"

namespace tessera::testing {

bool Eventually(const std::function<bool()>& condition, absl::Duration timeout,
                absl::Duration poll) {
  // Real time: the condition is made true by another thread or process, which a fake clock does
  // not pace.
  Clock* const clock = Clock::Real();
  const absl::Time deadline = clock->Now() + timeout;
  while (clock->Now() < deadline) {
    if (condition()) {
      return true;
    }
    absl::SleepFor(poll);
  }
  return condition();
}

}  // namespace tessera::testing

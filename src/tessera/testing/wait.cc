#include "tessera/testing/wait.h"

#include "absl/time/clock.h"

namespace tessera::testing {

bool Eventually(const std::function<bool()>& condition, absl::Duration timeout,
                absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) {
      return true;
    }
    absl::SleepFor(poll);
  }
  return condition();
}

}  // namespace tessera::testing

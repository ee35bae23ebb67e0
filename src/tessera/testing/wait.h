// File: tessera/testing/wait.h
//
// Test-only (library tessera::testing_objects). Polling for a condition that another thread or
// process makes true, with a deadline (never an unbounded wait):
//
//   ASSERT_TRUE(testing::Eventually([&] { return informer.Has(key); }));
#pragma once

#include <functional>

#include "absl/time/time.h"

namespace tessera::testing {

// Calls `condition` every `poll` until it returns true (then true) or `timeout` has passed
// (then its last answer, asked once more at the deadline).
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(10),
                absl::Duration poll = absl::Milliseconds(10));

}  // namespace tessera::testing

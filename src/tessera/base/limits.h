// File: tessera/base/limits.h
//
// Process resource limits. A server that holds one descriptor per connection needs more than
// the usual soft limit of 1,024 open files to keep 1,000+ connections (docs/serve.md "Listener
// limits"); Go's runtime raises the soft limit to the hard limit at start for the same reason, and
// so does `tessera serve`.
//
// Thread safety: call from main() before threads start (the limit is process-wide).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace tessera {

// Raises the soft RLIMIT_NOFILE to the hard limit and returns the soft limit now in effect.
// Errors: Internal when the limit cannot be read or set (the old limit stays).
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

}  // namespace tessera

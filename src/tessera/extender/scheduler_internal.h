// File: tessera/extender/scheduler_internal.h
//
// Helpers shared by the files that implement Scheduler (scheduler.cc, bind.cc, bind_managed.cc,
// bind_recheck.cc, pending_check.cc, reservations.cc). Not part of the public API.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"

#include "tessera/kube/objects.h"

namespace tessera::extender::internal {

// A status's message alone, as a reply's error text or an event's message.
inline std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Why `pod` can no longer be given a decision: bound, being deleted or finished; OK when none.
absl::Status NotPending(const kube::Pod& pod);

}  // namespace tessera::extender::internal

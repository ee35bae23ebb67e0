// File: tessera/ledger/ledger_internal.h
//
// Private helpers the ledger's source files share (ledger.cc, ledger_pin.cc, ledger_mig.cc,
// ledger_diff.cc). Not part of the library's interface: include it from those files only.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "absl/strings/string_view.h"

#include "tessera/device/model.h"

namespace tessera::ledger::internal {

// Debian's absl::string_view is its own type: convert at the hash-map boundary.
inline absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Whether two registrations of a node are the same (devices, format, cordons, pair scores).
inline bool SameDevices(const device::NodeDevices& a, const device::NodeDevices& b) {
  return a.node == b.node && a.devices == b.devices && a.format == b.format &&
         a.cordoned == b.cordoned && a.pair_scores == b.pair_scores;
}

// init_count clamped to the containers that are stored (up to the last one with a device):
// it classifies every stored entry as the original did, and two inputs that count the same
// store the same value.
template <typename EntryList>
uint16_t NormalInitCount(int32_t init_count, const EntryList& entries) {
  const int32_t stored = entries.empty() ? 0 : int32_t{entries.back().container} + 1;
  return static_cast<uint16_t>(std::clamp(init_count, 0, stored));
}

}  // namespace tessera::ledger::internal

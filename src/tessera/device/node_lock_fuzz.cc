// Fuzz target: ParseNodeLock is total; an owned lock re-formats and re-parses to the same
// owner and the same time truncated to whole seconds (FormatNodeLock writes UTC seconds).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/time/civil_time.h"

#include "tessera/device/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::device;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<NodeLock> lock = ParseNodeLock(input);
  if (!lock.ok()) {
    if (lock.status().message().empty()) {
      __builtin_trap();
    }
    return 0;
  }
  if (!NodeLockOwnedBy(*lock, lock->ns, lock->name) != lock->legacy) {
    __builtin_trap();
  }
  absl::CivilSecond utc = absl::ToCivilSecond(lock->time, absl::UTCTimeZone());
  if (utc.year() < 0 || utc.year() > 9999) {
    return 0;  // outside FormatNodeLock's precondition (an offset moved the year)
  }
  std::string ns = lock->legacy ? "ns" : lock->ns;
  std::string name = lock->legacy ? "name" : lock->name;
  absl::StatusOr<NodeLock> again = ParseNodeLock(FormatNodeLock(lock->time, ns, name));
  absl::Time whole = absl::FromCivil(utc, absl::UTCTimeZone());
  if (!again.ok() || again->legacy || again->ns != ns || again->name != name ||
      again->time != whole) {
    __builtin_trap();
  }
  return 0;
}

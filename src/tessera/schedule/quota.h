// File: tessera/schedule/quota.h
//
// Namespace quota on GPU memory and cores at filter time: the limits a namespace's
// ResourceQuotas set on the NVIDIA memory and core resources ("limits.nvidia.com/gpumem",
// "limits.nvidia.com/gpucores" by default), the usage the ledger says the namespace holds, and
// the check HAMi v2.10 makes per candidate card (pkg/device/quota.go FitQuota, called from the
// NVIDIA Fit): used + asked > limit fails with ResourceQuotaNotFit. `asked` is the pod's own
// collapsed usage on the node if that card were taken (schedule::Fitter computes it). Semantics
// and the deliberate differences from HAMi: docs/quota.md.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::schedule {

// One limited resource of a namespace.
struct QuotaLimit {
  int64_t limit = 0;   // spec.hard's value in the resource's unit (MiB, percent), unscaled
  std::string object;  // the ResourceQuota that sets it (the smallest; ties: name ascending)

  friend bool operator==(const QuotaLimit&, const QuotaLimit&) = default;
};

// What the check needs for one pod: its namespace's limits (nullopt = unlimited) and usage.
struct NamespaceQuota {
  std::string ns;
  std::string memory_name;  // e.g. "nvidia.com/gpumem"
  std::string cores_name;   // e.g. "nvidia.com/gpucores"
  std::optional<QuotaLimit> memory;
  std::optional<QuotaLimit> cores;
  int32_t memory_factor = 1;  // usage is recorded scaled; the memory limit is scaled to match
  int64_t usedmem = 0;        // the ledger's NamespaceUsage, scaled like the records
  int64_t usedcores = 0;

  bool Limited() const { return memory.has_value() || cores.has_value(); }
  // The memory limit in recorded (scaled) units.
  int64_t MemoryLimit() const;
  // Whether the namespace can take `mem` more (scaled) MiB and `cores` more percent.
  bool Fits(int64_t mem, int64_t cores) const;
};

// Which resource a rejected ask exceeded, with the amounts (for explain and events).
struct QuotaMiss {
  bool memory = true;  // false: cores
  int64_t asked = 0;   // the smallest rejected ask of that resource over the nodes tried
  friend bool operator==(const QuotaMiss&, const QuotaMiss&) = default;
};

// "namespace ml: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked" (memory in the
// quota's unit: scaled amounts are divided back by the memory factor, rounding the ask up).
std::string QuotaMissText(const NamespaceQuota& quota, const QuotaMiss& miss);

// The limits of one namespace from its ResourceQuotas' spec.hard entries, each given as
// (object name, key, quantity string). Keys other than "limits.<memory_name>" and
// "limits.<cores_name>" are ignored; a value that is not a whole number (Kubernetes'
// AsInt64: "1.5", "500m") or that does not parse is skipped, as HAMi skips it, and reported in
// `skipped` ("ml/gpu: limits.nvidia.com/gpumem: \"1.5\" is not a whole number"). When several
// objects limit one resource the smallest wins (a pod must satisfy every quota of its
// namespace, as Kubernetes' own quota admission requires).
struct QuotaEntry {
  std::string_view object;
  std::string_view key;
  std::string_view value;
};
void CollectLimits(const std::vector<QuotaEntry>& entries, NamespaceQuota* quota,
                   std::vector<std::string>* skipped);

}  // namespace tessera::schedule

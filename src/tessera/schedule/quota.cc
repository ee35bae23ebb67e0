#include "tessera/schedule/quota.h"

#include <tuple>

#include "fmt/format.h"

#include "tessera/device/quantity.h"

namespace tessera::schedule {

int64_t NamespaceQuota::MemoryLimit() const {
  if (!memory.has_value()) {
    return 0;
  }
  return memory_factor > 1 ? memory->limit * memory_factor : memory->limit;
}

bool NamespaceQuota::Fits(int64_t mem, int64_t cores_asked) const {
  if (memory.has_value() && usedmem + mem > MemoryLimit()) {
    return false;
  }
  return !(cores.has_value() && usedcores + cores_asked > cores->limit);
}

std::string QuotaMissText(const NamespaceQuota& quota, const QuotaMiss& miss) {
  if (miss.memory) {
    const int64_t f = quota.memory_factor > 1 ? quota.memory_factor : 1;
    return fmt::format("namespace {}: limits.{} {}, used {} + {} asked", quota.ns,
                       quota.memory_name, quota.memory ? quota.memory->limit : 0, quota.usedmem / f,
                       (miss.asked + f - 1) / f);
  }
  return fmt::format("namespace {}: limits.{} {}, used {} + {} asked", quota.ns, quota.cores_name,
                     quota.cores ? quota.cores->limit : 0, quota.usedcores, miss.asked);
}

void CollectLimits(const std::vector<QuotaEntry>& entries, NamespaceQuota* quota,
                   std::vector<std::string>* skipped) {
  for (const QuotaEntry& e : entries) {
    if (!e.key.starts_with("limits.")) {
      continue;
    }
    const std::string_view name = e.key.substr(7);
    std::optional<QuotaLimit>* slot = nullptr;
    if (name == quota->memory_name) {
      slot = &quota->memory;
    } else if (name == quota->cores_name) {
      slot = &quota->cores;
    } else {
      continue;
    }
    absl::StatusOr<device::Quantity> q = device::ParseQuantity(e.value);
    absl::StatusOr<int64_t> v = q.ok() ? q->AsInt64() : absl::StatusOr<int64_t>(q.status());
    if (!v.ok()) {
      if (skipped != nullptr) {
        skipped->push_back(fmt::format("{}/{}: {}: {}", quota->ns, e.object, e.key,
                                       std::string(v.status().message())));
      }
      continue;
    }
    QuotaLimit candidate{*v, std::string(e.object)};
    if (!slot->has_value() ||
        std::tie(candidate.limit, candidate.object) < std::tie((*slot)->limit, (*slot)->object)) {
      *slot = std::move(candidate);
    }
  }
}

}  // namespace tessera::schedule

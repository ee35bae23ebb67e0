// Huawei Ascend's fit rules. See ascend_fit.h.
#include "tessera/schedule/vendors/ascend_fit.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::schedule {
namespace {

using device::DeviceInfo;
using device::DeviceUsage;
using device::NodeDevices;

constexpr std::string_view kHamiCore = "hami-core";
constexpr std::string_view kAscend910Prefix = "Ascend910";
constexpr std::string_view kAscend910C = "Ascend910C";

bool Listed(const std::vector<std::string>& list, std::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

class AscendRules final : public DeviceRules {
 public:
  void Prepare(const device::PodRequest& /*request*/, const device::PodConstraints& constraints,
               const device::GpuPolicy& policy) override {
    constraints_ = &constraints;
    hami_core_ = constraints.vgpu_mode.has_value() && *constraints.vgpu_mode == kHamiCore;
    mutex_ = HasMutex(policy);
  }
  bool MayExceedCandidates(int /*container*/, const ContainerWalk& /*w*/) const override {
    return false;
  }
  void Walk(int container, ContainerWalk& w) override;

 private:
  bool UuidPasses(const DeviceInfo& d) const {
    const auto& c = *constraints_;
    if (!c.use_uuids.empty() && !Listed(c.use_uuids, d.id)) {
      return false;
    }
    return !Listed(c.nouse_uuids, d.id);
  }
  // HAMi's computeBestCombination: the taken cards grouped by numeric NetworkID, the largest
  // groups first (ties: the group met first), each group's cards in visiting order.
  void BestNetworkCombination(const NodeDevices& node, int32_t nums,
                              std::vector<Fitter::Taken>* taken);
  // HAMi's computeBestCombination910C: whole modules (device index / 2) with both NPUs taken,
  // modules in visiting order, until `nums` NPUs.
  void BestModulePairs(const NodeDevices& node, int32_t nums, std::vector<Fitter::Taken>* taken);

  const device::PodConstraints* constraints_ = nullptr;
  bool hami_core_ = false;
  bool mutex_ = false;
  std::vector<Fitter::Taken> scratch_;
  std::vector<int64_t> keys_;
};

void AscendRules::Walk(int /*container*/, ContainerWalk& w) {
  const device::ContainerRequest& request = w.request;
  const NodeDevices& node = *w.node.devices;
  const auto& devs = node.devices;
  const Fitter::SortEntry* ent = w.entries.data();
  const size_t m = w.entries.size();
  std::vector<Fitter::Taken>& taken = *w.taken;
  auto skip = [&w](Reason r) { ++w.counts[static_cast<size_t>(r)]; };

  if (hami_core_ && !node.hami_core_allowed) {
    skip(Reason::kModeNotFit);
    return;
  }
  const std::string_view type = request.type;
  bool topology = type.starts_with(kAscend910Prefix) && m > 0;
  for (size_t k = 0; topology && k < m; ++k) {
    topology = devs[static_cast<size_t>(ent[k].pos)].network_key != device::NetworkKey::kNone;
  }
  const bool pairs = type == kAscend910C && request.nums > 1;
  const bool collect = topology || pairs;
  int32_t remaining = request.nums;
  int32_t coresreq = request.coresreq;
  for (size_t k = m; k-- > 0;) {
    const int32_t i = ent[w.rank[k]].pos;
    const DeviceInfo& d = devs[static_cast<size_t>(i)];
    const DeviceUsage& u = w.usage[static_cast<size_t>(i)];
    if (!d.health) {
      skip(Reason::kCardNotHealth);
      continue;
    }
    if (d.type != type) {
      skip(Reason::kCardTypeMismatch);
      continue;
    }
    if (!UuidPasses(d)) {
      skip(Reason::kCardUuidMismatch);
      continue;
    }
    if (u.used >= d.count) {
      skip(Reason::kCardTimeSlicingExhausted);
      continue;
    }
    if (mutex_ && u.used > 0) {
      skip(Reason::kExclusiveDeviceAllocateConflict);
      continue;
    }
    coresreq = std::min(coresreq, 100);
    int64_t memreq = request.memreq > 0 ? request.memreq : 0;
    if (request.mem_percentage != device::kPercentageUnset && request.memreq == 0) {
      memreq = PercentOf(d.devmem, request.mem_percentage);
    }
    if (d.devmem - u.usedmem < memreq) {
      skip(Reason::kCardInsufficientMemory);
      continue;
    }
    const int64_t total_cores = hami_core_ ? 100 : d.devcore;
    if (total_cores - u.usedcores < coresreq) {
      skip(Reason::kCardInsufficientCore);
      continue;
    }
    if (total_cores == 100 && coresreq == 100 && u.used > 0) {
      skip(Reason::kExclusiveDeviceAllocateConflict);
      continue;
    }
    if (total_cores != 0 && u.usedcores == total_cores && coresreq == 0) {
      skip(Reason::kCardComputeUnitsExhausted);
      continue;
    }
    taken.push_back(
        Fitter::Taken{i, static_cast<int32_t>(memreq), coresreq, static_cast<int32_t>(k)});
    if (!collect && --remaining == 0) {
      return;
    }
  }
  if (pairs) {
    BestModulePairs(node, request.nums, &taken);
    if (taken.size() != static_cast<size_t>(request.nums)) {
      w.failed = true;                // also with more NPUs than asked (an odd request)
      w.reason_total = request.nums;  // HAMi counts against the request here
    }
    return;
  }
  if (topology && taken.size() > static_cast<size_t>(request.nums)) {
    if (request.nums == 1) {
      taken.resize(1);
    } else {
      BestNetworkCombination(node, request.nums, &taken);
    }
  }
}

void AscendRules::BestNetworkCombination(const NodeDevices& node, int32_t nums,
                                         std::vector<Fitter::Taken>* taken) {
  // Group ids in order of first appearance, with their sizes.
  keys_.clear();
  std::vector<int32_t> sizes;
  for (const Fitter::Taken& t : *taken) {
    const DeviceInfo& d = node.devices[static_cast<size_t>(t.device)];
    if (d.network_key != device::NetworkKey::kNumber) {
      continue;
    }
    auto it = std::find(keys_.begin(), keys_.end(), d.network_id);
    if (it == keys_.end()) {
      keys_.push_back(d.network_id);
      sizes.push_back(1);
    } else {
      ++sizes[static_cast<size_t>(it - keys_.begin())];
    }
  }
  std::vector<size_t> order(keys_.size());
  for (size_t g = 0; g < order.size(); ++g) {
    order[g] = g;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&sizes](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  scratch_.clear();
  for (size_t g : order) {
    for (const Fitter::Taken& t : *taken) {
      const DeviceInfo& d = node.devices[static_cast<size_t>(t.device)];
      if (d.network_key == device::NetworkKey::kNumber && d.network_id == keys_[g]) {
        scratch_.push_back(t);
        if (scratch_.size() == static_cast<size_t>(nums)) {
          taken->swap(scratch_);
          return;
        }
      }
    }
  }
  taken->swap(scratch_);  // fewer than nums: the container fails (HAMi would under-allocate)
}

void AscendRules::BestModulePairs(const NodeDevices& node, int32_t nums,
                                  std::vector<Fitter::Taken>* taken) {
  // Modules (index / 2) in order of first appearance, with how many of their NPUs were taken.
  keys_.clear();
  std::vector<int32_t> sizes;
  for (const Fitter::Taken& t : *taken) {
    const int64_t module = node.devices[static_cast<size_t>(t.device)].index / 2;
    auto it = std::find(keys_.begin(), keys_.end(), module);
    if (it == keys_.end()) {
      keys_.push_back(module);
      sizes.push_back(1);
    } else {
      ++sizes[static_cast<size_t>(it - keys_.begin())];
    }
  }
  scratch_.clear();
  int32_t left = nums;
  for (size_t g = 0; g < keys_.size() && left > 0; ++g) {
    if (sizes[g] != 2) {
      continue;
    }
    for (const Fitter::Taken& t : *taken) {
      if (node.devices[static_cast<size_t>(t.device)].index / 2 == keys_[g]) {
        scratch_.push_back(t);
      }
    }
    left -= 2;
  }
  taken->swap(scratch_);
}

}  // namespace

std::unique_ptr<DeviceRules> NewAscendRules() { return std::make_unique<AscendRules>(); }

}  // namespace tessera::schedule

// The usage rebuild of one pod's MIG reservations. See mig_usage.h.
#include "tessera/device/mig_usage.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string_view>

namespace tessera::device {
namespace {

constexpr std::string_view kMig = "mig";
constexpr std::string_view kHamiCore = "hami-core";

}  // namespace

MigPodUsage MigUsageOfPod(const NodeDevices& node, const PodDevices& devices,
                          const std::vector<MigAllocation>& allocations) {
  MigPodUsage usage;
  usage.occupied.resize(node.devices.size());
  auto problem = [&](size_t device, std::string why) {
    MigPodUsage::Problem p{device, std::move(why)};
    if (std::find(usage.problems.begin(), usage.problems.end(), p) == usage.problems.end()) {
      usage.problems.push_back(std::move(p));
    }
  };
  // Unconsumed allocations per card, in annotation order; cards in first-seen order.
  std::map<std::string, std::deque<const MigAllocation*>, std::less<>> by_card;
  std::vector<std::string> card_order;
  for (const MigAllocation& a : allocations) {
    auto [it, inserted] = by_card.try_emplace(a.gpu_uuid);
    if (inserted) {
      card_order.push_back(a.gpu_uuid);
    }
    it->second.push_back(&a);
  }
  for (const ContainerDevices& container : devices) {
    for (const ContainerDevice& d : container) {
      const int i = node.Find(d.uuid);
      if (i < 0) {
        continue;  // stale device: HAMi logs it and counts nothing
      }
      const auto index = static_cast<size_t>(i);
      const DeviceInfo& card = node.devices[index];
      auto it = by_card.find(d.uuid);
      if (it != by_card.end() && !it->second.empty()) {
        if (card.mode == kHamiCore) {
          problem(index, "a MIG reservation on a hami-core card");
          continue;
        }
        usage.occupied[index].push_back(it->second.front()->placement);
        it->second.pop_front();
        continue;
      }
      if (card.mode == kMig) {
        problem(index, "MIG device without a reservation");
      }
    }
  }
  for (const std::string& uuid : card_order) {
    const std::deque<const MigAllocation*>& left = by_card[uuid];
    if (left.empty()) {
      continue;
    }
    const int i = node.Find(uuid);
    if (i < 0) {
      for (size_t k = 0; k < node.devices.size(); ++k) {
        if (node.devices[k].mode == kMig) {
          problem(k, "MIG reservation for an unknown card");
        }
      }
      continue;
    }
    const auto index = static_cast<size_t>(i);
    if (node.devices[index].mode != kMig) {
      problem(index, "MIG reservation on a non-MIG card");
      continue;
    }
    for (const MigAllocation* a : left) {
      usage.occupied[index].push_back(a->placement);
    }
  }
  std::stable_sort(usage.problems.begin(), usage.problems.end(),
                   [](const auto& a, const auto& b) { return a.device < b.device; });
  return usage;
}

std::string MigCardConflict(const MigCardUsage& card) {
  if (card.unusable) {
    return "the card's MIG books disagree (it fails closed)";
  }
  const std::vector<MigPlacement>& o = card.occupied;
  for (size_t i = 0; i < o.size(); ++i) {
    for (size_t j = i + 1; j < o.size(); ++j) {
      if (o[i].Overlaps(o[j])) {
        return "MIG placements slices " + std::to_string(o[i].start) + "-" +
               std::to_string(o[i].start + o[i].size - 1) + " and " + std::to_string(o[j].start) +
               "-" + std::to_string(o[j].start + o[j].size - 1) + " overlap";
      }
    }
  }
  return "";
}

}  // namespace tessera::device

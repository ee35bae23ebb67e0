// The MIG-capable path of NVIDIA's fit rules. See nvidia_mig.h.
#include "tessera/schedule/vendors/nvidia_mig.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "tessera/schedule/mig_fit.h"

namespace tessera::schedule {

bool IsMigRequest(const device::ContainerRequest& request,
                  const device::PodConstraints& constraints, const device::NodeDevices& node,
                  absl::Span<const Fitter::SortEntry> candidates) {
  if (request.type != device::kNvidiaVendor ||
      (constraints.vgpu_mode.has_value() &&
       constraints.vgpu_mode->find("mig") == std::string::npos)) {
    return false;
  }
  return std::any_of(candidates.begin(), candidates.end(), [&node](const Fitter::SortEntry& e) {
    return node.devices[static_cast<size_t>(e.pos)].mode == "mig";
  });
}

bool PickMigInstance(const device::NodeSnapshot& node, int32_t device, int64_t memreq,
                     absl::Span<const Fitter::Choice> earlier,
                     absl::Span<const Fitter::Taken> taken,
                     std::vector<device::MigPlacement>* occupied, Fitter::Taken* out) {
  const device::DeviceInfo& d = node.devices->devices[static_cast<size_t>(device)];
  occupied->clear();
  if (!node.mig.empty()) {
    const auto& held = node.mig[static_cast<size_t>(device)].occupied;
    occupied->assign(held.begin(), held.end());
  }
  for (const Fitter::Choice& c : earlier) {
    if (c.device == device && c.mig_profile >= 0) {
      occupied->push_back(c.placement);
    }
  }
  for (const Fitter::Taken& t : taken) {
    if (t.device == device && t.mig_profile >= 0) {
      occupied->push_back(t.placement);
    }
  }
  const MigCard card{d.mig_profiles, *occupied};
  const std::optional<MigCardChoice> choice = ChooseMigPlacement(
      std::span<const MigCard>(&card, 1),
      static_cast<int32_t>(std::min<int64_t>(memreq, std::numeric_limits<int32_t>::max())));
  // A placement of size 0 occupies nothing (the plugin cannot create it, HAMi's annotation skips
  // it): taking one would let the walk revisit the card for ever.
  if (!choice.has_value() || choice->choice.placement.size == 0) {
    return false;
  }
  const device::MigProfile& profile = d.mig_profiles[choice->choice.profile];
  out->usedmem = profile.memory_mb;
  out->usedcores = profile.core;
  out->mig_profile = static_cast<int32_t>(choice->choice.profile);
  out->placement = choice->choice.placement;
  return true;
}

}  // namespace tessera::schedule

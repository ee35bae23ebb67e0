// NVIDIA's fit rules. See nvidia_fit.h.
#include "tessera/schedule/vendors/nvidia_fit.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/schedule/vendors/nvidia_mig.h"
#include "tessera/schedule/vendors/nvidia_topology.h"

namespace tessera::schedule {
namespace {

using device::DeviceInfo;
using device::DeviceUsage;
using device::NodeDevices;
using device::NodeSnapshot;

bool Listed(const std::vector<std::string>& list, std::string_view value) {
  for (const auto& item : list) {
    if (item == value) {
      return true;
    }
  }
  return false;
}

class NvidiaRules final : public DeviceRules {
 public:
  void Prepare(const device::PodRequest& request, const device::PodConstraints& constraints,
               const device::GpuPolicy& policy) override;
  bool MayExceedCandidates(int container, const ContainerWalk& w) const override;
  void Walk(int container, ContainerWalk& w) override;

 private:
  bool TypeFilterPasses(const DeviceInfo& info) const;
  bool UuidFilterPasses(const DeviceInfo& info) const;

  const device::PodConstraints* constraints_ = nullptr;
  std::vector<uint8_t> nvidia_type_;  // per container: its request type is NVIDIA's (not
                                      // vector<bool>: read once per walk, unpacked)
  TopologyChooser topology_chooser_;
  std::vector<device::MigPlacement> mig_occupied_;  // PickMigInstance's scratch
  bool mutex_ = false;
  bool topology_ = false;
  bool has_type_filters_ = false;
  bool has_uuid_filters_ = false;
};

void NvidiaRules::Prepare(const device::PodRequest& request,
                          const device::PodConstraints& constraints,
                          const device::GpuPolicy& policy) {
  constraints_ = &constraints;
  nvidia_type_.assign(request.containers.size(), 0);
  for (size_t c = 0; c < request.containers.size(); ++c) {
    const auto& req = request.containers[c];
    nvidia_type_[c] = req.has_value() && req->type == device::kNvidiaVendor ? 1 : 0;
  }
  mutex_ = HasMutex(policy);
  topology_ = HasTopology(policy);
  has_type_filters_ = !constraints.use_types.empty() || !constraints.nouse_types.empty() ||
                      constraints.vgpu_mode.has_value();
  has_uuid_filters_ = !constraints.use_uuids.empty() || !constraints.nouse_uuids.empty();
}

bool NvidiaRules::MayExceedCandidates(int /*container*/, const ContainerWalk& w) const {
  return IsMigRequest(w.request, *constraints_, *w.node.devices, w.entries);
}

bool NvidiaRules::TypeFilterPasses(const DeviceInfo& info) const {
  const auto& c = *constraints_;
  if (!c.use_types.empty()) {
    bool any = false;
    bool any_token = false;
    for (const auto& token : c.use_types) {
      if (token.empty()) {
        continue;
      }
      any_token = true;
      if (ContainsFold(info.type, token)) {
        any = true;
        break;
      }
    }
    if (any_token && !any) {
      return false;
    }
  }
  for (const auto& token : c.nouse_types) {
    if (!token.empty() && ContainsFold(info.type, token)) {
      return false;
    }
  }
  if (c.vgpu_mode.has_value() && c.vgpu_mode->find(info.mode) == std::string::npos) {
    return false;
  }
  return true;
}

bool NvidiaRules::UuidFilterPasses(const DeviceInfo& info) const {
  const auto& c = *constraints_;
  if (!c.use_uuids.empty() && !Listed(c.use_uuids, info.id)) {
    return false;
  }
  return !Listed(c.nouse_uuids, info.id);
}

void NvidiaRules::Walk(int container, ContainerWalk& w) {
  const device::ContainerRequest& request = w.request;
  const NodeSnapshot& snap = w.node;
  const NodeDevices& node = *snap.devices;
  const auto& devs = node.devices;
  const absl::Span<const DeviceUsage> usage = w.usage;
  const Fitter::SortEntry* ent = w.entries.data();
  const int32_t* order = w.rank;
  const size_t m = w.entries.size();
  std::vector<Fitter::Taken>& taken = *w.taken;
  std::array<int32_t, kReasonCount>& counts = w.counts;  // zero from the Fitter
  auto skip = [&counts](Reason r) { ++counts[static_cast<size_t>(r)]; };
  const bool numa_bind = constraints_->numa_bind;
  const bool cordons = !node.cordoned.empty();
  const bool type_ok = nvidia_type_[static_cast<size_t>(container)] != 0;
  const bool quota = w.quota_limited();
  int32_t remaining = request.nums;
  int32_t prevnuma = -1;
  int32_t coresreq = request.coresreq;
  for (size_t k = m; k-- > 0;) {
    const int32_t i = ent[order[k]].pos;
    const DeviceInfo& d = devs[i];
    const DeviceUsage& u = usage[i];
    if (!d.health || (!snap.mig.empty() && snap.mig[static_cast<size_t>(i)].unusable)) {
      skip(Reason::kCardNotHealth);  // a MIG card whose books disagree fails closed, as in HAMi
      continue;
    }
    if (cordons && node.IsCordoned(d.id)) {
      skip(Reason::kCardCordoned);
      continue;
    }
    if (!type_ok || (has_type_filters_ && !TypeFilterPasses(d))) {
      skip(Reason::kCardTypeMismatch);
      continue;
    }
    if (numa_bind && d.numa != prevnuma) {
      // HAMi counts the dropped devices only when its countdown has moved, which under
      // topology-aware it never does (it collects every passing device).
      if (!topology_) {
        counts[static_cast<size_t>(Reason::kNumaNotFit)] += static_cast<int32_t>(taken.size());
      }
      remaining = request.nums;
      taken.clear();
      prevnuma = d.numa;
    }
    if (has_uuid_filters_ && !UuidFilterPasses(d)) {
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
    if (coresreq > 100) {
      coresreq = 100;
    }
    int64_t memreq = 0;
    if (request.memreq > 0) {
      memreq = request.memreq;
    } else if (request.mem_percentage != device::kPercentageUnset) {
      memreq = PercentOf(d.devmem, request.mem_percentage);
    }
    if (quota && !w.QuotaFits(i, memreq, coresreq)) {
      skip(Reason::kResourceQuotaNotFit);
      continue;
    }
    if (d.devmem - u.usedmem < memreq) {
      skip(Reason::kCardInsufficientMemory);
      continue;
    }
    if (d.devcore - u.usedcores < coresreq) {
      skip(Reason::kCardInsufficientCore);
      continue;
    }
    if (d.devcore == 100 && coresreq == 100 && u.used > 0) {
      skip(Reason::kExclusiveDeviceAllocateConflict);
      continue;
    }
    if (d.devcore != 0 && u.usedcores == d.devcore && coresreq == 0) {
      skip(Reason::kCardComputeUnitsExhausted);
      continue;
    }
    if (d.mode.size() == 3 && d.mode == "mig") {
      Fitter::Taken t{i, 0, 0, static_cast<int32_t>(k)};
      if (!PickMigInstance(snap, i, memreq, w.earlier, taken, &mig_occupied_, &t)) {
        skip(Reason::kCardMigTopologyInfeasible);
        continue;
      }
      taken.push_back(t);
      if (!topology_ && --remaining == 0) {
        break;
      }
      ++k;  // HAMi visits a MIG card again after taking it (device.go Fit: `i++`)
      continue;
    }
    taken.push_back(
        Fitter::Taken{i, static_cast<int32_t>(memreq), coresreq, static_cast<int32_t>(k)});
    if (!topology_ && --remaining == 0) {
      break;
    }
  }
  if (topology_ && taken.size() > static_cast<size_t>(request.nums)) {
    topology_chooser_.Select(node, request.nums, &taken);
  }
}

}  // namespace

std::unique_ptr<DeviceRules> NewNvidiaRules() { return std::make_unique<NvidiaRules>(); }

}  // namespace tessera::schedule

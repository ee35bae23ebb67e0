// The ledger's MIG books: the placements each pod holds on a "mig" card, the cards whose books
// disagree, and the MIG problems the auditor reports (docs/mig.md "The ledger").
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fmt/format.h"

#include "tessera/device/mig_usage.h"
#include "tessera/ledger/ledger.h"

namespace tessera::ledger {

const std::vector<device::MigAllocation>& Ledger::MigOf(uint32_t id, bool reserved) const {
  static const std::vector<device::MigAllocation> kNoMig;
  if (reserved) {
    return pods_[id].res->mig;
  }
  auto it = record_mig_.find(id);
  return it == record_mig_.end() ? kNoMig : it->second;
}

void Ledger::AccountMig(uint32_t id, const Entries& entries, NodeSlot* slot) {
  const bool reserved = pods_[id].held == Source::kReservation;
  const device::MigPodUsage usage =
      device::MigUsageOfPod(*slot->devices, ExportDevices(entries), MigOf(id, reserved));
  bool any = !usage.problems.empty();
  for (const auto& o : usage.occupied) {
    any = any || !o.empty();
  }
  if (!any) {
    return;
  }
  slot->mig.resize(slot->devices->devices.size());
  for (size_t d = 0; d < usage.occupied.size(); ++d) {
    for (const device::MigPlacement& placement : usage.occupied[d]) {
      slot->mig[d].held.push_back(MigHeld{id, placement});
    }
  }
  for (const device::MigPodUsage::Problem& problem : usage.problems) {
    slot->mig[problem.device].bad.push_back(MigBad{id, problem.why});
  }
}

void Ledger::UnaccountMig(uint32_t id, NodeSlot* slot) {
  for (MigBook& book : slot->mig) {
    std::erase_if(book.held, [id](const MigHeld& h) { return h.pod == id; });
    std::erase_if(book.bad, [id](const MigBad& b) { return b.pod == id; });
  }
}

std::string_view MigProblemKindName(MigProblemKind kind) {
  switch (kind) {
    case MigProblemKind::kUnusable:
      return "unusable";
    case MigProblemKind::kOverlap:
      return "overlap";
    case MigProblemKind::kUnrealised:
      return "unrealised";
    case MigProblemKind::kStrayInstance:
      return "stray_instance";
  }
  return "unknown";
}

void Ledger::FindMigProblems(Problems* out) const {
  auto add = [&](MigProblemKind kind, const Pod& p, const std::string& node, std::string_view uuid,
                 std::string why) {
    out->mig.push_back(MigProblem{kind, std::string(p.uid()), std::string(p.ns()),
                                  std::string(p.name()), node, std::string(uuid), std::move(why)});
  };
  auto slices = [](const device::MigPlacement& x) {
    return fmt::format("slices {}-{}", x.start, x.start + x.size - 1);
  };
  for (const NodeSlot& slot : nodes_) {
    for (size_t d = 0; d < slot.mig.size(); ++d) {
      const std::string& uuid = slot.devices->devices[d].id;
      for (const MigBad& b : slot.mig[d].bad) {
        add(MigProblemKind::kUnusable, pods_[b.pod], slot.name, uuid, b.why);
      }
      const std::vector<MigHeld>& held = slot.mig[d].held;
      for (size_t i = 0; i < held.size(); ++i) {
        for (size_t j = i + 1; j < held.size(); ++j) {
          if (held[i].placement.Overlaps(held[j].placement)) {
            const Pod& other = pods_[held[j].pod];
            add(MigProblemKind::kOverlap, pods_[held[i].pod], slot.name, uuid,
                fmt::format("{} overlap {} held by {}/{}", slices(held[i].placement),
                            slices(held[j].placement), other.ns(), other.name()));
          }
        }
      }
    }
  }
  for (const auto& [id, allocations] : record_mig_) {
    const Pod& p = pods_[id];
    const bool holds = p.held == Source::kRecord;
    const bool stray = !holds && (p.bind_failed || p.conflict());
    for (const device::MigAllocation& a : allocations) {
      if (holds && !a.RuntimeReady()) {
        add(MigProblemKind::kUnrealised, p, nodes_[p.node].name, a.gpu_uuid,
            fmt::format("{} at {} of container {} device {} not realised by the device plugin",
                        a.profile, slices(a.placement), a.container_index, a.device_index));
      } else if (stray && a.RuntimeReady()) {
        add(MigProblemKind::kStrayInstance, p, nodes_[p.node].name, a.gpu_uuid,
            fmt::format("instance {} ({} at {}) realised for a pod that holds nothing ({})",
                        a.mig_uuid, a.profile, slices(a.placement),
                        p.bind_failed ? "bind failed" : "bound to another node"));
      }
    }
  }
  std::sort(out->mig.begin(), out->mig.end(), [](const MigProblem& x, const MigProblem& y) {
    return std::tie(x.kind, x.uid, x.uuid, x.why) < std::tie(y.kind, y.uid, y.uuid, y.why);
  });
}

}  // namespace tessera::ledger

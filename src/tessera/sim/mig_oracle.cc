#include "tessera/sim/mig_oracle.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include <fmt/core.h>

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/sim/oracle.h"

namespace tessera::sim {

MigTruth ComputeMigTruth(const std::vector<kube::Node>& nodes, const std::vector<kube::Pod>& pods) {
  MigTruth t;
  ForEachRegisteredDevice(nodes, [&](const kube::Node& n, const device::DeviceInfo& info) {
    if (info.mode == "mig") {
      t.cards[info.id].node = n.meta.name;
    }
  });
  for (const kube::Pod& p : pods) {
    std::optional<device::PodDevices> devs = HeldAllocation(p);
    if (!devs.has_value()) {
      continue;
    }
    absl::StatusOr<std::vector<device::MigAllocation>> mig =
        device::DecodeMigAllocations(p.meta.annotations.Get(device::kMigAllocationsAnnotation));
    if (!mig.ok() || mig->empty()) {
      continue;
    }
    std::set<std::string> entries;  // the cards the pod has a device entry on
    for (const device::ContainerDevices& c : *devs) {
      for (const device::ContainerDevice& d : c) {
        entries.insert(d.uuid);
      }
    }
    const std::string pod = p.meta.ns + "/" + p.meta.name;
    bool any = false;
    for (const device::MigAllocation& a : *mig) {
      auto card = t.cards.find(a.gpu_uuid);
      if (card == t.cards.end() || card->second.node != p.node_name) {
        continue;  // not a mig card of the pod's node: HAMi holds nothing there
      }
      const bool exported = a.RuntimeReady() && entries.contains(a.gpu_uuid);
      card->second.instances.push_back(MigInstance{pod, a, exported});
      ++t.instances;
      t.realised += a.RuntimeReady() ? 1 : 0;
      any = true;
    }
    t.pods += any ? 1 : 0;
  }
  return t;
}

std::vector<MigOverlap> FindMigOverlaps(const MigTruth& truth) {
  std::vector<MigOverlap> out;
  for (const auto& [uuid, card] : truth.cards) {
    const std::vector<MigInstance>& in = card.instances;
    for (size_t i = 0; i < in.size(); ++i) {
      for (size_t j = i + 1; j < in.size(); ++j) {
        const device::MigAllocation& a = in[i].allocation;
        const device::MigAllocation& b = in[j].allocation;
        if (!a.placement.Overlaps(b.placement)) {
          continue;
        }
        auto side = [](const MigInstance& m) {
          return fmt::format("{} container {} device {} ({} at {}+{})", m.pod,
                             m.allocation.container_index, m.allocation.device_index,
                             m.allocation.profile, m.allocation.placement.start,
                             m.allocation.placement.size);
        };
        const std::string x = side(in[i]), y = side(in[j]);
        out.push_back(MigOverlap{uuid, card.node, fmt::format("mig {} {} | {}", uuid, x, y),
                                 fmt::format("{} and {}", x, y)});
      }
    }
  }
  return out;
}

std::string MigInstanceText(const device::MigAllocation& a) {
  return fmt::format("{}+{} {} {} {}/{}", a.placement.start, a.placement.size, a.profile,
                     a.mig_uuid, a.gpu_instance_id.value_or(0), a.compute_instance_id.value_or(0));
}

absl::StatusOr<MigInstances> ParseMigInstances(std::string_view text) {
  MigInstances out;
  const absl::Status parsed = ForEachSample(
      text, "hami_node_gpu_mig_instance_info",
      [&](std::string_view line, std::string_view labels, std::string_view) -> absl::Status {
        std::map<std::string_view, std::string> v;
        for (std::string_view key : {"device_uuid", "placement_start", "placement_size", "profile",
                                     "mig_uuid", "gpu_instance_id", "compute_instance_id"}) {
          std::optional<std::string> value = SampleLabel(labels, key);
          if (!value.has_value()) {
            return absl::InvalidArgumentError(fmt::format("sample without {}: {}", key, line));
          }
          v[key] = *std::move(value);
        }
        device::MigAllocation a;
        a.profile = v["profile"];
        a.mig_uuid = v["mig_uuid"];
        uint32_t numbers[4] = {};
        const std::string_view keys[4] = {"placement_start", "placement_size", "gpu_instance_id",
                                          "compute_instance_id"};
        for (size_t k = 0; k < 4; ++k) {
          const std::string& s = v[keys[k]];
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), numbers[k]);
          if (ec != std::errc() || end != s.data() + s.size()) {
            return absl::InvalidArgumentError(fmt::format("bad {}: {}", keys[k], line));
          }
        }
        a.placement = device::MigPlacement{numbers[0], numbers[1]};
        a.gpu_instance_id = numbers[2];
        a.compute_instance_id = numbers[3];
        out[v["device_uuid"]].push_back(MigInstanceText(a));
        return absl::OkStatus();
      });
  if (!parsed.ok()) {
    return parsed;
  }
  for (auto& [uuid, list] : out) {
    std::sort(list.begin(), list.end());
  }
  return out;
}

std::map<std::string, std::string> CompareMigInstances(const MigTruth& truth,
                                                       const MigInstances& exported) {
  MigInstances want;
  for (const auto& [uuid, card] : truth.cards) {
    for (const MigInstance& m : card.instances) {
      if (m.exported) {
        want[uuid].push_back(MigInstanceText(m.allocation));
      }
    }
  }
  for (auto& [uuid, list] : want) {
    std::sort(list.begin(), list.end());
  }
  std::map<std::string, std::string> out;
  static const std::vector<std::string> kNone;
  auto compare = [&](const std::string& uuid, const std::vector<std::string>& t,
                     const std::vector<std::string>& e) {
    if (t != e) {
      out[uuid] = fmt::format("MIG instances: truth [{}], exported [{}]", absl::StrJoin(t, ", "),
                              absl::StrJoin(e, ", "));
    }
  };
  for (const auto& [uuid, t] : want) {
    auto it = exported.find(uuid);
    compare(uuid, t, it == exported.end() ? kNone : it->second);
  }
  for (const auto& [uuid, e] : exported) {
    if (!want.contains(uuid)) {
      compare(uuid, kNone, e);
    }
  }
  return out;
}

}  // namespace tessera::sim

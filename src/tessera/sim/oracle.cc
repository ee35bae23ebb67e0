#include "tessera/sim/oracle.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/core.h>

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"

namespace tessera::sim {

Truth ComputeTruth(const std::vector<kube::Node>& nodes, const std::vector<kube::Pod>& pods) {
  Truth t;
  for (const kube::Node& n : nodes) {
    const std::string* reg = n.meta.annotations.Find(device::kNodeRegisterAnnotation);
    if (reg == nullptr) {
      continue;
    }
    absl::StatusOr<device::DecodedRegister> d = device::DecodeNodeRegister(*reg);
    if (!d.ok()) {
      continue;
    }
    for (const device::DeviceInfo& info : d->devices) {
      DeviceUsage& u = t.devices[info.id];
      u.node = n.meta.name;
      u.count = info.count;
      u.devmem = info.devmem;
      u.devcore = info.devcore;
    }
  }
  for (const kube::Pod& p : pods) {
    if (p.Terminal() || p.node_name.empty()) {
      continue;
    }
    if (p.meta.annotations.Get(device::kVgpuNodeAnnotation) != p.node_name ||
        p.meta.annotations.Get(device::kBindPhaseAnnotation) == device::kBindPhaseFailed) {
      continue;
    }
    const std::string* alloc = p.meta.annotations.Find(device::kDevicesAllocatedAnnotation);
    if (alloc == nullptr) {
      continue;
    }
    absl::StatusOr<device::PodDevices> devs = device::DecodePodDevices(*alloc);
    if (!devs.ok()) {
      continue;
    }
    bool holds = false;
    for (const device::ContainerDevices& c : *devs) {
      for (const device::ContainerDevice& d : c) {
        auto it = t.devices.find(d.uuid);
        if (it == t.devices.end() || it->second.node != p.node_name) {
          continue;  // a device the node does not register holds nothing
        }
        it->second.used += 1;
        it->second.usedmem += d.usedmem;
        it->second.usedcores += d.usedcores;
        t.total_usedmem += d.usedmem;
        holds = true;
      }
    }
    t.holding_pods += holds ? 1 : 0;
  }
  return t;
}

namespace {

// The value of label `name` in a sample's label block `{a="x",b="y"}` (no escapes expected in
// the labels read here; an escaped quote ends nothing early because \" is skipped).
std::optional<std::string> Label(std::string_view labels, std::string_view name) {
  size_t pos = 0;
  while (pos < labels.size()) {
    const size_t eq = labels.find("=\"", pos);
    if (eq == std::string_view::npos) {
      return std::nullopt;
    }
    std::string_view key = labels.substr(pos, eq - pos);
    while (!key.empty() && (key.front() == ',' || key.front() == '{' || key.front() == ' ')) {
      key.remove_prefix(1);
    }
    size_t end = eq + 2;
    std::string value;
    while (end < labels.size() && labels[end] != '"') {
      if (labels[end] == '\\' && end + 1 < labels.size()) {
        ++end;
      }
      value.push_back(labels[end]);
      ++end;
    }
    if (key == name) {
      return value;
    }
    pos = end + 1;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<Exported> ParseDeviceMetrics(std::string_view text) {
  Exported out;
  static constexpr std::string_view kFamilies[] = {
      "hami_gpu_memory_allocated_bytes", "hami_gpu_shared_count", "hami_gpu_core_allocated_ratio"};
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) {
      nl = text.size();
    }
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || line.front() == '#') {
      continue;
    }
    int family = -1;
    for (int i = 0; i < 3; ++i) {
      if (line.size() > kFamilies[i].size() &&
          line.substr(0, kFamilies[i].size()) == kFamilies[i] && line[kFamilies[i].size()] == '{') {
        family = i;
      }
    }
    if (family < 0) {
      continue;
    }
    const size_t close = line.rfind('}');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("unterminated labels: {}", line));
    }
    std::string_view labels =
        line.substr(kFamilies[family].size(), close + 1 - kFamilies[family].size());
    std::optional<std::string> uuid = Label(labels, "device_uuid");
    if (!uuid.has_value()) {
      return absl::InvalidArgumentError(fmt::format("sample without device_uuid: {}", line));
    }
    std::string value(line.substr(close + 1));
    while (!value.empty() && value.front() == ' ') {
      value.erase(value.begin());
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end == value.c_str() || !std::isfinite(v)) {
      return absl::InvalidArgumentError(fmt::format("bad sample value: {}", line));
    }
    ExportedDevice& d = out[*uuid];
    if (std::optional<std::string> node = Label(labels, "node"); node.has_value()) {
      d.node = *node;
    }
    const int64_t n = std::llround(v);
    switch (family) {
      case 0:
        d.usedmem = std::llround(v / 1048576.0);
        break;
      case 1:
        d.used = n;
        break;
      default:
        d.usedcores = n;
        break;
    }
  }
  return out;
}

void Oracle::Observe(absl::Time now, const Truth& truth, const Exported* exported,
                     const std::string& last_fault) {
  ++observations_;
  for (const auto& [uuid, u] : truth.devices) {
    const bool over = u.used > u.count || u.usedmem > u.devmem || u.usedcores > u.devcore;
    bool& was = overcommitted_[uuid];
    if (over && !was) {
      violations_.push_back(
          {now,
           fmt::format("over-commit on {} ({}): slots {}/{}, memory {}/{} MiB, cores {}/{}", uuid,
                       u.node, u.used, u.count, u.usedmem, u.devmem, u.usedcores, u.devcore)});
    }
    was = over;
  }
  if (exported == nullptr) {
    return;
  }
  ++compared_;
  std::map<std::string, std::string> differ;  // uuid -> detail
  static const DeviceUsage kZero;
  static const ExportedDevice kNone;
  auto compare = [&](const std::string& uuid, const DeviceUsage& t, const ExportedDevice& e) {
    if (t.usedmem != e.usedmem || t.used != e.used || t.usedcores != e.usedcores) {
      differ[uuid] =
          fmt::format("truth {} MiB / {} slots / {}% cores, exported {} MiB / {} slots / {}% cores",
                      t.usedmem, t.used, t.usedcores, e.usedmem, e.used, e.usedcores);
    }
  };
  for (const auto& [uuid, t] : truth.devices) {
    auto it = exported->find(uuid);
    compare(uuid, t, it == exported->end() ? kNone : it->second);
  }
  for (const auto& [uuid, e] : *exported) {
    if (truth.devices.find(uuid) == truth.devices.end()) {
      compare(uuid, kZero, e);
    }
  }
  // Close what no longer differs.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (differ.find(it->first) == differ.end()) {
      Close(it->first, it->second, now);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [uuid, detail] : differ) {
    auto [it, inserted] = pending_.try_emplace(uuid);
    Pending& p = it->second;
    if (inserted) {
      p.start = now;
      p.cause = last_fault.empty() ? "in-flight" : last_fault;
      p.detail = detail;
      auto t = truth.devices.find(uuid);
      p.node = t != truth.devices.end() ? t->second.node
                                        : (exported->count(uuid) ? exported->at(uuid).node : "");
    }
    ++p.samples;
    if (p.samples == 2) {
      p.recorded = static_cast<int64_t>(divergences_.size());
      divergences_.push_back(
          {uuid, p.node, p.start, absl::InfiniteFuture(), p.cause, p.detail, p.samples, false});
    }
    if (p.recorded >= 0) {
      Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
      d.samples = p.samples;
      if (!d.violation && now - d.start > window_) {
        d.violation = true;
        violations_.push_back({now, fmt::format("divergence on {} ({}) longer than {}: {}", uuid,
                                                d.node, absl::FormatDuration(window_), d.detail)});
      }
    }
  }
}

void Oracle::Close(const std::string& uuid, Pending& p, absl::Time now) {
  if (p.recorded < 0) {
    ++transient_;
    return;
  }
  Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
  d.end = now;
  if (!d.violation && d.end - d.start > window_) {  // it outlived the window between samples
    d.violation = true;
    violations_.push_back({now, fmt::format("divergence on {} ({}) lasted {}, longer than {}: {}",
                                            uuid, d.node, absl::FormatDuration(d.end - d.start),
                                            absl::FormatDuration(window_), d.detail)});
  }
}

void Oracle::Finish(absl::Time now) {
  for (auto& [uuid, p] : pending_) {
    if (p.recorded < 0) {
      ++transient_;
      continue;
    }
    Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
    if (!d.violation && now - d.start > window_) {
      d.violation = true;
      violations_.push_back(
          {now, fmt::format("divergence on {} ({}) never healed: {}", uuid, d.node, d.detail)});
    }
  }
}

}  // namespace tessera::sim

#include "tessera/sim/oracle.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/sim/mig_oracle.h"
#include "tessera/sim/quota_oracle.h"

namespace tessera::sim {

std::optional<device::PodDevices> HeldAllocation(const kube::Pod& p) {
  if (p.Terminal() || p.node_name.empty()) {
    return std::nullopt;
  }
  if (p.meta.annotations.Get(device::kVgpuNodeAnnotation) != p.node_name ||
      p.meta.annotations.Get(device::kBindPhaseAnnotation) == device::kBindPhaseFailed) {
    return std::nullopt;
  }
  const std::string* alloc = p.meta.annotations.Find(device::kDevicesAllocatedAnnotation);
  if (alloc == nullptr) {
    return std::nullopt;
  }
  absl::StatusOr<device::PodDevices> devs = device::DecodePodDevices(*alloc);
  if (!devs.ok()) {
    return std::nullopt;
  }
  return *std::move(devs);
}

void ForEachRegisteredDevice(
    const std::vector<kube::Node>& nodes,
    const std::function<void(const kube::Node& node, const device::DeviceInfo& device)>& fn) {
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
      fn(n, info);
    }
  }
}

Truth ComputeTruth(const std::vector<kube::Node>& nodes, const std::vector<kube::Pod>& pods) {
  Truth t;
  ForEachRegisteredDevice(nodes, [&](const kube::Node& n, const device::DeviceInfo& info) {
    DeviceUsage& u = t.devices[info.id];
    u.node = n.meta.name;
    u.count = info.count;
    u.devmem = info.devmem;
    u.devcore = info.devcore;
    u.mig = info.mode == "mig";
  });
  for (const kube::Pod& p : pods) {
    std::optional<device::PodDevices> devs = HeldAllocation(p);
    if (!devs.has_value()) {
      continue;
    }
    bool holds = false;
    const std::string pod = p.meta.ns + "/" + p.meta.name;
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
        PodShare& share = t.shares[{pod, d.uuid}];
        share.node = p.node_name;
        share.usedmem += d.usedmem;
        share.usedcores += d.usedcores;
        holds = true;
      }
    }
    t.holding_pods += holds ? 1 : 0;
  }
  return t;
}

// No escapes expected in the labels read here; an escaped quote ends nothing early because \"
// is skipped.
absl::Status ForEachSample(
    std::string_view text, std::string_view family,
    const std::function<absl::Status(std::string_view line, std::string_view labels,
                                     std::string_view value)>& fn) {
  for (const absl::string_view piece :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    const std::string_view line(piece.data(), piece.size());
    if (line.size() <= family.size() || !line.starts_with(family) || line[family.size()] != '{') {
      continue;
    }
    const size_t close = line.rfind('}');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("unterminated labels: {}", line));
    }
    TESSERA_RETURN_IF_ERROR(
        fn(line, line.substr(family.size(), close + 1 - family.size()), line.substr(close + 1)));
  }
  return absl::OkStatus();
}

std::optional<std::string> SampleLabel(std::string_view labels, std::string_view name) {
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

namespace {

enum Field { kDeviceMem, kDeviceSlots, kDeviceCores, kShareMem, kShareCores };
struct Family {
  std::string_view name;
  Field field;
};
// A generation of HAMi's metric names and their key labels.
struct Dialect {
  std::vector<Family> families;
  std::string_view uuid, node, share_node, ns, pod;
};

// hami_* (HAMi v2.8 on, Tessera), then the names before them (HAMi v2.5's only).
const Dialect& Current() {
  static const Dialect* d = new Dialect{{{"hami_gpu_memory_allocated_bytes", kDeviceMem},
                                         {"hami_gpu_shared_count", kDeviceSlots},
                                         {"hami_gpu_core_allocated_ratio", kDeviceCores},
                                         {"hami_vgpu_memory_allocated_bytes", kShareMem},
                                         {"hami_vgpu_core_allocated_ratio", kShareCores}},
                                        "device_uuid",
                                        "node",
                                        "node",
                                        "namespace",
                                        "pod"};
  return *d;
}
const Dialect& Legacy() {
  static const Dialect* d = new Dialect{{{"GPUDeviceMemoryAllocated", kDeviceMem},
                                         {"GPUDeviceSharedNum", kDeviceSlots},
                                         {"GPUDeviceCoreAllocated", kDeviceCores},
                                         {"vGPUPodsDeviceAllocated", kShareMem},
                                         {"vGPUCorePercentage", kShareCores}},
                                        "deviceuuid",
                                        "nodeid",
                                        "nodename",
                                        "podnamespace",
                                        "podname"};
  return *d;
}

absl::StatusOr<Exported> ParseDialect(std::string_view text, const Dialect& dialect) {
  Exported out;
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
    const Family* family = nullptr;
    for (const Family& f : dialect.families) {
      if (line.size() > f.name.size() && line.substr(0, f.name.size()) == f.name &&
          line[f.name.size()] == '{') {
        family = &f;
      }
    }
    if (family == nullptr) {
      continue;
    }
    const size_t close = line.rfind('}');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("unterminated labels: {}", line));
    }
    std::string_view labels = line.substr(family->name.size(), close + 1 - family->name.size());
    std::optional<std::string> uuid = SampleLabel(labels, dialect.uuid);
    if (!uuid.has_value()) {
      return absl::InvalidArgumentError(fmt::format("sample without {}: {}", dialect.uuid, line));
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
    if (family->field >= kShareMem) {
      std::optional<std::string> ns = SampleLabel(labels, dialect.ns);
      std::optional<std::string> pod = SampleLabel(labels, dialect.pod);
      if (!ns.has_value() || !pod.has_value()) {
        return absl::InvalidArgumentError(
            fmt::format("pod sample without {} or {}: {}", dialect.ns, dialect.pod, line));
      }
      PodShare& s = out.shares[{*ns + "/" + *pod, *uuid}];
      if (std::optional<std::string> node = SampleLabel(labels, dialect.share_node);
          node.has_value()) {
        s.node = *node;
      }
      // Several container_index values of one share add up (HAMi before HEAD's collapse).
      if (family->field == kShareMem) {
        s.usedmem += std::llround(v / 1048576.0);
      } else {
        s.usedcores += std::llround(v);
      }
      continue;
    }
    ExportedDevice& d = out.devices[*uuid];
    if (std::optional<std::string> node = SampleLabel(labels, dialect.node); node.has_value()) {
      d.node = *node;
    }
    switch (family->field) {
      case kDeviceMem:
        d.usedmem = std::llround(v / 1048576.0);
        break;
      case kDeviceSlots:
        d.used = std::llround(v);
        break;
      default:
        d.usedcores = std::llround(v);
        break;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Exported> ParseMetrics(std::string_view text) {
  TESSERA_ASSIGN_OR_RETURN(Exported current, ParseDialect(text, Current()));
  if (!current.devices.empty() || !current.shares.empty()) {
    return current;
  }
  return ParseDialect(text, Legacy());
}

namespace {

// compare(key, truth, exported) for every key of either map; a key one side lacks is compared
// with that side's zero value.
template <typename K, typename T, typename E, typename F>
void CompareEveryKey(const std::map<K, T>& truth, const std::map<K, E>& exported, const T& no_truth,
                     const E& not_exported, F compare) {
  for (const auto& [key, t] : truth) {
    auto it = exported.find(key);
    compare(key, t, it == exported.end() ? not_exported : it->second);
  }
  for (const auto& [key, e] : exported) {
    if (!truth.contains(key)) {
      compare(key, no_truth, e);
    }
  }
}

}  // namespace

void Oracle::Observe(absl::Time now, const Truth& truth, const Exported* exported,
                     const std::string& last_fault, const QuotaObservation* quota,
                     const MigObservation* mig) {
  ++observations_;
  for (const auto& [uuid, u] : truth.devices) {
    const bool over =
        u.used > u.count || u.usedmem > u.devmem || (!u.mig && u.usedcores > u.devcore);
    bool& was = overcommitted_[uuid];
    if (over && !was) {
      violations_.push_back(
          {now,
           fmt::format("over-commit on {} ({}): slots {}/{}, memory {}/{} MiB, cores {}/{}", uuid,
                       u.node, u.used, u.count, u.usedmem, u.devmem, u.usedcores, u.devcore),
           /*overcommit=*/true});
    }
    was = over;
  }
  if (quota != nullptr) {
    for (const auto& [key, q] : quota->truth) {
      const bool over = q.limit.has_value() && q.used > *q.limit;
      bool& was = overcommitted_["quota " + key.first + " " + key.second];
      if (over && !was) {
        violations_.push_back({now,
                               fmt::format("namespace {} over its quota: limits.{} {}, used {}",
                                           key.first, key.second, *q.limit, q.used),
                               /*overcommit=*/true});
      }
      was = over;
    }
  }
  if (mig != nullptr) {
    std::set<std::string> now_overlapping;
    for (const MigOverlap& o : FindMigOverlaps(mig->truth)) {
      now_overlapping.insert(o.key);
      if (!overcommitted_[o.key]) {
        violations_.push_back(
            {now, fmt::format("MIG placements overlap on {} ({}): {}", o.card, o.node, o.what),
             /*overcommit=*/true});
      }
      overcommitted_[o.key] = true;
    }
    for (auto it = overcommitted_.begin(); it != overcommitted_.end();) {
      if (it->first.starts_with("mig ") && !now_overlapping.contains(it->first)) {
        it = overcommitted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (exported == nullptr) {
    return;
  }
  ++compared_;
  struct Difference {
    std::string node, detail;
  };
  std::map<Key, Difference> differ;
  static const DeviceUsage kZero;
  static const ExportedDevice kNone;
  static const PodShare kNoShare;
  auto compare = [&](const std::string& uuid, const DeviceUsage& t, const ExportedDevice& e) {
    if (t.usedmem != e.usedmem || t.used != e.used || t.usedcores != e.usedcores) {
      differ[{"", uuid}] = {
          t.node.empty() ? e.node : t.node,
          fmt::format("truth {} MiB / {} slots / {}% cores, exported {} MiB / {} slots / {}% cores",
                      t.usedmem, t.used, t.usedcores, e.usedmem, e.used, e.usedcores)};
    }
  };
  CompareEveryKey(truth.devices, exported->devices, kZero, kNone, compare);
  auto compare_share = [&](const Key& key, const PodShare& t, const PodShare& e) {
    if (t.usedmem != e.usedmem || t.usedcores != e.usedcores) {
      differ[key] = {t.node.empty() ? e.node : t.node,
                     fmt::format("pod share: truth {} MiB / {}% cores, exported {} MiB / {}% cores",
                                 t.usedmem, t.usedcores, e.usedmem, e.usedcores)};
    }
  };
  CompareEveryKey(truth.shares, exported->shares, kNoShare, kNoShare, compare_share);
  if (mig != nullptr && mig->exported.has_value()) {
    for (auto& [uuid, detail] : CompareMigInstances(mig->truth, *mig->exported)) {
      auto card = mig->truth.cards.find(uuid);
      differ[{"", "mig " + uuid}] = {card == mig->truth.cards.end() ? "" : card->second.node,
                                     std::move(detail)};
    }
  }
  // A namespace's usage sums many pods, so under churn some pod of it is nearly always in flight
  // and the sums would differ in chained samples: quota usage is compared in the quiet samples
  // only, those where every device and pod share agrees (then the sums must agree too).
  const bool quiet = differ.empty();
  if (quiet && quota != nullptr && quota->exported.has_value()) {
    static const NamespaceQuotaTruth kNoQuota;
    auto compare_quota = [&](const QuotaKey& key, const NamespaceQuotaTruth& t, int64_t e) {
      if (t.used != e) {
        differ[{"", fmt::format("quota {} {}", key.first, key.second)}] = {
            "", fmt::format("quota usage: truth {}, exported {}", t.used, e)};
      }
    };
    CompareEveryKey(quota->truth, *quota->exported, kNoQuota, int64_t{0}, compare_quota);
  }
  // Close what no longer differs (quota usage: judged in quiet samples only).
  for (auto it = pending_.begin(); it != pending_.end();) {
    const bool unjudged =
        !quiet && it->first.first.empty() && it->first.second.starts_with("quota ");
    if (!unjudged && differ.find(it->first) == differ.end()) {
      Close(it->second, now);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  open_shares_ = 0;
  for (auto& [key, diff] : differ) {
    open_shares_ += key.first.empty() ? 0 : 1;
    auto [it, inserted] = pending_.try_emplace(key);
    Pending& p = it->second;
    if (inserted) {
      p.start = now;
      p.cause = last_fault.empty() ? "in-flight" : last_fault;
      p.detail = diff.detail;
      p.node = diff.node;
    }
    ++p.samples;
    if (p.samples == 2) {
      p.recorded = static_cast<int64_t>(divergences_.size());
      divergences_.push_back({key.second, key.first, p.node, p.start, absl::InfiniteFuture(),
                              p.cause, p.detail, p.samples, false});
    }
    if (p.recorded >= 0) {
      Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
      d.samples = p.samples;
      if (!d.violation && now - d.start > window_) {
        d.violation = true;
        violations_.push_back(
            {now, fmt::format("divergence on {} ({}) longer than {}: {}", Subject(d), d.node,
                              absl::FormatDuration(window_), d.detail)});
      }
    }
  }
}

void Oracle::Close(Pending& p, absl::Time now) {
  if (p.recorded < 0) {
    ++transient_;
    if (p.cause != "in-flight") {
      transient_fault_spans_.emplace_back(p.start, now);
    }
    return;
  }
  Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
  d.end = now;
  if (!d.violation && d.end - d.start > window_) {  // it outlived the window between samples
    d.violation = true;
    violations_.push_back(
        {now, fmt::format("divergence on {} ({}) lasted {}, longer than {}: {}", Subject(d), d.node,
                          absl::FormatDuration(d.end - d.start), absl::FormatDuration(window_),
                          d.detail)});
  }
}

void Oracle::Finish(absl::Time now) {
  for (auto& [key, p] : pending_) {
    if (p.recorded < 0) {
      ++transient_;
      continue;
    }
    Divergence& d = divergences_[static_cast<size_t>(p.recorded)];
    if (!d.violation && now - d.start > window_) {
      d.violation = true;
      violations_.push_back({now, fmt::format("divergence on {} ({}) never healed: {}", Subject(d),
                                              d.node, d.detail)});
    }
  }
}

std::string Subject(const Divergence& d) {
  return d.pod.empty() ? d.device : fmt::format("pod {} on {}", d.pod, d.device);
}

int64_t ParseRequeuedTotal(std::string_view text) {
  constexpr std::string_view kName = "tessera_pending_pods_requeued_total ";
  size_t at = text.starts_with(kName) ? 0 : text.find("\n" + std::string(kName));
  if (at == std::string_view::npos) {
    return -1;
  }
  std::string_view value = text.substr(at + (text[at] == '\n' ? 1 : 0) + kName.size());
  value = value.substr(0, value.find('\n'));
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !(v >= 0) || v > 1e15) {
    return -1;
  }
  return static_cast<int64_t>(v);
}

}  // namespace tessera::sim

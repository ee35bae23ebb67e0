// Pinned decisions (LedgerOptions::pin_decisions): how a bound pod's allocation is held against
// later rewrites of its annotations, reported (Problems::rewritten) and carried into a
// recomputed ledger (Pinned, Recompute); and how a refit's move is held against the informer's
// events older than its patch (FollowMove). See ledger.h and docs/self-healing.md "Pinned
// decisions".
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fmt/format.h"

#include "tessera/ledger/ledger.h"
#include "tessera/ledger/ledger_internal.h"

namespace tessera::ledger {

using internal::Key;
using internal::NormalInitCount;

namespace {

// A MIG placement without the runtime identity the device plugin writes back.
bool SamePlacement(const device::MigAllocation& a, const device::MigAllocation& b) {
  return a.container_index == b.container_index && a.device_index == b.device_index &&
         a.gpu_uuid == b.gpu_uuid && a.profile == b.profile && a.placement == b.placement;
}

}  // namespace

bool Ledger::SameEntries(const Pod& p, const PodAllocation& pod) const {
  size_t k = 0;
  for (size_t c = 0; c < pod.devices.size(); ++c) {
    for (const auto& d : pod.devices[c]) {
      if (d.uuid.empty()) {
        continue;
      }
      if (k == p.entries.size()) {
        return false;
      }
      const Entry& e = p.entries[k++];
      if (e.container != c || e.usedmem != d.usedmem || e.usedcores != d.usedcores ||
          uuids_[e.uuid].value != d.uuid) {
        return false;
      }
    }
  }
  // Same entries, so the same stored containers: init_count normalises against p.entries.
  return k == p.entries.size() && p.init_count == NormalInitCount(pod.init_count, p.entries);
}

bool SameDecision(const Decision& a, const Decision& b) {
  if (a.node != b.node || a.unreadable != b.unreadable || a.mig.size() != b.mig.size()) {
    return false;
  }
  for (size_t i = 0; i < a.mig.size(); ++i) {
    if (!SamePlacement(a.mig[i], b.mig[i])) {
      return false;
    }
  }
  if (a.unreadable) {
    return true;
  }
  // The (container, device) entries with a UUID, in order.
  auto entries = [](const device::PodDevices& devices) {
    std::vector<std::pair<size_t, const device::ContainerDevice*>> out;
    for (size_t c = 0; c < devices.size(); ++c) {
      for (const device::ContainerDevice& d : devices[c]) {
        if (!d.uuid.empty()) {
          out.emplace_back(c, &d);
        }
      }
    }
    return out;
  };
  const auto x = entries(a.devices);
  const auto y = entries(b.devices);
  if (x.size() != y.size()) {
    return false;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].first != y[i].first || x[i].second->uuid != y[i].second->uuid ||
        x[i].second->usedmem != y[i].second->usedmem ||
        x[i].second->usedcores != y[i].second->usedcores) {
      return false;
    }
  }
  const int32_t stored = x.empty() ? 0 : static_cast<int32_t>(x.back().first) + 1;
  return std::clamp(a.init_count, 0, stored) == std::clamp(b.init_count, 0, stored);
}

std::string DecisionText(const Decision& d) {
  if (d.unreadable) {
    return "allocation unreadable";
  }
  std::string out;
  for (const auto& container : d.devices) {
    for (const device::ContainerDevice& c : container) {
      if (!c.uuid.empty()) {
        out +=
            fmt::format("{}{} {}MiB {}%", out.empty() ? "" : ", ", c.uuid, c.usedmem, c.usedcores);
      }
    }
  }
  for (const device::MigAllocation& m : d.mig) {
    out += fmt::format("{}{} {} slices {}-{}", out.empty() ? "" : ", ", m.gpu_uuid, m.profile,
                       m.placement.start, m.placement.start + m.placement.size - 1);
  }
  return out.empty() ? "no devices" : out;
}

bool Ledger::SameDecision(uint32_t id, const PodAllocation& pod) const {
  const Pod& p = pods_[id];
  if (pod.unreadable || nodes_[p.node].name != pod.node) {
    return false;
  }
  auto mig = record_mig_.find(id);
  const size_t mig_count = mig == record_mig_.end() ? 0 : mig->second.size();
  if (mig_count != pod.mig.size()) {
    return false;
  }
  for (size_t i = 0; i < mig_count; ++i) {
    if (!SamePlacement(mig->second[i], pod.mig[i])) {
      return false;
    }
  }
  return SameEntries(p, pod);
}

PodAllocation Ledger::KeepDecision(uint32_t id, const PodAllocation& pod) const {
  const Pod& p = pods_[id];
  PodAllocation out;
  out.uid = pod.uid;
  out.ns = pod.ns;
  out.name = pod.name;
  out.bound_node = pod.bound_node;
  out.bind_failed = pod.bind_failed;
  out.node = nodes_[p.node].name;
  out.devices = ExportDevices(p.entries);
  out.init_count = p.init_count;
  if (auto mig = record_mig_.find(id); mig != record_mig_.end()) {
    out.mig = mig->second;
    for (device::MigAllocation& kept : out.mig) {
      for (const device::MigAllocation& seen : pod.mig) {
        if (SamePlacement(kept, seen)) {
          kept = seen;  // the runtime identity as the plugin wrote it back
          break;
        }
      }
    }
  }
  return out;
}

Decision Ledger::DecisionOf(uint32_t id) const {
  const Pod& p = pods_[id];
  Decision out;
  out.node = nodes_[p.node].name;
  out.unreadable = p.unreadable;
  out.devices = ExportDevices(p.entries);
  out.init_count = p.init_count;
  if (auto mig = record_mig_.find(id); mig != record_mig_.end()) {
    out.mig = mig->second;
  }
  return out;
}

PodAllocation Ledger::ExportRecord(uint32_t id) const {
  const Pod& p = pods_[id];
  PodAllocation a;
  a.uid = std::string(p.uid());
  a.ns = std::string(p.ns());
  a.name = std::string(p.name());
  a.node = nodes_[p.node].name;
  if (p.bound) {
    a.bound_node = p.bound_len > 0 ? std::string(p.bound_elsewhere()) : a.node;
  }
  a.bind_failed = p.bind_failed;
  a.unreadable = p.unreadable;
  a.devices = ExportDevices(p.entries);
  a.init_count = p.init_count;
  if (auto mig = record_mig_.find(id); mig != record_mig_.end()) {
    a.mig = mig->second;
  }
  return a;
}

std::vector<PodAllocation> Ledger::Pinned() const {
  std::vector<PodAllocation> out;
  MutexLock lock(&mu_);
  for (uint32_t id = 0; id < pods_.size(); ++id) {
    const Pod& p = pods_[id];
    if (!p.pinned) {
      continue;
    }
    PodAllocation a = ExportRecord(id);
    // A pin holds the decision of a pod bound to its annotated node, readable.
    a.bound_node = p.bound_len > 0 ? std::string(p.bound_elsewhere()) : a.node;
    a.unreadable = false;
    out.push_back(std::move(a));
  }
  std::sort(out.begin(), out.end(),
            [](const PodAllocation& x, const PodAllocation& y) { return x.uid < y.uid; });
  return out;
}

const PodAllocation& Ledger::HoldPin(uint32_t id, const PodAllocation& observed,
                                     PodAllocation* kept) {
  if (observed.terminal || observed.deleted) {
    pods_[id].pinned = false;  // finished: the pin ends with it
    rewritten_.erase(id);
    return observed;
  }
  if (SameDecision(id, observed)) {
    rewritten_.erase(id);
    return observed;
  }
  // Someone changed the allocation of a bound pod: the decision stays (LedgerOptions).
  rewritten_[id] =
      Decision{observed.node, observed.unreadable ? device::PodDevices{} : observed.devices,
               observed.unreadable ? 0 : observed.init_count, observed.mig, observed.unreadable};
  *kept = KeepDecision(id, observed);
  return *kept;
}

void Ledger::DropRewriteIfSame(uint32_t id) {
  // An Apply that already carried the move (the informer was first) is no rewrite.
  if (auto seen = rewritten_.find(id); seen != rewritten_.end()) {
    PodAllocation stated;
    stated.node = seen->second.node;
    stated.devices = seen->second.devices;
    stated.init_count = seen->second.init_count;
    stated.mig = seen->second.mig;
    stated.unreadable = seen->second.unreadable;
    if (SameDecision(id, stated)) {
      rewritten_.erase(seen);
    }
  }
}

const PodAllocation& Ledger::FollowMove(uint32_t id, const PodAllocation& observed,
                                        PodAllocation* moved) {
  auto it = moves_.find(id);
  if (it == moves_.end()) {
    return observed;
  }
  const Move& m = it->second;
  if (!observed.terminal && !observed.deleted && observed.node.empty()) {
    return observed;  // older than the filter's annotations: nothing to compare yet
  }
  // Whether the observed container states `want` (its entries with a UUID, in order).
  auto states = [&](const device::ContainerDevices& want) {
    if (observed.unreadable || m.container >= observed.devices.size()) {
      return false;
    }
    size_t k = 0;
    for (const device::ContainerDevice& d : observed.devices[m.container]) {
      if (d.uuid.empty()) {
        continue;
      }
      if (k == want.size() || d.uuid != want[k].uuid || d.usedmem != want[k].usedmem ||
          d.usedcores != want[k].usedcores) {
        return false;
      }
      ++k;
    }
    return k == want.size();
  };
  if (!observed.terminal && !observed.deleted && !states(m.to) && states(m.from)) {
    *moved = observed;
    moved->devices[m.container] = m.to;
    return *moved;
  }
  moves_.erase(it);  // its own event, someone else's write, or the pod's end
  return observed;
}

void Ledger::FindRewritten(Problems* out) const {
  for (const auto& [id, observed] : rewritten_) {
    const Pod& p = pods_[id];
    out->rewritten.push_back(Rewritten{std::string(p.uid()), std::string(p.ns()),
                                       std::string(p.name()), DecisionOf(id), observed});
  }
  std::sort(out->rewritten.begin(), out->rewritten.end(),
            [](const Rewritten& x, const Rewritten& y) { return x.uid < y.uid; });
}

void Ledger::RestorePinsLocked(const std::vector<PodAllocation>& pinned,
                               const std::vector<PodAllocation>& pods) {
  if (pinned.empty()) {
    return;
  }
  absl::flat_hash_set<absl::string_view> present;
  for (const auto& pod : pods) {
    present.insert(Key(pod.uid));
  }
  for (const auto& pin : pinned) {
    if (!present.contains(Key(pin.uid)) || !ApplyLocked(pin, /*account=*/false).ok()) {
      continue;
    }
    if (const uint32_t id = FindPod(pin.uid);
        id != kNone && pods_[id].has_record && !pods_[id].unreadable) {
      pods_[id].pinned = true;
    }
  }
}

}  // namespace tessera::ledger

#include "tessera/ledger/ledger.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>

#include "fmt/format.h"

#include "tessera/device/mig_usage.h"

namespace tessera::ledger {
namespace {

constexpr size_t kMaxLen = std::numeric_limits<uint16_t>::max();
constexpr size_t kMaxDevicesPerNode = std::numeric_limits<int16_t>::max();

// Debian's absl::string_view is its own type: convert at the hash-map boundary.
absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The UUID without a trailing MIG "[template-slot]" suffix.
std::string_view BaseUuid(std::string_view uuid) {
  if (!uuid.empty() && uuid.back() == ']') {
    const size_t open = uuid.rfind('[');
    if (open != std::string_view::npos) {
      return uuid.substr(0, open);
    }
  }
  return uuid;
}

bool SameDevices(const device::NodeDevices& a, const device::NodeDevices& b) {
  return a.node == b.node && a.devices == b.devices && a.format == b.format &&
         a.cordoned == b.cordoned && a.pair_scores == b.pair_scores;
}

absl::Status CheckLengths(std::string_view uid, std::string_view ns, std::string_view name,
                          std::string_view node, std::string_view bound) {
  if (uid.empty()) {
    return absl::InvalidArgumentError("ledger: empty pod uid");
  }
  if (uid.size() > kMaxLen || ns.size() > kMaxLen || name.size() > kMaxLen ||
      node.size() > kMaxLen || bound.size() > kMaxLen) {
    return absl::InvalidArgumentError(
        fmt::format("ledger: pod {}: a name is longer than {} bytes", uid.substr(0, 64), kMaxLen));
  }
  return absl::OkStatus();
}

absl::Status CheckInitCount(std::string_view uid, int32_t init_count) {
  if (init_count < 0) {
    return absl::InvalidArgumentError(
        fmt::format("ledger: pod {}: negative init_count {}", uid.substr(0, 64), init_count));
  }
  return absl::OkStatus();
}

// init_count clamped to the containers that are stored (up to the last one with a device):
// it classifies every stored entry as the original did, and two inputs that count the same
// store the same value.
template <typename EntryList>
uint16_t NormalInitCount(int32_t init_count, const EntryList& entries) {
  const int32_t stored = entries.empty() ? 0 : int32_t{entries.back().container} + 1;
  return static_cast<uint16_t>(std::clamp(init_count, 0, stored));
}

}  // namespace

Ledger::Ledger() = default;
Ledger::Ledger(LedgerOptions options) : options_(options) {}
Ledger::~Ledger() = default;

// ---- interning ----------------------------------------------------------------------------

uint32_t Ledger::InternUuid(std::string_view uuid) {
  auto it = uuid_index_.find(Key(uuid));
  if (it != uuid_index_.end()) {
    ++uuids_[it->second].refs;
    return it->second;
  }
  const std::string_view base = BaseUuid(uuid);
  uint32_t base_id = kNone;
  if (base.size() != uuid.size()) {
    base_id = InternUuid(base);
  }
  uint32_t id;
  if (!free_uuids_.empty()) {
    id = free_uuids_.back();
    free_uuids_.pop_back();
  } else {
    id = static_cast<uint32_t>(uuids_.size());
    uuids_.emplace_back();
  }
  UuidSlot& slot = uuids_[id];
  slot.value = std::string(uuid);
  slot.base = base_id == kNone ? id : base_id;
  slot.refs = 1;
  uuid_index_.emplace(slot.value, id);
  return id;
}

void Ledger::ReleaseUuid(uint32_t id) {
  UuidSlot& slot = uuids_[id];
  if (--slot.refs > 0) {
    return;
  }
  const uint32_t base = slot.base;
  uuid_index_.erase(slot.value);
  slot.value.clear();
  slot.value.shrink_to_fit();
  slot.base = kNone;
  free_uuids_.push_back(id);
  if (base != id) {
    ReleaseUuid(base);
  }
}

absl::Status Ledger::BuildEntries(const device::PodDevices& devices, Entries* out) {
  if (devices.size() > kMaxLen) {
    return absl::InvalidArgumentError(
        fmt::format("ledger: {} containers (at most {})", devices.size(), kMaxLen));
  }
  size_t n = 0;
  for (const auto& container : devices) {
    for (const auto& d : container) {
      if (d.uuid.size() > kMaxLen) {
        return absl::InvalidArgumentError("ledger: device uuid too long");
      }
      n += d.uuid.empty() ? 0 : 1;
    }
  }
  out->clear();
  out->reserve(n);
  for (size_t c = 0; c < devices.size(); ++c) {
    for (const auto& d : devices[c]) {
      if (d.uuid.empty()) {
        continue;
      }
      Entry e;
      e.uuid = InternUuid(d.uuid);
      e.usedmem = d.usedmem;
      e.usedcores = d.usedcores;
      e.container = static_cast<uint16_t>(c);
      out->push_back(e);
    }
  }
  return absl::OkStatus();
}

void Ledger::ReleaseEntries(const Entries& entries) {
  for (const Entry& e : entries) {
    ReleaseUuid(e.uuid);
  }
}

void Ledger::AddNamespaceUsage(std::string_view ns, int64_t mem, int64_t cores, int32_t sign) {
  auto it = namespaces_.find(Key(ns));
  if (it == namespaces_.end()) {
    if (sign < 0) {
      return;  // cannot happen: every subtraction follows its addition
    }
    it = namespaces_.emplace(std::string(ns), NamespaceUsage{}).first;
  }
  NamespaceUsage& n = it->second;
  n.usedmem += sign * mem;
  n.usedcores += sign * cores;
  n.holders += sign;
  if (n.holders <= 0) {
    namespaces_.erase(it);
  }
}

void Ledger::AddUsage(const Entries& entries, uint16_t init_count, NodeSlot* slot,
                      std::string_view ns, int32_t sign) {
  if (entries.size() == 1) {
    // One entry (most pods): the collapse of a single entry is the entry itself.
    const Entry& e = entries.front();
    if (e.dev >= 0) {
      device::DeviceUsage& u = slot->usage[static_cast<size_t>(e.dev)];
      u.used += sign;
      u.usedmem += int64_t{sign} * e.usedmem;
      u.usedcores += int64_t{sign} * e.usedcores;
      AddNamespaceUsage(ns, e.usedmem, e.usedcores, sign);
    }
    return;
  }
  if (collapse_.size() < slot->usage.size()) {
    collapse_.resize(slot->usage.size());
  }
  touched_.clear();
  for (const Entry& e : entries) {
    if (e.dev < 0) {
      continue;
    }
    Collapse& c = collapse_[static_cast<size_t>(e.dev)];
    if (!c.touched) {
      c.touched = true;
      touched_.push_back(e.dev);
    }
    if (e.container < init_count) {
      c.init = true;
      c.init_mem = std::max(c.init_mem, int64_t{e.usedmem});
      c.init_cores = std::max(c.init_cores, int64_t{e.usedcores});
    } else {
      c.app += 1;
      c.app_mem += e.usedmem;
      c.app_cores += e.usedcores;
    }
  }
  int64_t mem = 0, cores = 0;
  for (int16_t d : touched_) {
    Collapse& c = collapse_[static_cast<size_t>(d)];
    device::DeviceUsage& u = slot->usage[static_cast<size_t>(d)];
    const int64_t m = std::max(c.init_mem, c.app_mem);
    const int64_t k = std::max(c.init_cores, c.app_cores);
    u.used += sign * std::max(c.init ? 1 : 0, c.app);
    u.usedmem += sign * m;
    u.usedcores += sign * k;
    mem += m;
    cores += k;
    c = Collapse();
  }
  if (!touched_.empty()) {
    AddNamespaceUsage(ns, mem, cores, sign);
  }
}

uint32_t Ledger::NodeSlotFor(std::string_view name) {
  auto it = node_index_.find(Key(name));
  if (it != node_index_.end()) {
    return it->second;
  }
  uint32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id].name = std::string(name);
  node_index_.emplace(nodes_[id].name, id);
  return id;
}

void Ledger::MaybeFreeNode(uint32_t id) {
  if (id == kNone) {
    return;
  }
  NodeSlot& slot = nodes_[id];
  if (slot.devices != nullptr || !slot.members.empty()) {
    return;
  }
  node_index_.erase(slot.name);
  slot = NodeSlot();
  free_nodes_.push_back(id);
}

// ---- pods ---------------------------------------------------------------------------------

uint32_t Ledger::FindPod(std::string_view uid) const {
  auto it = pod_index_.find(Key(uid));
  return it == pod_index_.end() ? kNone : it->second;
}

uint32_t Ledger::NewPod() {
  if (!free_pods_.empty()) {
    const uint32_t id = free_pods_.back();
    free_pods_.pop_back();
    return id;
  }
  pods_.emplace_back();
  return static_cast<uint32_t>(pods_.size() - 1);
}

void Ledger::FreePod(uint32_t id) {
  Pod& p = pods_[id];
  if (p.text != nullptr) {
    pod_index_.erase(Key(p.uid()));
  }
  // Field by field: g++ -O2 misreports `p = Pod()` on the InlinedVector as uninitialised use.
  p.text.reset();
  p.uid_len = p.ns_len = p.name_len = p.bound_len = 0;
  p.node = kNone;
  p.has_record = p.bound = p.bind_failed = p.unreadable = p.pinned = false;
  p.held = Source::kNothing;
  p.init_count = 0;
  p.entries.clear();
  p.entries.shrink_to_fit();
  p.res.reset();
  record_mig_.erase(id);
  rewritten_.erase(id);
  free_pods_.push_back(id);
}

void Ledger::SetText(uint32_t id, std::string_view uid, std::string_view ns, std::string_view name,
                     std::string_view bound_elsewhere) {
  Pod& p = pods_[id];
  if (p.text != nullptr && p.uid() == uid && p.ns() == ns && p.name() == name &&
      p.bound_elsewhere() == bound_elsewhere) {
    return;
  }
  const size_t total = uid.size() + ns.size() + name.size() + bound_elsewhere.size();
  auto text = std::make_unique_for_overwrite<char[]>(total);
  char* out = text.get();
  for (std::string_view part : {uid, ns, name, bound_elsewhere}) {
    if (!part.empty()) {
      std::memcpy(out, part.data(), part.size());
      out += part.size();
    }
  }
  if (p.text != nullptr) {
    pod_index_.erase(Key(p.uid()));
  }
  p.text = std::move(text);
  p.uid_len = static_cast<uint16_t>(uid.size());
  p.ns_len = static_cast<uint16_t>(ns.size());
  p.name_len = static_cast<uint16_t>(name.size());
  p.bound_len = static_cast<uint16_t>(bound_elsewhere.size());
  pod_index_.emplace(Key(p.uid()), id);
}

void Ledger::DropReservation(uint32_t id) {
  Pod& p = pods_[id];
  if (p.res == nullptr) {
    return;
  }
  ReleaseEntries(p.res->entries);
  p.res.reset();
  reserved_.erase(id);
}

void Ledger::Link(uint32_t id) {
  const Pod& p = pods_[id];
  if (p.has_record) {
    nodes_[p.node].members.insert(id);
  }
  if (p.res != nullptr) {
    nodes_[p.res->node].members.insert(id);
  }
}

void Ledger::Unlink(uint32_t id) {
  const Pod& p = pods_[id];
  if (p.has_record) {
    nodes_[p.node].members.erase(id);
  }
  if (p.res != nullptr) {
    nodes_[p.res->node].members.erase(id);
  }
}

void Ledger::Account(uint32_t id) {
  Pod& p = pods_[id];
  Entries* src;
  uint32_t node;
  uint16_t init_count;
  if (p.res != nullptr) {
    p.held = Source::kReservation;
    src = &p.res->entries;
    node = p.res->node;
    init_count = p.res->init_count;
  } else if (p.record_holds()) {
    p.held = Source::kRecord;
    if (p.unreadable) {
      nodes_[p.node].blockers.push_back(id);  // holds no device, blocks the node (rule 6)
      return;
    }
    src = &p.entries;
    node = p.node;
    init_count = p.init_count;
  } else {
    p.held = Source::kNothing;
    return;
  }
  const bool reserved = p.held == Source::kReservation;
  NodeSlot& slot = nodes_[node];
  const size_t n = slot.device_uuids.size();
  for (Entry& e : *src) {
    e.dev = -1;
    if (slot.devices == nullptr) {
      continue;
    }
    const uint32_t base = uuids_[e.uuid].base;
    for (size_t i = 0; i < n; ++i) {
      if (slot.device_uuids[i] == base) {
        e.dev = static_cast<int16_t>(i);
        break;
      }
    }
    if (e.dev >= 0) {
      slot.holders[static_cast<size_t>(e.dev)].push_back(id);
    }
  }
  AddUsage(*src, init_count, &slot, p.ns(), +1);
  if (slot.devices != nullptr && (slot.has_mig_card || !MigOf(id, reserved).empty())) {
    AccountMig(id, *src, &slot);
  }
}

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

void Ledger::Unaccount(uint32_t id) {
  Pod& p = pods_[id];
  if (p.held == Source::kNothing) {
    return;
  }
  const bool reserved = p.held == Source::kReservation;
  if (!reserved && p.unreadable) {
    std::vector<uint32_t>& b = nodes_[p.node].blockers;
    auto it = std::find(b.begin(), b.end(), id);
    if (it != b.end()) {
      *it = b.back();
      b.pop_back();
    }
    p.held = Source::kNothing;
    return;
  }
  Entries& src = reserved ? p.res->entries : p.entries;
  NodeSlot& slot = nodes_[reserved ? p.res->node : p.node];
  AddUsage(src, reserved ? p.res->init_count : p.init_count, &slot, p.ns(), -1);
  if (!slot.mig.empty()) {
    UnaccountMig(id, &slot);
  }
  for (Entry& e : src) {
    if (e.dev < 0) {
      continue;
    }
    std::vector<uint32_t>& h = slot.holders[static_cast<size_t>(e.dev)];
    auto it = std::find(h.begin(), h.end(), id);
    if (it != h.end()) {
      *it = h.back();
      h.pop_back();
    }
    e.dev = -1;
  }
  p.held = Source::kNothing;
}

void Ledger::Settle(uint32_t id, bool account, uint32_t old_a, uint32_t old_b) {
  Pod& p = pods_[id];
  if (!p.has_record && p.res == nullptr) {
    FreePod(id);
  } else {
    Link(id);
    if (account) {
      Account(id);
    }
  }
  MaybeFreeNode(old_a);
  if (old_b != old_a) {
    MaybeFreeNode(old_b);
  }
}

bool Ledger::SameRecord(const Pod& p, const PodAllocation& pod) const {
  if (!p.has_record || p.bound != !pod.bound_node.empty() || p.bind_failed != pod.bind_failed ||
      p.unreadable != pod.unreadable || nodes_[p.node].name != pod.node || p.ns() != pod.ns ||
      p.name() != pod.name) {
    return false;
  }
  const std::string_view elsewhere =
      p.bound && pod.bound_node != pod.node ? std::string_view(pod.bound_node) : "";
  if (p.bound_elsewhere() != elsewhere) {
    return false;
  }
  if (pod.unreadable) {
    return true;  // devices and init_count are not kept
  }
  auto mig = record_mig_.find(FindPod(p.uid()));
  if (mig == record_mig_.end() ? !pod.mig.empty() : mig->second != pod.mig) {
    return false;
  }
  return SameEntries(p, pod);
}

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

namespace {

// A MIG placement without the runtime identity the device plugin writes back.
bool SamePlacement(const device::MigAllocation& a, const device::MigAllocation& b) {
  return a.container_index == b.container_index && a.device_index == b.device_index &&
         a.gpu_uuid == b.gpu_uuid && a.profile == b.profile && a.placement == b.placement;
}

}  // namespace

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

// ---- nodes --------------------------------------------------------------------------------

absl::Status Ledger::SetNode(std::shared_ptr<const device::NodeDevices> node) {
  MutexLock lock(&mu_);
  return SetNodeLocked(std::move(node), /*account=*/true);
}

absl::Status Ledger::SetNodeLocked(std::shared_ptr<const device::NodeDevices> node, bool account) {
  if (node == nullptr) {
    return absl::InvalidArgumentError("ledger: null node registration");
  }
  if (node->node.empty() || node->node.size() > kMaxLen) {
    return absl::InvalidArgumentError("ledger: node registration without a valid name");
  }
  if (node->devices.size() > kMaxDevicesPerNode) {
    return absl::InvalidArgumentError(
        fmt::format("ledger: node {} registers {} devices (at most {})", node->node,
                    node->devices.size(), kMaxDevicesPerNode));
  }
  const uint32_t id = NodeSlotFor(node->node);
  if (nodes_[id].devices != nullptr && SameDevices(*nodes_[id].devices, *node)) {
    nodes_[id].devices = std::move(node);
    return absl::OkStatus();
  }
  const std::vector<uint32_t> members(nodes_[id].members.begin(), nodes_[id].members.end());
  for (uint32_t m : members) {
    Unaccount(m);
  }
  std::vector<uint32_t> uuids;
  uuids.reserve(node->devices.size());
  for (const auto& d : node->devices) {
    // Registered IDs are matched without any MIG suffix, like record entries.
    uuids.push_back(InternUuid(BaseUuid(d.id)));
  }
  NodeSlot& slot = nodes_[id];
  for (uint32_t u : slot.device_uuids) {
    ReleaseUuid(u);
  }
  slot.device_uuids = std::move(uuids);
  slot.usage.assign(node->devices.size(), device::DeviceUsage{});
  slot.holders.assign(node->devices.size(), {});
  slot.has_mig_card = std::any_of(node->devices.begin(), node->devices.end(),
                                  [](const device::DeviceInfo& d) { return d.mode == "mig"; });
  slot.mig.clear();
  slot.devices = std::move(node);
  if (account) {
    for (uint32_t m : members) {
      Account(m);
    }
  }
  return absl::OkStatus();
}

bool Ledger::RemoveNode(std::string_view name) {
  MutexLock lock(&mu_);
  auto it = node_index_.find(Key(name));
  if (it == node_index_.end() || nodes_[it->second].devices == nullptr) {
    return false;
  }
  const uint32_t id = it->second;
  const std::vector<uint32_t> members(nodes_[id].members.begin(), nodes_[id].members.end());
  for (uint32_t m : members) {
    Unaccount(m);
  }
  NodeSlot& slot = nodes_[id];
  for (uint32_t u : slot.device_uuids) {
    ReleaseUuid(u);
  }
  slot.device_uuids.clear();
  slot.usage.clear();
  slot.holders.clear();
  slot.mig.clear();
  slot.has_mig_card = false;
  slot.devices.reset();
  for (uint32_t m : members) {
    Account(m);
  }
  MaybeFreeNode(id);
  return true;
}

// ---- records ------------------------------------------------------------------------------

absl::Status Ledger::Apply(const PodAllocation& pod) {
  MutexLock lock(&mu_);
  return ApplyLocked(pod, /*account=*/true);
}

absl::Status Ledger::ApplyLocked(const PodAllocation& observed, bool account) {
  if (absl::Status s = CheckLengths(observed.uid, observed.ns, observed.name, observed.node,
                                    observed.bound_node);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckInitCount(observed.uid, observed.init_count); !s.ok()) {
    return s;
  }
  uint32_t id = FindPod(observed.uid);
  PodAllocation kept;
  const PodAllocation* in = &observed;
  if (id != kNone && pods_[id].pinned) {
    if (observed.terminal || observed.deleted) {
      pods_[id].pinned = false;  // finished: the pin ends with it
      rewritten_.erase(id);
    } else if (SameDecision(id, observed)) {
      rewritten_.erase(id);
    } else {
      // Someone changed the allocation of a bound pod: the decision stays (LedgerOptions).
      rewritten_[id] = Decision{
          observed.node, observed.unreadable ? device::PodDevices{} : observed.devices,
          observed.unreadable ? 0 : observed.init_count, observed.mig, observed.unreadable};
      kept = KeepDecision(id, observed);
      in = &kept;
    }
  }
  const PodAllocation& pod = *in;
  const bool stored = !pod.terminal && !pod.deleted && !pod.node.empty();
  const bool ends_reservation = pod.terminal || pod.deleted || !pod.bound_node.empty();
  if (id != kNone && stored && (!ends_reservation || pods_[id].res == nullptr) &&
      SameRecord(pods_[id], pod)) {
    return absl::OkStatus();  // most watch deliveries: nothing the ledger keeps has changed
  }
  Entries entries;
  if (stored && !pod.unreadable) {
    if (absl::Status s = BuildEntries(pod.devices, &entries); !s.ok()) {
      return s;
    }
  }
  if (id == kNone) {
    if (!stored) {
      return absl::OkStatus();  // nothing known, nothing to keep
    }
    id = NewPod();
  }
  Unaccount(id);
  Unlink(id);
  Pod& p = pods_[id];
  const uint32_t old_node = p.has_record ? p.node : kNone;
  const uint32_t old_res_node = p.res != nullptr ? p.res->node : kNone;
  if (ends_reservation) {
    DropReservation(id);
  }
  ReleaseEntries(p.entries);
  p.entries.clear();
  if (stored) {
    p.has_record = true;
    p.node = NodeSlotFor(pod.node);
    p.bound = !pod.bound_node.empty();
    p.bind_failed = pod.bind_failed;
    p.unreadable = pod.unreadable;
    p.init_count = NormalInitCount(pod.init_count, entries);
    p.entries = std::move(entries);
    if (pod.unreadable || pod.mig.empty()) {
      record_mig_.erase(id);
    } else {
      record_mig_[id] = pod.mig;
    }
  } else {
    record_mig_.erase(id);
    p.has_record = false;
    p.node = kNone;
    p.bound = false;
    p.bind_failed = false;
    p.unreadable = false;
    p.init_count = 0;
  }
  if (old_node == kNone && stored) {
    ++records_;
  } else if (old_node != kNone && !stored) {
    --records_;
  }
  const std::string_view elsewhere = stored && p.bound && pod.bound_node != pod.node
                                         ? std::string_view(pod.bound_node)
                                         : std::string_view();
  if (p.has_record || p.res != nullptr) {
    SetText(id, pod.uid, pod.ns, pod.name, elsewhere);
  }
  if (options_.pin_decisions && p.record_holds() && !p.unreadable) {
    p.pinned = true;  // first stored holding: this allocation is the decision from now on
  }
  Settle(id, account, old_node, old_res_node);
  return absl::OkStatus();
}

bool Ledger::Remove(std::string_view uid) {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  if (id == kNone) {
    return false;
  }
  Unaccount(id);
  Unlink(id);
  Pod& p = pods_[id];
  const uint32_t old_node = p.has_record ? p.node : kNone;
  const Res* res = p.res.get();
  const uint32_t old_res_node = res != nullptr ? res->node : kNone;
  DropReservation(id);
  ReleaseEntries(p.entries);
  p.entries.clear();
  record_mig_.erase(id);
  if (p.has_record) {
    --records_;
  }
  p.has_record = false;
  p.unreadable = false;
  p.init_count = 0;
  Settle(id, /*account=*/true, old_node, old_res_node);
  return true;
}

// ---- reservations -------------------------------------------------------------------------

absl::Status Ledger::Reserve(std::string_view uid, std::string_view ns, std::string_view name,
                             std::string_view node, const device::PodDevices& devices,
                             absl::Time expires_at, int32_t init_count,
                             const std::vector<device::MigAllocation>& mig) {
  MutexLock lock(&mu_);
  return ReserveLocked(uid, ns, name, node, devices, expires_at, init_count, mig,
                       /*account=*/true);
}

absl::Status Ledger::ReserveLocked(std::string_view uid, std::string_view ns, std::string_view name,
                                   std::string_view node, const device::PodDevices& devices,
                                   absl::Time expires_at, int32_t init_count,
                                   const std::vector<device::MigAllocation>& mig, bool account) {
  if (absl::Status s = CheckLengths(uid, ns, name, node, {}); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckInitCount(uid, init_count); !s.ok()) {
    return s;
  }
  if (node.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("ledger: reservation for {} without a node", uid));
  }
  uint32_t id = FindPod(uid);
  if (id != kNone && pods_[id].has_record && pods_[id].bound) {
    return absl::FailedPreconditionError(
        fmt::format("ledger: pod {} is already observed bound; nothing to reserve", uid));
  }
  auto res = std::make_unique<Res>();
  if (absl::Status s = BuildEntries(devices, &res->entries); !s.ok()) {
    return s;
  }
  res->expires_at = expires_at;
  res->init_count = NormalInitCount(init_count, res->entries);
  res->mig = mig;
  if (id == kNone) {
    id = NewPod();
  }
  Unaccount(id);
  Unlink(id);
  const uint32_t old_res_node = pods_[id].res != nullptr ? pods_[id].res->node : kNone;
  DropReservation(id);
  res->node = NodeSlotFor(node);
  pods_[id].res = std::move(res);
  reserved_.insert(id);
  SetText(id, uid, ns, name, pods_[id].bound_elsewhere());
  Settle(id, account, old_res_node, kNone);
  return absl::OkStatus();
}

bool Ledger::ReleaseLocked(uint32_t id) {
  if (pods_[id].res == nullptr) {
    return false;
  }
  Unaccount(id);
  Unlink(id);
  const uint32_t old_res_node = pods_[id].res->node;
  DropReservation(id);
  Settle(id, /*account=*/true, old_res_node, kNone);
  return true;
}

bool Ledger::Release(std::string_view uid) {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  return id != kNone && ReleaseLocked(id);
}

bool Ledger::ReplaceEntries(Entries* entries, uint16_t container,
                            const device::ContainerDevices& from,
                            const device::ContainerDevices& to) {
  auto first = std::find_if(entries->begin(), entries->end(),
                            [&](const Entry& e) { return e.container == container; });
  auto last =
      std::find_if(first, entries->end(), [&](const Entry& e) { return e.container != container; });
  if (static_cast<size_t>(last - first) != from.size()) {
    return false;
  }
  for (size_t i = 0; i < from.size(); ++i) {
    const Entry& e = first[static_cast<ptrdiff_t>(i)];
    if (uuids_[e.uuid].value != from[i].uuid || e.usedmem != from[i].usedmem ||
        e.usedcores != from[i].usedcores) {
      return false;
    }
  }
  Entries replaced;
  replaced.reserve(entries->size() - from.size() + to.size());
  replaced.insert(replaced.end(), entries->begin(), first);
  for (const device::ContainerDevice& d : to) {
    Entry e;
    e.uuid = InternUuid(d.uuid);
    e.usedmem = d.usedmem;
    e.usedcores = d.usedcores;
    e.container = container;
    replaced.push_back(e);
  }
  for (auto it = first; it != last; ++it) {
    ReleaseUuid(it->uuid);
  }
  replaced.insert(replaced.end(), last, entries->end());
  *entries = std::move(replaced);
  return true;
}

absl::StatusOr<int> Ledger::ReplaceContainer(std::string_view uid, int32_t container,
                                             const device::ContainerDevices& from,
                                             const device::ContainerDevices& to) {
  if (from.empty() || to.empty()) {
    return absl::InvalidArgumentError("ledger: a container move needs devices on both sides");
  }
  if (container < 0 || static_cast<size_t>(container) > kMaxLen) {
    return absl::InvalidArgumentError(fmt::format("ledger: container {} out of range", container));
  }
  for (const device::ContainerDevice& d : to) {
    if (d.uuid.empty() || d.uuid.size() > kMaxLen) {
      return absl::InvalidArgumentError("ledger: device uuid empty or too long");
    }
  }
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  if (id == kNone) {
    return absl::NotFoundError(fmt::format("ledger: pod {} is not known", uid.substr(0, 64)));
  }
  // Usage comes off and goes back inside this one critical section: nobody sees the pod
  // without its usage, and nothing else about it (node, other containers, init count) changes.
  Unaccount(id);
  Pod& p = pods_[id];
  const auto c = static_cast<uint16_t>(container);
  int moved = 0;
  if (p.has_record && !p.unreadable && ReplaceEntries(&p.entries, c, from, to)) {
    ++moved;
  }
  if (p.res != nullptr && ReplaceEntries(&p.res->entries, c, from, to)) {
    ++moved;
  }
  Account(id);
  // A refit is Tessera's own decision: the pin moves with it, and an Apply that already carried
  // the move (the informer was first) is no rewrite.
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
  return moved;
}

std::optional<Held> Ledger::Find(std::string_view uid) const {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  if (id == kNone) {
    return std::nullopt;
  }
  const Pod& p = pods_[id];
  Held out;
  out.ns = std::string(p.ns());
  out.name = std::string(p.name());
  if (p.has_record && !p.unreadable) {
    out.node = nodes_[p.node].name;
    out.devices = ExportDevices(p.entries);
  } else if (p.res != nullptr) {
    out.node = nodes_[p.res->node].name;
    out.reserved = true;
    out.devices = ExportDevices(p.res->entries);
  } else {
    return std::nullopt;
  }
  return out;
}

std::optional<Reservation> Ledger::ReservationOf(std::string_view uid) const {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  if (id == kNone || pods_[id].res == nullptr) {
    return std::nullopt;
  }
  return ExportReservation(pods_[id]);
}

bool Ledger::HasReservation(std::string_view uid) const {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  return id != kNone && pods_[id].res != nullptr;
}

std::vector<Reservation> Ledger::ExpireReservations(absl::Time now) {
  return ExpireReservations(now, [](std::string_view) { return false; });
}

std::vector<Reservation> Ledger::ExpireReservations(
    absl::Time now, const std::function<bool(std::string_view uid)>& keep) {
  MutexLock lock(&mu_);
  std::vector<uint32_t> due;
  for (uint32_t id : reserved_) {
    if (pods_[id].res->expires_at <= now && !keep(pods_[id].uid())) {
      due.push_back(id);
    }
  }
  std::vector<Reservation> out;
  out.reserve(due.size());
  for (uint32_t id : due) {
    out.push_back(ExportReservation(pods_[id]));
    ReleaseLocked(id);
  }
  std::sort(out.begin(), out.end(),
            [](const Reservation& x, const Reservation& y) { return x.uid < y.uid; });
  return out;
}

std::string Ledger::BlockedByLocked(const NodeSlot& slot) const {
  const Pod* first = nullptr;
  for (uint32_t id : slot.blockers) {
    if (first == nullptr || pods_[id].uid() < first->uid()) {
      first = &pods_[id];
    }
  }
  if (first == nullptr) {
    return "";
  }
  return fmt::format("{}/{}", first->ns(), first->name());
}

// ---- reads --------------------------------------------------------------------------------

std::vector<std::optional<device::NodeSnapshot>> Ledger::Snapshot(
    const std::vector<std::string_view>& node_names) const {
  // A /filter reads 500 nodes picked at random among thousands: nearly every read of a node's
  // index entry, slot, usage and device list misses the cache, and one after the other those
  // misses were most of this function's time (perf, docs/benchmarks.md). Three passes instead,
  // each starting the next one's loads early: find every slot, then its usage and devices, then
  // copy.
  const size_t n = node_names.size();
  std::vector<std::optional<device::NodeSnapshot>> out(n);
  std::vector<const NodeSlot*> slots(n, nullptr);
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    auto it = node_index_.find(Key(node_names[i]));
    if (it != node_index_.end()) {
      slots[i] = &nodes_[it->second];
      __builtin_prefetch(slots[i]);
    }
  }
  for (const NodeSlot* slot : slots) {
    if (slot != nullptr && slot->devices != nullptr) {
      __builtin_prefetch(slot->usage.data());
      // The reference count (a make_shared control block sits just before the object) is
      // written by the copy below.
      __builtin_prefetch(reinterpret_cast<const char*>(slot->devices.get()) - 16, 1);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const NodeSlot* slot = slots[i];
    if (slot == nullptr || slot->devices == nullptr) {
      continue;
    }
    out[i].emplace(device::NodeSnapshot{slot->devices,
                                        device::UsageList(slot->usage.begin(), slot->usage.end())});
    if (!slot->blockers.empty()) {
      out[i]->blocked_by = BlockedByLocked(*slot);
    }
    if (!slot->mig.empty()) {
      std::vector<device::MigCardUsage>& mig = out[i]->mig;
      mig.resize(slot->mig.size());
      for (size_t d = 0; d < slot->mig.size(); ++d) {
        for (const MigHeld& h : slot->mig[d].held) {
          mig[d].occupied.push_back(h.placement);
        }
        mig[d].unusable = !slot->mig[d].bad.empty();
      }
    }
  }
  return out;
}

device::PodDevices Ledger::ExportDevices(const Entries& entries) const {
  device::PodDevices out;
  for (const Entry& e : entries) {
    if (out.size() <= e.container) {
      out.resize(size_t{e.container} + 1);
    }
    out[e.container].push_back(device::ContainerDevice{
        uuids_[e.uuid].value, std::string(device::kNvidiaVendor), e.usedmem, e.usedcores});
  }
  return out;
}

Reservation Ledger::ExportReservation(const Pod& p) const {
  return Reservation{std::string(p.uid()),          std::string(p.ns()),
                     std::string(p.name()),         nodes_[p.res->node].name,
                     ExportDevices(p.res->entries), p.res->expires_at,
                     int32_t{p.res->init_count},    p.res->mig};
}

NodeView Ledger::ViewLocked(const NodeSlot& slot) const {
  NodeView v;
  v.devices = slot.devices;
  v.usage = slot.usage;
  v.holders.resize(slot.holders.size());
  for (size_t d = 0; d < slot.holders.size(); ++d) {
    std::vector<uint32_t> ids = slot.holders[d];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (uint32_t id : ids) {
      const Pod& p = pods_[id];
      const bool reserved = p.held == Source::kReservation;
      const Entries& src = reserved ? p.res->entries : p.entries;
      const uint16_t init_count = reserved ? p.res->init_count : p.init_count;
      for (const Entry& e : src) {
        if (e.dev == static_cast<int16_t>(d)) {
          v.holders[d].push_back(Holder{std::string(p.uid()), std::string(p.ns()),
                                        std::string(p.name()), e.container, e.usedmem, e.usedcores,
                                        reserved, e.container < init_count});
        }
      }
    }
    std::sort(v.holders[d].begin(), v.holders[d].end(), [](const Holder& x, const Holder& y) {
      return std::tie(x.uid, x.container, x.usedmem, x.usedcores) <
             std::tie(y.uid, y.container, y.usedmem, y.usedcores);
    });
    if (slot.mig.empty()) {
      continue;
    }
    v.mig.resize(slot.holders.size());
    for (uint32_t id : ids) {
      auto mig = record_mig_.find(id);
      if (pods_[id].held != Source::kRecord || mig == record_mig_.end()) {
        continue;
      }
      for (const device::MigAllocation& a : mig->second) {
        if (a.RuntimeReady() && a.gpu_uuid == slot.devices->devices[d].id) {
          v.mig[d].push_back(a);
        }
      }
    }
  }
  return v;
}

FullSnapshot Ledger::Full() const {
  FullSnapshot out;
  MutexLock lock(&mu_);
  std::vector<const NodeSlot*> slots;
  for (const NodeSlot& slot : nodes_) {
    if (slot.devices != nullptr) {
      slots.push_back(&slot);
    }
  }
  std::sort(slots.begin(), slots.end(),
            [](const NodeSlot* x, const NodeSlot* y) { return x->name < y->name; });
  out.nodes.reserve(slots.size());
  for (const NodeSlot* slot : slots) {
    out.nodes.push_back(ViewLocked(*slot));
  }
  out.records = records_;
  out.reservations = reserved_.size();
  out.namespaces.assign(namespaces_.begin(), namespaces_.end());
  std::sort(out.namespaces.begin(), out.namespaces.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

std::optional<NodeView> Ledger::View(std::string_view node) const {
  MutexLock lock(&mu_);
  auto it = node_index_.find(Key(node));
  if (it == node_index_.end() || nodes_[it->second].devices == nullptr) {
    return std::nullopt;
  }
  return ViewLocked(nodes_[it->second]);
}

std::optional<absl::Time> Ledger::ReservationExpiry(std::string_view uid) const {
  MutexLock lock(&mu_);
  const uint32_t id = FindPod(uid);
  if (id == kNone || pods_[id].res == nullptr) {
    return std::nullopt;
  }
  return pods_[id].res->expires_at;
}

NamespaceUsage Ledger::UsageOf(std::string_view ns) const {
  MutexLock lock(&mu_);
  auto it = namespaces_.find(Key(ns));
  return it == namespaces_.end() ? NamespaceUsage{} : it->second;
}

Problems Ledger::FindProblems() const {
  Problems out;
  MutexLock lock(&mu_);
  for (const Pod& p : pods_) {
    if (p.text == nullptr) {
      continue;
    }
    if (p.conflict()) {
      out.conflicts.push_back(Conflict{std::string(p.uid()), std::string(p.ns()),
                                       std::string(p.name()), nodes_[p.node].name,
                                       std::string(p.bound_elsewhere())});
    }
    if (p.held == Source::kNothing) {
      continue;
    }
    const bool reserved = p.held == Source::kReservation;
    if (!reserved && p.unreadable) {
      out.unreadable.push_back(Unreadable{std::string(p.uid()), std::string(p.ns()),
                                          std::string(p.name()), nodes_[p.node].name});
      continue;
    }
    const uint32_t node = reserved ? p.res->node : p.node;
    const Entries& src = reserved ? p.res->entries : p.entries;
    if (nodes_[node].devices == nullptr) {
      out.unregistered.push_back(Unregistered{std::string(p.uid()), std::string(p.ns()),
                                              std::string(p.name()), nodes_[node].name, reserved});
      continue;
    }
    for (const Entry& e : src) {
      if (e.dev < 0) {
        out.orphans.push_back(Orphan{std::string(p.uid()), std::string(p.ns()),
                                     std::string(p.name()), nodes_[node].name, uuids_[e.uuid].value,
                                     e.container, reserved});
      }
    }
  }
  std::sort(out.conflicts.begin(), out.conflicts.end(),
            [](const Conflict& x, const Conflict& y) { return x.uid < y.uid; });
  std::sort(out.orphans.begin(), out.orphans.end(), [](const Orphan& x, const Orphan& y) {
    return std::tie(x.uid, x.container, x.uuid) < std::tie(y.uid, y.container, y.uuid);
  });
  std::sort(out.unregistered.begin(), out.unregistered.end(),
            [](const Unregistered& x, const Unregistered& y) { return x.uid < y.uid; });
  std::sort(out.unreadable.begin(), out.unreadable.end(),
            [](const Unreadable& x, const Unreadable& y) { return x.uid < y.uid; });
  for (const auto& [id, observed] : rewritten_) {
    const Pod& p = pods_[id];
    out.rewritten.push_back(Rewritten{std::string(p.uid()), std::string(p.ns()),
                                      std::string(p.name()), DecisionOf(id), observed});
  }
  std::sort(out.rewritten.begin(), out.rewritten.end(),
            [](const Rewritten& x, const Rewritten& y) { return x.uid < y.uid; });
  FindMigProblems(&out);
  return out;
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

std::vector<PodAllocation> Ledger::Records() const {
  std::vector<PodAllocation> out;
  MutexLock lock(&mu_);
  out.reserve(records_);
  for (uint32_t id = 0; id < pods_.size(); ++id) {
    if (pods_[id].has_record) {
      out.push_back(ExportRecord(id));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const PodAllocation& x, const PodAllocation& y) { return x.uid < y.uid; });
  return out;
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

std::vector<Reservation> Ledger::Reservations() const {
  std::vector<Reservation> out;
  MutexLock lock(&mu_);
  out.reserve(reserved_.size());
  for (uint32_t id : reserved_) {
    out.push_back(ExportReservation(pods_[id]));
  }
  std::sort(out.begin(), out.end(),
            [](const Reservation& x, const Reservation& y) { return x.uid < y.uid; });
  return out;
}

// ---- recompute and diff -------------------------------------------------------------------

void Ledger::RebuildUsageLocked() {
  namespaces_.clear();
  for (NodeSlot& slot : nodes_) {
    std::fill(slot.usage.begin(), slot.usage.end(), device::DeviceUsage{});
    for (auto& h : slot.holders) {
      h.clear();
    }
    slot.blockers.clear();
    slot.mig.clear();
  }
  for (uint32_t id = 0; id < pods_.size(); ++id) {
    if (pods_[id].text != nullptr) {
      pods_[id].held = Source::kNothing;
      Account(id);
    }
  }
}

std::unique_ptr<Ledger> Ledger::Recompute(
    const std::vector<std::shared_ptr<const device::NodeDevices>>& nodes,
    const std::vector<PodAllocation>& pods, const std::vector<Reservation>& reservations,
    const std::vector<PodAllocation>& pinned) {
  auto ledger = std::make_unique<Ledger>();
  MutexLock lock(&ledger->mu_);
  for (const auto& node : nodes) {
    (void)ledger->SetNodeLocked(node, /*account=*/false);
  }
  if (!pinned.empty()) {
    absl::flat_hash_set<absl::string_view> present;
    for (const auto& pod : pods) {
      present.insert(Key(pod.uid));
    }
    for (const auto& pin : pinned) {
      if (!present.contains(Key(pin.uid)) || !ledger->ApplyLocked(pin, /*account=*/false).ok()) {
        continue;
      }
      if (const uint32_t id = ledger->FindPod(pin.uid);
          id != kNone && ledger->pods_[id].has_record && !ledger->pods_[id].unreadable) {
        ledger->pods_[id].pinned = true;
      }
    }
  }
  for (const auto& pod : pods) {
    (void)ledger->ApplyLocked(pod, /*account=*/false);
  }
  for (const auto& r : reservations) {
    (void)ledger->ReserveLocked(r.uid, r.ns, r.name, r.node, r.devices, r.expires_at, r.init_count,
                                r.mig, /*account=*/false);
  }
  ledger->RebuildUsageLocked();
  return ledger;
}

namespace {}  // namespace

// The analysis cannot follow the address-ordered locking of two ledgers.
ABSL_NO_THREAD_SAFETY_ANALYSIS LedgerDiff Diff(const Ledger& a, const Ledger& b) {
  if (&a == &b) {
    return LedgerDiff{};
  }
  // Lock in address order so that concurrent Diff(a, b) and Diff(b, a) cannot deadlock.
  const Ledger* first = std::less<const Ledger*>()(&a, &b) ? &a : &b;
  const Ledger* second = first == &a ? &b : &a;
  MutexLock l1(&first->mu_);
  MutexLock l2(&second->mu_);
  return Ledger::DiffLocked(a, b);
}

LedgerDiff Ledger::DiffLocked(const Ledger& a, const Ledger& b) {
  LedgerDiff out;
  auto same_entries = [&](const Entries& x, const Entries& y) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu_,
                                                                                            b.mu_) {
    if (x.size() != y.size()) {
      return false;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].container != y[i].container || x[i].usedmem != y[i].usedmem ||
          x[i].usedcores != y[i].usedcores ||
          a.uuids_[x[i].uuid].value != b.uuids_[y[i].uuid].value) {
        return false;
      }
    }
    return true;
  };
  auto diff = [](DiffKind kind, bool reservation, const Pod& p, std::string node_a,
                 std::string node_b) {
    return RecordDiff{kind,
                      reservation,
                      std::string(p.uid()),
                      std::string(p.ns()),
                      std::string(p.name()),
                      std::move(node_a),
                      std::move(node_b)};
  };
  for (const Pod& pa : a.pods_) {
    if (pa.text == nullptr) {
      continue;
    }
    const uint32_t ib = b.FindPod(pa.uid());
    const Pod* pb = ib == kNone ? nullptr : &b.pods_[ib];
    if (pa.has_record) {
      const std::string& na = a.nodes_[pa.node].name;
      if (pb == nullptr || !pb->has_record) {
        out.records.push_back(diff(DiffKind::kStale, false, pa, na, ""));
      } else {
        const std::string& nb = b.nodes_[pb->node].name;
        if (na != nb || pa.bound != pb->bound || pa.bind_failed != pb->bind_failed ||
            pa.unreadable != pb->unreadable || pa.bound_elsewhere() != pb->bound_elsewhere() ||
            pa.ns() != pb->ns() || pa.name() != pb->name() || pa.init_count != pb->init_count ||
            !same_entries(pa.entries, pb->entries) ||
            a.MigOf(static_cast<uint32_t>(&pa - a.pods_.data()), false) != b.MigOf(ib, false)) {
          out.records.push_back(diff(DiffKind::kChanged, false, pa, na, nb));
        }
      }
    }
    if (pa.res != nullptr) {
      const std::string& na = a.nodes_[pa.res->node].name;
      if (pb == nullptr || pb->res == nullptr) {
        out.records.push_back(diff(DiffKind::kStale, true, pa, na, ""));
      } else {
        const std::string& nb = b.nodes_[pb->res->node].name;
        if (na != nb || pa.res->expires_at != pb->res->expires_at ||
            pa.res->init_count != pb->res->init_count ||
            !same_entries(pa.res->entries, pb->res->entries) || pa.res->mig != pb->res->mig) {
          out.records.push_back(diff(DiffKind::kChanged, true, pa, na, nb));
        }
      }
    }
  }
  for (const Pod& pb : b.pods_) {
    if (pb.text == nullptr) {
      continue;
    }
    const uint32_t ia = a.FindPod(pb.uid());
    const Pod* pa = ia == kNone ? nullptr : &a.pods_[ia];
    if (pb.has_record && (pa == nullptr || !pa->has_record)) {
      out.records.push_back(diff(DiffKind::kMissing, false, pb, "", b.nodes_[pb.node].name));
    }
    if (pb.res != nullptr && (pa == nullptr || pa->res == nullptr)) {
      out.records.push_back(diff(DiffKind::kMissing, true, pb, "", b.nodes_[pb.res->node].name));
    }
  }
  std::sort(out.records.begin(), out.records.end(), [](const RecordDiff& x, const RecordDiff& y) {
    return std::tie(x.reservation, x.uid) < std::tie(y.reservation, y.uid);
  });

  auto holder_uids = [](const std::vector<uint32_t>& ids, const std::vector<Pod>& pods) {
    std::vector<std::string> uids;
    uids.reserve(ids.size());
    for (uint32_t id : ids) {
      uids.emplace_back(pods[id].uid());
    }
    std::sort(uids.begin(), uids.end());
    return uids;
  };
  // Usage: per device UUID of every node registered in either ledger.
  auto compare_node = [&](const NodeSlot* sa, const NodeSlot* sb,
                          const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu_, b.mu_) {
    absl::flat_hash_map<absl::string_view, size_t> in_b;
    if (sb != nullptr && sb->devices != nullptr) {
      for (size_t j = 0; j < sb->devices->devices.size(); ++j) {
        in_b.emplace(sb->devices->devices[j].id, j);
      }
    }
    absl::flat_hash_set<absl::string_view> seen;
    if (sa != nullptr && sa->devices != nullptr) {
      for (size_t i = 0; i < sa->devices->devices.size(); ++i) {
        const std::string& uuid = sa->devices->devices[i].id;
        if (!seen.insert(uuid).second) {
          continue;
        }
        UsageDiff d{name, uuid, sa->usage[i], {}, holder_uids(sa->holders[i], a.pods_), {}};
        auto it = in_b.find(uuid);
        if (it != in_b.end()) {
          d.b = sb->usage[it->second];
          d.holders_b = holder_uids(sb->holders[it->second], b.pods_);
        }
        if (d.a != d.b || d.holders_a != d.holders_b) {
          out.usage.push_back(std::move(d));
        }
      }
    }
    if (sb != nullptr && sb->devices != nullptr) {
      for (size_t j = 0; j < sb->devices->devices.size(); ++j) {
        const std::string& uuid = sb->devices->devices[j].id;
        if (seen.contains(uuid) || in_b[uuid] != j) {
          continue;
        }
        UsageDiff d{name, uuid, {}, sb->usage[j], {}, holder_uids(sb->holders[j], b.pods_)};
        if (d.a != d.b || d.holders_a != d.holders_b) {
          out.usage.push_back(std::move(d));
        }
      }
    }
  };
  for (const NodeSlot& sa : a.nodes_) {
    if (sa.devices == nullptr) {
      continue;
    }
    auto it = b.node_index_.find(sa.name);
    const NodeSlot* sb = it == b.node_index_.end() ? nullptr : &b.nodes_[it->second];
    const bool registered_b = sb != nullptr && sb->devices != nullptr;
    if (!registered_b || !SameDevices(*sa.devices, *sb->devices)) {
      out.nodes.push_back(NodeDiff{sa.name, true, registered_b});
    }
    compare_node(&sa, sb, sa.name);
  }
  for (const NodeSlot& sb : b.nodes_) {
    if (sb.devices == nullptr) {
      continue;
    }
    auto it = a.node_index_.find(sb.name);
    if (it != a.node_index_.end() && a.nodes_[it->second].devices != nullptr) {
      continue;  // compared above
    }
    out.nodes.push_back(NodeDiff{sb.name, false, true});
    compare_node(nullptr, &sb, sb.name);
  }
  std::sort(out.nodes.begin(), out.nodes.end(),
            [](const NodeDiff& x, const NodeDiff& y) { return x.node < y.node; });
  std::sort(out.usage.begin(), out.usage.end(), [](const UsageDiff& x, const UsageDiff& y) {
    return std::tie(x.node, x.uuid) < std::tie(y.node, y.uuid);
  });
  for (const auto& [ns, ua] : a.namespaces_) {
    auto it = b.namespaces_.find(ns);
    const NamespaceUsage ub = it == b.namespaces_.end() ? NamespaceUsage{} : it->second;
    if (ua != ub) {
      out.namespaces.push_back(NamespaceDiff{ns, ua, ub});
    }
  }
  for (const auto& [ns, ub] : b.namespaces_) {
    if (!a.namespaces_.contains(ns)) {
      out.namespaces.push_back(NamespaceDiff{ns, NamespaceUsage{}, ub});
    }
  }
  std::sort(out.namespaces.begin(), out.namespaces.end(),
            [](const NamespaceDiff& x, const NamespaceDiff& y) { return x.ns < y.ns; });
  return out;
}

std::string LedgerDiff::ToString() const {
  std::string out;
  static constexpr const char* kKind[] = {"stale", "missing", "changed"};
  for (const RecordDiff& r : records) {
    out += fmt::format("{} {} {} {}/{} node_a={} node_b={}\n", kKind[static_cast<int>(r.kind)],
                       r.reservation ? "reservation" : "record", r.uid, r.ns, r.name, r.node_a,
                       r.node_b);
  }
  for (const NodeDiff& n : nodes) {
    out += fmt::format("node {} registered_a={} registered_b={} (or devices differ)\n", n.node,
                       n.registered_a, n.registered_b);
  }
  for (const UsageDiff& u : usage) {
    out += fmt::format(
        "usage {} {}: a=(used {}, mem {}, cores {}, holders [{}]) b=(used {}, mem {}, cores {}, "
        "holders [{}])\n",
        u.node, u.uuid, u.a.used, u.a.usedmem, u.a.usedcores, fmt::join(u.holders_a, ","), u.b.used,
        u.b.usedmem, u.b.usedcores, fmt::join(u.holders_b, ","));
  }
  for (const NamespaceDiff& n : namespaces) {
    out += fmt::format(
        "namespace {}: a=(mem {}, cores {}, holders {}) b=(mem {}, cores {}, "
        "holders {})\n",
        n.ns, n.a.usedmem, n.a.usedcores, n.a.holders, n.b.usedmem, n.b.usedcores, n.b.holders);
  }
  return out;
}

}  // namespace tessera::ledger

#include "tessera/ledger/ledger.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>

#include "fmt/format.h"

#include "tessera/ledger/ledger_internal.h"

namespace tessera::ledger {
namespace {

using internal::Key;
using internal::NormalInitCount;
using internal::SameDevices;

constexpr size_t kMaxLen = std::numeric_limits<uint16_t>::max();
constexpr size_t kMaxDevicesPerNode = std::numeric_limits<int16_t>::max();

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
  moves_.erase(id);
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
      nodes_[p.node].changed = ++capacity_version_;
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
  slot.changed = ++capacity_version_;
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

void Ledger::Unaccount(uint32_t id) {
  Pod& p = pods_[id];
  if (p.held == Source::kNothing) {
    return;
  }
  const bool reserved = p.held == Source::kReservation;
  if (!reserved && p.unreadable) {
    nodes_[p.node].changed = ++capacity_version_;
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
  slot.changed = ++capacity_version_;
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
  slot.changed = ++capacity_version_;
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
  slot.changed = ++capacity_version_;
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
  PodAllocation moved, kept;
  const PodAllocation& seen =
      id != kNone && !moves_.empty() ? FollowMove(id, observed, &moved) : observed;
  const PodAllocation& pod = id != kNone && pods_[id].pinned ? HoldPin(id, seen, &kept) : seen;
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
  // A refit is Tessera's own decision: the pin moves with it. A pinned pod whose rewrite the
  // move has just matched had its patch delivered already: nothing older is to come.
  bool delivered = false;
  if (rewritten_.contains(id)) {
    DropRewriteIfSame(id);
    delivered = !rewritten_.contains(id);
  }
  if (moved > 0 && !delivered) {
    moves_[id] = Move{c, from, to};
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
    if (slot != nullptr && slot->devices != nullptr) {
      out[i].emplace(SnapshotLocked(*slot));
    }
  }
  return out;
}

device::NodeSnapshot Ledger::SnapshotLocked(const NodeSlot& slot) const {
  device::NodeSnapshot out{slot.devices, device::UsageList(slot.usage.begin(), slot.usage.end())};
  if (!slot.blockers.empty()) {
    out.blocked_by = BlockedByLocked(slot);
  }
  if (!slot.mig.empty()) {
    out.mig.resize(slot.mig.size());
    for (size_t d = 0; d < slot.mig.size(); ++d) {
      for (const MigHeld& h : slot.mig[d].held) {
        out.mig[d].occupied.push_back(h.placement);
      }
      out.mig[d].unusable = !slot.mig[d].bad.empty();
    }
  }
  return out;
}

uint64_t Ledger::CapacityVersion() const {
  MutexLock l(&mu_);
  return capacity_version_;
}

CapacityChanges Ledger::CapacitySince(uint64_t version) const {
  CapacityChanges out;
  {
    MutexLock lock(&mu_);
    out.version = capacity_version_;
    for (const NodeSlot& slot : nodes_) {
      out.registered += slot.devices != nullptr ? 1 : 0;
      if (slot.changed <= version || slot.name.empty()) {
        continue;
      }
      out.nodes.emplace_back(
          slot.name, slot.devices != nullptr ? std::optional(SnapshotLocked(slot)) : std::nullopt);
    }
    out.namespaces.assign(namespaces_.begin(), namespaces_.end());
  }
  std::sort(out.namespaces.begin(), out.namespaces.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
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
  FindRewritten(&out);
  FindMigProblems(&out);
  return out;
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
    slot.changed = ++capacity_version_;
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
  ledger->RestorePinsLocked(pinned, pods);
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

}  // namespace tessera::ledger

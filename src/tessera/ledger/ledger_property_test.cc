// Property test: random sequences of node registrations, pod applies and removals, reservations,
// confirmations, releases and expiries. After every step the incremental ledger must equal
//   (1) Recompute of the same inputs (Diff empty),
//   (2) an independent, naive model of the holder rule written here (usage and holders, with
//       HAMi v2.10's init-container collapse computed per pod and device from plain maps), and
//   (3) itself: every device's usage is the collapse of its holders' entries (init entries
//       contribute their peak and one slot, app entries their sum and count, per pod), and
//   (4) the model's blocked nodes (unreadable allocations, holder rule 6), in Snapshot of both
//       the incremental and the recomputed ledger.
//
// Reproduce a failure with TESSERA_LEDGER_SEED=<seed printed in the failure> (runs that one
// sequence first); TESSERA_LEDGER_SEQUENCES overrides the number of sequences.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/ledger/ledger.h"
#include "tessera/testing/objects.h"

namespace tessera::ledger {
namespace {

using device::ContainerDevice;
using device::DeviceUsage;
using device::NodeDevices;
using device::PodDevices;

constexpr int kNodes = 5;         // n0..n4 may register; n5 never does
constexpr int kUuidsPerNode = 4;  // GPU-<node>-<j>
constexpr int kPods = 16;
constexpr int kSteps = 40;  // per sequence

std::string BaseUuid(const std::string& uuid) {
  if (!uuid.empty() && uuid.back() == ']') {
    const size_t open = uuid.rfind('[');
    if (open != std::string::npos) {
      return uuid.substr(0, open);
    }
  }
  return uuid;
}

// What the ledger stores of a PodDevices: no blank entries, vendor key as type, no trailing
// empty containers.
PodDevices Normalize(const PodDevices& in) {
  PodDevices out(in.size());
  for (size_t c = 0; c < in.size(); ++c) {
    for (const auto& d : in[c]) {
      if (!d.uuid.empty()) {
        out[c].push_back(ContainerDevice{d.uuid, "NVIDIA", d.usedmem, d.usedcores});
      }
    }
  }
  while (!out.empty() && out.back().empty()) {
    out.pop_back();
  }
  return out;
}

// What the ledger stores of an init_count: clamped to the stored containers.
int32_t NormalizeInit(int32_t init_count, const PodDevices& normalized) {
  return std::min(init_count, static_cast<int32_t>(normalized.size()));
}

// Per (pod, device): HAMi v2.10's collapse of that pod's entries on the device.
struct Collapsed {
  bool any_init = false;
  int32_t init_mem = 0, init_cores = 0;
  int32_t apps = 0, app_mem = 0, app_cores = 0;
  void Add(bool init, int32_t mem, int32_t cores) {
    if (init) {
      any_init = true;
      init_mem = std::max(init_mem, mem);
      init_cores = std::max(init_cores, cores);
    } else {
      ++apps;
      app_mem += mem;
      app_cores += cores;
    }
  }
  DeviceUsage Usage() const {
    return DeviceUsage{std::max(any_init ? 1 : 0, apps), std::max(init_mem, app_mem),
                       std::max(init_cores, app_cores)};
  }
};

// The naive reference: plain maps, the rule applied from scratch.
struct Model {
  std::map<std::string, std::shared_ptr<const NodeDevices>> nodes;
  std::map<std::string, PodAllocation> records;
  std::map<std::string, Reservation> reservations;

  void Apply(const PodAllocation& p) {
    if (p.terminal || p.deleted) {
      records.erase(p.uid);
      reservations.erase(p.uid);
      return;
    }
    if (p.node.empty()) {
      records.erase(p.uid);
    } else {
      PodAllocation stored = p;
      stored.devices = p.unreadable ? PodDevices{} : Normalize(p.devices);
      stored.init_count = p.unreadable ? 0 : NormalizeInit(p.init_count, stored.devices);
      records[p.uid] = stored;
    }
    if (!p.bound_node.empty()) {
      reservations.erase(p.uid);
    }
    // ns/name are fixed per uid in this test, so the reservation's copy stays right.
  }
  bool Reserve(const Reservation& r) {
    auto it = records.find(r.uid);
    if (it != records.end() && !it->second.bound_node.empty()) {
      return false;
    }
    Reservation stored = r;
    stored.devices = Normalize(r.devices);
    stored.init_count = NormalizeInit(r.init_count, stored.devices);
    reservations[r.uid] = stored;
    return true;
  }

  using Key = std::pair<std::string, size_t>;  // (node, device index)
  struct Expected {
    std::map<Key, DeviceUsage> usage;
    std::map<Key, std::vector<std::string>> holders;
    std::map<std::string, std::string> blocked;  // node → "ns/name" of the smallest blocking uid
  };
  Expected Compute() const {
    Expected e;
    struct Source {
      const std::string* node;
      const PodDevices* devices;
      int32_t init_count;
    };
    std::map<std::string, Source> source;
    for (const auto& [uid, r] : records) {
      if (r.bound_node == r.node && !r.bind_failed) {
        if (r.unreadable) {
          // Rule 6: no device, the node is blocked (unless a reservation holds instead).
          if (!reservations.contains(uid) && !e.blocked.contains(r.node)) {
            e.blocked[r.node] = r.ns + "/" + r.name;  // records are in uid order
          }
          continue;
        }
        source[uid] = {&r.node, &r.devices, r.init_count};
      }
    }
    for (const auto& [uid, r] : reservations) {
      source[uid] = {&r.node, &r.devices, r.init_count};  // the reservation wins
    }
    for (const auto& [uid, src] : source) {
      auto n = nodes.find(*src.node);
      if (n == nodes.end()) {
        continue;
      }
      std::map<size_t, Collapsed> pod;  // this pod's entries per matched device
      for (size_t c = 0; c < src.devices->size(); ++c) {
        for (const auto& d : (*src.devices)[c]) {
          const std::string base = BaseUuid(d.uuid);
          for (size_t i = 0; i < n->second->devices.size(); ++i) {
            if (BaseUuid(n->second->devices[i].id) == base) {
              pod[i].Add(static_cast<int32_t>(c) < src.init_count, d.usedmem, d.usedcores);
              e.holders[{*src.node, i}].push_back(uid);
              break;
            }
          }
        }
      }
      for (const auto& [i, collapsed] : pod) {
        const DeviceUsage add = collapsed.Usage();
        DeviceUsage& u = e.usage[{*src.node, i}];
        u.used += add.used;
        u.usedmem += add.usedmem;
        u.usedcores += add.usedcores;
      }
    }
    for (auto& [k, h] : e.holders) {
      std::sort(h.begin(), h.end());
    }
    return e;
  }
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(int percent) { return Int(0, 99) < percent; }

  std::string NodeName(bool allow_unregistered = true) {
    return "n" + std::to_string(Int(0, allow_unregistered ? kNodes : kNodes - 1));
  }
  std::string Uuid(const std::string& node) {
    const int r = Int(0, 99);
    if (r < 6) {
      return "GPU-ghost-" + std::to_string(Int(0, 2));  // on no node
    }
    if (r < 12) {
      return "GPU-" + NodeName(false) + "-" + std::to_string(Int(0, kUuidsPerNode - 1));
    }
    std::string u = "GPU-" + node + "-" + std::to_string(Int(0, kUuidsPerNode - 1));
    if (r < 16) {
      u += "[1-" + std::to_string(Int(0, 6)) + "]";  // MIG suffix, matched by base
    }
    return u;
  }
  std::shared_ptr<const NodeDevices> Node(const std::string& name) {
    auto n = std::make_shared<NodeDevices>();
    n->node = name;
    for (int j = 0; j < kUuidsPerNode; ++j) {
      if (Chance(75)) {
        n->devices.push_back(::tessera::testing::GpuDevice("GPU-" + name + "-" + std::to_string(j),
                                                           j, 16384, "NVIDIA-A10"));
      }
    }
    std::shuffle(n->devices.begin(), n->devices.end(), rng_);
    return n;
  }
  PodDevices Devices(const std::string& node) {
    PodDevices out(static_cast<size_t>(Int(0, 3)));
    for (auto& c : out) {
      const int k = Int(0, 2);
      for (int i = 0; i < k; ++i) {
        if (Chance(5)) {
          c.push_back(ContainerDevice{"", "", 0, 0});  // v2.5.2 blank padding
        } else {
          c.push_back(ContainerDevice{Uuid(node), "NVIDIA", Int(1, 8) * 512, Int(0, 10) * 10});
        }
      }
    }
    return out;
  }
  std::string Uid() { return "uid-" + std::to_string(Int(0, kPods - 1)); }
  // Half the pods have no init containers; the rest 1..3 (sometimes more than they have
  // containers with devices).
  int32_t InitCount() { return Chance(50) ? 0 : Int(1, 3); }

 private:
  std::mt19937_64 rng_;
};

std::string NsOf(const std::string& uid) { return "ns" + std::to_string(uid.back() % 3); }
std::string NameOf(const std::string& uid) { return "pod-" + uid; }

// Returns "" when everything agrees, otherwise what differs.
std::string Check(const Ledger& ledger, const Model& model) {
  std::vector<std::shared_ptr<const NodeDevices>> nodes;
  for (const auto& [name, n] : model.nodes) {
    nodes.push_back(n);
  }
  std::vector<PodAllocation> records;
  for (const auto& [uid, r] : model.records) {
    records.push_back(r);
  }
  std::vector<Reservation> reservations;
  for (const auto& [uid, r] : model.reservations) {
    reservations.push_back(r);
  }
  // (1) incremental == recompute.
  auto fresh = Ledger::Recompute(nodes, records, reservations);
  const LedgerDiff diff = Diff(ledger, *fresh);
  if (!diff.Empty()) {
    return "incremental vs recompute:\n" + diff.ToString();
  }
  // Stored records and reservations equal the model's.
  if (ledger.Records() != records) {
    return "records differ from the model";
  }
  if (ledger.Reservations() != reservations) {
    return "reservations differ from the model";
  }
  // (2) usage and holders equal the naive model; (3) usage equals the sum of holders.
  const Model::Expected expected = model.Compute();
  const FullSnapshot full = ledger.Full();
  if (full.nodes.size() != model.nodes.size()) {
    return "registered node count differs";
  }
  if (full.records != records.size() || full.reservations != reservations.size()) {
    return "record or reservation counts differ";
  }
  // (4) blocked nodes (rule 6) equal the model's, incrementally and recomputed.
  std::vector<std::string_view> names;
  for (const auto& [name, n] : model.nodes) {
    names.push_back(name);
  }
  const auto snap = ledger.Snapshot(names);
  const auto fresh_snap = fresh->Snapshot(names);
  for (size_t i = 0; i < names.size(); ++i) {
    auto b = expected.blocked.find(std::string(names[i]));
    const std::string want = b == expected.blocked.end() ? "" : b->second;
    if (!snap[i] || snap[i]->blocked_by != want || !fresh_snap[i] ||
        fresh_snap[i]->blocked_by != want) {
      return "blocked_by of " + std::string(names[i]) + ": ledger " +
             (snap[i] ? snap[i]->blocked_by : "(none)") + ", recomputed " +
             (fresh_snap[i] ? fresh_snap[i]->blocked_by : "(none)") + ", model " + want;
    }
  }
  for (const NodeView& view : full.nodes) {
    const std::string& name = view.devices->node;
    for (size_t i = 0; i < view.usage.size(); ++i) {
      const Model::Key key{name, i};
      auto eu = expected.usage.find(key);
      const DeviceUsage want = eu == expected.usage.end() ? DeviceUsage{} : eu->second;
      if (view.usage[i] != want) {
        return "usage of " + name + "/" + view.devices->devices[i].id + ": ledger used " +
               std::to_string(view.usage[i].used) + " mem " +
               std::to_string(view.usage[i].usedmem) + ", model used " + std::to_string(want.used) +
               " mem " + std::to_string(want.usedmem);
      }
      std::map<std::string, Collapsed> per_pod;  // holders are sorted by uid
      std::vector<std::string> uids;
      for (const Holder& h : view.holders[i]) {
        per_pod[h.uid].Add(h.init, h.usedmem, h.usedcores);
        uids.push_back(h.uid);
      }
      DeviceUsage sum;
      for (const auto& [uid, collapsed] : per_pod) {
        const DeviceUsage add = collapsed.Usage();
        sum.used += add.used;
        sum.usedmem += add.usedmem;
        sum.usedcores += add.usedcores;
      }
      if (sum != view.usage[i]) {
        return "usage of " + name + " device " + std::to_string(i) +
               " is not its holders' collapse";
      }
      auto eh = expected.holders.find(key);
      const std::vector<std::string> want_uids =
          eh == expected.holders.end() ? std::vector<std::string>{} : eh->second;
      if (uids != want_uids) {
        return "holders of " + name + " device " + std::to_string(i) + " differ";
      }
    }
  }
  return "";
}

// Runs one random sequence; returns "" or a description of the first failing step.
std::string RunSequence(uint64_t seed, int steps) {
  Generator g(seed);
  Ledger ledger;
  Model model;
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  std::string log;
  for (int step = 0; step < steps; ++step) {
    const int op = g.Int(0, 99);
    std::string what;
    if (op < 10) {
      auto n = g.Node(g.NodeName(false));
      what = "SetNode " + n->node + " (" + std::to_string(n->devices.size()) + " devices)";
      if (!ledger.SetNode(n).ok()) {
        return "SetNode failed at step " + std::to_string(step);
      }
      model.nodes[n->node] = n;
    } else if (op < 14) {
      const std::string name = g.NodeName(false);
      what = "RemoveNode " + name;
      const bool had = model.nodes.erase(name) > 0;
      if (ledger.RemoveNode(name) != had) {
        return log + what + ": return value differs";
      }
    } else if (op < 44) {
      PodAllocation p;
      p.uid = g.Uid();
      p.ns = NsOf(p.uid);
      p.name = NameOf(p.uid);
      p.node = g.Chance(85) ? g.NodeName() : "";
      const int b = g.Int(0, 99);
      p.bound_node = b < 35 ? "" : (b < 90 ? p.node : g.NodeName());
      p.terminal = g.Chance(6);
      p.deleted = g.Chance(4);
      p.bind_failed = g.Chance(6);
      p.devices = g.Devices(p.node.empty() ? g.NodeName() : p.node);
      p.init_count = g.InitCount();
      p.unreadable = g.Chance(12);
      what = "Apply " + p.uid + " node=" + p.node + " init=" + std::to_string(p.init_count) +
             " bound=" + p.bound_node + (p.unreadable ? " unreadable" : "") +
             (p.terminal ? " terminal" : "") + (p.deleted ? " deleted" : "") +
             (p.bind_failed ? " bind_failed" : "");
      if (!ledger.Apply(p).ok()) {
        return log + what + ": Apply failed";
      }
      model.Apply(p);
    } else if (op < 50) {
      // Re-apply a stored record unchanged (a status-only update), or with one small change.
      if (model.records.empty()) {
        continue;
      }
      auto it = model.records.begin();
      std::advance(it, g.Int(0, static_cast<int>(model.records.size()) - 1));
      PodAllocation p = it->second;
      const int change = g.Int(0, 6);
      if (change == 1) {
        p.bind_failed = !p.bind_failed;
      } else if (change == 2 && !p.devices.empty() && !p.devices.back().empty()) {
        p.devices.back().back().usedmem += 512;
      } else if (change == 3) {
        p.devices.push_back({});  // a trailing empty container: stored form unchanged
      } else if (change == 4) {
        p.bound_node = p.bound_node.empty() ? p.node : "";
      } else if (change == 5) {
        p.init_count = g.InitCount();  // often the same classification, sometimes not
      } else if (change == 6) {
        p.unreadable = !p.unreadable;  // broken, or fixed (with its old devices) again
        if (!p.unreadable) {
          p.devices = g.Devices(p.node);
        }
      }
      what = "Reapply " + p.uid + " change=" + std::to_string(change);
      if (!ledger.Apply(p).ok()) {
        return log + what + ": Apply failed";
      }
      model.Apply(p);
    } else if (op < 56) {
      const std::string uid = g.Uid();
      what = "Remove " + uid;
      const bool had = model.records.erase(uid) + model.reservations.erase(uid) > 0;
      if (ledger.Remove(uid) != had) {
        return log + what + ": return value differs";
      }
    } else if (op < 74) {
      Reservation r;
      r.uid = g.Uid();
      r.ns = NsOf(r.uid);
      r.name = NameOf(r.uid);
      r.node = g.NodeName();
      r.devices = g.Devices(r.node);
      r.expires_at = now + absl::Seconds(g.Int(1, 30));
      r.init_count = g.InitCount();
      what = "Reserve " + r.uid + " node=" + r.node + " init=" + std::to_string(r.init_count);
      const absl::Status s =
          ledger.Reserve(r.uid, r.ns, r.name, r.node, r.devices, r.expires_at, r.init_count);
      const bool accepted = model.Reserve(r);
      if (s.ok() != accepted || (!accepted && s.code() != absl::StatusCode::kFailedPrecondition)) {
        return log + what + ": status " + s.ToString();
      }
    } else if (op < 84) {
      // Confirm: the pod of some reservation is observed bound with the reserved devices,
      // or (sometimes) with its annotations but still unbound.
      if (model.reservations.empty()) {
        continue;
      }
      auto it = model.reservations.begin();
      std::advance(it, g.Int(0, static_cast<int>(model.reservations.size()) - 1));
      PodAllocation p;
      p.uid = it->second.uid;
      p.ns = it->second.ns;
      p.name = it->second.name;
      p.node = it->second.node;
      p.bound_node = g.Chance(75) ? p.node : "";
      p.devices = it->second.devices;
      p.init_count = it->second.init_count;
      what = "Confirm " + p.uid + " bound=" + p.bound_node;
      if (!ledger.Apply(p).ok()) {
        return log + what + ": Apply failed";
      }
      model.Apply(p);
    } else if (op < 92) {
      const std::string uid = g.Uid();
      what = "Release " + uid;
      const bool had = model.reservations.erase(uid) > 0;
      if (ledger.Release(uid) != had) {
        return log + what + ": return value differs";
      }
    } else {
      now += absl::Seconds(g.Int(0, 12));
      what = "Expire at +" +
             std::to_string(absl::ToInt64Seconds(now - absl::FromUnixSeconds(1'800'000'000)));
      std::vector<std::string> want;
      for (auto it = model.reservations.begin(); it != model.reservations.end();) {
        if (it->second.expires_at <= now) {
          want.push_back(it->first);
          it = model.reservations.erase(it);
        } else {
          ++it;
        }
      }
      std::vector<std::string> got;
      for (const Reservation& r : ledger.ExpireReservations(now)) {
        got.push_back(r.uid);
      }
      if (got != want) {
        return log + what + ": expired set differs";
      }
    }
    log += "  " + what + "\n";
    if (std::string err = Check(ledger, model); !err.empty()) {
      return "after step " + std::to_string(step) + ":\n" + log + err;
    }
  }
  return "";
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoull(v, nullptr, 10);
}

TEST(LedgerPropertyTest, IncrementalEqualsRecomputeAndModel) {
  const uint64_t sequences = EnvOr("TESSERA_LEDGER_SEQUENCES", 2000);
  const uint64_t first_seed = EnvOr("TESSERA_LEDGER_SEED", 20261202);
  for (uint64_t i = 0; i < sequences; ++i) {
    const uint64_t seed = first_seed + i;
    const std::string failure = RunSequence(seed, kSteps);
    if (!failure.empty()) {
      FAIL() << "seed " << seed << " (rerun with TESSERA_LEDGER_SEED=" << seed << ")\n" << failure;
    }
  }
}

}  // namespace
}  // namespace tessera::ledger

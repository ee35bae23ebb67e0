// Diff: two ledgers compared entry by entry (records, reservations, usage, namespaces).
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "fmt/format.h"

#include "tessera/ledger/ledger.h"
#include "tessera/ledger/ledger_internal.h"

namespace tessera::ledger {

using internal::SameDevices;

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

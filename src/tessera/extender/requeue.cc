#include "tessera/extender/requeue.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"

#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {
namespace {

using NamedNode = std::pair<std::string, device::NodeSnapshot>;

bool SameRegistration(const device::NodeDevices& a, const device::NodeDevices& b) {
  return &a == &b || (a.devices == b.devices && a.cordoned == b.cordoned);
}

// Whether `after` offers something `before` did not: a changed registration, a node no longer
// blocked, less usage on a device, a MIG placement released or a card usable again.
bool NodeGained(const device::NodeSnapshot& before, const device::NodeSnapshot& after) {
  if (!SameRegistration(*before.devices, *after.devices) ||
      (!before.blocked_by.empty() && after.blocked_by.empty())) {
    return true;
  }
  for (size_t i = 0; i < after.usage.size() && i < before.usage.size(); ++i) {
    const device::DeviceUsage& b = before.usage[i];
    const device::DeviceUsage& a = after.usage[i];
    if (a.used < b.used || a.usedmem < b.usedmem || a.usedcores < b.usedcores) {
      return true;
    }
  }
  const device::MigCardUsage none;
  for (size_t i = 0; i < before.mig.size(); ++i) {
    const device::MigCardUsage& b = before.mig[i];
    const device::MigCardUsage& a = i < after.mig.size() ? after.mig[i] : none;
    if (b.unusable && !a.unusable) {
      return true;
    }
    for (const device::MigPlacement& p : b.occupied) {
      if (std::find(a.occupied.begin(), a.occupied.end(), p) == a.occupied.end()) {
        return true;
      }
    }
  }
  return false;
}

// A limit rose or went.
bool LimitLoosened(const std::optional<schedule::QuotaLimit>& before,
                   const std::optional<schedule::QuotaLimit>& after) {
  return before.has_value() && (!after.has_value() || after->limit > before->limit);
}

template <typename T, typename Key>
const T* FindSorted(const std::vector<T>& v, const Key& key, auto key_of) {
  auto it = std::lower_bound(v.begin(), v.end(), key,
                             [&](const T& x, const Key& k) { return key_of(x) < k; });
  return it != v.end() && key_of(*it) == key ? &*it : nullptr;
}

// The part of each device a pod's picked devices take, counted on `node` (app containers
// only: init containers share with them, so this never counts more than the ledger will).
void Count(const device::PodDevices& devices, size_t init_count, device::NodeSnapshot* node,
           ledger::NamespaceUsage* ns) {
  for (size_t c = init_count; c < devices.size(); ++c) {
    for (const device::ContainerDevice& d : devices[c]) {
      std::string_view uuid = d.uuid;
      if (size_t open = uuid.rfind('['); !uuid.empty() && uuid.back() == ']' && open != 0) {
        uuid = uuid.substr(0, open);  // a MIG instance: its card
      }
      const int i = node->devices->Find(uuid);
      if (i < 0 || static_cast<size_t>(i) >= node->usage.size()) {
        continue;
      }
      device::DeviceUsage& u = node->usage[static_cast<size_t>(i)];
      u.used += 1;
      u.usedmem += d.usedmem;
      u.usedcores += d.usedcores;
      ns->usedmem += d.usedmem;
      ns->usedcores += d.usedcores;
    }
  }
}

// Advance's step: `changes` (since view->version; with `full`, since 0) applied to `view`.
Gains ApplyChanges(ledger::CapacityChanges changes, std::vector<schedule::NamespaceQuota> limits,
                   bool full, CapacityView* view) {
  Gains out;
  std::sort(changes.nodes.begin(), changes.nodes.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  // The changed nodes (sorted) merged into the view's (sorted); with `full` the view's nodes
  // that are not listed go.
  std::vector<NamedNode> merged;
  merged.reserve(view->nodes.size() + changes.nodes.size());
  auto old = view->nodes.begin();
  auto keep_until = [&](const std::string* name) {
    for (; old != view->nodes.end() && (name == nullptr || old->first < *name); ++old) {
      if (!full) {
        merged.push_back(std::move(*old));
      }
    }
  };
  for (auto& [name, snapshot] : changes.nodes) {
    keep_until(&name);
    const bool known = old != view->nodes.end() && old->first == name;
    if (snapshot.has_value()) {
      if (!known || NodeGained(old->second, *snapshot)) {
        out.nodes.push_back(name);
      }
      merged.emplace_back(std::move(name), *std::move(snapshot));
    }
    if (known) {
      ++old;
    }
  }
  keep_until(nullptr);
  view->nodes = std::move(merged);
  view->version = changes.version;
  view->registered = changes.registered;

  using NamedUsage = std::pair<std::string, ledger::NamespaceUsage>;
  for (const NamedUsage& b : view->namespaces) {
    const NamedUsage* a =
        FindSorted(changes.namespaces, b.first, [](const NamedUsage& n) { return n.first; });
    const ledger::NamespaceUsage now = a != nullptr ? a->second : ledger::NamespaceUsage{};
    if (now.usedmem < b.second.usedmem || now.usedcores < b.second.usedcores) {
      out.namespaces.push_back(b.first);
    }
  }
  std::sort(limits.begin(), limits.end(), [](const auto& x, const auto& y) { return x.ns < y.ns; });
  for (const schedule::NamespaceQuota& b : view->limits) {
    const schedule::NamespaceQuota* a = FindSorted(
        limits, b.ns, [](const schedule::NamespaceQuota& q) -> const std::string& { return q.ns; });
    if (a == nullptr || LimitLoosened(b.memory, a->memory) || LimitLoosened(b.cores, a->cores) ||
        a->memory_factor != b.memory_factor) {
      out.namespaces.push_back(b.ns);
    }
  }
  view->namespaces = std::move(changes.namespaces);
  view->limits = std::move(limits);
  std::sort(out.namespaces.begin(), out.namespaces.end());
  out.namespaces.erase(std::unique(out.namespaces.begin(), out.namespaces.end()),
                       out.namespaces.end());
  return out;
}

}  // namespace

void Gains::Merge(const Gains& other) {
  auto merge = [](std::vector<std::string>* into, const std::vector<std::string>& from) {
    std::vector<std::string> out;
    out.reserve(into->size() + from.size());
    std::set_union(into->begin(), into->end(), from.begin(), from.end(), std::back_inserter(out));
    *into = std::move(out);
  };
  merge(&nodes, other.nodes);
  merge(&namespaces, other.namespaces);
}

Gains Advance(const ledger::Ledger& ledger, std::vector<schedule::NamespaceQuota> limits,
              CapacityView* view) {
  const bool fresh = view->version == 0 && view->nodes.empty();
  Gains gains = ApplyChanges(ledger.CapacitySince(view->version), limits, fresh, view);
  if (view->nodes.size() != view->registered) {  // a node was forgotten: read them all
    gains.Merge(ApplyChanges(ledger.CapacitySince(0), std::move(limits), /*full=*/true, view));
  }
  return gains;
}

std::vector<Requeue> PickRequeues(const device::Vendor& vendor, const cycle::Config& config,
                                  const Gains& gains,
                                  std::vector<std::shared_ptr<const kube::Pod>> pods,
                                  const std::vector<Requeue>& held, size_t limit,
                                  const CapacityView& view, bool* tried_all) {
  *tried_all = true;
  std::vector<Requeue> out;
  // The gained nodes and, when a namespace gained (its pods may go anywhere), every node, both
  // sorted by name; a pick is counted in both.
  std::vector<schedule::Candidate> all, gained;
  if (!gains.namespaces.empty()) {
    all.reserve(view.nodes.size());
    for (const NamedNode& n : view.nodes) {
      all.push_back(schedule::Candidate{n.first, n.second});
    }
  }
  for (const std::string& name : gains.nodes) {
    if (const NamedNode* n =
            FindSorted(view.nodes, name, [](const NamedNode& x) { return x.first; })) {
      gained.push_back(schedule::Candidate{n->first, n->second});
    }
  }
  absl::flat_hash_map<std::string, ledger::NamespaceUsage> usage(view.namespaces.begin(),
                                                                 view.namespaces.end());
  const absl::flat_hash_set<std::string> gained_ns(gains.namespaces.begin(),
                                                   gains.namespaces.end());
  auto count = [&](const kube::Pod& pod, const std::string& node, const device::PodDevices& d,
                   size_t init_count) {
    ledger::NamespaceUsage& ns = usage[pod.meta.ns];
    bool counted = false;  // the namespace's usage once
    for (std::vector<schedule::Candidate>* v : {&all, &gained}) {
      auto it = std::lower_bound(
          v->begin(), v->end(), node,
          [](const schedule::Candidate& x, const std::string& k) { return x.name < k; });
      if (it != v->end() && it->name == node && it->snapshot.has_value()) {
        ledger::NamespaceUsage scratch;
        Count(d, init_count, &*it->snapshot, counted ? &scratch : &ns);
        counted = true;
      }
    }
  };
  for (const Requeue& h : held) {
    cycle::Decoded decoded = cycle::Decode(vendor, *h.pod, cycle::DecodeMode::kFilter);
    count(*h.pod, h.node, h.devices, decoded.request.init_count);
  }

  std::sort(pods.begin(), pods.end(), [](const auto& x, const auto& y) {
    return std::tuple(-int64_t{x->priority}, x->meta.ns, x->meta.name) <
           std::tuple(-int64_t{y->priority}, y->meta.ns, y->meta.name);
  });
  for (size_t i = 0; i < pods.size(); ++i) {
    if (out.size() == limit) {
      *tried_all = false;
      break;
    }
    const kube::Pod& pod = *pods[i];
    const std::vector<schedule::Candidate>& candidates =
        gained_ns.contains(pod.meta.ns) ? all : gained;
    if (candidates.empty()) {
      continue;
    }
    cycle::Decoded decoded = cycle::Decode(vendor, pod, cycle::DecodeMode::kFilter);
    if (decoded.code != cycle::DecodeCode::kRequest) {
      continue;
    }
    schedule::NamespaceQuota quota;
    if (config.quotas != nullptr) {
      quota = config.quotas->Limits(pod.meta.ns);
      if (auto it = usage.find(pod.meta.ns); it != usage.end()) {
        quota.usedmem = it->second.usedmem;
        quota.usedcores = it->second.usedcores;
      }
    }
    const cycle::Input in{
        .pod = &pod, .request = &decoded.request, .constraints = &decoded.constraints};
    schedule::Decision decision = cycle::Place(config, in, candidates, quota);
    if (!decision.winner) {
      continue;
    }
    Requeue r{pods[i], candidates[*decision.winner].name, std::move(decision.devices)};
    count(pod, r.node, r.devices, decoded.request.init_count);
    out.push_back(std::move(r));
  }
  return out;
}

Requeuer::Requeuer(Options options, Parts parts)
    : options_(std::move(options)),
      parts_(std::move(parts)),
      limiter_(options_.qps, options_.burst, parts_.clock) {}

Gains Requeuer::Refresh() {
  if (parts_.quotas == nullptr) {
    return Advance(*parts_.ledger, {}, &view_);
  }
  // Loosenings as they happened, too: a limit that came and went since the last view (and
  // refused a pod meanwhile) leaves the two views alike.
  Gains loosened;
  loosened.namespaces = parts_.quotas->LoosenedSince(&quota_cursor_);
  Gains gains = Advance(*parts_.ledger, parts_.quotas->AllLimits(), &view_);
  gains.Merge(loosened);
  return gains;
}

void Requeuer::Observe() {
  Refresh();
  have_view_ = true;
  carried_ = {};
  last_gains_ = {};
  held_.clear();
}

Requeuer::Counts Requeuer::counts() const {
  MutexLock l(&mu_);
  return counts_;
}

void Requeuer::Round() {
  if (options_.qps <= 0) {
    return;
  }
  if (!have_view_) {
    Observe();
    return;
  }
  Gains gains = Refresh();
  gains.Merge(carried_);
  carried_ = {};
  // A filter decides on the ledger, then offers its refusal: one offered since the last round
  // may have been decided before that round's gains, which it then never met. Such late
  // refusals are tried against the last round's gains too (so are the others then: they found
  // nothing there before, and the picks held since count).
  uint64_t latest_offer = 0;
  const std::vector<std::pair<std::string, uint64_t>> refused =
      parts_.verdicts->UidsAndOffers(&latest_offer);
  const bool late = std::any_of(refused.begin(), refused.end(),
                                [this](const auto& r) { return r.second > offers_seen_; });
  offers_seen_ = latest_offer;
  Gains last = std::exchange(last_gains_, gains);
  if (late) {
    gains.Merge(last);
  }
  const absl::Time t = parts_.clock->Now();
  std::vector<Requeue> held;
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (t - it->second.second >= options_.hold || parts_.pod(it->first) == nullptr) {
      held_.erase(it);
    } else {
      held.push_back(it->second.first);
    }
    it = next;
  }
  if (gains.Empty()) {
    return;
  }
  std::vector<std::shared_ptr<const kube::Pod>> pods;
  for (const auto& [uid, offer] : refused) {
    if (held_.contains(uid)) {
      continue;
    }
    if (std::shared_ptr<const kube::Pod> pod = parts_.pod(uid); pod != nullptr) {
      pods.push_back(std::move(pod));
    }
  }
  const cycle::Config config{options_.node_policy, options_.gpu_policy, parts_.quotas};
  bool tried_all = true;
  const std::vector<Requeue> picks =
      PickRequeues(*parts_.vendor, config, gains, std::move(pods), held,
                   static_cast<size_t>(std::max(options_.burst, 1)), view_, &tried_all);
  size_t written = 0;
  for (const Requeue& r : picks) {
    if (!limiter_.TryAcquire()) {
      tried_all = false;
      break;
    }
    written += Write(r, t) ? 1 : 0;
  }
  if (!tried_all) {
    carried_ = gains;
  }
  {
    MutexLock l(&mu_);
    ++counts_.rounds_with_gains;
  }
  TESSERA_VLOGS(1, "requeue round", "gained_nodes", absl::StrJoin(gains.nodes, ","),
                "gained_namespaces", absl::StrJoin(gains.namespaces, ","), "refused",
                parts_.verdicts->size(), "picked", picks.size(), "requeued", written, "carried",
                !tried_all);
}

bool Requeuer::Write(const Requeue& r, absl::Time now) {
  const kube::Pod& pod = *r.pod;
  kube::MetadataPatch patch;
  patch.uid = pod.meta.uid;
  patch.annotations.emplace_back(
      std::string(device::kRequeueAnnotation),
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", now, absl::UTCTimeZone()));
  absl::StatusOr<kube::Pod> patched =
      parts_.client->PatchPodMetadata(pod.meta.ns, pod.meta.name, patch);
  MutexLock l(&mu_);
  if (!patched.ok()) {
    ++counts_.failed;
    if (absl::IsNotFound(patched.status()) || absl::IsAborted(patched.status())) {
      TESSERA_VLOG(2, "requeue of pod {}: {}", pod.Key(), std::string(patched.status().message()));
    } else {
      TESSERA_LOG(kWarning, "requeue of pod {} failed: {}", pod.Key(),
                  std::string(patched.status().message()));
    }
    return false;
  }
  ++counts_.requeued;
  held_[pod.meta.uid] = {r, now};
  TESSERA_VLOGS(2, "requeued", "pod", pod.Key(), "fits_on", r.node);
  return true;
}

}  // namespace tessera::extender

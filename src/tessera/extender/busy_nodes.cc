#include "tessera/extender/busy_nodes.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

#include "tessera/device/codec.h"

namespace tessera::extender {
namespace {

// Debian's absl::string_view is its own type: convert at the hash-map boundary.
absl::string_view Key(std::string_view s) { return {s.data(), s.size()}; }

// Whether a copy at resourceVersion `seen` is at least as new as `written`. etcd's (and
// apisim's) versions are increasing integers; anything else never counts as caught up.
bool CaughtUp(std::string_view seen, std::string_view written) {
  uint64_t s = 0;
  uint64_t w = 0;
  return absl::SimpleAtoi(Key(seen), &s) && absl::SimpleAtoi(Key(written), &w) && s >= w;
}

}  // namespace

BusyNodes::BusyNodes(LockOf lock_of, Standing standing, HolderDone holder_done,
                     absl::Duration lock_timeout)
    : lock_of_(std::move(lock_of)),
      standing_(std::move(standing)),
      holder_done_(std::move(holder_done)),
      lock_timeout_(lock_timeout) {}

BusyNodes::NodeView BusyNodes::View(std::string_view node) const {
  return lock_of_ ? lock_of_(node) : NodeView{};
}

void BusyNodes::EndLocked(std::string_view uid) {
  auto it = node_of_.find(Key(uid));
  if (it == node_of_.end()) {
    return;
  }
  auto node = by_node_.find(it->second);
  if (node != by_node_.end()) {
    std::erase_if(node->second, [&](const Decision& d) { return d.uid == uid; });
    if (node->second.empty()) {
      by_node_.erase(node);
    }
  }
  node_of_.erase(it);
}

void BusyNodes::AddLocked(std::string_view uid, std::string_view node, Decision d) {
  EndLocked(uid);
  by_node_[Key(node)].push_back(std::move(d));
  node_of_.emplace(Key(uid), Key(node));
}

bool BusyNodes::HoldsLocked(const Decision& d, const NodeView& view, absl::Time now) const {
  if (d.until <= now) {
    return false;
  }
  if (d.bound) {
    return !CaughtUp(view.resource_version, d.version);  // then the lock itself tells
  }
  return !standing_ || standing_(d.uid);
}

void BusyNodes::Decided(std::string_view uid, std::string_view node, absl::Time until) {
  MutexLock lock(&mu_);
  AddLocked(uid, node, Decision{.uid = std::string(uid), .until = until});
}

void BusyNodes::Bound(std::string_view uid, std::string_view node, std::string_view version,
                      absl::Time until) {
  MutexLock lock(&mu_);
  AddLocked(
      uid, node,
      Decision{
          .uid = std::string(uid), .until = until, .bound = true, .version = std::string(version)});
}

void BusyNodes::Ended(std::string_view uid) {
  MutexLock lock(&mu_);
  EndLocked(uid);
}

void BusyNodes::Purge(absl::Time now) {
  MutexLock lock(&mu_);
  for (auto node = by_node_.begin(); node != by_node_.end();) {
    const NodeView view = View(node->first);
    std::vector<Decision>& list = node->second;
    for (auto d = list.begin(); d != list.end();) {
      if (HoldsLocked(*d, view, now)) {
        ++d;
        continue;
      }
      node_of_.erase(Key(d->uid));
      d = list.erase(d);
    }
    auto current = node++;
    if (current->second.empty()) {
      by_node_.erase(current);
    }
  }
}

bool BusyNodes::Busy(std::string_view node, const Pod& pod, absl::Time now) const {
  const NodeView view = View(node);
  {
    MutexLock lock(&mu_);
    auto it = by_node_.find(Key(node));
    if (it != by_node_.end()) {
      for (const Decision& d : it->second) {
        if (d.uid != pod.uid && HoldsLocked(d, view, now)) {
          return true;
        }
      }
    }
  }
  if (view.lock.empty()) {
    return false;
  }
  absl::StatusOr<device::NodeLock> held = device::ParseNodeLock(view.lock);
  if (!held.ok()) {
    return true;
  }
  if (!held->legacy && held->ns == pod.ns && held->name == pod.name) {
    return false;  // the asking pod's own lock
  }
  if (now - held->time >= lock_timeout_) {
    return false;
  }
  return held->legacy || !holder_done_ || !holder_done_(held->ns, held->name);
}

size_t BusyNodes::decisions() const {
  MutexLock lock(&mu_);
  return node_of_.size();
}

}  // namespace tessera::extender

#include "tessera/extender/busy_nodes.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

#include "tessera/device/codec.h"

namespace tessera::extender {
namespace {

// Debian's absl::string_view is its own type: convert at the hash-map boundary.
absl::string_view Key(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace

BusyNodes::BusyNodes(LockOf lock_of, Standing standing, absl::Duration lock_timeout)
    : lock_of_(std::move(lock_of)), standing_(std::move(standing)), lock_timeout_(lock_timeout) {}

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

bool BusyNodes::HoldsLocked(const Decision& d, absl::Time now) const {
  return d.until > now && (d.bound || !standing_ || standing_(d.uid));
}

void BusyNodes::Decided(std::string_view uid, std::string_view node, absl::Time until) {
  MutexLock lock(&mu_);
  AddLocked(uid, node, Decision{std::string(uid), until, /*bound=*/false});
}

void BusyNodes::Bound(std::string_view uid, std::string_view node, absl::Time until) {
  MutexLock lock(&mu_);
  AddLocked(uid, node, Decision{std::string(uid), until, /*bound=*/true});
}

void BusyNodes::Ended(std::string_view uid) {
  MutexLock lock(&mu_);
  EndLocked(uid);
}

void BusyNodes::Purge(absl::Time now) {
  MutexLock lock(&mu_);
  for (auto node = by_node_.begin(); node != by_node_.end();) {
    std::erase_if(node->second, [&](const Decision& d) {
      if (HoldsLocked(d, now)) {
        return false;
      }
      node_of_.erase(d.uid);
      return true;
    });
    auto current = node++;
    if (current->second.empty()) {
      by_node_.erase(current);
    }
  }
}

bool BusyNodes::Busy(std::string_view node, const Pod& pod, absl::Time now) const {
  {
    MutexLock lock(&mu_);
    auto it = by_node_.find(Key(node));
    if (it != by_node_.end() &&
        std::any_of(it->second.begin(), it->second.end(),
                    [&](const Decision& d) { return d.uid != pod.uid && HoldsLocked(d, now); })) {
      return true;
    }
  }
  if (!lock_of_) {
    return false;
  }
  const std::string value = lock_of_(node);
  if (value.empty()) {
    return false;
  }
  absl::StatusOr<device::NodeLock> held = device::ParseNodeLock(value);
  if (!held.ok()) {
    return true;
  }
  if (!held->legacy && held->ns == pod.ns && held->name == pod.name) {
    return false;  // the asking pod's own lock
  }
  return now - held->time < lock_timeout_;
}

size_t BusyNodes::decisions() const {
  MutexLock lock(&mu_);
  return node_of_.size();
}

}  // namespace tessera::extender

#include "tessera/apisim/store.h"

#include <algorithm>
#include <random>
#include <string>

#include "fmt/core.h"

#include "tessera/apisim/store_internal.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"

namespace tessera::apisim {

using internal::Json;
using internal::Key;
using internal::kNamespaces;
using internal::kPods;
using internal::NotFound;

namespace {

const char* TypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "";
}

ObjectPtr Restamp(const StoredObject& o, uint64_t rv) {
  auto copy = std::make_shared<StoredObject>(o);
  copy->json = o.JsonWithRv(rv);
  copy->rv_len = std::to_string(rv).size();
  copy->rv = rv;
  return copy;
}

}  // namespace

// ---- store --------------------------------------------------------------------------------

Store::Store(StoreOptions options, Clock* clock)
    : options_(options),
      clock_(clock),
      changed_by_resource_(new CondVar[Resources().size()]),
      newest_rv_by_resource_(Resources().size(), 0),
      trimmed_rv_by_resource_(Resources().size(), 0),
      objects_(Resources().size()),
      rng_(1) {
  TESSERA_CHECK(Resources().size() <= sizeof(wake_pending_) * 8);  // a bit per resource
  std::random_device rd;
  uid_rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

Store::~Store() { Shutdown(); }

size_t Store::IndexOf(const ResourceInfo& r) const {
  const std::vector<ResourceInfo>& all = Resources();
  return static_cast<size_t>(&r - all.data());
}

void Store::EnsureDefaultNamespaces() {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    std::string body = fmt::format(R"({{"metadata":{{"name":"{}"}}}})", ns);
    (void)Create(Resources()[kNamespaces], "", body);  // AlreadyExists is fine
  }
}

absl::StatusOr<ObjectPtr> Store::Lookup(size_t r, std::string_view ns, std::string_view name) {
  const ResourceInfo& info = Resources()[r];
  auto it = objects_[r].find(Key(info, ns, name));
  if (it == objects_[r].end()) {
    return NotFound(info, name);
  }
  return it->second;
}

bool Store::ShouldDrop(const ResourceInfo& r, EventType type) {
  for (DropRule& rule : faults_.drop_watch_events) {
    if (rule.count == 0) {
      continue;
    }
    if (!rule.resource.empty() && rule.resource != r.name) {
      continue;
    }
    if (!rule.type.empty() && rule.type != TypeName(type)) {
      continue;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(rng_) < rule.probability) {
      if (rule.count > 0) {
        --rule.count;
      }
      return true;
    }
  }
  return false;
}

void Store::Commit(size_t r, EventType type, ObjectPtr obj, ObjectPtr prev) {
  rv_ = obj->rv;
  if (type == EventType::kDeleted) {
    objects_[r].erase(obj->key);
  } else {
    objects_[r][obj->key] = obj;
  }
  Event e;
  e.rv = obj->rv;
  e.type = type;
  e.resource = r;
  e.obj = std::move(obj);
  e.prev = std::move(prev);
  e.dropped = ShouldDrop(Resources()[r], type);
  if (e.dropped) {
    ++events_dropped_;
  }
  newest_rv_by_resource_[r] = e.rv;
  history_.push_back(std::move(e));
  while (history_.size() > std::max<size_t>(options_.watch_history, 1)) {
    const Event& front = history_.front();
    oldest_rv_ = std::max(oldest_rv_, front.rv);
    trimmed_rv_by_resource_[front.resource] =
        std::max(trimmed_rv_by_resource_[front.resource], front.rv);
    history_.pop_front();
  }
  wake_pending_ |= uint64_t{1} << r;  // StoreLock wakes the watchers after unlocking
}

Store::StoreLock::StoreLock(Store* s) : s_(s) { s_->mu_.Lock(); }

Store::StoreLock::~StoreLock() {
  const uint64_t wake = s_->wake_pending_;
  s_->wake_pending_ = 0;
  s_->mu_.Unlock();
  if (wake == 0) {
    return;
  }
  s_->changed_.SignalAll();
  for (size_t r = 0; r < Resources().size(); ++r) {
    if ((wake & (uint64_t{1} << r)) != 0) {
      s_->changed_by_resource_[r].SignalAll();
    }
  }
}

void Store::WakeEveryWatcherLocked() {
  // StoreLock wakes them after unlocking, as for a write.
  wake_pending_ |=
      Resources().size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << Resources().size()) - 1;
}

void Store::ForgetHistoryLocked() {
  history_.clear();
  oldest_rv_ = rv_;
  // Every event is gone; a watcher that had sent all of its resource's keeps running.
  trimmed_rv_by_resource_ = newest_rv_by_resource_;
}

void Store::Remove(size_t r, const ObjectPtr& old) {
  ObjectPtr last = Restamp(*old, rv_ + 1);
  if (r == kPods) {
    for (auto it = deadlines_.begin(); it != deadlines_.end(); ++it) {
      if (it->second == old->key) {
        deadlines_.erase(it);
        break;
      }
    }
  }
  Commit(r, EventType::kDeleted, std::move(last), old);
}

std::string Store::Finish(size_t r, const ObjectPtr& old, const ObjectPtr& obj,
                          const WriteOptions& w) {
  if (w.dry_run) {
    return obj->json;
  }
  const bool complete = obj->has_deletion && !obj->has_finalizers &&
                        (r != kPods || obj->terminal || obj->fields.at("spec.nodeName").empty());
  // A pod whose grace period already ended goes as soon as its finalizers are gone.
  bool grace_over = false;
  if (r == kPods && obj->has_deletion && !obj->has_finalizers) {
    for (const auto& d : deadlines_) {
      if (d.second == obj->key && d.first <= clock_->Now()) {
        grace_over = true;
      }
    }
  }
  std::string answer = obj->json;
  Commit(r, EventType::kModified, obj, old);
  if (complete || grace_over) {
    Remove(r, obj);
  }
  return answer;
}

absl::StatusOr<std::string> Store::Get(const ResourceInfo& r, std::string_view ns,
                                       std::string_view name) {
  StoreLock l(this);
  TESSERA_ASSIGN_OR_RETURN(ObjectPtr o, Lookup(IndexOf(r), ns, name));
  return o->json;
}

void Store::SetFaults(const Faults& faults) {
  StoreLock l(this);
  faults_ = faults;
  request_faults_set_.store(faults.latency_ms > 0 || faults.fail_probability > 0,
                            std::memory_order_release);
  rng_.seed(faults.seed);
  WakeEveryWatcherLocked();
}

Faults Store::GetFaults() {
  StoreLock l(this);
  return faults_;
}

int Store::SeverWatches() {
  StoreLock l(this);
  ++sever_generation_;
  WakeEveryWatcherLocked();
  return static_cast<int>(watches_open_.load());
}

uint64_t Store::Compact() {
  StoreLock l(this);
  ForgetHistoryLocked();
  WakeEveryWatcherLocked();
  return rv_;
}

void Store::Shutdown() {
  StoreLock l(this);
  shutdown_ = true;
  WakeEveryWatcherLocked();
}

uint64_t Store::CurrentRevision() {
  StoreLock l(this);
  return rv_;
}

std::string Store::StatsJson() {
  StoreLock l(this);
  Json o = Json::object();
  o["resourceVersion"] = std::to_string(rv_);
  o["compactedRevision"] = std::to_string(oldest_rv_);
  o["historyEvents"] = history_.size();
  Json counts = Json::object();
  for (size_t i = 0; i < Resources().size(); ++i) {
    const ResourceInfo& r = Resources()[i];
    counts[r.group.empty() ? r.name : r.name + "." + r.group] = objects_[i].size();
  }
  o["objects"] = counts;
  o["watchesOpen"] = watches_open_.load();
  o["watchesStarted"] = watches_started_.load();
  o["watchEventsSent"] = watch_events_sent_.load();
  o["watchEventsDropped"] = events_dropped_;
  o["watchesSevered"] = watches_severed_;
  o["expiredAnswers"] = expired_answers_.load();
  o["pendingGracefulDeletions"] = deadlines_.size();
  return o.dump();
}

}  // namespace tessera::apisim

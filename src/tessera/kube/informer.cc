#include "tessera/kube/informer.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/logging.h"

namespace tessera::kube {

template <typename T>
Informer<T>::Informer(ApiClient* client, Options options, EventHandlers<T> handlers)
    : options_(std::move(options)),
      handlers_(std::move(handlers)),
      queue_(std::make_shared<WorkQueue>(WorkQueue::Options{.name = "inf-" + options_.name,
                                                            .threads = 1,
                                                            .on_stop = WorkQueue::OnStop::kDiscard,
                                                            .tick = [this] { return Tick(); }})),
      reflector_(client, options_.reflector, options_.clock, this,
                 [queue = queue_](absl::AnyInvocable<void()> task) {
                   queue->Push(std::move(task));  // refused after Stop
                 }) {}

namespace {

constexpr uint64_t kUnknownRv = ~uint64_t{0};
constexpr size_t kMaxDeletedUids = 100000;
constexpr size_t kMaxReconcileDetails = 100;

// The revision of a resourceVersion, or nullopt when it is not an unsigned integer.
std::optional<uint64_t> ParseRv(std::string_view rv) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(rv.data(), rv.data() + rv.size(), v);
  if (rv.empty() || ec != std::errc() || end != rv.data() + rv.size()) {
    return std::nullopt;
  }
  return v;
}

}  // namespace

template <typename T>
Informer<T>::~Informer() {
  Stop();
}

template <typename T>
void Informer<T>::Start() {
  if (started_.exchange(true, std::memory_order_acq_rel)) {
    return;
  }
  queue_->Push([this] { reflector_.Start(); });
}

template <typename T>
void Informer<T>::Stop() {
  // Destroys what is queued unrun (a Reconcile's `done` among it) and joins the worker.
  queue_->Stop();
  // Cancels the watch; the reflector, the worker's until now, is the caller's.
  reflector_.Stop();
}

template <typename T>
void Informer<T>::Wake(absl::AnyInvocable<void()> then) {
  queue_->Push([this, then = std::move(then)]() mutable {
    Tick();
    if (then) {
      then();
    }
  });
}

template <typename T>
bool Informer<T>::WaitForSync(absl::Duration timeout) const {
  // Real time, not options_.clock: the sync comes from the API server, which a fake clock does
  // not pace.
  Clock* const real = Clock::Real();
  const absl::Time deadline = real->Now() + timeout;
  MutexLock lock(&sync_mu_);
  while (!HasSynced()) {
    const absl::Duration left = deadline - real->Now();
    if (left <= absl::ZeroDuration()) {
      return false;
    }
    sync_cv_.WaitFor(&sync_mu_, absl::ToChronoMilliseconds(std::min(left, absl::Milliseconds(50))));
  }
  return true;
}

template <typename T>
InformerCounters Informer<T>::counters() const {
  InformerCounters out;
  {
    MutexLock lock(&counters_mu_);
    out = counters_;
  }
  out.reflector = reflector_.counters();
  return out;
}

template <typename T>
void Informer<T>::Reconcile(std::vector<T> listed, std::string list_resource_version,
                            std::string seen_before_list,
                            absl::AnyInvocable<void(ReconcileResult)> done) {
  queue_->Push([this, listed = std::move(listed), rv = std::move(list_resource_version),
                seen = std::move(seen_before_list), done = std::move(done)]() mutable {
    ReconcileResult result = DoReconcile(std::move(listed), rv, seen);
    if (done) {
      done(std::move(result));
    }
  });
}

template <typename T>
void Informer<T>::NoteDeleted(const T& obj, uint64_t rv) {
  if (obj.meta.uid.empty() || !deleted_uid_set_.emplace(obj.meta.uid, rv).second) {
    return;
  }
  deleted_uids_.emplace_back(rv, obj.meta.uid);
  while (deleted_uids_.size() > kMaxDeletedUids) {
    deleted_uid_set_.erase(deleted_uids_.front().second);
    deleted_uids_.pop_front();
  }
}

template <typename T>
std::string Informer<T>::RollbackEvidence(const std::vector<T>& listed, const std::string& list_rv,
                                          const std::string& seen_before_list) const {
  const std::optional<uint64_t> list_revision = ParseRv(list_rv);
  if (!list_revision) {
    return {};
  }
  // A LIST from storage is never older than what a watch had delivered before it was sent.
  if (const std::optional<uint64_t> seen = ParseRv(seen_before_list);
      seen && *list_revision < *seen) {
    return fmt::format("list rv={} < seen rv={}", *list_revision, *seen);
  }
  for (const T& obj : listed) {
    // A uid never comes back: one deleted at or below the list's revision cannot be listed.
    if (auto it = deleted_uid_set_.find(obj.meta.uid);
        it != deleted_uid_set_.end() && it->second != kUnknownRv && it->second <= *list_revision) {
      return fmt::format("{} uid={} deleted at rv={}, listed at rv={} (list rv={})",
                         ObjectKey(obj.meta), obj.meta.uid, it->second, obj.meta.resource_version,
                         list_rv);
    }
    // An object's resourceVersion never goes down: a list that is not older than the stored
    // copy shows that copy or a newer one.
    typename Store<T>::Ptr old = store_.Get(ObjectKey(obj.meta));
    if (old == nullptr || old->meta.uid != obj.meta.uid) {
      continue;
    }
    const std::optional<uint64_t> stored_rv = ParseRv(old->meta.resource_version);
    const std::optional<uint64_t> listed_rv = ParseRv(obj.meta.resource_version);
    if (stored_rv && listed_rv && *listed_rv < *stored_rv && *stored_rv <= *list_revision) {
      return fmt::format("{} uid={} rv={}->{} (list rv={})", ObjectKey(obj.meta), obj.meta.uid,
                         *stored_rv, *listed_rv, list_rv);
    }
  }
  return {};
}

template <typename T>
ReconcileResult Informer<T>::DoReconcile(std::vector<T> listed, const std::string& list_rv,
                                         const std::string& seen_before_list) {
  ReconcileResult result;
  if (!HasSynced()) {
    return result;
  }
  result.ran = true;
  result.listed = listed.size();
  if (std::string evidence = RollbackEvidence(listed, list_rv, seen_before_list);
      !evidence.empty()) {
    // The resourceVersion rules below would keep what the lost timeline left in the store.
    // The list is the truth, but the watch resumed from a revision of that timeline: relist,
    // and watch again from the relist's revision.
    TESSERA_LOG(kWarning,
                "informer {}: the API server went back in time (its storage was restored?): {}; "
                "relisting",
                options_.name, evidence);
    result.rolled_back = true;
    result.stored = store_.size();
    result.details.push_back("rollback " + evidence);
    Count([](InformerCounters& c) {
      ++c.reconciles;
      ++c.reconcile_rollbacks;
    });
    reflector_.Relist();
    return result;
  }
  const std::optional<uint64_t> list_revision = ParseRv(list_rv);
  auto detail = [&](std::string_view kind, const std::string& key, const std::string& uid,
                    std::string_view from, std::string_view to) {
    if (result.details.size() < kMaxReconcileDetails) {
      result.details.push_back(fmt::format("{} {} uid={} rv={}->{}", kind, key, uid,
                                           from.empty() ? "-" : from, to.empty() ? "-" : to));
    }
  };

  absl::flat_hash_set<std::string> listed_keys;
  listed_keys.reserve(listed.size());
  std::vector<typename Store<T>::Ptr> stored = store_.List();
  result.stored = stored.size();
  for (T& obj : listed) {
    std::string key = ObjectKey(obj.meta);
    listed_keys.insert(key);
    if (deleted_uid_set_.contains(obj.meta.uid)) {
      continue;  // a deletion this informer delivered is newer than the list
    }
    typename Store<T>::Ptr old = store_.Get(key);
    if (old == nullptr) {
      ++result.missing;
      detail("missing", key, obj.meta.uid, "", obj.meta.resource_version);
      auto ptr = std::make_shared<const T>(std::move(obj));
      store_.Upsert(ptr);
      if (handlers_.on_add) {
        handlers_.on_add(*ptr, false);
      }
      continue;
    }
    if (old->meta.uid == obj.meta.uid && old->meta.resource_version == obj.meta.resource_version) {
      continue;
    }
    const std::optional<uint64_t> stored_rv = ParseRv(old->meta.resource_version);
    const std::optional<uint64_t> listed_rv = ParseRv(obj.meta.resource_version);
    if (!stored_rv || !listed_rv) {
      ++result.undecided;
      continue;
    }
    if (*listed_rv <= *stored_rv) {
      continue;  // the watch already delivered this version or a newer one
    }
    ++result.stale;
    if (old->meta.uid != obj.meta.uid) {
      NoteDeleted(*old, list_revision.value_or(kUnknownRv));
    }
    detail("stale", key, obj.meta.uid, old->meta.resource_version, obj.meta.resource_version);
    auto ptr = std::make_shared<const T>(std::move(obj));
    store_.Upsert(ptr);
    if (handlers_.on_update) {
      handlers_.on_update(*old, *ptr);
    }
  }
  for (const auto& obj : stored) {
    std::string key = ObjectKey(obj->meta);
    if (listed_keys.contains(key)) {
      continue;
    }
    typename Store<T>::Ptr current = store_.Get(key);
    if (current == nullptr || current->meta.uid != obj->meta.uid) {
      continue;  // repaired above
    }
    const std::optional<uint64_t> stored_rv = ParseRv(current->meta.resource_version);
    if (!stored_rv || !list_revision) {
      ++result.undecided;
      continue;
    }
    if (*stored_rv > *list_revision) {
      continue;  // created or changed after the LIST
    }
    ++result.gone;
    detail("gone", key, current->meta.uid, current->meta.resource_version, "");
    store_.Delete(key);
    NoteDeleted(*current, list_revision.value_or(kUnknownRv));
    if (handlers_.on_delete) {
      handlers_.on_delete(*current, true);
    }
  }
  // Deletions the list already reflects need no more protection.
  if (list_revision) {
    while (!deleted_uids_.empty() && deleted_uids_.front().first <= *list_revision) {
      deleted_uid_set_.erase(deleted_uids_.front().second);
      deleted_uids_.pop_front();
    }
  }
  Count([&](InformerCounters& c) {
    ++c.reconciles;
    c.reconcile_missing += result.missing;
    c.reconcile_stale += result.stale;
    c.reconcile_gone += result.gone;
  });
  return result;
}

template <typename T>
absl::Duration Informer<T>::Tick() {
  if (!started_.load(std::memory_order_acquire)) {
    return absl::InfiniteDuration();  // nothing is due before Start
  }
  Clock* const clock = options_.clock;
  // A fake clock moves without notifying anyone: poll it often. The real clock is polled only
  // as often as its next deadline needs.
  const absl::Duration max_wait =
      clock == Clock::Real() ? absl::Seconds(1) : absl::Milliseconds(10);
  // The queue calls this without its lock: a due retry sends a request, and a transport may
  // answer it synchronously (which pushes to the queue).
  const absl::Time due = std::min(reflector_.Tick(), next_resync_);
  MaybeResync(clock->Now());
  return std::min(due - clock->Now(), max_wait);
}

template <typename T>
void Informer<T>::OnReplace(std::vector<T> items, const std::string& resource_version,
                            absl::Time list_started) {
  const bool initial = !HasSynced();
  typename Store<T>::ReplaceResult result = store_.Replace(std::move(items));
  int64_t adds = 0;
  int64_t updates = 0;
  const uint64_t revision = ParseRv(resource_version).value_or(kUnknownRv);
  if (!deleted_uids_.empty()) {
    // The list is the truth: a uid it holds is not deleted, and a deletion above its revision
    // belongs to a timeline the API server went back from.
    absl::flat_hash_set<std::string_view> listed;
    listed.reserve(result.replaced.size());
    for (const auto& replaced : result.replaced) {
      listed.insert(replaced.second->meta.uid);
    }
    std::erase_if(deleted_uids_, [&](const std::pair<uint64_t, std::string>& d) {
      const bool drop = (d.first != kUnknownRv && revision != kUnknownRv && d.first > revision) ||
                        listed.contains(d.second);
      if (drop) {
        deleted_uid_set_.erase(d.second);
      }
      return drop;
    });
  }
  for (const auto& gone : result.deleted) {
    NoteDeleted(*gone, revision);
    if (handlers_.on_delete) {
      handlers_.on_delete(*gone, true);
    }
  }
  for (const auto& [old_obj, new_obj] : result.replaced) {
    if (old_obj != nullptr && old_obj->meta.uid != new_obj->meta.uid) {
      NoteDeleted(*old_obj, revision);
    }
    if (old_obj != nullptr) {
      ++updates;
      if (handlers_.on_update) {
        handlers_.on_update(*old_obj, *new_obj);
      }
    } else {
      ++adds;
      if (handlers_.on_add) {
        handlers_.on_add(*new_obj, initial);
      }
    }
  }
  Count([&](InformerCounters& c) {
    c.adds += adds;
    c.updates += updates;
    c.tombstones += static_cast<int64_t>(result.deleted.size());
  });
  if (handlers_.on_listed) {
    handlers_.on_listed(list_started, initial);
  }
  if (initial) {
    if (options_.resync_period > absl::ZeroDuration()) {
      next_resync_ = options_.clock->Now() + std::max(options_.resync_period, absl::Seconds(1));
    }
    MutexLock lock(&sync_mu_);
    synced_.store(true, std::memory_order_release);
    sync_cv_.SignalAll();
  }
}

template <typename T>
void Informer<T>::OnEvent(WatchEvent<T> event) {
  if (event.type == WatchEventType::kDeleted) {
    store_.Delete(ObjectKey(event.object.meta));
    NoteDeleted(event.object, ParseRv(event.object.meta.resource_version).value_or(kUnknownRv));
    Count([](InformerCounters& c) { ++c.deletes; });
    if (handlers_.on_delete) {
      handlers_.on_delete(event.object, false);
    }
    return;
  }
  auto obj = std::make_shared<const T>(std::move(event.object));
  typename Store<T>::Ptr old = store_.Upsert(obj);
  if (old != nullptr) {
    Count([](InformerCounters& c) { ++c.updates; });
    if (handlers_.on_update) {
      handlers_.on_update(*old, *obj);
    }
  } else {
    Count([](InformerCounters& c) { ++c.adds; });
    if (handlers_.on_add) {
      handlers_.on_add(*obj, false);
    }
  }
}

template <typename T>
void Informer<T>::MaybeResync(absl::Time now) {
  if (now < next_resync_) {
    return;
  }
  next_resync_ = now + std::max(options_.resync_period, absl::Seconds(1));
  Count([](InformerCounters& c) { ++c.resyncs; });
  if (!handlers_.on_update) {
    return;
  }
  for (const auto& obj : store_.List()) {
    handlers_.on_update(*obj, *obj);
  }
}

template class Informer<Pod>;
template class Informer<Node>;
template class Informer<ResourceQuota>;

}  // namespace tessera::kube

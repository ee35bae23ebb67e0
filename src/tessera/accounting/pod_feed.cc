#include "tessera/accounting/pod_feed.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"

#include "tessera/accounting/projection.h"
#include "tessera/base/logging.h"
#include "tessera/device/annotations.h"

namespace tessera::accounting {

PodFeed::PodFeed(const device::Vendor* vendor, ledger::Ledger* ledger, Clock* clock,
                 PodFeedOptions options)
    : vendor_(vendor), ledger_(ledger), clock_(clock), options_(options) {}

kube::EventHandlers<kube::Pod> PodFeed::Handlers() {
  kube::EventHandlers<kube::Pod> h;
  h.on_add = [this](const kube::Pod& pod, bool initial) { OnAdd(pod, initial); };
  h.on_update = [this](const kube::Pod& old_pod, const kube::Pod& new_pod) {
    OnUpdate(old_pod, new_pod);
  };
  h.on_delete = [this](const kube::Pod& last, bool unknown) { OnDelete(last, unknown); };
  return h;
}

void PodFeed::OnAdd(const kube::Pod& pod, bool in_initial_list) {
  MutexLock apply(&apply_mu_);
  Observe(pod, in_initial_list);
}

void PodFeed::Reconcile(std::string_view uid, const kube::Pod* current) {
  MutexLock apply(&apply_mu_);
  if (current == nullptr || current->meta.uid != uid) {
    if (ledger_->Remove(uid)) {
      MutexLock lock(&mu_);
      ++stats_.removed;
    }
    return;
  }
  Observe(*current, /*in_initial_list=*/false);
}

void PodFeed::OnUpdate(const kube::Pod& old_pod, const kube::Pod& new_pod) {
  MutexLock apply(&apply_mu_);
  if (old_pod.meta.uid != new_pod.meta.uid && !old_pod.meta.uid.empty()) {
    // Same namespace/name, another pod: the old one is gone.
    const bool found = ledger_->Remove(old_pod.meta.uid);
    MutexLock lock(&mu_);
    ++stats_.uid_changes;
    if (found) {
      ++stats_.removed;
    }
  }
  Observe(new_pod, /*in_initial_list=*/false);
}

void PodFeed::OnDelete(const kube::Pod& last, bool final_state_unknown) {
  MutexLock apply(&apply_mu_);
  const bool found = ledger_->Remove(last.meta.uid);
  MutexLock lock(&mu_);
  if (found) {
    ++stats_.removed;
  }
  if (final_state_unknown) {
    ++stats_.tombstones;
  }
}

void PodFeed::Observe(const kube::Pod& pod, bool in_initial_list) {
  absl::Status decoded;
  const ledger::PodAllocation alloc = accounting::ProjectPodForLedger(*vendor_, pod, &decoded);
  if (!decoded.ok()) {
    // Applied below as an unreadable record: it holds no device but blocks its node while the
    // pod runs there (holder rule 6).
    {
      MutexLock lock(&mu_);
      ++stats_.projection_errors;
    }
    NoteError(std::string(decoded.message()));
  }
  absl::Status applied = ledger_->Apply(alloc);
  {
    MutexLock lock(&mu_);
    ++stats_.applied;
  }
  if (!applied.ok()) {
    NoteError("pod " + pod.Key() + ": " + std::string(applied.message()));
    return;
  }
  if (!in_initial_list || options_.reservation_ttl <= absl::ZeroDuration() || alloc.unreadable ||
      alloc.node.empty() || !alloc.bound_node.empty() || alloc.terminal || alloc.bind_failed ||
      pod.Deleting()) {
    return;
  }
  const std::string* vgpu_time = pod.meta.annotations.Find(device::kVgpuTimeAnnotation);
  int64_t seconds = 0;
  if (vgpu_time == nullptr || !absl::SimpleAtoi(*vgpu_time, &seconds)) {
    return;
  }
  const absl::Time expires = absl::FromUnixSeconds(seconds) + options_.reservation_ttl;
  if (expires <= clock_->Now()) {
    return;
  }
  absl::Status reserved = ledger_->Reserve(alloc.uid, alloc.ns, alloc.name, alloc.node,
                                           alloc.devices, expires, alloc.init_count);
  if (!reserved.ok()) {
    NoteError("re-reserving pod " + pod.Key() + ": " + std::string(reserved.message()));
    return;
  }
  TESSERA_LOG(kInfo, "pod {} is in flight to node {}: holding its devices until {}", pod.Key(),
              alloc.node, absl::FormatTime(expires));
  MutexLock lock(&mu_);
  ++stats_.rereserved;
}

void PodFeed::NoteError(const std::string& message) {
  bool first = false;
  {
    MutexLock lock(&mu_);
    first = stats_.last_error != message;
    stats_.last_error = message;
  }
  if (first) {
    TESSERA_LOG(kWarning, "pod feed: {}", message);
  }
}

PodFeedStats PodFeed::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tessera::accounting

// File: tessera/serve/informers.h
//
// Informers: serve's three informers and where their deliveries go — pods into the PodFeed,
// nodes into the NodeRegistry (its handshake writes queued in the housekeeping Inbox),
// ResourceQuotas into the QuotaBook — with the repairs of lost events they reveal (tombstones,
// a pod recreated under its name) noted in Repairs for /debug/audit. /readyz, /filter and
// /debug/why wait for all three to have listed (Synced).
//
// Errors: none; the informers retry the API server (kube/informer.h). Thread safety: Start and
// Stop from one thread; ExportMetrics from the housekeeping loop only; the rest from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/time/time.h"

#include "tessera/accounting/node_registry.h"
#include "tessera/accounting/pod_feed.h"
#include "tessera/accounting/quota_book.h"
#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/metrics/registry.h"
#include "tessera/serve/repairs.h"

namespace tessera::serve {

class Inbox;  // housekeeping.h

class Informers {
 public:
  // Every pointer must outlive the object.
  struct Parts {
    kube::ApiClient* client = nullptr;
    accounting::PodFeed* feed = nullptr;
    accounting::NodeRegistry* registry = nullptr;
    accounting::QuotaBook* quotas = nullptr;
    Repairs* repairs = nullptr;
    Inbox* inbox = nullptr;
    Clock* clock = nullptr;
    // After each relist of the pods (not the first list), with the time the LIST was sent: a
    // relist ends the reservations of pods it does not return (created, filtered, bound and
    // deleted while the watch was down: no tombstone tells).
    std::function<void(absl::Time list_started)> pods_relisted;
  };
  // Builds the informers; Start starts them. Watch timeouts are randomised between
  // `min_watch_timeout` and twice it.
  Informers(Parts parts, absl::Duration min_watch_timeout);

  void Start();
  void Stop();

  // Whether all three have delivered their first list.
  bool Synced() const;
  // Waits until all three have synced, at most `timeout` in all (by the clock).
  bool WaitForSync(absl::Duration timeout) const;
  // "waiting for the informers to sync (pods: synced, nodes: listing, ...)".
  std::string SyncState() const;

  // The informer families of the metrics: synced, relists, events delivered since the last call.
  void ExportMetrics(metrics::Registry* metrics);

  kube::Informer<kube::Pod>& pods() { return *pods_; }
  const kube::Informer<kube::Pod>& pods() const { return *pods_; }
  kube::Informer<kube::Node>& nodes() { return *nodes_; }
  const kube::Informer<kube::Node>& nodes() const { return *nodes_; }

 private:
  // The counters as last exported.
  struct Exported {
    int64_t relists = 0;
    int64_t events = 0;
  };

  const Parts parts_;
  std::unique_ptr<kube::Informer<kube::Pod>> pods_;
  std::unique_ptr<kube::Informer<kube::Node>> nodes_;
  std::unique_ptr<kube::Informer<kube::ResourceQuota>> quotas_;
  Exported pods_exported_, nodes_exported_, quotas_exported_;  // ExportMetrics only
};

}  // namespace tessera::serve

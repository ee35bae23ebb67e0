#include "tessera/serve/informers.h"

#include <utility>
#include <vector>

#include <fmt/core.h>

#include "tessera/serve/housekeeping.h"

namespace tessera::serve {

namespace {

template <typename T>
typename kube::Informer<T>::Options InformerOptions(std::string_view name, Clock* clock,
                                                    absl::Duration min_watch_timeout) {
  typename kube::Informer<T>::Options options;
  options.name = std::string(name);
  options.reflector.min_watch_timeout = min_watch_timeout;
  options.clock = clock;
  return options;
}

}  // namespace

Informers::Informers(Parts parts, absl::Duration min_watch_timeout) : parts_(std::move(parts)) {
  Repairs* repairs = parts_.repairs;
  kube::EventHandlers<kube::Pod> pod_handlers = parts_.feed->Handlers();
  // The apply layer's repairs of lost events, named for /debug/audit.
  pod_handlers.on_delete = [repairs, on_delete = std::move(pod_handlers.on_delete)](
                               const kube::Pod& pod, bool final_state_unknown) {
    on_delete(pod, final_state_unknown);
    if (final_state_unknown) {
      repairs->Note("apply", fmt::format("tombstone {}/{} uid={} node={}", pod.meta.ns,
                                         pod.meta.name, pod.meta.uid, pod.node_name));
      repairs->Count("apply", {{"tombstone", 1}});
    }
  };
  pod_handlers.on_update = [repairs, on_update = std::move(pod_handlers.on_update)](
                               const kube::Pod& old_pod, const kube::Pod& pod) {
    on_update(old_pod, pod);
    if (old_pod.meta.uid != pod.meta.uid) {
      repairs->Note("apply", fmt::format("uid_change {}/{} uid={}->{}", pod.meta.ns, pod.meta.name,
                                         old_pod.meta.uid, pod.meta.uid));
      repairs->Count("apply", {{"uid_change", 1}});
    }
  };
  pod_handlers.on_listed = [relisted = parts_.pods_relisted](absl::Time list_started,
                                                             bool initial) {
    if (!initial) {
      relisted(list_started);
    }
  };
  pods_ = std::make_unique<kube::Informer<kube::Pod>>(
      parts_.client, InformerOptions<kube::Pod>("pods", parts_.clock, min_watch_timeout),
      std::move(pod_handlers));

  kube::EventHandlers<kube::Node> node_handlers = parts_.registry->Handlers(
      {.clock = parts_.clock,
       .patches =
           [inbox = parts_.inbox](std::vector<accounting::NodePatch> patches) {
             inbox->Queue(std::move(patches));
           },
       .tombstone =
           [repairs](const kube::Node& node) {
             repairs->Note("apply", "tombstone node " + node.meta.name);
             repairs->Count("apply", {{"node_tombstone", 1}});
           }});
  nodes_ = std::make_unique<kube::Informer<kube::Node>>(
      parts_.client, InformerOptions<kube::Node>("nodes", parts_.clock, min_watch_timeout),
      std::move(node_handlers));

  accounting::QuotaBook* book = parts_.quotas;
  kube::EventHandlers<kube::ResourceQuota> quota_handlers;
  quota_handlers.on_add = [book](const kube::ResourceQuota& q, bool) { book->Upsert(q); };
  quota_handlers.on_update = [book](const kube::ResourceQuota& old_q,
                                    const kube::ResourceQuota& q) {
    if (old_q.meta.ns != q.meta.ns || old_q.meta.name != q.meta.name) {
      book->Remove(old_q.meta.ns, old_q.meta.name);
    }
    book->Upsert(q);
  };
  quota_handlers.on_delete = [book](const kube::ResourceQuota& q, bool) {
    book->Remove(q.meta.ns, q.meta.name);
  };
  quotas_ = std::make_unique<kube::Informer<kube::ResourceQuota>>(
      parts_.client,
      InformerOptions<kube::ResourceQuota>("resourcequotas", parts_.clock, min_watch_timeout),
      std::move(quota_handlers));
}

void Informers::Start() {
  pods_->Start();
  nodes_->Start();
  quotas_->Start();
}

void Informers::Stop() {
  pods_->Stop();
  nodes_->Stop();
  quotas_->Stop();
}

bool Informers::Synced() const {
  return pods_->HasSynced() && nodes_->HasSynced() && quotas_->HasSynced();
}

bool Informers::WaitForSync(absl::Duration timeout) const {
  const absl::Time deadline = parts_.clock->Now() + timeout;
  return pods_->WaitForSync(timeout) && nodes_->WaitForSync(deadline - parts_.clock->Now()) &&
         quotas_->WaitForSync(deadline - parts_.clock->Now());
}

std::string Informers::SyncState() const {
  return fmt::format("waiting for the informers to sync (pods: {}, nodes: {}, resourcequotas: {})",
                     pods_->HasSynced() ? "synced" : "listing",
                     nodes_->HasSynced() ? "synced" : "listing",
                     quotas_->HasSynced() ? "synced" : "listing");
}

void Informers::ExportMetrics(metrics::Registry* metrics) {
  auto update = [metrics](std::string_view resource, const kube::InformerCounters& c, bool synced,
                          Exported* exported) {
    metrics->SetInformerSynced(resource, synced);
    if (c.reflector.relists > exported->relists) {
      for (int64_t i = exported->relists; i < c.reflector.relists; ++i) {
        metrics->RecordInformerRelist(resource);
      }
      exported->relists = c.reflector.relists;
    }
    const int64_t delivered = c.adds + c.updates + c.deletes + c.tombstones;
    if (delivered > exported->events) {
      metrics->RecordInformerEvents(resource, delivered - exported->events);
      exported->events = delivered;
    }
  };
  update("pods", pods_->counters(), pods_->HasSynced(), &pods_exported_);
  update("nodes", nodes_->counters(), nodes_->HasSynced(), &nodes_exported_);
  update("resourcequotas", quotas_->counters(), quotas_->HasSynced(), &quotas_exported_);
}

}  // namespace tessera::serve

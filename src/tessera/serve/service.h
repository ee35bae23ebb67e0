// File: tessera/serve/service.h
//
// `tessera serve`: the HAMi-compatible scheduler extender assembled from its parts.
//
//   kube-apiserver ─LIST/WATCH─▶ pod informer ──▶ PodFeed ─────▶ Ledger ◀── Scheduler ◀── /filter
//                               node informer ─▶ NodeRegistry ─▶   │                    ◀── /bind
//                                                                  └──▶ metrics::Registry ◀─
//                                                                  /metrics
//
//   ServeOptions options;  options.kube.path = "/etc/kubernetes/scheduler.conf";
//   absl::StatusOr<std::unique_ptr<Service>> service = Service::Start(options);
//   ... (*service)->WaitForSync(absl::Minutes(2));
//   (*service)->Stop();
//
// Start loads the device configuration and the client configuration, starts the pod and node
// informers, the housekeeping loop (handshake ticks and writes, reservation expiry, informer
// metrics every `housekeeping_period`; the audit every `audit_period`), the resyncer (its own
// thread, every `resync_period`) and both HTTP listeners.
// /readyz turns ready once both informers have delivered their first list; until then /filter
// answers with an error (which kube-scheduler retries), exactly like HAMi's unsynced cache.
//
// Leadership (leader.h, docs/serve.md "Leadership"): an Elector decides which replica runs the
// background writers — the handshake writes of the node registry and HAMi's scheduler-role pod
// labels (role_labels.h), both run by the housekeeping loop (the node lock is only written by
// /bind, and the audit and reservation expiry change nothing on the API server).
// Followers drop those writes but keep their informers, ledger and registry in sync, and answer
// /filter and /bind (a kube-scheduler calls the extender of its own pod); when a follower
// becomes the leader it asks at once for every write that is due. /readyz reports the role in
// its body but its status stays "informers synced" for both roles; tessera_leader is 1 on the
// leader. The elector's first round runs inside Start, so the role is known before the first
// informer delivery.
//
// Thread safety: Start, Stop and the destructor from one thread; everything else (including the
// Backend methods, which the HTTP server calls concurrently) from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/accounting/resyncer.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/model.h"
#include "tessera/extender/http_server.h"
#include "tessera/kube/config.h"
#include "tessera/serve/leader.h"
#include "tessera/serve/role_labels.h"

namespace tessera::serve {

struct ServeOptions {
  // Extender listener (--http_bind) and TLS (--cert_file, --key_file).
  std::string http_bind = "127.0.0.1:8080";
  std::string cert_file;
  std::string key_file;
  // Metrics listener (--metrics-bind-address); empty disables it.
  std::string metrics_bind_address = ":9395";
  // The event source and the schedulerName HAMi's webhook writes (--scheduler-name).
  std::string scheduler_name = "hami-scheduler";
  // The webhook also takes pods whose schedulerName is "default-scheduler"
  // (--force-overwrite-default-scheduler, HAMi HEAD).
  bool force_overwrite_default_scheduler = true;
  device::NodePolicy node_policy = device::NodePolicy::kBinpack;
  device::GpuPolicy gpu_policy;  // spread
  // HAMi's device-config YAML (--device-config-file); empty: HAMi's defaults.
  std::string device_config_file;
  // --node-label-selector, "k=v[,k=v]".
  std::string node_label_selector;
  absl::Duration node_lock_timeout = absl::Minutes(5);
  // How long a bind waits for a node lock another pod holds (--node-lock-retry-timeout); 0: no
  // wait.
  absl::Duration node_lock_retry_timeout = absl::Seconds(28);
  absl::Duration reservation_ttl = absl::Minutes(5);
  // --legacy-metrics: also the v2.5-era metric names.
  bool legacy_metrics = false;
  // The client: --kubeconfig / $KUBECONFIG / in-cluster, --kube-qps, --kube-burst.
  kube::KubeconfigOptions kube;
  double kube_qps = 50;
  int kube_burst = 100;
  // The audit (docs/self-healing.md): every this often the ledger is recomputed from the
  // informers' objects and repaired where it differs (--audit-period). Zero disables it.
  absl::Duration audit_period = absl::Seconds(30);
  // Leadership (--leader-elect-mode, --leader-elect-resource-namespace/-name,
  // --leader-elect-identity, --leader-elect-lease-duration/-renew-deadline/-retry-period).
  // `clock` and `on_change` are set by the service.
  ElectorOptions leader;
  // HAMi's hami.io/scheduler-role pod labels (role_labels.h): `pod_name` from $POD_NAME and `ns`
  // from $POD_NAMESPACE (serve_command); `enabled` is --scheduler-role-labels. An empty `ns`
  // means the client configuration's namespace. `observed` and `is_leader` are set by the
  // service.
  RoleLabelOptions role_labels;
  // The resync (docs/self-healing.md): every this often (jittered by ±10 %) the pods and nodes
  // are LISTed from the API server and the informers repaired where they differ
  // (--resync-period). Zero disables it.
  absl::Duration resync_period = absl::Minutes(5);
  // The resync's pause after each LIST page, in multiples of the page's own time
  // (ResyncOptions::pace).
  double resync_pace = accounting::ResyncOptions{}.pace;
  // How often the housekeeping loop runs.
  absl::Duration housekeeping_period = absl::Seconds(1);
  // Informer watch timeouts (randomised between this and twice it, as client-go does).
  absl::Duration min_watch_timeout = absl::Minutes(5);
  // Server worker threads kept while idle (each open connection holds one; the pool grows).
  size_t http_threads = 16;
  // The cap on open connections of each listener (--max-connections).
  size_t max_connections = 4096;
  Clock* clock = Clock::Real();
};

class Service {
 public:
  // Errors: InvalidArgument for bad options or files (device config, selector, certificates,
  // addresses), the client configuration's error, Unavailable when a port cannot be bound.
  // Nothing is left running on error.
  static absl::StatusOr<std::unique_ptr<Service>> Start(const ServeOptions& options);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Stops the listeners, the loop and the informers. Idempotent.
  void Stop();

  // Waits (real time) until both informers have synced.
  bool WaitForSync(absl::Duration timeout) const;

  int port() const;
  int metrics_port() const;

  // The /metrics body and the /debug/ledger document (also served over HTTP).
  std::string MetricsText() const;
  std::string DebugLedgerJson() const;
  // Whether this replica runs the background writers now, and the elector's one-line account.
  bool IsLeader() const;
  std::string LeaderDescription() const;
  // The /debug/audit document: the last audit and the last resync.
  std::string DebugAuditJson() const;
  // Runs one resync pass now on the calling thread (serialised with the periodic passes, whose
  // schedule it does not change) and returns its report; counted like a periodic pass.
  accounting::ResyncReport ResyncNow();

  class Impl;

 private:
  explicit Service(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve

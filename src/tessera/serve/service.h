// File: tessera/serve/service.h
//
// `tessera serve`: the HAMi-compatible scheduler extender assembled from its parts — pod and node
// informers, PodFeed, NodeRegistry, Ledger, Scheduler, auditor, resyncer, elector, the HTTP
// listeners and the metrics — and the extender::Backend the HTTP server calls. The picture and
// what each thread runs: docs/architecture.md, docs/serve.md "The assembly".
//
//   absl::StatusOr<std::unique_ptr<Service>> service = Service::Start(options);
//   (*service)->WaitForSync(absl::Minutes(2));  ...  (*service)->Stop();
//
// Errors: Start returns InvalidArgument for bad options or files, the client configuration's
// error, or Unavailable when a port cannot be bound; nothing is left running. Until both
// informers have listed, /filter answers with an error (kube-scheduler retries).
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
#include "tessera/extender/requeue.h"
#include "tessera/extender/self_preempt.h"
#include "tessera/extender/webhook.h"
#include "tessera/kube/config.h"
#include "tessera/serve/debug_auth.h"
#include "tessera/serve/leader.h"
#include "tessera/serve/role_labels.h"

namespace tessera::serve {

// How Tessera preempts for a pod of higher priority (docs/preemption.md; --preemption).
enum class PreemptionMode : uint8_t {
  kExtender,  // answers kube-scheduler's /preempt (Kubernetes 1.38 and later asks)
  kSelf,      // that, and evicts for refused pods itself (before 1.38 nobody asks)
  kOff,       // /preempt answers 404; nobody is evicted
};

struct ServeOptions {
  // Extender listener (--http_bind) and TLS (--cert_file, --key_file).
  std::string http_bind = "127.0.0.1:8080";
  std::string cert_file;
  std::string key_file;
  // Metrics listener (--metrics-bind-address); empty disables it.
  std::string metrics_bind_address = ":9395";
  // Who reads its /debug routes (--debug-auth, debug_auth.h): loopback peers only, or also
  // callers whose bearer token the API server authenticates and authorises.
  DebugAuthMode debug_auth = DebugAuthMode::kLoopback;
  // The event source and the schedulerName HAMi's webhook writes (--scheduler-name).
  std::string scheduler_name = "hami-scheduler";
  // The webhook also takes pods whose schedulerName is "default-scheduler"
  // (--force-overwrite-default-scheduler, HAMi HEAD).
  bool force_overwrite_default_scheduler = true;
  // Who may write the scheduler-owned pod annotations on UPDATE (docs/serve.md "The admission
  // webhook"): this process's own user (--self-username; empty: the subject of the client's
  // service-account token, when it has one) and, for the keys HAMi's device plugin writes,
  // --trusted-annotation-writers.
  std::string self_username;
  std::vector<std::string> trusted_annotation_writers = {
      std::string(extender::kHamiDevicePluginUsername)};
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
  // --avoid-busy-nodes: the filter prefers fitting nodes no other pod's bind occupies
  // (extender/busy_nodes.h); false: HAMi's choice whatever the node locks.
  bool avoid_busy_nodes = true;
  // --legacy-metrics: also the v2.5-era metric names.
  bool legacy_metrics = false;
  // The client: --kubeconfig / $KUBECONFIG / in-cluster, --kube-qps, --kube-burst. A scheduled
  // pod costs about four requests (the filter's patch, the node lock, the Binding, an event),
  // where kube-scheduler's 50/100 pays for one Binding; at 200/400 with 16 writers a burst's
  // binds waited 7 s for their patches (docs/benchmarks.md, "Busy nodes").
  kube::KubeconfigOptions kube;
  double kube_qps = 500;
  int kube_burst = 1000;
  // Writers of the filter's write-behind annotation patches (--patch-threads): each waits out a
  // round trip of 40–300 ms under load, and a burst's binds wait for their pod's patch.
  int patch_threads = 48;
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
  // The requeue of refused pods when capacity they fit in frees (docs/requeue.md;
  // --requeue-qps, --requeue-burst; node_policy and gpu_policy are set from the fields above),
  // a round every requeue_period.
  extender::Requeuer::Options requeue;
  absl::Duration requeue_period = absl::Milliseconds(200);
  // Preemption (--preemption); with kSelf, the settle time of a refusal (--preemption-settle)
  // and a round of self-preemption every self_preempt_period.
  PreemptionMode preemption = PreemptionMode::kExtender;
  extender::SelfPreemptor::Options self_preempt;
  absl::Duration self_preempt_period = absl::Seconds(1);
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

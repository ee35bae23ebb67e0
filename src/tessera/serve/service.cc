#include "tessera/serve/service.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/node_registry.h"
#include "tessera/accounting/pod_feed.h"
#include "tessera/accounting/quota_book.h"
#include "tessera/accounting/resyncer.h"
#include "tessera/base/allocator.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/annotations.h"
#include "tessera/device/device_config.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/verdict.h"
#include "tessera/extender/webhook.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/transport.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/build_revision.h"
#include "tessera/metrics/registry.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"
#include "tessera/serve/debug_json.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::serve {

namespace {

// The label of an unschedulable filter in tessera_filter_decisions_total{reason}: the reason
// most failed candidates give, each device reason of a node counted once by name
// ("CardInsufficientMemory" for HAMi's "2/8 CardInsufficientMemory"), a node-level reason by its
// label ("node unregistered"), ties broken by name. Bounded by the fixed set of reasons, never
// a node or pod name.
std::string_view CommonFailureReason(const std::vector<extender::FailedNode>& failed_nodes) {
  return failed_nodes.empty() ? std::string_view() : extender::MainReason(failed_nodes);
}

metrics::FilterOutcome FilterOutcomeOf(extender::FilterCode code) {
  switch (code) {
    case extender::FilterCode::kFit:
      return metrics::FilterOutcome::kScheduled;
    case extender::FilterCode::kNoFit:
      return metrics::FilterOutcome::kUnschedulable;
    case extender::FilterCode::kPassThrough:
      return metrics::FilterOutcome::kPassthrough;
    case extender::FilterCode::kError:
      return metrics::FilterOutcome::kError;
  }
  return metrics::FilterOutcome::kError;
}

// tessera_bind_total{outcome}: refusals that leave the cluster as it was are "rejected",
// failed API calls "error".
metrics::BindOutcome BindOutcomeOf(extender::BindCode code) {
  switch (code) {
    case extender::BindCode::kBound:
      return metrics::BindOutcome::kBound;
    case extender::BindCode::kPodNotFound:
    case extender::BindCode::kInProgress:
    case extender::BindCode::kNotOurs:
    case extender::BindCode::kNodeUnregistered:
    case extender::BindCode::kNoAllocation:
    case extender::BindCode::kLockHeld:
    case extender::BindCode::kDevicesNotFree:
    case extender::BindCode::kBindingRejected:
      return metrics::BindOutcome::kRejected;
    case extender::BindCode::kLockError:
    case extender::BindCode::kPatchFailed:
    case extender::BindCode::kError:
      return metrics::BindOutcome::kError;
  }
  return metrics::BindOutcome::kError;
}

// tessera_ledger_problems{kind}: the kinds Housekeeping sets after each audit.
constexpr std::array<std::string_view, 7> kLedgerProblemKinds = {
    "conflict", "orphan", "unregistered", "unreadable", "foreign_allocation", "mig", "rewritten"};

// Every label value the labelled families can take, exported at 0 from the start.
metrics::KnownLabels KnownLabelValues() {
  metrics::KnownLabels known;
  for (auto outcome : {metrics::FilterOutcome::kScheduled, metrics::FilterOutcome::kPassthrough,
                       metrics::FilterOutcome::kError, metrics::FilterOutcome::kUnschedulable}) {
    known.filter_decisions.emplace_back(outcome, "");
  }
  known.filter_decisions.emplace_back(metrics::FilterOutcome::kError, "not_synced");
  for (size_t i = 0; i < schedule::kReasonCount; ++i) {
    known.filter_decisions.emplace_back(metrics::FilterOutcome::kUnschedulable,
                                        schedule::ReasonName(static_cast<schedule::Reason>(i)));
  }
  for (size_t i = 0; i < extender::kNodeFailureCount; ++i) {
    known.filter_decisions.emplace_back(
        metrics::FilterOutcome::kUnschedulable,
        extender::NodeFailureLabel(static_cast<extender::NodeFailure>(i)));
  }
  for (std::string_view reason : extender::PendingReasons()) {
    known.pending_reasons.emplace_back(reason);
  }
  known.informer_resources = {"pods", "nodes", "resourcequotas"};
  known.audit_causes.assign(accounting::kAuditCauses.begin(), accounting::kAuditCauses.end());
  known.ledger_problem_kinds.assign(kLedgerProblemKinds.begin(), kLedgerProblemKinds.end());
  known.resync_kinds.assign(accounting::kResyncKinds.begin(), accounting::kResyncKinds.end());
  return known;
}

}  // namespace

class Service::Impl : public extender::Backend {
 public:
  explicit Impl(ServeOptions options) : options_(std::move(options)) {}
  ~Impl() override { Stop(); }

  absl::Status Init();
  void Stop();

  bool Synced() const {
    return pods_->HasSynced() && nodes_->HasSynced() && quota_informer_->HasSynced();
  }
  bool WaitForSync(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    return pods_->WaitForSync(timeout) && nodes_->WaitForSync(deadline - absl::Now()) &&
           quota_informer_->WaitForSync(deadline - absl::Now());
  }
  int port() const { return http_->port(); }
  int metrics_port() const { return http_->metrics_port(); }

  // extender::Backend
  extender::FilterResult Filter(const extender::FilterArgs& args) override;
  extender::BindResult Bind(const extender::BindArgs& args) override;
  extender::RefitResponse Refit(const extender::RefitRequest& request) override;
  bool Ready(std::string* why) override;
  std::string DebugLedgerJson() override;
  std::string DebugAuditJson() override;
  extender::WhyReply DebugWhy(const extender::WhyRequest& request) override;
  // DebugWhy's replay on a copy of the ledger, under why_mu_.
  extender::WhyReply Replay(const extender::WhyRequest& why, const kube::Pod& pod,
                            device::PodRequest request, const device::PodConstraints& constraints,
                            nlohmann::json doc);
  accounting::ResyncReport ResyncNow() { return resyncer_->RunOnce(); }

  bool IsLeader() const { return elector_->IsLeader(); }
  std::string LeaderDescription() const { return elector_->Describe(); }

  // A follower renders no device families (HAMi's followers show no node families either), so
  // that a sum over every scraped replica counts each device once (docs/metrics.md, "Replicas").
  std::string MetricsText() const {
    const bool leader = elector_->IsLeader();
    metrics_->SetLeader(leader);  // the role /readyz reports now
    ledger::FullSnapshot snapshot = ledger_.Full();
    if (!leader) {
      snapshot.nodes.clear();  // tessera_reservations_in_flight stays this replica's own
    }
    // HAMi's quota families from the same snapshot (every replica, as HAMi's followers too).
    std::string body = metrics_->Render(snapshot, options_.legacy_metrics);
    body += metrics::RenderQuotaFamilies(snapshot, quotas_->AllLimits(), quotas_->Limits(""),
                                         options_.legacy_metrics);
    return body;
  }

 private:
  void Housekeeping();
  // tessera_pending_pods from the verdicts of the pods still pending (leader only).
  void UpdatePendingPods(bool leader);
  void QueuePatches(std::vector<accounting::NodePatch> patches);
  void UpdateInformerMetrics();
  std::string SyncState() const;

  const ServeOptions options_;
  Clock* clock() const { return options_.clock; }

  std::unique_ptr<device::Vendor> vendor_;
  // A bound pod's allocation is Tessera's decision: a later rewrite of its annotations does not
  // change what the ledger holds (docs/self-healing.md "Pinned decisions").
  ledger::Ledger ledger_{ledger::LedgerOptions{.pin_decisions = true}};
  std::unique_ptr<kube::CurlTransport> transport_;
  std::unique_ptr<kube::ApiClient> client_;
  // The webhook's scheduler identity: --self-username, else the token's subject (set in Start).
  std::string self_username_;
  std::unique_ptr<metrics::Registry> metrics_;
  std::unique_ptr<accounting::PodFeed> feed_;
  std::unique_ptr<accounting::NodeRegistry> registry_;
  std::unique_ptr<accounting::HandshakeWriter> writer_;
  std::unique_ptr<Elector> elector_;
  std::unique_ptr<RoleLabeler> role_labels_;
  uint64_t leader_generation_ = 0;       // housekeeping thread only
  bool logged_synced_ = false;           // housekeeping thread only
  absl::Time started_ = absl::Now();     // for the "informers synced" line
  std::atomic<bool> trim_again_{false};  // a large request was served since the last trim
  std::unique_ptr<kube::Informer<kube::Pod>> pods_;
  std::unique_ptr<kube::Informer<kube::Node>> nodes_;
  // Namespace quota: the limits of the observed ResourceQuotas (usage is the ledger's).
  std::unique_ptr<accounting::QuotaBook> quotas_;
  std::unique_ptr<kube::Informer<kube::ResourceQuota>> quota_informer_;
  std::unique_ptr<extender::Scheduler> scheduler_;
  // Who reads /debug (--debug-auth); used by http_'s workers, so declared before it.
  std::unique_ptr<DebugReviewer> debug_reviewer_;
  std::unique_ptr<DebugGate> debug_gate_;
  std::unique_ptr<extender::HttpServer> http_;
  std::unique_ptr<accounting::Auditor> auditor_;
  std::unique_ptr<accounting::Resyncer> resyncer_;

  // What the self-healing layers repaired, for /debug/audit: totals since start and the latest
  // lines (layer "apply", "audit", "resync" or "expiry"), newest last.
  struct Repair {
    absl::Time at;
    std::string layer;
    std::string what;
  };
  // The verdict's VerdictInput::withheld: the registry has `node` in the ledger but it does not
  // offer its devices (handshake expired, not Ready, not selected).
  bool Withheld(std::string_view node) const {
    const std::optional<accounting::NodeStatus> status = registry_->Find(node);
    return status && status->in_ledger &&
           status->availability != accounting::Availability::kAvailable;
  }
  void NoteRepair(std::string_view layer, std::string what);
  void NoteRepairCounts(std::string_view layer, const std::map<std::string, int64_t>& counts);
  // Ends the reservations made before `list_started` whose pod the informer's store (which
  // now reflects a complete LIST taken after that time) does not have; counted under `layer`
  // as "absent_reservation".
  void ReleaseAbsentReservations(absl::Time list_started, std::string_view layer);
  mutable Mutex repairs_mu_;
  std::deque<Repair> repairs_ ABSL_GUARDED_BY(repairs_mu_);
  std::map<std::string, std::map<std::string, int64_t>> repair_totals_ ABSL_GUARDED_BY(repairs_mu_);
  absl::Time next_audit_ = absl::InfinitePast();  // housekeeping thread only

  // One /debug/why replay at a time (each copies the ledger); others are answered 429.
  Mutex why_mu_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<accounting::NodePatch> patches_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;

  // Informer counters as last exported (housekeeping thread only).
  int64_t pod_relists_ = 0, node_relists_ = 0;
  int64_t pod_events_ = 0, node_events_ = 0;
  int64_t quota_relists_ = 0, quota_events_ = 0;
};

absl::Status Service::Impl::Init() {
  device::NvidiaConfig config = device::DefaultNvidiaConfig();
  if (!options_.device_config_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(config, device::LoadDeviceConfigFile(options_.device_config_file));
  }
  vendor_ = device::NewNvidiaVendor(config);
  TESSERA_ASSIGN_OR_RETURN(accounting::NodeSelector selector,
                           accounting::NodeSelector::Parse(options_.node_label_selector));
  if (options_.reservation_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--reservation-ttl must be positive");
  }
  if (options_.node_lock_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--node-lock-timeout must be positive");
  }
  if (options_.node_lock_retry_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--node-lock-retry-timeout must not be negative");
  }
  TESSERA_RETURN_IF_ERROR(Elector::Validate(options_.leader));

  absl::StatusOr<kube::RestConfig> rest = kube::LoadRestConfig(options_.kube);
  if (!rest.ok()) {
    return Annotate(rest.status(), "kubernetes client configuration");
  }
  rest->qps = options_.kube_qps;
  rest->burst = options_.kube_burst;
  TESSERA_LOG(kInfo, "serve: API server {}", rest->DebugString());
  kube::CurlTransport::Options transport_options;
  transport_options.user_agent = "tessera/" TESSERA_VERSION " (serve)";
  std::shared_ptr<kube::TokenSource> tokens = kube::MakeTokenSource(*rest, Clock::Real());
  TESSERA_ASSIGN_OR_RETURN(transport_,
                           kube::CurlTransport::Create(*rest, tokens, transport_options));
  self_username_ = options_.self_username;
  if (self_username_.empty()) {
    absl::StatusOr<std::string> token =
        tokens != nullptr ? tokens->Token() : absl::NotFoundError("no bearer token");
    absl::StatusOr<std::string> user =
        token.ok() ? extender::ServiceAccountUsername(*token) : token.status();
    if (user.ok()) {
      self_username_ = *std::move(user);
    } else {
      TESSERA_LOG(kWarning,
                  "serve: --self-username not given and not derived from the client's token ({}): "
                  "the webhook lets no request write scheduler-owned annotations as the scheduler",
                  std::string(user.status().message()));
    }
  }
  TESSERA_LOG(kInfo,
              "serve: webhook: scheduler-owned annotations written by {}; the device "
              "plugin's by [{}]",
              self_username_.empty() ? "nobody" : self_username_,
              absl::StrJoin(options_.trusted_annotation_writers, ", "));
  client_ = std::make_unique<kube::ApiClient>(transport_.get());
  ElectorOptions leader = options_.leader;
  leader.clock = clock();
  leader.on_change = nullptr;  // the housekeeping loop polls generation()
  TESSERA_ASSIGN_OR_RETURN(elector_, Elector::Create(client_.get(), std::move(leader)));

  metrics_ = std::make_unique<metrics::Registry>(
      metrics::BuildInfo{TESSERA_VERSION, std::string(metrics::BuildRevision()),
                         metrics::CompilerId()},
      clock());
  metrics_->DeclareKnownLabels(KnownLabelValues());
  feed_ = std::make_unique<accounting::PodFeed>(
      vendor_.get(), &ledger_, clock(),
      accounting::PodFeedOptions{.reservation_ttl = options_.reservation_ttl});
  registry_ = std::make_unique<accounting::NodeRegistry>(
      vendor_.get(), &ledger_, accounting::NodeRegistry::Options{.selector = std::move(selector)});
  // Only the leader writes; the check is repeated at each write (leadership can end between
  // the loop's check and the PATCH).
  writer_ = std::make_unique<accounting::HandshakeWriter>(
      client_.get(),
      accounting::HandshakeWriter::Options{.is_leader = [this] { return elector_->IsLeader(); }});

  RoleLabelOptions role_labels = options_.role_labels;
  if (role_labels.ns.empty()) {
    role_labels.ns = rest->namespace_;
  }
  role_labels.is_leader = [this] { return elector_->IsLeader(); };
  // The pod informer holds every pod, with its hami.io/ labels: the check between passes.
  role_labels.observed = [this,
                          ns = role_labels.ns](std::string_view name) -> std::optional<kube::Pod> {
    auto pod = pods_->store().Get(ns + "/" + std::string(name));
    return pod == nullptr ? std::nullopt : std::optional<kube::Pod>(*pod);
  };
  if (!role_labels.enabled) {
    TESSERA_LOG(kInfo, "serve: scheduler-role pod labels off (--scheduler-role-labels=false)");
  } else if (role_labels.pod_name.empty()) {
    TESSERA_LOG(kInfo,
                "serve: scheduler-role pod labels off: POD_NAME is not set (give the pod its "
                "name through the downward API to have the leader label the scheduler pods)");
  } else {
    TESSERA_LOG(kInfo,
                "serve: the leader labels the pods {} in namespace {} with {}=leader (this pod: "
                "{}) or {}",
                role_labels.selector, role_labels.ns, kSchedulerRoleLabel, role_labels.pod_name,
                kRoleFollower);
  }
  role_labels_ = std::make_unique<RoleLabeler>(client_.get(), std::move(role_labels));

  kube::Informer<kube::Pod>::Options pod_options;
  pod_options.name = "pods";
  pod_options.reflector.min_watch_timeout = options_.min_watch_timeout;
  pod_options.clock = clock();
  kube::EventHandlers<kube::Pod> pod_handlers = feed_->Handlers();
  // The apply layer's repairs of lost events, named for /debug/audit.
  pod_handlers.on_delete = [this, on_delete = std::move(pod_handlers.on_delete)](
                               const kube::Pod& pod, bool final_state_unknown) {
    on_delete(pod, final_state_unknown);
    if (final_state_unknown) {
      NoteRepair("apply", fmt::format("tombstone {}/{} uid={} node={}", pod.meta.ns, pod.meta.name,
                                      pod.meta.uid, pod.node_name));
      NoteRepairCounts("apply", {{"tombstone", 1}});
    }
  };
  pod_handlers.on_update = [this, on_update = std::move(pod_handlers.on_update)](
                               const kube::Pod& old_pod, const kube::Pod& pod) {
    on_update(old_pod, pod);
    if (old_pod.meta.uid != pod.meta.uid) {
      NoteRepair("apply", fmt::format("uid_change {}/{} uid={}->{}", pod.meta.ns, pod.meta.name,
                                      old_pod.meta.uid, pod.meta.uid));
      NoteRepairCounts("apply", {{"uid_change", 1}});
    }
  };
  // A relist ends the reservations of pods it does not return (created, filtered, bound and
  // deleted while the watch was down: no tombstone tells).
  pod_handlers.on_listed = [this](absl::Time list_started, bool initial) {
    if (!initial) {
      ReleaseAbsentReservations(list_started, "apply");
    }
  };
  pods_ = std::make_unique<kube::Informer<kube::Pod>>(client_.get(), pod_options,
                                                      std::move(pod_handlers));

  kube::Informer<kube::Node>::Options node_options;
  node_options.name = "nodes";
  node_options.reflector.min_watch_timeout = options_.min_watch_timeout;
  node_options.clock = clock();
  kube::EventHandlers<kube::Node> node_handlers = registry_->Handlers(
      {.clock = clock(),
       .patches =
           [this](std::vector<accounting::NodePatch> patches) { QueuePatches(std::move(patches)); },
       .tombstone =
           [this](const kube::Node& node) {
             NoteRepair("apply", "tombstone node " + node.meta.name);
             NoteRepairCounts("apply", {{"node_tombstone", 1}});
           }});
  nodes_ = std::make_unique<kube::Informer<kube::Node>>(client_.get(), node_options,
                                                        std::move(node_handlers));

  quotas_ = std::make_unique<accounting::QuotaBook>(
      accounting::QuotaBook::Options{.memory_name = config.resource_memory_name,
                                     .cores_name = config.resource_core_name,
                                     .memory_factor = config.memory_factor});
  kube::Informer<kube::ResourceQuota>::Options quota_options;
  quota_options.name = "resourcequotas";
  quota_options.reflector.min_watch_timeout = options_.min_watch_timeout;
  quota_options.clock = clock();
  kube::EventHandlers<kube::ResourceQuota> quota_handlers;
  quota_handlers.on_add = [this](const kube::ResourceQuota& q, bool) { quotas_->Upsert(q); };
  quota_handlers.on_update = [this](const kube::ResourceQuota& old_q,
                                    const kube::ResourceQuota& q) {
    if (old_q.meta.ns != q.meta.ns || old_q.meta.name != q.meta.name) {
      quotas_->Remove(old_q.meta.ns, old_q.meta.name);
    }
    quotas_->Upsert(q);
  };
  quota_handlers.on_delete = [this](const kube::ResourceQuota& q, bool) {
    quotas_->Remove(q.meta.ns, q.meta.name);
  };
  quota_informer_ = std::make_unique<kube::Informer<kube::ResourceQuota>>(
      client_.get(), quota_options, std::move(quota_handlers));

  extender::Scheduler::Options scheduler_options;
  scheduler_options.scheduler_name = options_.scheduler_name;
  scheduler_options.node_policy = options_.node_policy;
  scheduler_options.gpu_policy = options_.gpu_policy;
  scheduler_options.node_lock_timeout = options_.node_lock_timeout;
  scheduler_options.node_lock_retry_timeout = options_.node_lock_retry_timeout;
  // Pauses between lock tries (409 backoff, the wait for a held lock) end at Stop, and a
  // waiting bind then gives up, so Stop does not wait out --node-lock-retry-timeout.
  scheduler_options.lock.sleep = [this](absl::Duration d) {
    MutexLock lock(&mu_);
    if (!stopping_) {
      cv_.WaitFor(&mu_, absl::ToChronoNanoseconds(d));
    }
  };
  scheduler_options.lock.stopping = [this] {
    MutexLock lock(&mu_);
    return stopping_;
  };
  // A bind waiting for a lock holds an HTTP worker: leave half of them to /filter.
  scheduler_options.max_lock_waiters = std::max(1, static_cast<int>(options_.http_threads / 2));
  scheduler_options.reservation_ttl = options_.reservation_ttl;
  scheduler_options.patch_threads = options_.patch_threads;
  scheduler_options.vendor = vendor_.get();
  scheduler_options.avoid_busy_nodes = options_.avoid_busy_nodes;
  // Verdicts are written by the leader only (like every background write).
  scheduler_options.is_leader = [this] { return elector_->IsLeader(); };
  scheduler_options.withheld = [this](std::string_view node) { return Withheld(node); };
  scheduler_options.node_lock = [this](std::string_view name) {
    auto node = nodes_->store().Get(name);
    if (node == nullptr) {
      return extender::BusyNodes::NodeView{};
    }
    return extender::BusyNodes::NodeView{
        .lock = std::string(node->meta.annotations.Get(device::kNodeLockAnnotation)),
        .resource_version = node->meta.resource_version};
  };
  // The node informer's copy saves the GET of an unlocked node in bind.
  scheduler_options.lock.cached = [this](std::string_view name) -> std::optional<kube::Node> {
    auto node = nodes_->store().Get(name);
    if (node == nullptr) {
      return std::nullopt;
    }
    return *node;
  };
  extender::Scheduler::Deps deps;
  deps.ledger = &ledger_;
  deps.quotas = quotas_.get();
  deps.client = client_.get();
  deps.clock = clock();
  deps.lookup = [this](std::string_view ns, std::string_view name) -> std::optional<kube::Pod> {
    auto pod = pods_->store().Get(std::string(ns) + "/" + std::string(name));
    if (pod == nullptr) {
      return std::nullopt;
    }
    return *pod;
  };
  scheduler_ = std::make_unique<extender::Scheduler>(scheduler_options, std::move(deps));

  auditor_ = std::make_unique<accounting::Auditor>(
      vendor_.get(), &ledger_, feed_.get(), [this] { return pods_->store().List(); },
      [this](std::string_view uid) { return pods_->store().GetByUid(uid); },
      [this] { return registry_->Registrations(); },
      accounting::AuditorOptions{.scheduler_name = options_.scheduler_name,
                                 .mig_realise_deadline = options_.reservation_ttl});

  resyncer_ = std::make_unique<accounting::Resyncer>(
      client_.get(), pods_.get(), nodes_.get(),
      // Each replica its own jitter, so that replicas started
      // together do not LIST at the same moments.
      accounting::ResyncOptions{.period = options_.resync_period,
                                .pace = options_.resync_pace,
                                .clock = clock(),
                                .seed = std::random_device{}()},
      [this](const accounting::ResyncReport& report) {
        for (const auto& [kind, n] : report.corrections) {
          metrics_->RecordResyncCorrections(kind, n);
        }
        NoteRepairCounts("resync", report.corrections);
        for (const std::string& line : report.details) {
          NoteRepair("resync", line);
        }
        if (report.error.empty()) {
          ReleaseAbsentReservations(report.at, "resync");
        }
      });

  extender::HttpServerOptions http_options;
  http_options.bind_address = options_.http_bind;
  http_options.cert_file = options_.cert_file;
  http_options.key_file = options_.key_file;
  http_options.metrics_bind_address = options_.metrics_bind_address;
  http_options.metrics = [this] { return MetricsText(); };
  if (options_.debug_auth == DebugAuthMode::kKubernetes) {
    debug_reviewer_ = NewKubeDebugReviewer(transport_.get());
  }
  debug_gate_ = std::make_unique<DebugGate>(options_.debug_auth, debug_reviewer_.get(), clock());
  http_options.debug_access = [gate = debug_gate_.get()](const extender::DebugCaller& caller) {
    return gate->Check(caller);
  };
  http_options.threads = options_.http_threads;
  http_options.max_connections = options_.max_connections;
  // What the writer and event threads free after a large request's reply stays in their
  // arenas until the next trim: housekeeping trims once more (base/allocator.h).
  http_options.after_large_request = [this] { trim_again_.store(true); };
  extender::WebhookOptions webhook{
      .scheduler_name = options_.scheduler_name,
      .force_overwrite_default_scheduler = options_.force_overwrite_default_scheduler,
      .nvidia = config,
      .self_username = self_username_,
      .trusted_annotation_writers = options_.trusted_annotation_writers};
  http_options.webhook = [webhook](std::string_view content_type, std::string_view body) {
    extender::WebhookReply reply = extender::HandleAdmissionReview(content_type, body, webhook);
    return std::make_pair(reply.http_status, std::move(reply.body));
  };
  http_ = std::make_unique<extender::HttpServer>(this, http_options);
  TESSERA_RETURN_IF_ERROR(http_->Start());

  elector_->Step();  // the role before the first delivery
  metrics_->SetLeader(elector_->IsLeader());
  TESSERA_LOG(kInfo, "serve: leadership: {}", elector_->Describe());
  elector_->Start();
  pods_->Start();
  nodes_->Start();
  quota_informer_->Start();
  loop_ = std::thread([this] { Housekeeping(); });
  resyncer_->Start();
  TESSERA_LOG(kInfo, "serve: extender on {} (port {}), metrics on {} (port {}); /debug for {}",
              options_.http_bind, http_->port(), options_.metrics_bind_address,
              http_->metrics_port(),
              options_.debug_auth == DebugAuthMode::kKubernetes
                  ? "loopback peers and callers the API server authorises (--debug-auth=kubernetes)"
                  : "loopback peers only (--debug-auth=loopback)");
  return absl::OkStatus();
}

void Service::Impl::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
    cv_.SignalAll();
  }
  if (http_ != nullptr) {
    http_->Stop();
  }
  if (loop_.joinable()) {
    loop_.join();
  }
  if (resyncer_ != nullptr) {
    resyncer_->Stop();  // before the informers, whose Reconcile it may be waiting for
  }
  if (elector_ != nullptr) {
    elector_->Stop();  // after the last write: releases an own Lease for a quick takeover
    if (metrics_ != nullptr) {
      metrics_->SetLeader(false);
    }
  }
  if (pods_ != nullptr) {
    pods_->Stop();
  }
  if (nodes_ != nullptr) {
    nodes_->Stop();
  }
  if (quota_informer_ != nullptr) {
    quota_informer_->Stop();
  }
  scheduler_.reset();  // drains its event queue while the client still exists
}

void Service::Impl::QueuePatches(std::vector<accounting::NodePatch> patches) {
  if (patches.empty()) {
    return;
  }
  MutexLock lock(&mu_);
  for (accounting::NodePatch& p : patches) {
    patches_.push_back(std::move(p));
  }
  cv_.SignalAll();
}

void Service::Impl::Housekeeping() {
  while (true) {
    std::vector<accounting::NodePatch> patches;
    {
      MutexLock lock(&mu_);
      if (patches_.empty() && !stopping_) {
        cv_.WaitFor(&mu_, absl::ToChronoMilliseconds(options_.housekeeping_period));
      }
      if (stopping_) {
        return;
      }
      patches.swap(patches_);
    }
    if (trim_again_.exchange(false)) {
      ReleaseFreeMemory();
    }
    const absl::Time now = clock()->Now();
    const bool leader = elector_->IsLeader();
    metrics_->SetLeader(leader);
    const uint64_t gen = elector_->generation();
    if (gen != leader_generation_) {
      leader_generation_ = gen;
      if (leader) {
        registry_->ResetAsks();  // what was asked for as a follower was dropped
      }
    }
    // HAMi's scheduler-role labels: at each gain, every minute and on a difference seen.
    role_labels_->Tick(now, leader, gen);
    if (nodes_->HasSynced()) {
      std::vector<accounting::NodePatch> due = registry_->Tick(now);
      patches.insert(patches.end(), std::make_move_iterator(due.begin()),
                     std::make_move_iterator(due.end()));
    }
    // Handshake writes: the only background writer, the leader's job.
    if (!patches.empty()) {
      if (leader) {
        writer_->WriteAll(patches);
      } else {
        TESSERA_VLOG(2, "follower: {} handshake writes left to the leader", patches.size());
      }
    }
    std::vector<ledger::Reservation> expired = scheduler_->ExpireReservations(now);
    if (!expired.empty()) {
      metrics_->RecordReservationsExpired(static_cast<int64_t>(expired.size()));
      NoteRepairCounts("expiry", {{"reservation", static_cast<int64_t>(expired.size())}});
      for (const ledger::Reservation& r : expired) {
        NoteRepair("expiry",
                   fmt::format("reservation {}/{} uid={} node={}", r.ns, r.name, r.uid, r.node));
        TESSERA_LOG(kInfo, "reservation of pod {}/{} on node {} expired (no bind observed)", r.ns,
                    r.name, r.node);
      }
    }
    UpdateInformerMetrics();
    UpdatePendingPods(leader);
    if (!logged_synced_ && Synced()) {
      logged_synced_ = true;
      TESSERA_LOGS(kInfo, "informers synced", "pods", pods_->store().size(), "nodes",
                   nodes_->store().size(), "after", absl::FormatDuration(absl::Now() - started_));
    }
    if (options_.audit_period > absl::ZeroDuration() && Synced()) {
      if (next_audit_ == absl::InfinitePast()) {
        next_audit_ = now + options_.audit_period;
      } else if (now >= next_audit_) {
        next_audit_ = now + options_.audit_period;
        accounting::AuditReport report = auditor_->Run(now);
        int64_t total = 0;
        for (const auto& [cause, n] : report.corrections) {
          metrics_->RecordAuditCorrections(cause, n);
          total += n;
        }
        const ledger::Problems& p = report.problems;
        metrics_->SetLedgerProblems("conflict", static_cast<int64_t>(p.conflicts.size()));
        metrics_->SetLedgerProblems("orphan", static_cast<int64_t>(p.orphans.size()));
        metrics_->SetLedgerProblems("unregistered", static_cast<int64_t>(p.unregistered.size()));
        metrics_->SetLedgerProblems("unreadable", static_cast<int64_t>(p.unreadable.size()));
        metrics_->SetLedgerProblems("foreign_allocation",
                                    static_cast<int64_t>(report.foreign.size()));
        metrics_->SetLedgerProblems("mig", static_cast<int64_t>(p.mig.size()));
        metrics_->SetLedgerProblems("rewritten", static_cast<int64_t>(p.rewritten.size()));
        metrics_->RecordAllocationRewrites(static_cast<int64_t>(report.new_rewrites.size()));
        for (const ledger::Rewritten& r : report.new_rewrites) {
          NoteRepair("audit",
                     fmt::format("rewritten {}/{} uid={}: kept node {} [{}], annotations "
                                 "say node {} [{}]",
                                 r.ns, r.name, r.uid, r.kept.node, ledger::DecisionText(r.kept),
                                 r.observed.node, ledger::DecisionText(r.observed)));
          if (leader) {  // one event per rewrite, from the replica that writes
            kube::ObjectMeta pod;
            pod.ns = r.ns;
            pod.name = r.name;
            pod.uid = r.uid;
            scheduler_->events().Record(
                pod, "AllocationRewritten",
                fmt::format("the pod's allocation was changed after it was bound; the scheduler "
                            "keeps its decision: node {} [{}] (the annotations now say node {} "
                            "[{}])",
                            r.kept.node, ledger::DecisionText(r.kept),
                            r.observed.node.empty() ? "-" : r.observed.node,
                            ledger::DecisionText(r.observed)),
                extender::EventType::kWarning);
          }
        }
        NoteRepairCounts("audit", report.corrections);
        for (const std::string& line : report.details) {
          NoteRepair("audit", line);
        }
        TESSERA_VLOG(1, "audit: {} pods, {} nodes, {} corrections, {}", report.pods, report.nodes,
                     total, absl::FormatDuration(report.took));
      }
    }
  }
}

void Service::Impl::UpdatePendingPods(bool leader) {
  extender::VerdictWriter& verdicts = scheduler_->verdicts();
  if (!leader) {
    verdicts.Clear();  // the leader counts; a follower's entries would double them
  } else {
    verdicts.Retain([this](std::string_view uid) {
      std::shared_ptr<const kube::Pod> pod = pods_->store().GetByUid(uid);
      return pod != nullptr && pod->node_name.empty() && !pod->Deleting() && !pod->Terminal();
    });
  }
  const std::map<std::string, int64_t> counts = verdicts.CountByReason();
  for (std::string_view reason : extender::PendingReasons()) {
    auto it = counts.find(std::string(reason));
    metrics_->SetPendingPods(reason, it == counts.end() ? 0 : it->second);
  }
}

void Service::Impl::UpdateInformerMetrics() {
  auto update = [this](std::string_view resource, const kube::InformerCounters& c, bool synced,
                       int64_t* relists, int64_t* events) {
    metrics_->SetInformerSynced(resource, synced);
    if (c.reflector.relists > *relists) {
      for (int64_t i = *relists; i < c.reflector.relists; ++i) {
        metrics_->RecordInformerRelist(resource);
      }
      *relists = c.reflector.relists;
    }
    const int64_t delivered = c.adds + c.updates + c.deletes + c.tombstones;
    if (delivered > *events) {
      metrics_->RecordInformerEvents(resource, delivered - *events);
      *events = delivered;
    }
  };
  update("pods", pods_->counters(), pods_->HasSynced(), &pod_relists_, &pod_events_);
  update("nodes", nodes_->counters(), nodes_->HasSynced(), &node_relists_, &node_events_);
  update("resourcequotas", quota_informer_->counters(), quota_informer_->HasSynced(),
         &quota_relists_, &quota_events_);
}

std::string Service::Impl::SyncState() const {
  return fmt::format("waiting for the informers to sync (pods: {}, nodes: {}, resourcequotas: {})",
                     pods_->HasSynced() ? "synced" : "listing",
                     nodes_->HasSynced() ? "synced" : "listing",
                     quota_informer_->HasSynced() ? "synced" : "listing");
}

// Readiness is the informers' sync for every role: a follower serves /filter and /bind from
// the same synced ledger (its kube-scheduler may call it); the role is reported, not gated on.
bool Service::Impl::Ready(std::string* why) {
  const bool synced = Synced();
  *why = fmt::format("{}\nrole: {}\n",
                     synced ? "ok: the pod and node informers have synced" : SyncState(),
                     elector_->Describe());
  return synced;
}

extender::FilterResult Service::Impl::Filter(const extender::FilterArgs& args) {
  const absl::Time start = absl::Now();
  extender::FilterResult result;
  if (!Synced()) {
    result.node_names = std::vector<std::string>();
    result.error = "tessera is not ready: " + SyncState();
    metrics_->RecordFilter(metrics::FilterOutcome::kError, "not_synced", absl::Now() - start);
    return result;
  }
  extender::FilterOutcome outcome;
  result = scheduler_->Filter(args, &outcome);
  const std::string_view reason = outcome.code == extender::FilterCode::kNoFit
                                      ? CommonFailureReason(outcome.failed_nodes)
                                      : std::string_view();
  metrics_->RecordFilter(FilterOutcomeOf(outcome.code), reason, absl::Now() - start);
  return result;
}

extender::BindResult Service::Impl::Bind(const extender::BindArgs& args) {
  const absl::Time start = absl::Now();
  extender::BindOutcome outcome;
  extender::BindResult result = scheduler_->Bind(args, &outcome);
  metrics_->RecordBind(BindOutcomeOf(outcome.code), absl::Now() - start);
  return result;
}

// Only the leader moves an allocation: a refit decides under the decision lock of the replica
// that answers it, and only the leader's lock orders it against the filters of the
// kube-scheduler that schedules (docs/serve.md "NUMA refit").
extender::RefitResponse Service::Impl::Refit(const extender::RefitRequest& request) {
  extender::RefitResponse response;
  if (!Synced()) {
    response.failure_reason = "tessera is not ready: " + SyncState();
  } else if (!elector_->IsLeader()) {
    response.failure_reason = fmt::format(
        "this replica is not the leader ({}): only the leader refits; point the device plugin "
        "at the leader (hami.io/scheduler-role=leader)",
        elector_->Describe());
  } else {
    return scheduler_->Refit(request);
  }
  TESSERA_VLOGS(2, "refit", "pod", request.pod_namespace + "/" + request.pod_name, "outcome",
                response.failure_reason);
  return response;
}

std::string Service::Impl::DebugLedgerJson() {
  const ElectorStatus leader = elector_->status();
  nlohmann::json leadership = LeadershipJson(leader, elector_->Describe(), *writer_);
  leadership["role_labels"] = RoleLabelsJson(role_labels_->enabled(), role_labels_->stats());
  const ledger::FullSnapshot full = ledger_.Full();
  nlohmann::json doc = {{"synced", Synced()},
                        {"leadership", std::move(leadership)},
                        {"records", full.records},
                        {"nodes", NodesJson(full, *registry_)},
                        {"reservations", ReservationsJson(ledger_.Reservations())},
                        {"problems", ProblemsJson(ledger_.FindProblems())},
                        {"audit", AuditJson(auditor_->last())},
                        {"pod_feed", PodFeedJson(feed_->stats())}};
  return doc.dump(2) + "\n";
}

extender::WhyReply Service::Impl::DebugWhy(const extender::WhyRequest& why) {
  if (!Synced()) {
    return {503, "tessera is not ready: " + SyncState() + "\n"};
  }
  std::shared_ptr<const kube::Pod> pod = pods_->store().Get(why.ns + "/" + why.name);
  if (pod == nullptr) {
    return {404, fmt::format("pod {}/{} not found\n", why.ns, why.name)};
  }
  nlohmann::json doc = {{"pod", pod->Key()}};
  if (!pod->node_name.empty()) {
    doc["scheduled"] = pod->node_name;
    return {200, doc.dump() + "\n"};
  }
  absl::StatusOr<device::PodRequest> request = vendor_->DecodeRequest(*pod);
  absl::StatusOr<device::PodConstraints> constraints =
      request.ok() ? vendor_->DecodeConstraints(*pod) : request.status();
  if (!constraints.ok()) {
    doc["error"] = std::string(constraints.status().message()).substr(0, 512);
    return {200, doc.dump() + "\n"};
  }
  if (request->Empty()) {
    doc["error"] = "the pod asks for no device Tessera manages";
    return {200, doc.dump() + "\n"};
  }
  if (!why_mu_.TryLock()) {
    return {429, "another /debug/why replay is running; try again\n"};
  }
  extender::WhyReply reply = Replay(why, *pod, *std::move(request), *constraints, std::move(doc));
  why_mu_.Unlock();
  return reply;
}

extender::WhyReply Service::Impl::Replay(const extender::WhyRequest& why, const kube::Pod& pod,
                                         device::PodRequest request,
                                         const device::PodConstraints& constraints,
                                         nlohmann::json doc) {
  nlohmann::json what_if = nlohmann::json::object();
  if (why.gpumem > 0) {
    for (auto& c : request.containers) {
      if (c.has_value() && c->nums > 0) {
        c->memreq = why.gpumem;
        c->mem_percentage = device::kPercentageUnset;
      }
    }
    what_if["gpumem"] = why.gpumem;
  }
  // The replay's own ledger: the live one's nodes, records and reservations, without the pod's
  // own reservation and without the --if-deleted pod. The live ledger is only read.
  const ledger::FullSnapshot full = ledger_.Full();
  std::vector<std::shared_ptr<const device::NodeDevices>> nodes;
  std::vector<std::string> names;
  for (const ledger::NodeView& n : full.nodes) {
    nodes.push_back(n.devices);
    if (why.node.empty() || n.devices->node == why.node) {
      names.push_back(n.devices->node);
    }
  }
  auto removed = [&](std::string_view uid, std::string_view ns, std::string_view name) {
    return uid == pod.meta.uid ||
           (!why.if_deleted_name.empty() && ns == why.if_deleted_ns && name == why.if_deleted_name);
  };
  std::vector<ledger::PodAllocation> records = ledger_.Records();
  std::erase_if(records,
                [&](const ledger::PodAllocation& r) { return removed(r.uid, r.ns, r.name); });
  std::vector<ledger::Reservation> reservations = ledger_.Reservations();
  std::erase_if(reservations,
                [&](const ledger::Reservation& r) { return removed(r.uid, r.ns, r.name); });
  std::unique_ptr<ledger::Ledger> replay = ledger::Ledger::Recompute(nodes, records, reservations);
  if (!why.if_deleted_name.empty()) {
    what_if["if_deleted"] = why.if_deleted_ns + "/" + why.if_deleted_name;
  }
  if (!why.node.empty()) {
    what_if["node"] = why.node;
    if (names.empty()) {
      return {404, fmt::format("node {} has no device registration\n", why.node)};
    }
  }
  std::vector<schedule::Candidate> candidates(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    candidates[i].name = std::move(names[i]);
  }
  // The cycle as the filter runs it, on the replay's ledger: the namespace quota's usage too, so
  // --if-deleted frees the deleted pod's share.
  const cycle::Result run = cycle::Run(
      {.node_policy = options_.node_policy,
       .gpu_policy = options_.gpu_policy,
       .quotas = quotas_.get()},
      {.pod = &pod, .request = &request, .constraints = &constraints, .ledger = replay.get()},
      &candidates);
  doc["what_if"] = std::move(what_if);
  if (run.decision.winner) {
    doc["fits"] = candidates[*run.decision.winner].name;
    return {200, doc.dump() + "\n"};
  }
  const extender::Verdict verdict = extender::BuildVerdict(
      run.diagnosis,
      {.request = &request,
       .candidates = candidates,
       .ledger = replay.get(),
       .lock_of =
           [this](std::string_view node) {
             auto n = nodes_->store().Get(node);
             return n == nullptr
                        ? std::string()
                        : std::string(n->meta.annotations.Get(device::kNodeLockAnnotation));
           },
       .withheld = [this](std::string_view node) { return Withheld(node); }});
  doc["verdict"] = nlohmann::json::parse(extender::EncodeVerdict(verdict));
  return {200, doc.dump() + "\n"};
}

void Service::Impl::NoteRepair(std::string_view layer, std::string what) {
  constexpr size_t kMaxRepairs = 200;
  MutexLock lock(&repairs_mu_);
  repairs_.push_back({clock()->Now(), std::string(layer), std::move(what)});
  while (repairs_.size() > kMaxRepairs) {
    repairs_.pop_front();
  }
}

void Service::Impl::NoteRepairCounts(std::string_view layer,
                                     const std::map<std::string, int64_t>& counts) {
  MutexLock lock(&repairs_mu_);
  for (const auto& [what, n] : counts) {
    repair_totals_[std::string(layer)][what] += n;
  }
}

void Service::Impl::ReleaseAbsentReservations(absl::Time list_started, std::string_view layer) {
  std::vector<ledger::Reservation> released = scheduler_->ReleaseAbsent(
      list_started,
      [this](std::string_view uid) { return pods_->store().GetByUid(uid) != nullptr; });
  if (released.empty()) {
    return;
  }
  NoteRepairCounts(layer, {{"absent_reservation", static_cast<int64_t>(released.size())}});
  for (const ledger::Reservation& r : released) {
    NoteRepair(layer,
               fmt::format("absent_reservation {}/{} uid={} node={}", r.ns, r.name, r.uid, r.node));
    TESSERA_LOG(kInfo,
                "reservation of pod {}/{} on node {} ended: the pod is not in a list taken "
                "after it was made",
                r.ns, r.name, r.node);
  }
}

std::string Service::Impl::DebugAuditJson() {
  const accounting::AuditReport audit = auditor_->last();
  nlohmann::json audit_doc = AuditJson(audit);
  if (audit_doc.is_object()) {
    audit_doc["problems"] = ProblemsJson(audit.problems);
  }
  nlohmann::json recent = nlohmann::json::array();
  nlohmann::json totals = nlohmann::json::object();
  {
    MutexLock lock(&repairs_mu_);
    for (const Repair& r : repairs_) {
      recent.push_back({{"at", DebugTime(r.at)}, {"layer", r.layer}, {"what", r.what}});
    }
    for (const auto& [layer, counts] : repair_totals_) {
      totals[layer] = counts;
    }
  }
  nlohmann::json doc = {{"audit_period_s", absl::ToDoubleSeconds(options_.audit_period)},
                        {"resync_period_s", absl::ToDoubleSeconds(options_.resync_period)},
                        {"audit", std::move(audit_doc)},
                        {"resync", ResyncJson(resyncer_->last(), options_.resync_period)},
                        {"problems", ProblemsJson(ledger_.FindProblems())},
                        {"totals", std::move(totals)},
                        {"recent", std::move(recent)}};
  return doc.dump(2) + "\n";
}

absl::StatusOr<std::unique_ptr<Service>> Service::Start(const ServeOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  absl::Status status = impl->Init();
  if (!status.ok()) {
    impl->Stop();
    return status;
  }
  return std::unique_ptr<Service>(new Service(std::move(impl)));
}

Service::Service(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Service::~Service() { Stop(); }
void Service::Stop() { impl_->Stop(); }
bool Service::WaitForSync(absl::Duration timeout) const { return impl_->WaitForSync(timeout); }
int Service::port() const { return impl_->port(); }
int Service::metrics_port() const { return impl_->metrics_port(); }
std::string Service::MetricsText() const { return impl_->MetricsText(); }
std::string Service::DebugLedgerJson() const { return impl_->DebugLedgerJson(); }
bool Service::IsLeader() const { return impl_->IsLeader(); }
std::string Service::LeaderDescription() const { return impl_->LeaderDescription(); }
std::string Service::DebugAuditJson() const { return impl_->DebugAuditJson(); }
accounting::ResyncReport Service::ResyncNow() { return impl_->ResyncNow(); }

}  // namespace tessera::serve

#include "tessera/serve/service.h"

#include <array>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/node_registry.h"
#include "tessera/accounting/pod_feed.h"
#include "tessera/accounting/quota_book.h"
#include "tessera/accounting/resyncer.h"
#include "tessera/base/status_macros.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/annotations.h"
#include "tessera/device/device_config.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/verdict.h"
#include "tessera/kube/informer.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/build_revision.h"
#include "tessera/metrics/registry.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/score.h"
#include "tessera/serve/connection.h"
#include "tessera/serve/debug_json.h"
#include "tessera/serve/housekeeping.h"
#include "tessera/serve/informers.h"
#include "tessera/serve/leadership.h"
#include "tessera/serve/listeners.h"
#include "tessera/serve/preempting.h"
#include "tessera/serve/repairs.h"
#include "tessera/serve/requeueing.h"
#include "tessera/serve/scheduling.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::serve {

namespace {

// tessera_ledger_problems{kind}: the kinds Repairs::Audited sets after each audit.
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

// The options Start refuses before it connects (the device configuration and the node
// selector are checked where they are loaded).
absl::Status ValidateOptions(const ServeOptions& options) {
  if (options.reservation_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--reservation-ttl must be positive");
  }
  if (options.node_lock_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--node-lock-timeout must be positive");
  }
  if (options.node_lock_retry_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--node-lock-retry-timeout must not be negative");
  }
  return Elector::Validate(options.leader);
}

}  // namespace

// The parts in the order Init builds them (and the reverse of their destruction); each
// component owns its wiring (docs/serve.md "The assembly").
class Service::Impl : public extender::Backend {
 public:
  explicit Impl(ServeOptions options) : options_(std::move(options)) {}
  ~Impl() override { Stop(); }

  absl::Status Init();
  void Stop();

  bool WaitForSync(absl::Duration timeout) const { return informers_->WaitForSync(timeout); }
  int port() const { return listeners_->port(); }
  int metrics_port() const { return listeners_->metrics_port(); }

  // extender::Backend
  extender::FilterResult Filter(const extender::FilterArgs& args) override {
    return scheduling_->Filter(args);
  }
  extender::BindResult Bind(const extender::BindArgs& args) override {
    return scheduling_->Bind(args);
  }
  extender::RefitResponse Refit(const extender::RefitRequest& request) override {
    return scheduling_->Refit(request);
  }
  absl::StatusOr<extender::PreemptResult> Preempt(const extender::PreemptArgs& args) override {
    return scheduling_->Preempt(args);
  }
  bool Ready(std::string* why) override;
  std::string DebugLedgerJson() override;
  std::string DebugAuditJson() override {
    return repairs_->DebugAuditJson(*auditor_, *resyncer_, ledger_, options_.audit_period,
                                    options_.resync_period);
  }
  extender::WhyReply DebugWhy(const extender::WhyRequest& request) override;
  // DebugWhy's replay on a copy of the ledger, under why_mu_.
  extender::WhyReply Replay(const extender::WhyRequest& why, const kube::Pod& pod,
                            device::PodRequest request, const device::PodConstraints& constraints,
                            nlohmann::json doc);
  accounting::ResyncReport ResyncNow() { return resyncer_->RunOnce(); }

  bool IsLeader() const { return leadership_->IsLeader(); }
  std::string LeaderDescription() const { return leadership_->Describe(); }

  // A follower renders no device families (HAMi's followers show no node families either), so
  // that a sum over every scraped replica counts each device once (docs/metrics.md, "Replicas").
  std::string MetricsText() const {
    const bool leader = leadership_->IsLeader();
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
  Clock* clock() const { return options_.clock; }
  bool Synced() const { return informers_->Synced(); }
  std::string SyncState() const { return informers_->SyncState(); }
  bool Withheld(std::string_view node) const { return serve::Withheld(*registry_, node); }
  // After a complete LIST taken after `list_started` (a relist under `layer` "apply", a resync
  // pass under "resync"): Repairs::ReleaseAbsentReservations.
  void ReleaseAbsentReservations(absl::Time list_started, std::string_view layer) {
    repairs_->ReleaseAbsentReservations(&scheduling_->scheduler(), pods_->store(), list_started,
                                        layer);
  }

  const ServeOptions options_;
  const absl::Time started_ = clock()->Now();  // for the "informers synced" line

  std::unique_ptr<device::Vendor> vendor_;
  // A bound pod's allocation is Tessera's decision: a later rewrite of its annotations does not
  // change what the ledger holds (docs/self-healing.md "Pinned decisions").
  ledger::Ledger ledger_{ledger::LedgerOptions{.pin_decisions = true}};
  Connection connection_;
  std::unique_ptr<metrics::Registry> metrics_;
  std::unique_ptr<accounting::PodFeed> feed_;
  std::unique_ptr<accounting::NodeRegistry> registry_;
  // Namespace quota: the limits of the observed ResourceQuotas (usage is the ledger's).
  std::unique_ptr<accounting::QuotaBook> quotas_;
  std::unique_ptr<Repairs> repairs_;
  // Wakes the housekeeping loop; its Stop is the service's.
  Inbox inbox_;
  std::unique_ptr<Informers> informers_;
  kube::Informer<kube::Pod>* pods_ = nullptr;    // informers_'s, for DebugWhy
  kube::Informer<kube::Node>* nodes_ = nullptr;  // informers_'s, for Replay
  std::unique_ptr<Leadership> leadership_;
  std::unique_ptr<Scheduling> scheduling_;
  std::unique_ptr<accounting::Auditor> auditor_;
  std::unique_ptr<accounting::Resyncer> resyncer_;
  std::unique_ptr<Housekeeping> housekeeping_;
  std::unique_ptr<Requeueing> requeueing_;
  std::unique_ptr<Preempting> preempting_;  // --preemption=self only
  std::unique_ptr<Listeners> listeners_;

  // One /debug/why replay at a time (each copies the ledger); others are answered 429.
  Mutex why_mu_;
};

absl::Status Service::Impl::Init() {
  device::DeviceConfig config = device::DefaultDeviceConfig();
  if (!options_.device_config_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(config, device::LoadDeviceConfigFile(options_.device_config_file));
  }
  vendor_ = device::NewNvidiaVendor(config.nvidia);
  TESSERA_ASSIGN_OR_RETURN(accounting::NodeSelector selector,
                           accounting::NodeSelector::Parse(options_.node_label_selector));
  TESSERA_RETURN_IF_ERROR(ValidateOptions(options_));
  TESSERA_ASSIGN_OR_RETURN(connection_, Connection::Open(options_));

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
  quotas_ = std::make_unique<accounting::QuotaBook>(
      accounting::QuotaBook::Options{.memory_name = config.nvidia.resource_memory_name,
                                     .cores_name = config.nvidia.resource_core_name,
                                     .memory_factor = config.nvidia.memory_factor});
  repairs_ = std::make_unique<Repairs>(clock(), metrics_.get());
  informers_ = std::make_unique<Informers>(Informers::Parts{.client = connection_.client.get(),
                                                            .feed = feed_.get(),
                                                            .registry = registry_.get(),
                                                            .quotas = quotas_.get(),
                                                            .repairs = repairs_.get(),
                                                            .inbox = &inbox_,
                                                            .clock = clock(),
                                                            .pods_relisted =
                                                                [this](absl::Time list_started) {
                                                                  ReleaseAbsentReservations(
                                                                      list_started, "apply");
                                                                }},
                                           options_.min_watch_timeout);
  pods_ = &informers_->pods();
  nodes_ = &informers_->nodes();
  TESSERA_ASSIGN_OR_RETURN(leadership_,
                           Leadership::Create(options_.leader, options_.role_labels, connection_.ns,
                                              {.client = connection_.client.get(),
                                               .pods = pods_,
                                               .registry = registry_.get(),
                                               .metrics = metrics_.get(),
                                               .clock = clock()}));
  scheduling_ =
      std::make_unique<Scheduling>(options_, Scheduling::Parts{.vendor = vendor_.get(),
                                                               .ledger = &ledger_,
                                                               .quotas = quotas_.get(),
                                                               .client = connection_.client.get(),
                                                               .informers = informers_.get(),
                                                               .registry = registry_.get(),
                                                               .leadership = leadership_.get(),
                                                               .inbox = &inbox_,
                                                               .metrics = metrics_.get(),
                                                               .clock = clock()});
  auditor_ = std::make_unique<accounting::Auditor>(
      vendor_.get(), &ledger_, feed_.get(), [this] { return pods_->store().List(); },
      [this](std::string_view uid) { return pods_->store().GetByUid(uid); },
      [this] { return registry_->Registrations(); },
      accounting::AuditorOptions{.scheduler_name = options_.scheduler_name,
                                 .mig_realise_deadline = options_.reservation_ttl,
                                 .clock = clock()});
  resyncer_ = std::make_unique<accounting::Resyncer>(
      connection_.client.get(), pods_, nodes_,
      // Each replica its own jitter, so that replicas started
      // together do not LIST at the same moments.
      accounting::ResyncOptions{.period = options_.resync_period,
                                .pace = options_.resync_pace,
                                .clock = clock(),
                                .seed = std::random_device{}()},
      [this](const accounting::ResyncReport& report) {
        repairs_->Resynced(report);
        if (report.error.empty()) {
          ReleaseAbsentReservations(report.at, "resync");
        }
      });
  housekeeping_ =
      std::make_unique<Housekeeping>(Housekeeping::Parts{.inbox = &inbox_,
                                                         .leadership = leadership_.get(),
                                                         .registry = registry_.get(),
                                                         .scheduler = &scheduling_->scheduler(),
                                                         .informers = informers_.get(),
                                                         .repairs = repairs_.get(),
                                                         .auditor = auditor_.get(),
                                                         .metrics = metrics_.get(),
                                                         .clock = clock()},
                                     Housekeeping::Options{.period = options_.housekeeping_period,
                                                           .audit_period = options_.audit_period,
                                                           .started = started_});
  extender::Requeuer::Options requeue = options_.requeue;
  requeue.node_policy = options_.node_policy;
  requeue.gpu_policy = options_.gpu_policy;
  requeueing_ = std::make_unique<Requeueing>(
      requeue, options_.requeue_period,
      Requeueing::Parts{.vendor = vendor_.get(),
                        .ledger = &ledger_,
                        .quotas = quotas_.get(),
                        .client = connection_.client.get(),
                        .clock = clock(),
                        .verdicts = &scheduling_->scheduler().verdicts(),
                        .informers = informers_.get(),
                        .leadership = leadership_.get(),
                        .metrics = metrics_.get()});
  if (extender::SelfPreemptor* self = scheduling_->self_preemptor(); self != nullptr) {
    preempting_ = std::make_unique<Preempting>(options_.self_preempt_period,
                                               Preempting::Parts{.self = self,
                                                                 .informers = informers_.get(),
                                                                 .leadership = leadership_.get(),
                                                                 .metrics = metrics_.get()});
  }
  listeners_ = std::make_unique<Listeners>(
      options_,
      Listeners::Parts{.backend = this,
                       .transport = connection_.transport.get(),
                       .clock = clock(),
                       .nvidia = config.nvidia,
                       .self_username = connection_.self_username,
                       .metrics = [this] { return MetricsText(); },
                       .after_large_request =
                           [housekeeping = housekeeping_.get()] { housekeeping->TrimAgain(); }});
  TESSERA_RETURN_IF_ERROR(listeners_->Start());

  leadership_->Begin();  // the role before the first delivery
  informers_->Start();
  housekeeping_->Start();
  requeueing_->Start();
  if (preempting_ != nullptr) {
    preempting_->Start();
  }
  resyncer_->Start();
  listeners_->LogListening();
  return absl::OkStatus();
}

void Service::Impl::Stop() {
  if (!inbox_.Stop()) {  // wakes the housekeeping loop and every bind waiting for a lock
    return;
  }
  if (listeners_ != nullptr) {
    listeners_->Stop();
  }
  if (requeueing_ != nullptr) {
    requeueing_->Stop();
  }
  if (preempting_ != nullptr) {
    preempting_->Stop();
  }
  if (housekeeping_ != nullptr) {
    housekeeping_->Stop();
  }
  if (resyncer_ != nullptr) {
    resyncer_->Stop();  // before the informers, whose Reconcile it may be waiting for
  }
  if (leadership_ != nullptr) {
    leadership_->Stop();  // after the last write
  }
  if (informers_ != nullptr) {
    informers_->Stop();
  }
  scheduling_.reset();  // drains its event queue while the client still exists
}

// Readiness is the informers' sync for every role: a follower serves /filter and /bind from
// the same synced ledger (its kube-scheduler may call it); the role is reported, not gated on.
bool Service::Impl::Ready(std::string* why) {
  const bool synced = Synced();
  *why = fmt::format("{}\nrole: {}\n",
                     synced ? "ok: the pod and node informers have synced" : SyncState(),
                     leadership_->Describe());
  return synced;
}

std::string Service::Impl::DebugLedgerJson() {
  nlohmann::json leadership = leadership_->DebugJson();
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
  cycle::Decoded decoded = cycle::Decode(*vendor_, *pod, cycle::DecodeMode::kStrict);
  if (decoded.code == cycle::DecodeCode::kError) {
    doc["error"] = std::string(decoded.error.message()).substr(0, 512);
    return {200, doc.dump() + "\n"};
  }
  if (decoded.code == cycle::DecodeCode::kPassThrough) {
    doc["error"] = "the pod asks for no device Tessera manages";
    return {200, doc.dump() + "\n"};
  }
  if (!why_mu_.TryLock()) {
    return {429, "another /debug/why replay is running; try again\n"};
  }
  extender::WhyReply reply =
      Replay(why, *pod, std::move(decoded.request), decoded.constraints, std::move(doc));
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

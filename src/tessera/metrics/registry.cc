#include "tessera/metrics/registry.h"

#include <algorithm>
#include <locale>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

#include "tessera/base/mutex.h"

namespace tessera::metrics {
namespace {

// 50 µs … 5 s, 1-2.5-5 steps: a filter over 500 candidates takes ~100 µs, an API round trip
// during bind milliseconds, a stalled API server seconds.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
  return *buckets;
}

double Seconds(absl::Duration d) { return std::max(0.0, absl::ToDoubleSeconds(d)); }

}  // namespace

std::string CompilerId() {
#if defined(__clang__)
  return "clang " + std::to_string(__clang_major__) + "." + std::to_string(__clang_minor__) + "." +
         std::to_string(__clang_patchlevel__);
#elif defined(__GNUC__)
  return "gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string_view OutcomeName(FilterOutcome outcome) {
  switch (outcome) {
    case FilterOutcome::kScheduled:
      return "scheduled";
    case FilterOutcome::kUnschedulable:
      return "unschedulable";
    case FilterOutcome::kError:
      return "error";
    case FilterOutcome::kPassthrough:
      return "passthrough";
  }
  return "error";
}

std::string_view OutcomeName(BindOutcome outcome) {
  switch (outcome) {
    case BindOutcome::kBound:
      return "bound";
    case BindOutcome::kRejected:
      return "rejected";
    case BindOutcome::kError:
      return "error";
  }
  return "error";
}

std::string_view OutcomeName(PreemptOutcome outcome) {
  switch (outcome) {
    case PreemptOutcome::kVictims:
      return "victims";
    case PreemptOutcome::kNoVictims:
      return "no_victims";
    case PreemptOutcome::kNoNode:
      return "no_node";
    case PreemptOutcome::kError:
      return "error";
  }
  return "error";
}

struct Registry::Impl {
  explicit Impl(const Clock* c)
      : clock(c),
        registry(std::make_shared<prometheus::Registry>()),
        filter_duration(prometheus::BuildHistogram()
                            .Name("tessera_filter_duration_seconds")
                            .Help("Service time of /filter calls in seconds.")
                            .Register(*registry)
                            .Add({}, LatencyBuckets())),
        bind_duration(prometheus::BuildHistogram()
                          .Name("tessera_bind_duration_seconds")
                          .Help("Service time of /bind calls in seconds.")
                          .Register(*registry)
                          .Add({}, LatencyBuckets())),
        filter_decisions(prometheus::BuildCounter()
                             .Name("tessera_filter_decisions_total")
                             .Help("Filter decisions by outcome and reason.")
                             .Register(*registry)),
        bind_total(prometheus::BuildCounter()
                       .Name("tessera_bind_total")
                       .Help("Bind calls by outcome.")
                       .Register(*registry)),
        preempt_total(prometheus::BuildCounter()
                          .Name("tessera_preempt_total")
                          .Help("Preempt verb calls by outcome.")
                          .Register(*registry)),
        preempt_victims(prometheus::BuildCounter()
                            .Name("tessera_preempt_victims_total")
                            .Help("Victims the preempt verb added to kube-scheduler's.")
                            .Register(*registry)
                            .Add({})),
        self_evictions(prometheus::BuildCounter()
                           .Name("tessera_preempt_evictions_total")
                           .Help("Victims --preemption=self evicted, by outcome.")
                           .Register(*registry)),
        informer_synced(prometheus::BuildGauge()
                            .Name("tessera_informer_synced")
                            .Help("1 once the informer's initial list is in, else 0.")
                            .Register(*registry)),
        informer_age(prometheus::BuildGauge()
                         .Name("tessera_informer_last_event_age_seconds")
                         .Help("Seconds since the informer's last delivery.")
                         .Register(*registry)),
        informer_relists(prometheus::BuildCounter()
                             .Name("tessera_informer_relists_total")
                             .Help("Relists the informer performed.")
                             .Register(*registry)),
        informer_events(prometheus::BuildCounter()
                            .Name("tessera_informer_events_total")
                            .Help("Deliveries (watch events and listed items) the informer "
                                  "received.")
                            .Register(*registry)),
        reservations_in_flight(prometheus::BuildGauge()
                                   .Name("tessera_reservations_in_flight")
                                   .Help("Filter reservations not yet observed bound.")
                                   .Register(*registry)
                                   .Add({})),
        reservations_expired(prometheus::BuildCounter()
                                 .Name("tessera_reservations_expired_total")
                                 .Help("Reservations that outlived the reservation TTL.")
                                 .Register(*registry)
                                 .Add({})),
        audit_corrections(prometheus::BuildCounter()
                              .Name("tessera_ledger_audit_corrections_total")
                              .Help("Ledger entries the audit found wrong and repaired, by "
                                    "cause.")
                              .Register(*registry)),
        ledger_problems(prometheus::BuildGauge()
                            .Name("tessera_ledger_problems")
                            .Help("Ledger problems the last audit found, by kind.")
                            .Register(*registry)),
        allocation_rewrites(prometheus::BuildCounter()
                                .Name("tessera_allocation_rewrites_total")
                                .Help("Rewrites of a bound pod's allocation annotations the "
                                      "audit reported; the ledger kept Tessera's decision.")
                                .Register(*registry)
                                .Add({})),
        pending_pods(prometheus::BuildGauge()
                         .Name("tessera_pending_pods")
                         .Help("GPU pods the last filter left without a node, by the main reason "
                               "of their verdict (the leader's count; docs/metrics.md).")
                         .Register(*registry)),
        pods_requeued(prometheus::BuildCounter()
                          .Name("tessera_pending_pods_requeued_total")
                          .Help("Refused pods put back into kube-scheduler's queue because "
                                "capacity they fit in freed (docs/requeue.md).")
                          .Register(*registry)
                          .Add({})),
        resync_corrections(prometheus::BuildCounter()
                               .Name("tessera_resync_corrections_total")
                               .Help("Store entries a resync found wrong and repaired, by kind.")
                               .Register(*registry)),
        leader(
            prometheus::BuildGauge()
                .Name("tessera_leader")
                .Help(
                    "1 while this replica is the leader (it runs the background writers), else 0.")
                .Register(*registry)
                .Add({})),
        build_info(prometheus::BuildGauge()
                       .Name("tessera_build_info")
                       .Help("Build of this binary; the value is always 1.")
                       .Register(*registry)) {
    for (BindOutcome o : {BindOutcome::kBound, BindOutcome::kRejected, BindOutcome::kError}) {
      bind_total.Add({{"outcome", std::string(OutcomeName(o))}});
    }
    for (PreemptOutcome o : {PreemptOutcome::kVictims, PreemptOutcome::kNoVictims,
                             PreemptOutcome::kNoNode, PreemptOutcome::kError}) {
      preempt_total.Add({{"outcome", std::string(OutcomeName(o))}});
    }
    for (const char* o : {"evicted", "refused"}) {
      self_evictions.Add({{"outcome", o}});
    }
  }

  const Clock* const clock;
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Histogram& filter_duration;
  prometheus::Histogram& bind_duration;
  prometheus::Family<prometheus::Counter>& filter_decisions;
  prometheus::Family<prometheus::Counter>& bind_total;
  prometheus::Family<prometheus::Counter>& preempt_total;
  prometheus::Counter& preempt_victims;
  prometheus::Family<prometheus::Counter>& self_evictions;
  prometheus::Family<prometheus::Gauge>& informer_synced;
  prometheus::Family<prometheus::Gauge>& informer_age;
  prometheus::Family<prometheus::Counter>& informer_relists;
  prometheus::Family<prometheus::Counter>& informer_events;
  prometheus::Gauge& reservations_in_flight;
  prometheus::Counter& reservations_expired;
  prometheus::Family<prometheus::Counter>& audit_corrections;
  prometheus::Family<prometheus::Gauge>& ledger_problems;
  prometheus::Counter& allocation_rewrites;
  prometheus::Family<prometheus::Gauge>& pending_pods;
  prometheus::Counter& pods_requeued;
  prometheus::Family<prometheus::Counter>& resync_corrections;
  prometheus::Gauge& leader;
  prometheus::Family<prometheus::Gauge>& build_info;

  Mutex mu;
  absl::flat_hash_map<std::string, absl::Time> last_event ABSL_GUARDED_BY(mu);
};

Registry::Registry(const BuildInfo& build, const Clock* clock)
    : impl_(std::make_unique<Impl>(clock)) {
  impl_->build_info
      .Add({{"version", build.version}, {"revision", build.revision}, {"compiler", build.compiler}})
      .Set(1);
}

Registry::~Registry() = default;

void Registry::DeclareKnownLabels(const KnownLabels& known) {
  for (const auto& [outcome, reason] : known.filter_decisions) {
    impl_->filter_decisions.Add(
        {{"outcome", std::string(OutcomeName(outcome))}, {"reason", reason}});
  }
  for (const std::string& resource : known.informer_resources) {
    impl_->informer_synced.Add({{"resource", resource}});
    impl_->informer_relists.Add({{"resource", resource}});
    impl_->informer_events.Add({{"resource", resource}});
  }
  for (const std::string& cause : known.audit_causes) {
    impl_->audit_corrections.Add({{"cause", cause}});
  }
  for (const std::string& kind : known.ledger_problem_kinds) {
    impl_->ledger_problems.Add({{"kind", kind}});
  }
  for (const std::string& reason : known.pending_reasons) {
    impl_->pending_pods.Add({{"reason", reason}});
  }
  for (const std::string& kind : known.resync_kinds) {
    impl_->resync_corrections.Add({{"kind", kind}});
  }
}

void Registry::RecordFilter(FilterOutcome outcome, std::string_view reason,
                            absl::Duration latency) {
  impl_->filter_duration.Observe(Seconds(latency));
  impl_->filter_decisions
      .Add({{"outcome", std::string(OutcomeName(outcome))}, {"reason", std::string(reason)}})
      .Increment();
}

void Registry::RecordBind(BindOutcome outcome, absl::Duration latency) {
  impl_->bind_duration.Observe(Seconds(latency));
  impl_->bind_total.Add({{"outcome", std::string(OutcomeName(outcome))}}).Increment();
}

void Registry::RecordPreempt(PreemptOutcome outcome, int64_t victims) {
  impl_->preempt_total.Add({{"outcome", std::string(OutcomeName(outcome))}}).Increment();
  if (victims > 0) {
    impl_->preempt_victims.Increment(static_cast<double>(victims));
  }
}

void Registry::RecordSelfEvictions(int64_t evicted, int64_t refused) {
  if (evicted > 0) {
    impl_->self_evictions.Add({{"outcome", "evicted"}}).Increment(static_cast<double>(evicted));
  }
  if (refused > 0) {
    impl_->self_evictions.Add({{"outcome", "refused"}}).Increment(static_cast<double>(refused));
  }
}

void Registry::SetInformerSynced(std::string_view resource, bool synced) {
  impl_->informer_synced.Add({{"resource", std::string(resource)}}).Set(synced ? 1 : 0);
}

void Registry::RecordInformerEvents(std::string_view resource, int64_t n) {
  if (n > 0) {
    impl_->informer_events.Add({{"resource", std::string(resource)}})
        .Increment(static_cast<double>(n));
  }
  const absl::Time now = impl_->clock->Now();
  MutexLock lock(&impl_->mu);
  absl::Time& last = impl_->last_event[std::string(resource)];
  last = std::max(last, now);
}

void Registry::RecordInformerRelist(std::string_view resource) {
  impl_->informer_relists.Add({{"resource", std::string(resource)}}).Increment();
}

void Registry::RecordAllocationRewrites(int64_t n) {
  if (n > 0) {
    impl_->allocation_rewrites.Increment(static_cast<double>(n));
  }
}

void Registry::RecordReservationsExpired(int64_t n) {
  if (n > 0) {
    impl_->reservations_expired.Increment(static_cast<double>(n));
  }
}

void Registry::RecordRequeues(int64_t n) {
  if (n > 0) {
    impl_->pods_requeued.Increment(static_cast<double>(n));
  }
}

void Registry::RecordAuditCorrections(std::string_view cause, int64_t n) {
  if (n > 0) {
    impl_->audit_corrections.Add({{"cause", std::string(cause)}}).Increment(static_cast<double>(n));
  }
}

void Registry::SetLedgerProblems(std::string_view kind, int64_t n) {
  impl_->ledger_problems.Add({{"kind", std::string(kind)}}).Set(static_cast<double>(n));
}

void Registry::SetPendingPods(std::string_view reason, int64_t n) {
  impl_->pending_pods.Add({{"reason", std::string(reason)}}).Set(static_cast<double>(n));
}

void Registry::RecordResyncCorrections(std::string_view kind, int64_t n) {
  if (n > 0) {
    impl_->resync_corrections.Add({{"kind", std::string(kind)}}).Increment(static_cast<double>(n));
  }
}

void Registry::SetLeader(bool leader) { impl_->leader.Set(leader ? 1 : 0); }

void Registry::Render(const ledger::FullSnapshot& snapshot, bool legacy,
                      absl::FunctionRef<void(std::string_view)> sink) const {
  RenderDeviceFamilies(snapshot, legacy, sink);

  impl_->reservations_in_flight.Set(static_cast<double>(snapshot.reservations));
  {
    const absl::Time now = impl_->clock->Now();
    MutexLock lock(&impl_->mu);
    for (const auto& [resource, last] : impl_->last_event) {
      impl_->informer_age.Add({{"resource", resource}}).Set(Seconds(now - last));
    }
  }

  std::vector<prometheus::MetricFamily> families = impl_->registry->Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) {
              return a.name < b.name;
            });
  std::ostringstream out;
  out.imbue(std::locale::classic());
  prometheus::TextSerializer().Serialize(out, families);
  sink(out.view());
}

std::string Registry::Render(const ledger::FullSnapshot& snapshot, bool legacy) const {
  std::string out;
  Render(snapshot, legacy, [&out](std::string_view piece) { out.append(piece); });
  return out;
}

}  // namespace tessera::metrics

// File: tessera/metrics/registry.h
//
// metrics::Registry owns Tessera's own metric families (latencies, decisions, informer state,
// reservations, corrections, leadership, build info) and renders the whole /metrics body of
// `tessera serve`: HAMi's device families (device_families.h) plus these, in the Prometheus text
// format 0.0.4. Callers use typed methods; prometheus-cpp stays inside. The families, their
// labels and buckets: docs/metrics.md "Tessera's own families".
//
// Label values passed as strings must come from a small fixed vocabulary, never a pod or node
// name. A large cluster's body is ~99 MB, so serve it with the streaming Render.
//
// Errors: none.
//
// Thread safety: every method may be called concurrently from any thread; a Render sees each
// counter at some instant, not all counters at one instant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/device_families.h"

namespace tessera::metrics {

struct BuildInfo {
  std::string version;   // e.g. "0.1.0"
  std::string revision;  // e.g. a git commit; empty if unknown
  std::string compiler;  // e.g. CompilerId()
};

// "gcc 12.2.0" / "clang 14.0.6": the compiler this library was built with.
std::string CompilerId();

enum class FilterOutcome {
  kScheduled,      // at least one node fits
  kUnschedulable,  // no candidate fits
  kError,          // the request could not be answered (bad input, internal error)
  kPassthrough,    // the pod asks for no managed device: all candidates pass untouched
};

enum class BindOutcome {
  kBound,     // the binding was created
  kRejected,  // refused before binding (no reservation, devices no longer free, lock held)
  kError,     // an API call failed
};

// One /preempt call (docs/preemption.md).
enum class PreemptOutcome {
  kVictims,    // Tessera named victims of its own on at least one node
  kNoVictims,  // nodes kept, none needing a victim of Tessera's (kube-scheduler's, or room)
  kNoNode,     // no node kept: no eviction makes room, or preemptionPolicy Never
  kError,      // the request or the budgets could not be read
};

// The label value an outcome is exported as ("scheduled", "bound", …).
std::string_view OutcomeName(FilterOutcome outcome);
std::string_view OutcomeName(BindOutcome outcome);
std::string_view OutcomeName(PreemptOutcome outcome);

// The label values of the labelled families, exported at 0 from the start so that a counter's
// rate is defined before its first event and an alert on `increase()` sees the first one.
struct KnownLabels {
  // tessera_filter_decisions_total{outcome,reason}
  std::vector<std::pair<FilterOutcome, std::string>> filter_decisions;
  // tessera_informer_{synced,relists_total,events_total}{resource}
  std::vector<std::string> informer_resources;
  std::vector<std::string> audit_causes;          // tessera_ledger_audit_corrections_total{cause}
  std::vector<std::string> ledger_problem_kinds;  // tessera_ledger_problems{kind}
  std::vector<std::string> resync_kinds;          // tessera_resync_corrections_total{kind}
  std::vector<std::string> pending_reasons;       // tessera_pending_pods{reason}
};

class Registry {
 public:
  // `clock` (not owned, must outlive the registry) dates informer deliveries and renders.
  explicit Registry(const BuildInfo& build, const Clock* clock = Clock::Real());
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Creates every series `known` names, at 0 (a series that exists already keeps its value).
  void DeclareKnownLabels(const KnownLabels& known);

  // One /filter call: its decision and its service time (negative durations count as 0).
  void RecordFilter(FilterOutcome outcome, std::string_view reason, absl::Duration latency);
  // One /bind call.
  void RecordBind(BindOutcome outcome, absl::Duration latency);
  // One /preempt call, and how many victims Tessera added to kube-scheduler's.
  void RecordPreempt(PreemptOutcome outcome, int64_t victims);
  // Evictions --preemption=self made: `evicted` victims gone, `refused` that the API server
  // refused (a disruption budget, a failure).
  void RecordSelfEvictions(int64_t evicted, int64_t refused);

  // Informers, per resource ("pods", "nodes", "leases"…).
  void SetInformerSynced(std::string_view resource, bool synced);
  // `n` deliveries (watch events or the items of a list) just arrived: counts them and restarts
  // the resource's last-event age at the clock's Now().
  void RecordInformerEvents(std::string_view resource, int64_t n = 1);
  void RecordInformerRelist(std::string_view resource);

  void RecordReservationsExpired(int64_t n);
  void RecordAuditCorrections(std::string_view cause, int64_t n);
  // The number of ledger problems of `kind` the last audit found (a gauge).
  void SetLedgerProblems(std::string_view kind, int64_t n);
  // `n` allocation rewrites of bound pods the audit reported for the first time (a counter).
  void RecordAllocationRewrites(int64_t n);
  void RecordResyncCorrections(std::string_view kind, int64_t n);
  // GPU pods whose last filter left them without a node, by the verdict's main reason (a gauge).
  void SetPendingPods(std::string_view reason, int64_t n);
  // `n` refused pods put back into kube-scheduler's queue (extender/requeue.h).
  void RecordRequeues(int64_t n);
  void SetLeader(bool leader);

  // The whole /metrics body: RenderDeviceFamilies(snapshot, legacy), then Tessera's families
  // sorted by name. Sets tessera_reservations_in_flight from `snapshot` and refreshes the
  // informer ages first. Streams pieces to `sink`.
  void Render(const ledger::FullSnapshot& snapshot, bool legacy,
              absl::FunctionRef<void(std::string_view)> sink) const;
  std::string Render(const ledger::FullSnapshot& snapshot, bool legacy) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::metrics

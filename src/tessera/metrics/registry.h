// File: tessera/metrics/registry.h
//
// tessera::metrics::Registry owns Tessera's own metric families (latencies, decisions, informer
// state, reservations, corrections, leadership, build info) and renders the whole /metrics body
// of `tessera serve`: HAMi's device families from one ledger snapshot (device_families.h) plus
// these, in the Prometheus text exposition format 0.0.4 (Content-Type kTextContentType).
// Callers use typed methods only; prometheus-cpp stays an implementation detail.
//
// Families (none carries the zone label; that belongs to HAMi's families):
//   tessera_filter_duration_seconds            histogram   /filter service time
//   tessera_bind_duration_seconds              histogram   /bind service time
//     buckets (s): 50µs 100µs 250µs 500µs 1ms 2.5ms 5ms 10ms 25ms 50ms 100ms 250ms 500ms 1 2.5 5
//   tessera_filter_decisions_total{outcome,reason}  counter  outcome: scheduled | unschedulable |
//                                                            error | passthrough
//   tessera_bind_total{outcome}                counter     outcome: bound | rejected | error
//   tessera_informer_synced{resource}          gauge       1 once the initial list is in, else 0
//   tessera_informer_last_event_age_seconds{resource}  gauge  seconds since the last delivery,
//                                              computed at render time from the Clock; absent
//                                              until the resource's first delivery
//   tessera_informer_relists_total{resource}   counter
//   tessera_informer_events_total{resource}    counter
//   tessera_reservations_in_flight             gauge       FullSnapshot::reservations of the
//                                              snapshot given to Render
//   tessera_reservations_expired_total         counter
//   tessera_ledger_audit_corrections_total{cause}   counter
//   tessera_ledger_problems{kind}              gauge       as of the last audit: conflict, orphan,
//                                              unregistered, unreadable (pods whose allocation
//                                              does not decode, each blocking its node),
//                                              foreign_allocation
//   tessera_resync_corrections_total{kind}     counter
//   tessera_leader                             gauge       1 while this replica leads (runs the
//                                              background writers; serve/leader.h), else 0
//   tessera_build_info{version,revision,compiler}   gauge  always 1
// Label values given as strings (reason, resource, cause, kind) become time series: callers
// must pass values from a small fixed vocabulary (e.g. "pods", "nodes"; "stale", "missing",
// "changed"), never a pod or node name. An empty value is allowed. The bind outcomes are always
// present (at 0); the other labelled series appear at their first use, and a family without
// series (e.g. tessera_informer_events_total before any delivery) is left out of the text.
//
// Serving: a large cluster's body is big (5,000 nodes x 8 GPUs with 100,000 pods: ~99 MB, ~190 MB
// with legacy names), so the /metrics handler should use the streaming Render and pass pieces on
// as chunks rather than build the string. Which snapshot a follower replica renders (its own, or
// an empty one, as HAMi's followers show no node families) is the server's decision.
//
// Thread safety: every method may be called concurrently from any thread (the families are
// prometheus-cpp's, whose metrics are atomic; the informer clock readings are mutex-guarded).
// A Render sees each counter at some instant, not all counters at one instant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

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

// The label value an outcome is exported as ("scheduled", "bound", …).
std::string_view OutcomeName(FilterOutcome outcome);
std::string_view OutcomeName(BindOutcome outcome);

class Registry {
 public:
  // `clock` (not owned, must outlive the registry) dates informer deliveries and renders.
  explicit Registry(const BuildInfo& build, const Clock* clock = Clock::Real());
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // One /filter call: its decision and its service time (negative durations count as 0).
  void RecordFilter(FilterOutcome outcome, std::string_view reason, absl::Duration latency);
  // One /bind call.
  void RecordBind(BindOutcome outcome, absl::Duration latency);

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
  void RecordResyncCorrections(std::string_view kind, int64_t n);
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

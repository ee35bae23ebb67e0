// File: tessera/cycle/cycle.h
//
// The decision cycle: one pod, its candidate nodes and a view of the ledger in; the decision
// (reserved, for the live filter) or its diagnosis out. Every front end decides through it — the
// live /filter (extender/scheduler.h), the /debug/why replay (serve), `tessera explain` and the
// benchmarks' simulated filter — so a rule added to a stage holds for all of them. The stages, each
// one function with a typed outcome, and where vendors, preemption and DRA plug in:
// docs/decision-cycle.md.
//
//   Decoded d = Decode(vendor, pod, DecodeMode::kFilter);        // request | pass-through | error
//   std::vector<schedule::Candidate> candidates = ...;          // names (and busy marks)
//   Result r = Run(config, {.pod = &pod, .request = &d.request,
//                           .constraints = &d.constraints, .ledger = &ledger}, &candidates);
//   if (r.decision.winner) { ... } else { r.diagnosis.failed ... }
//
// Errors: Decode's error is the vendor's (InvalidArgument naming the container and field); Run's
// only failure is the reserve stage's, in Result::reserved.
// Thread safety: free functions. Run reads the ledger of its input (thread-safe) and reserves in
// Input::reserve_in; a caller that must decide and reserve atomically holds its own lock across
// the call (the filter's decision lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

#include "tessera/accounting/quota_book.h"
#include "tessera/cycle/diagnosis.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/quota.h"
#include "tessera/schedule/score.h"

namespace tessera::cycle {

// ---- stage 1: decode ------------------------------------------------------------------------

enum class DecodeCode : uint8_t {
  kRequest,      // the pod asks for managed devices: request and constraints are set
  kPassThrough,  // it asks for none: HAMi passes the input nodes through untouched
  kError,        // its requests or constraint annotations are malformed: `error`
};

enum class DecodeMode : uint8_t {
  // HAMi's filter: a pod that asks for no device passes through before its constraint
  // annotations are read (a malformed one does not fail it).
  kFilter,
  // Both are read before anything is decided: a malformed annotation is an error even for a pod
  // that asks for no device (`tessera explain`, the filter's re-read of the stored pod).
  kStrict,
};

struct Decoded {
  DecodeCode code = DecodeCode::kError;
  absl::Status error;  // kError
  device::PodRequest request;
  // kRequest; kPassThrough only in DecodeMode::kStrict (else default).
  device::PodConstraints constraints;
};

Decoded Decode(const device::Vendor& vendor, const kube::Pod& pod, DecodeMode mode);

// ---- stages 2-6: snapshot, pre-checks, fit, score, pick, reserve, diagnose ---------------------

// The defaults a pod's own policy annotations override, and the namespace limits.
struct Config {
  device::NodePolicy node_policy = device::NodePolicy::kBinpack;
  device::GpuPolicy gpu_policy = {};              // spread
  const accounting::QuotaBook* quotas = nullptr;  // null: no namespace is limited
};

// The snapshot of candidate `index`, which the ledger does not know (e.g. a Nodes request's
// template node decoded from its own registration); nullopt: unregistered.
using UnknownNode = std::function<std::optional<device::NodeSnapshot>(size_t index)>;

struct Input {
  const kube::Pod* pod = nullptr;  // its namespace's quota; the reservation's uid, ns and name
  const device::PodRequest* request = nullptr;  // Decode's, or a what-if of it
  const device::PodConstraints* constraints = nullptr;
  // The view decided on: the live ledger (read under the caller's lock when it reserves) or a
  // copy with what-ifs (the why replay's recomputed ledger).
  const ledger::Ledger* ledger = nullptr;
  UnknownNode unknown = nullptr;  // may be null: a node the ledger does not know is unregistered
  // Reserve stage: when set, the winner's devices (and MIG placements) are reserved here for
  // the pod until `expiry`. Null: nothing is reserved (a replay, explain, a Nodes request).
  ledger::Ledger* reserve_in = nullptr;
  absl::Time expiry = {};
  // Diagnose stage: false leaves Result::diagnosis empty, for a caller that diagnoses after
  // releasing its lock (Diagnose(candidates, decision, quota)).
  bool diagnose = true;
};

struct Result {
  schedule::NamespaceQuota quota;  // pre-checks: the namespace's limits and usage in the view
  schedule::Decision decision;     // fit per node, score, pick
  absl::Status reserved;           // reserve: OK, or why the winner's devices were refused
  Diagnosis diagnosis;             // diagnose
};

// Snapshot stage: each candidate's snapshot from `in.ledger` (else from `in.unknown`).
void Snapshot(const Input& in, std::vector<schedule::Candidate>* candidates);
// Pre-checks: the namespace quota bound the fit checks every card against (unlimited without
// config.quotas or limits).
schedule::NamespaceQuota PreCheck(const Config& config, const Input& in);
// Fit per node, score, pick (schedule::Decide: one pass, the pick incremental over the fits).
schedule::Decision Place(const Config& config, const Input& in,
                         const std::vector<schedule::Candidate>& candidates,
                         const schedule::NamespaceQuota& quota);
// Reserve: the winner's devices held in in.reserve_in until in.expiry (OK when nothing won).
absl::Status Reserve(const Input& in, const std::vector<schedule::Candidate>& candidates,
                     const schedule::Decision& decision);

// The cycle: Snapshot → PreCheck → Place → Reserve (with reserve_in) → Diagnose (with
// diagnose). `candidates` comes with names (and busy marks) and leaves with the snapshots decided
// on; the decision's nodes and winner index it.
Result Run(const Config& config, const Input& in, std::vector<schedule::Candidate>* candidates);

}  // namespace tessera::cycle

// File: tessera/extender/preempt.h
//
// Preemptor answers kube-scheduler's /preempt (the extender's preemptVerb): for each node
// kube-scheduler offers, the victims that let the pod fit on concrete devices — kube-scheduler's
// own victims (its in-tree resources need them) plus the fewest device holders of lower priority
// (cycle/preempt.h's rule), or the node left out when no eviction would make room. Why and how:
// docs/preemption.md.
//
//   Preemptor preemptor({.ledger = &ledger, .lookup = lookup, .vendor = vendor, .config = c});
//   absl::StatusOr<PreemptResult> r = preemptor.Preempt(args, &outcome);
//
// Errors: InvalidArgument when the pod's device requests or constraint annotations do not decode
// (the reply is a 400; kube-scheduler then preempts nothing for it); Unavailable when the
// disruption budgets cannot be read (victims are never chosen blind to them). Nothing is
// written: the answer is advisory, kube-scheduler evicts.
// Thread safety: Preempt is const and may run concurrently; the ledger and lookup must be
// thread-safe and outlive the Preemptor.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/cycle/cycle.h"
#include "tessera/cycle/preempt.h"
#include "tessera/device/vendor.h"
#include "tessera/extender/wire.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::extender {

// What a Preempt call did (logs, tests).
struct PreemptOutcome {
  // The informer holds the pod of the body's uid, and it was decided on (else the body's pod,
  // which nothing else vouches for: the caller must not write about it).
  bool stored = false;
  bool pass_through = false;  // the pod asks for no managed device: the offer is returned as is
  bool never = false;         // preemptionPolicy: Never: no node is returned
  // Per node kept, in name order: the victims Tessera added to kube-scheduler's.
  std::vector<std::pair<std::string, std::vector<cycle::PotentialVictim>>> added;
  std::vector<std::string> dropped;  // nodes where no eviction makes room, in name order
};

// "ns/name,ns/name" (events, logs).
std::string VictimNames(const std::vector<cycle::PotentialVictim>& victims);

// Why an answer does not help its pod, for the verdict (Verdict::preemption): "preemptionPolicy
// Never: ..." or "no eviction of lower-priority pods frees a GPU share on N nodes"; empty when
// it kept a node (or the pod asks for no device).
std::string PreemptionNote(const PreemptOutcome& outcome, const PreemptResult& result);

class Preemptor {
 public:
  struct Deps {
    const ledger::Ledger* ledger = nullptr;
    // A pod by namespace and name from the informer (its priority, start time, uid); null: only
    // kube-scheduler's victims are known, Tessera adds none.
    std::function<std::optional<kube::Pod>(std::string_view ns, std::string_view name)> lookup;
    const device::Vendor* vendor = nullptr;  // required
    cycle::Config config;
    // Which of `pods` (the lower-priority candidates on `node`, most important first) would
    // violate a PodDisruptionBudget if evicted, parallel to `pods` (disruption_budgets.h); an
    // error fails the call (Unavailable). Null: none would.
    std::function<absl::StatusOr<std::vector<bool>>(std::string_view node,
                                                    const std::vector<const kube::Pod*>& pods)>
        budget_violations;
  };

  explicit Preemptor(Deps deps);

  absl::StatusOr<PreemptResult> Preempt(const PreemptArgs& args,
                                        PreemptOutcome* outcome = nullptr) const;

 private:
  Deps deps_;
};

}  // namespace tessera::extender

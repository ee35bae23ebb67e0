// File: tessera/sim/preemption_oracle.h
//
// The preemption part of `tessera simulate`'s oracle (issue #36): were the scheduler's victims
// all of lower priority than the pod they were evicted for, and was none of them needless? It
// judges each preemption — the victims evicted on one node for one pod in one round, grouped
// by the scheduler's `Preempted` events — against the node's pods as apisim recorded them just
// before the first eviction, with a fit rule of its own written from HAMi's protocol (free
// slots, memory and cores per card; docs/simulate.md "Preemption"), not from Tessera's code.
// A victim is needless when the pod fits on the node with every other victim evicted and that
// one kept. Where the recorded state may differ from the one the scheduler decided on, the
// preemption is counted but not judged: a pod left the node within `quiet` of the eviction,
// another preemptor's nomination holds part of the node, or the pod's request is one the rule
// does not model (several GPU containers, device selectors, NUMA, MIG).
//
//   PreemptionInput in{.evictions = *ParseEvictions(apisim_body),
//                      .events = *ParsePreemptedEvents(event_list), ...};
//   PreemptionFindings f = JudgePreemptions(in);
//
// Errors: ParseEvictions and ParsePreemptedEvents return InvalidArgument for a body that is not
// their JSON shape; events of other reasons, or whose message does not parse, are skipped.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/kube/objects.h"

namespace tessera::sim {

// One eviction apisim recorded (GET /simulator/v1/evictions).
struct EvictionRecord {
  std::string ns, name, uid, node;
  absl::Time at;
  std::vector<kube::Pod> node_pods;  // the node's pods just before (bound or reserved there)
};
absl::StatusOr<std::vector<EvictionRecord>> ParseEvictions(std::string_view json);

// A `Preempted` event on a victim: "Tessera evicted this pod to free a GPU share on NODE for
// NS/NAME (priority P)".
struct PreemptedEvent {
  std::string victim_uid;
  std::string node, preemptor;  // preemptor "namespace/name"
};
// From a v1 EventList.
absl::StatusOr<std::vector<PreemptedEvent>> ParsePreemptedEvents(std::string_view json);

struct PreemptionInput {
  std::vector<EvictionRecord> evictions;
  std::vector<PreemptedEvent> events;
  std::vector<kube::Node> nodes;
  // The pods of the workload as created, by "namespace/name", with when each was bound (and
  // where): the preemptors' requests and priorities, and their outcome.
  struct WorkloadPod {
    kube::Pod pod;
    std::string node;  // bound to; empty: never bound
    absl::Time bound_at = absl::InfiniteFuture();
  };
  std::map<std::string, WorkloadPod> pods;
  // When a workload pod stopped holding devices on a node (finished or deleted), as the run
  // book saw it (after the API server did).
  struct Departure {
    std::string pod;  // "namespace/name"
    std::string node;
    absl::Time at;
  };
  std::vector<Departure> departures;
  // A departure from the node in [first eviction − quiet, first eviction + quiet / 4], other
  // than the round's own victims', leaves the round unjudged.
  absl::Duration quiet = absl::Seconds(1);
};

struct PreemptionFindings {
  int64_t preemptions = 0;   // rounds: victims on one node for one pod
  int64_t victims = 0;       // evictions a Preempted event attributes
  int64_t unattributed = 0;  // evictions without one
  int64_t judged = 0;        // preemptions whose victims were judged one by one
  int64_t unjudged_changed = 0, unjudged_nominated = 0, unjudged_request = 0;
  int64_t bound_there = 0, bound_elsewhere = 0, never_bound = 0;  // the preemptors
  struct Finding {
    absl::Time at;
    std::string what;
  };
  std::vector<Finding> violations;
};

PreemptionFindings JudgePreemptions(const PreemptionInput& in);

// The oracle's fit rule, exposed for its tests: whether `pod` (one GPU container, no device
// selectors) fits on `node` beside `pods`. nullopt: a request the rule does not model.
std::optional<bool> FitsOnNode(const kube::Pod& pod, const kube::Node& node,
                               const std::vector<kube::Pod>& pods);

}  // namespace tessera::sim

// File: tessera/extender/self_preempt.h
//
// SelfPreemptor: preemption where kube-scheduler cannot ask for it (--preemption=self; before
// Kubernetes 1.38 its dry run never calls the extender for resources it ignores). A pending pod
// of priority above 0 that Tessera refused, still refused after a settle time and without a
// nomination, is preempted for by the Preemptor's own rule over the nodes of its last filter
// (those passed kube-scheduler's in-tree filters); the node is chosen in kube-scheduler's order
// (pickOneNodeForPreemption), its victims evicted through the Eviction API (the API server
// enforces the budgets) and the share they free nominated for the pod (Scheduler::Nominate).
// Why and how: docs/preemption.md "Before Kubernetes 1.38".
//
//   SelfPreemptor self(options, {.preemptor = &p, .scheduler = &s, .client = c, .lookup = l});
//   self.Refused(pod, names);   // from the filter that refused it
//   self.Round();               // from one thread, every period while leading
//
// Errors: an eviction refused (429: a budget; any other failure) abandons the pod's round and
// is logged; the pod is tried again at a later round. Thread safety: Refused from any thread;
// Round from one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/extender/preempt.h"
#include "tessera/extender/scheduler.h"
#include "tessera/kube/client.h"

namespace tessera::extender {

// One node's answer for a pod, as pickOneNodeForPreemption ranks it.
struct PreemptionCandidate {
  std::string node;
  std::vector<cycle::PotentialVictim> victims;
  int64_t pdb_violations = 0;
};

// The index in `candidates` kube-scheduler would pick: fewest budget violations, then the
// lowest highest victim priority, then the lowest sum of priorities, then the fewest victims,
// then the latest start among each node's most important victims, then the first. nullopt when
// `candidates` is empty.
std::optional<size_t> PickNode(const std::vector<PreemptionCandidate>& candidates);

class SelfPreemptor {
 public:
  struct Options {
    // How long a refusal must last before anyone is evicted (kube-scheduler may still be
    // retrying the pod, or capacity freeing).
    absl::Duration settle = absl::Seconds(5);
    // Refused pods remembered at most (the newest refusals beyond it are not).
    size_t max_pods = 1000;
  };
  struct Deps {
    const Preemptor* preemptor = nullptr;
    Scheduler* scheduler = nullptr;  // Nominate, events
    kube::ApiClient* client = nullptr;
    Clock* clock = nullptr;
    PodLookup lookup;  // the informer's pod
  };
  // What the rounds did (logs, metrics, tests).
  struct Counts {
    uint64_t preempted = 0;  // pods a node was freed for
    uint64_t evicted = 0;    // victims evicted
    uint64_t refused = 0;    // evictions the API server refused (a budget, a failure)
    uint64_t hopeless = 0;   // rounds where no eviction would let the pod fit
  };

  SelfPreemptor(Options options, Deps deps);

  // A filter refused `pod` on `nodes` (the names kube-scheduler sent).
  void Refused(const kube::Pod& pod, std::vector<std::string> nodes);
  void Round();
  Counts counts() const;
  size_t tracked() const;

 private:
  struct Refusal {
    std::string ns, name;
    std::vector<std::string> nodes;
    absl::Time since;
  };
  // Preempts for one pod; false keeps it for a later round.
  bool PreemptFor(const kube::Pod& pod, const std::vector<std::string>& nodes);

  const Options options_;
  const Deps deps_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Refusal> refused_ ABSL_GUARDED_BY(mu_);  // by uid
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::extender

// File: tessera/sim/mig_oracle.h
//
// The MIG part of `tessera simulate`'s oracle (issue #26), computed like the rest of the truth
// from the API server's objects and HAMi v2.10's protocol, not from Tessera's code:
//   - the instances on each `mig` card: over the pods holding devices (the truth's rule,
//     HeldAllocation), every entry of their hami.io/vgpu-mig-allocations that names a `mig`
//     card of the pod's node (a value that does not decode holds no instance, as in HAMi);
//   - overlaps: two instances on one card sharing a memory slice (invariant 4: a violation in
//     any sample);
//   - the realised instances (runtime identity set) of pods that have a device entry on the
//     card, which is what HAMi v2.10 exports: hami_node_gpu_mig_instance_info, compared with
//     the truth as a device is (invariant 2: equal except for divergences within the window).
// The profile memory and core each instance books are in the pods' device annotations, so the
// per-device comparison (oracle.h) already judges them.
//
//   MigObservation m;
//   m.truth = ComputeMigTruth(nodes, pods);
//   m.exported = ParseMigInstances(metrics_text);   // StatusOr: a bad sample is not compared
//   oracle.Observe(now, truth, &exported, cause, nullptr, &m);
//
// Errors: ParseMigInstances returns InvalidArgument for a sample without one of its labels or
// with a non-numeric placement.
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

#include "tessera/device/mig.h"
#include "tessera/kube/objects.h"

namespace tessera::sim {

// One instance a holding pod has on a card.
struct MigInstance {
  std::string pod;  // "namespace/name"
  device::MigAllocation allocation;
  bool exported = false;  // realised and on a card the pod has a device entry on
};

struct MigCardTruth {
  std::string node;
  std::vector<MigInstance> instances;  // pod order, then annotation order
};

struct MigTruth {
  std::map<std::string, MigCardTruth> cards;  // every `mig` card registered, by UUID
  int64_t pods = 0;                           // holding pods with at least one instance
  int64_t instances = 0, realised = 0;
};

MigTruth ComputeMigTruth(const std::vector<kube::Node>& nodes, const std::vector<kube::Pod>& pods);

// Two instances of one card sharing a slice. `key` names the pair (stable while both live).
struct MigOverlap {
  std::string card, node, key, what;
};
std::vector<MigOverlap> FindMigOverlaps(const MigTruth& truth);

// A realised instance as a metric sample shows it: "start+size profile migUUID gi/ci".
std::string MigInstanceText(const device::MigAllocation& a);

// hami_node_gpu_mig_instance_info's samples: per device_uuid, the sorted MigInstanceText of
// each sample.
using MigInstances = std::map<std::string, std::vector<std::string>>;
absl::StatusOr<MigInstances> ParseMigInstances(std::string_view metrics_text);

// Per card whose exported instances differ from the truth's realised ones: "truth [...],
// exported [...]". Cards on neither side are not listed.
std::map<std::string, std::string> CompareMigInstances(const MigTruth& truth,
                                                       const MigInstances& exported);

// What Oracle::Observe is given about MIG in one sample.
struct MigObservation {
  MigTruth truth;
  std::optional<MigInstances> exported;  // nullopt: the scrape failed or did not parse
};

}  // namespace tessera::sim

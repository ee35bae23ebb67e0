// File: tessera/device/mig_usage.h
//
// What one bound pod's annotations contribute to its node's MIG state, as HAMi v2.10's usage
// rebuild (pkg/scheduler/scheduler.go:getNodesUsage): which placements it holds on which card,
// and which cards it makes unusable because its reservations and its devices disagree (HAMi
// marks them unhealthy: fail closed). The ledger keeps these per pod and card (docs/mig.md "The
// ledger").
//
// Thread safety: pure function.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tessera/device/mig.h"
#include "tessera/device/model.h"

namespace tessera::device {

struct MigPodUsage {
  // occupied[i]: the placements the pod holds on node.devices[i] (one entry per device).
  std::vector<std::vector<MigPlacement>> occupied;
  // Cards the pod makes unusable, by index into node.devices, each with HAMi's reason.
  struct Problem {
    size_t device = 0;
    std::string why;
    friend bool operator==(const Problem&, const Problem&) = default;
  };
  std::vector<Problem> problems;
};

// HAMi's rule, with `devices` the pod's decoded device annotation and `allocations` its decoded
// hami.io/vgpu-mig-allocations (empty when absent or undecodable, as HAMi ignores a value that
// does not decode):
// 1. Each of the pod's devices on a card of the node consumes the first unconsumed allocation
//    naming that card, in annotation order. On a "hami-core" card that is a problem ("a MIG
//    reservation on a hami-core card"); a "mig" card device with none left is a problem
//    ("MIG device without a reservation").
// 2. Allocations left over are added to their card if it is in "mig" mode ("restored"), are a
//    problem on any other card ("MIG reservation on a non-MIG card"), and when their card is not
//    on the node every "mig" card of the node is a problem ("MIG reservation for an unknown card").
// Problems are listed once per (device, reason), in device order.
MigPodUsage MigUsageOfPod(const NodeDevices& node, const PodDevices& devices,
                          const std::vector<MigAllocation>& allocations);

// Why a card's MIG state cannot be granted as it stands (the bind's re-check, after the pod's
// own placements are counted): "the card's MIG books disagree" when it is unusable, "placements
// slices a-b and c-d overlap" when two placements in use share a slice; "" when neither.
std::string MigCardConflict(const MigCardUsage& card);

}  // namespace tessera::device

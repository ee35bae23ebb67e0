// File: tessera/accounting/projection.h
//
// From Kubernetes objects to the ledger's inputs: the one place that decides what a Node and a
// Pod mean for device accounting. The informer path of `tessera serve`, its audit and resync,
// and `tessera explain` all go through these functions, so they cannot disagree.
//
// Thread safety: pure functions.
#pragma once

#include <memory>

#include "absl/status/statusor.h"

#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {

// The node's registered devices. NotFound when the node has no registration (it takes no GPU
// pods); InvalidArgument when the registration does not decode.
absl::StatusOr<std::shared_ptr<const device::NodeDevices>> ProjectNode(const device::Vendor& vendor,
                                                                       const kube::Node& node);

// The ledger record of `pod`: annotated node (hami.io/vgpu-node), bound node (spec.nodeName),
// terminal phase, bind-phase=failed, the devices of the allocated annotation and init_count =
// the number of init containers when the allocation has exactly one entry per container (the
// HAMi v2.9+ layout, init containers first); an allocation with any other entry count was
// written by an older scheduler for app containers only and gets init_count 0. A pod with
// no hami.io/vgpu-node carries no allocation (node empty). InvalidArgument (naming the pod)
// when the allocation annotation does not decode: such a pod holds nothing and the caller
// reports it. `deleted` is never set here: a deletion is a Ledger::Remove.
absl::StatusOr<ledger::PodAllocation> ProjectPod(const device::Vendor& vendor,
                                                 const kube::Pod& pod);

// The record the ledger keeps for `pod`, failing closed (ledger holder rule 6, HAMi #2958): the
// ProjectPod record when the allocation decodes, else an `unreadable` record so that a running
// pod whose devices cannot be named keeps its node unavailable. The unreadable record has no
// devices; its node is spec.nodeName when the pod is bound (the node whose devices it runs
// on, even when hami.io/vgpu-node names another), else hami.io/vgpu-node. A bound pod without
// hami.io/vgpu-node whose hami.io/vgpu-devices-allocated is present and does not decode is
// unreadable too (with a readable one it carries no allocation, as in ProjectPod). `error`,
// when not null, receives the decode error (OkStatus when readable). The pod feed, the audit
// and `tessera explain` all use this, so the block is the same in all three.
ledger::PodAllocation ProjectPodForLedger(const device::Vendor& vendor, const kube::Pod& pod,
                                          absl::Status* error = nullptr);

}  // namespace tessera::accounting

// File: tessera/device/vendor.h
//
// A Vendor is everything that differs between device kinds (NVIDIA, Ascend, Cambricon, Hygon,
// …): the annotation keys, how a node's registration and a pod's allocation are encoded, how a
// container's resources become a device request, and which pod annotations constrain the fit.
// The ledger, the fit, the extender and the metrics work on the vendor-neutral model of
// tessera/device/model.h, so adding a kind means implementing this interface — nothing in the
// core changes. NVIDIA (HAMi's `NVIDIA` vendor key) is the one implemented now.
//
// Thread safety: implementations are immutable after construction; every method may be called
// concurrently from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/device/device_config.h"
#include "tessera/device/mig.h"
#include "tessera/device/model.h"
#include "tessera/kube/objects.h"

namespace tessera::device {

class Vendor {
 public:
  virtual ~Vendor() = default;

  // The vendor key: the Type written for every allocated device ("NVIDIA").
  virtual std::string_view Key() const = 0;
  // The node annotation carrying the device registration (hami.io/node-nvidia-register).
  virtual std::string_view RegisterAnnotation() const = 0;
  // The node annotation of the liveness handshake (hami.io/node-handshake), or "" if none.
  virtual std::string_view HandshakeAnnotation() const = 0;
  // The pod annotations the filter writes (hami.io/vgpu-devices-to-allocate and
  // hami.io/vgpu-devices-allocated).
  virtual std::string_view ToAllocateAnnotation() const = 0;
  virtual std::string_view AllocatedAnnotation() const = 0;
  // The extended-resource names kube-scheduler must list under managedResources.
  virtual std::vector<std::string> ManagedResources() const = 0;

  // The devices `node` registers, with its cordon list and pair scores. NotFound when the node
  // carries no registration of this vendor; InvalidArgument (naming the node and the annotation)
  // when the registration or the pair scores do not decode.
  virtual absl::StatusOr<NodeDevices> DecodeNode(const kube::Node& node) const = 0;
  // What `pod` asks of this vendor, one entry per container (init containers first).
  // InvalidArgument names the pod, container and resource of a malformed value; Unimplemented
  // names the vendor when the pod asks for a device kind Tessera does not schedule
  // (other_vendors.h).
  virtual absl::StatusOr<PodRequest> DecodeRequest(const kube::Pod& pod) const = 0;
  // The pod-level constraints of the fit (type and UUID filters, NUMA binding, policies).
  virtual absl::StatusOr<PodConstraints> DecodeConstraints(const kube::Pod& pod) const = 0;
  // The allocation recorded on `pod` (its allocated annotation). NotFound when the pod has
  // none; InvalidArgument naming the pod when it does not decode.
  virtual absl::StatusOr<PodDevices> DecodeAllocation(const kube::Pod& pod) const = 0;
  // The annotation value for `devices` (the same string goes to both pod annotations).
  virtual std::string EncodeAllocation(const PodDevices& devices) const = 0;
  // The vendor's own annotations a filter writes beside the allocation for `pod` (Ascend:
  // predicate-time and huawei.com/<chip>); none by default.
  virtual void AddFilterAnnotations(const kube::Pod& /*pod*/, const PodDevices& /*devices*/,
                                    absl::Time /*now*/, kube::StringMap* /*out*/) const {}
};

// The NVIDIA vendor with the resource names and defaults of `config`.
std::unique_ptr<Vendor> NewNvidiaVendor(NvidiaConfig config);

// The annotations a successful filter writes on `pod`, in one merge patch: the node
// (hami.io/vgpu-node), the decision time in Unix seconds (hami.io/vgpu-time), the encoded
// allocation under both of the vendor's pod keys, and the vendor's own (AddFilterAnnotations).
// The same patch also sets the label hami.io/vgpu-node=<node> (FilterLabels). With MIG instances
// among the devices (`mig`, parallel to `devices`) it also writes hami.io/vgpu-mig-allocations as
// HAMi v2.10 does (mig.h).
kube::StringMap FilterAnnotations(const Vendor& vendor, const kube::Pod& pod, std::string_view node,
                                  const PodDevices& devices, absl::Time now,
                                  const PodMigReservations& mig = {});
kube::StringMap FilterLabels(std::string_view node);

}  // namespace tessera::device

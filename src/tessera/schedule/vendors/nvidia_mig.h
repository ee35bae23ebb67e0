// File: tessera/schedule/vendors/nvidia_mig.h
//
// The MIG-capable path of NVIDIA's fit rules (nvidia_fit.h): when a request is a MIG request,
// and which instance a container gets on a card in mode "mig" (the placement choice itself is
// schedule/mig_fit.h's ChooseMigPlacement). docs/mig.md.
//
// Internal to tessera::schedule. Thread safety: pure functions (the scratch is the caller's).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

#include "tessera/device/model.h"
#include "tessera/schedule/fit.h"

namespace tessera::schedule {

// HAMi's isMIGRequest: an NVIDIA request, a vgpu-mode that (if set) allows "mig", and a card of
// the request's type (one of `candidates`) in mode "mig". Then Nums may exceed the cards.
bool IsMigRequest(const device::ContainerRequest& request,
                  const device::PodConstraints& constraints, const device::NodeDevices& node,
                  absl::Span<const Fitter::SortEntry> candidates);

// The instance a container asking `memreq` MiB gets on MIG card `device` after the snapshot's
// instances, the pod's earlier ones (`earlier`) and this container's (`taken`), so that two
// containers of a pod never share a placement: its profile's memory and cores, profile and
// placement into *out; false when none fits. `occupied` is scratch.
bool PickMigInstance(const device::NodeSnapshot& node, int32_t device, int64_t memreq,
                     absl::Span<const Fitter::Choice> earlier,
                     absl::Span<const Fitter::Taken> taken,
                     std::vector<device::MigPlacement>* occupied, Fitter::Taken* out);

}  // namespace tessera::schedule

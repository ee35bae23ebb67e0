// File: tessera/extender/admission_warnings.h
//
// What the admission webhook warns about (the AdmissionReview's `warnings`, which kubectl prints
// as "Warning: ..."): mistakes that HAMi accepts silently and that surface only later, as a pod
// holding more than its author meant or a pod the scheduler refuses.
//
//   std::vector<std::string> w = AdmissionWarnings(pod, config);  // pod: with all annotations
//
//   - a device resource written as a pod annotation (`nvidia.com/gpumem: "4000"` under
//     metadata.annotations): nothing reads it there (HAMi #2862);
//   - a container that asks for a count without memory or percentage while the device config's
//     defaultMemory is 0: it gets each GPU's whole memory (HAMi #1781);
//   - a policy or numa-bind annotation the scheduler cannot read: the scheduler refuses the pod
//     until it is fixed (the message is the scheduler's own).
// At most kMaxAdmissionWarnings, each at most kMaxAdmissionWarningBytes (longer ones end "...").
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tessera/device/device_config.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {

inline constexpr size_t kMaxAdmissionWarnings = 8;
inline constexpr size_t kMaxAdmissionWarningBytes = 256;

std::vector<std::string> AdmissionWarnings(const kube::Pod& pod,
                                           const device::NvidiaConfig& config);

}  // namespace tessera::extender

// File: tessera/kube/lease.h
//
// Projection of a coordination.k8s.io/v1 Lease, the object behind leader election. Every spec
// field is a pointer in the Go type and omitted when unset, so each one here is optional: an
// absent field and a null field both decode to std::nullopt, and an empty holderIdentity (what a
// releasing leader writes) stays an empty string, distinct from absent.
//
// Thread safety: plain value; concurrent const access is safe, mutation needs external locking.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tessera/kube/objects.h"

namespace tessera::kube {

struct Lease {
  ObjectMeta meta;
  std::optional<std::string> holder_identity;     // spec.holderIdentity
  std::optional<int32_t> lease_duration_seconds;  // spec.leaseDurationSeconds
  std::optional<std::string> acquire_time;        // spec.acquireTime, MicroTime as sent
  std::optional<std::string> renew_time;          // spec.renewTime, MicroTime as sent
  std::optional<int32_t> lease_transitions;       // spec.leaseTransitions

  friend bool operator==(const Lease&, const Lease&) = default;
};

}  // namespace tessera::kube

// File: tessera/kube/resource_quota.h
//
// Projection of a core/v1 ResourceQuota: only what namespace quota on GPU resources reads
// (docs/quota.md). Of spec.hard only the keys that start with "limits." are kept, as quantity
// strings; HAMi reads no other key (requests.*, status.used and scopes are ignored). Which of
// the kept keys a scheduler manages, and their values, is tessera/extender/quota.h's business.
//
// Thread safety: plain value; concurrent const access is safe, mutation needs external locking.
#pragma once

#include <string_view>

#include "tessera/kube/objects.h"

namespace tessera::kube {

inline constexpr std::string_view kQuotaLimitsPrefix = "limits.";

// True for the spec.hard keys a ResourceQuota projection keeps.
inline bool QuotaLimitKey(std::string_view key) { return key.starts_with(kQuotaLimitsPrefix); }

struct ResourceQuota {
  ObjectMeta meta;    // labels and annotations are not kept
  ResourceList hard;  // spec.hard, keys "limits.*" only: resource name -> quantity string

  friend bool operator==(const ResourceQuota&, const ResourceQuota&) = default;
};

}  // namespace tessera::kube

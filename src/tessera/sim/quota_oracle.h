// File: tessera/sim/quota_oracle.h
//
// The namespace-quota part of `tessera simulate`'s oracle (issue #24), computed like the rest of
// the truth from the API server's objects and HAMi's protocol, not from Tessera's code:
//   - each namespace's limits: the smallest whole-number `limits.<resource>` of spec.hard over
//     its ResourceQuotas, for the memory and cores resources (HAMi reads no other key);
//   - each namespace's usage: over the pods holding devices (the truth's rule, ComputeTruth),
//     per pod and device HAMi's collapse — max(peak over init containers, sum over app
//     containers), the annotation's first len(spec.initContainers) entries being the init
//     containers' — summed;
//   - what Tessera exports: hami_resource_quota_used by {namespace, quota_name}.
// Oracle::Observe judges them: invariant 3, no namespace over a limit in any sample; and, with
// invariant 2, the exported usage equals the truth except for divergences within the window.
//
//   QuotaObservation q;
//   q.truth = ComputeQuotaTruth(truth, pods, quotas);
//   q.exported = ParseQuotaUsed(metrics_text);   // StatusOr: a bad sample is not compared
//   oracle.Observe(now, truth, &exported, cause, &q);
//
// Errors: ParseQuotaUsed returns InvalidArgument for a sample without its namespace or
// quota_name label or with an unparsable value.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/objects.h"
#include "tessera/kube/resource_quota.h"
#include "tessera/sim/oracle.h"

namespace tessera::sim {

// HAMi's default NVIDIA resource names, the only ones the simulated cluster uses.
inline constexpr std::string_view kQuotaMemoryResource = "nvidia.com/gpumem";   // MiB
inline constexpr std::string_view kQuotaCoresResource = "nvidia.com/gpucores";  // percent

// {namespace, resource}.
using QuotaKey = std::pair<std::string, std::string>;

struct NamespaceQuotaTruth {
  std::optional<int64_t> limit;  // nullopt: unlimited
  int64_t used = 0;
};

// Every namespace that has a limit or whose pods hold devices, with both resources for the
// latter (as Tessera exports them).
using QuotaTruth = std::map<QuotaKey, NamespaceQuotaTruth>;
QuotaTruth ComputeQuotaTruth(const Truth& truth, const std::vector<kube::Pod>& pods,
                             const std::vector<kube::ResourceQuota>& quotas);

// hami_resource_quota_used's samples by {namespace, quota_name}.
using QuotaUsed = std::map<QuotaKey, int64_t>;
absl::StatusOr<QuotaUsed> ParseQuotaUsed(std::string_view metrics_text);

// What Oracle::Observe is given about quota in one sample.
struct QuotaObservation {
  QuotaTruth truth;
  std::optional<QuotaUsed> exported;  // nullopt: the scrape failed or did not parse
};

}  // namespace tessera::sim

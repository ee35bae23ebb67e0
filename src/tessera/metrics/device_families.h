// File: tessera/metrics/device_families.h
//
// HAMi's device metric families (hami_gpu_*, hami_node_gpu_*, hami_vgpu_*, and with `legacy` the
// pre-v2.9 names), rendered from one ledger::FullSnapshot in the Prometheus text format 0.0.4 with
// HAMi's names, labels and units (docs/hami-protocol.md §5.3), so its dashboards keep working.
// "Allocated" is what the ledger's holder rule says holds a device, reservations included; per-pod
// usage is collapsed per device as HAMi v2.10 does. Every family, label and value, the output
// order and what is not rendered: docs/metrics.md "HAMi's device families".
//
// Errors: none (pure rendering). Cost: O(devices + holders); the streaming overload builds and
// hands over the text in chunks of a few thousand samples.
//
// Thread safety: pure functions of their arguments; safe to call concurrently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

#include "tessera/ledger/ledger.h"
#include "tessera/schedule/quota.h"

namespace tessera::metrics {

// The Content-Type of the text exposition format these functions produce.
inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

// Appends the device families of `snapshot` to `sink`, in pieces (each piece ends with '\n').
void RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy,
                          absl::FunctionRef<void(std::string_view)> sink);
// The same, as one string.
std::string RenderDeviceFamilies(const ledger::FullSnapshot& snapshot, bool legacy);

// HAMi's namespace quota families (v2.10 cmd/scheduler/metrics.go collectQuotaMetrics;
// docs/quota.md "Metrics"), zone="vGPU":
//   hami_resource_quota_used{limit,namespace,quota_name}  the namespace's usage from
//     `snapshot.namespaces` (memory in scaled MiB, cores in percent); `limit` is the unscaled
//     limit, "0" when the resource has none;
//   hami_resource_quota_limit{namespace,quota_name}       the limit, only where one is set;
//   QuotaUsed{limit,quotaName,quotanamespace}              with `legacy`, the same as _used.
// A namespace gets both resources' _used series when it holds anything, else only the limited
// ones. `limits` is QuotaBook::AllLimits() (names and factor of every entry alike); `names`
// gives the resource names when `limits` is empty.
void RenderQuotaFamilies(const ledger::FullSnapshot& snapshot,
                         const std::vector<schedule::NamespaceQuota>& limits,
                         const schedule::NamespaceQuota& names, bool legacy,
                         absl::FunctionRef<void(std::string_view)> sink);
std::string RenderQuotaFamilies(const ledger::FullSnapshot& snapshot,
                                const std::vector<schedule::NamespaceQuota>& limits,
                                const schedule::NamespaceQuota& names, bool legacy);

}  // namespace tessera::metrics

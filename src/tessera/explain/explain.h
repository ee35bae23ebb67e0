// File: tessera/explain/explain.h
//
// "Where would this pod go, and why not elsewhere?" — the engine behind `tessera explain`.
// It builds a ledger from a set of nodes and pods exactly as `tessera serve` does from its
// informers (tessera/accounting/projection.h), runs the same filter decision over every node, and
// reports the chosen node, the devices per container, the annotations the filter would write,
// and for every node that does not fit HAMi's reason strings. docs/explain.md documents the
// text and JSON outputs; the JSON schema is an interface.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/accounting/quota_book.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/resource_quota.h"

namespace tessera::explain {

struct ExplainInput {
  std::vector<kube::Node> nodes;  // candidates, in this order
  std::vector<kube::Pod> pods;    // occupy devices per the ledger's holder rule
  kube::Pod pod;                  // the pod to place
  // The cluster's ResourceQuotas: the pod's namespace quota is checked as /filter checks it,
  // against the usage the ledger built from `pods` (docs/quota.md).
  std::vector<kube::ResourceQuota> quotas;
  accounting::QuotaBook::Options quota_names;  // the vendor's resource names, memoryFactor
  device::NodePolicy node_policy = device::NodePolicy::kBinpack;
  device::GpuPolicy gpu_policy;  // default: spread
  // The decision time (written as hami.io/vgpu-time) and the reference for in-flight pods: an
  // annotated, unbound, live pod whose hami.io/vgpu-time is younger than `reservation_ttl`
  // holds its devices as a filter reservation would.
  absl::Time now;
  absl::Duration reservation_ttl = absl::Minutes(5);
  // The other device kinds of the cluster: their registrations join each node's devices, so a
  // node of another kind is a node without the pod's devices (HAMi's NodeInsufficientDevice),
  // not an unregistered one. The pod's own vendor is Explain's argument.
  std::vector<const device::Vendor*> node_vendors;
};

// One device given to one container.
struct ExplainDevice {
  std::string uuid;
  std::string type;  // the device's registered type, e.g. "NVIDIA-Tesla T4"
  int32_t index = 0;
  int32_t mem_mib = 0;
  int32_t cores = 0;
};

struct ExplainNode {
  std::string name;
  bool fit = false;
  double score = 0;
  std::vector<std::string> reasons;  // "1/2 CardInsufficientMemory", "node unregistered", …
  // A MIG request that fits no placement here: per MIG card, why no placement of the smallest
  // adequate profile is free and which instances would have to go (schedule::ExplainMigNode).
  std::vector<std::string> mig;
  // The node's registered devices and their use before this pod (none when unregistered).
  int32_t gpus = 0;
  int64_t mem_used_mib = 0;
  int64_t mem_total_mib = 0;
  int32_t slots_used = 0;  // allocations sharing the devices
};

struct ExplainResult {
  std::string pod;          // "namespace/name"
  bool no_request = false;  // the pod asks for no managed device: every node passes untouched
  std::optional<std::string> node;                     // the chosen node
  std::vector<std::vector<ExplainDevice>> containers;  // init containers first
  std::vector<std::string> container_names;            // same order
  kube::StringMap annotations;  // what the filter would write (empty without a node)
  kube::StringMap labels;
  std::vector<ExplainNode> nodes;  // one per input node, in input order
  std::string node_policy;         // effective policies, e.g. "binpack" and "spread"
  std::string gpu_policy;
  std::vector<std::string> warnings;  // objects that could not be projected, in-flight pods
  // What the admission webhook did to the pod as given (Ascend: templates, pairs); set by the
  // caller that applied it (device::AdmitAscendPod).
  std::vector<std::string> webhook;
  // The namespace quota refused a card: "namespace ml: limits.nvidia.com/gpumem 40000, used
  // 36000 + 8000 asked" (the text of /filter's event); empty otherwise.
  std::string quota;
};

// Explains the placement of `input.pod`. Errors (InvalidArgument, naming the pod, container
// and field) when the pod's requests or constraint annotations are malformed. Malformed node
// registrations and pod allocations of the cluster are not errors: they become warnings, as
// they would in a running scheduler (the node counts as unregistered; a running pod whose
// allocation does not decode holds no device but blocks its node, with a warning that names it).
absl::StatusOr<ExplainResult> Explain(const device::Vendor& vendor, const ExplainInput& input);

// The human-readable report. `wide` (-o wide) adds the columns GPUS, SHARED (allocations on
// them) and MEMORY (used/total MiB before this pod) to the nodes table.
std::string RenderExplainText(const ExplainResult& result, bool wide = false);
// The JSON document of docs/explain.md, followed by a newline.
std::string RenderExplainJson(const ExplainResult& result);

}  // namespace tessera::explain

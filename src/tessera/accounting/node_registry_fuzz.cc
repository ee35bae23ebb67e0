// Fuzz target: the node registry under arbitrary node annotations, labels, readiness and
// allocatable values, interleaved with Tick and Forget. It never crashes, NodeSelector::Parse is
// total, and after every step:
//   - the ledger's registered nodes are exactly Registrations() (same objects);
//   - a node that does not offer its devices has every device unhealthy in the ledger;
//   - every patch is a Requesting_/Deleted_ write of the handshake key on a known, selected,
//     delimited node at its observed resourceVersion.
//
// Input: '\x1e'-separated steps. The first is the selector flag. Each later step is
// '\x1f'-separated fields: op, node name (one byte folded into "n0".."n3"), register value,
// handshake, cordon, label "pool" value, ready byte, allocatable value, time delta in seconds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_split.h"

#include "tessera/accounting/node_registry.h"
#include "tessera/device/vendor.h"
#include "tessera/ledger/ledger.h"

namespace {

using tessera::accounting::Availability;
using tessera::accounting::NodeFormat;
using tessera::accounting::NodePatch;
using tessera::accounting::NodeRegistry;
using tessera::accounting::NodeSelector;
using tessera::accounting::NodeStatus;

void Check(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

void CheckInvariants(const NodeRegistry& registry, const tessera::ledger::Ledger& ledger,
                     const std::vector<NodePatch>& patches) {
  const auto regs = registry.Registrations();
  const tessera::ledger::FullSnapshot full = ledger.Full();
  Check(regs.size() == full.nodes.size());
  for (size_t i = 0; i < regs.size(); ++i) {
    Check(regs[i] == full.nodes[i].devices);
  }
  for (const NodeStatus& s : registry.Status()) {
    if (!s.in_ledger || s.availability == Availability::kAvailable) {
      continue;
    }
    for (const auto& r : regs) {
      if (r->node == s.name) {
        for (const auto& d : r->devices) {
          Check(!d.health);
        }
      }
    }
  }
  for (const NodePatch& p : patches) {
    Check(p.key == "hami.io/node-handshake");
    Check(p.value.starts_with("Requesting_") || p.value.starts_with("Deleted_"));
    std::optional<NodeStatus> s = registry.Find(p.node);
    Check(s.has_value());
    Check(s->selected && s->format == NodeFormat::kDelimited);
    Check(p.resource_version == s->resource_version);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* vendor =
      tessera::device::NewNvidiaVendor(tessera::device::DefaultNvidiaConfig()).release();
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> steps = absl::StrSplit(input, '\x1e');
  absl::StatusOr<NodeSelector> selector = NodeSelector::Parse(steps[0]);
  if (selector.ok()) {
    Check(NodeSelector::Parse(selector->ToString()).ok());
  }
  tessera::ledger::Ledger ledger;
  NodeRegistry::Options options;
  if (selector.ok()) {
    options.selector = *selector;
  }
  NodeRegistry registry(vendor, &ledger, options);
  absl::Time now = absl::FromUnixSeconds(1800000000);
  int rv = 0;
  for (size_t i = 1; i < steps.size() && i < 64; ++i) {
    std::vector<std::string> f = absl::StrSplit(steps[i], '\x1f');
    f.resize(9);
    const std::string name = "n" + std::to_string(f[1].empty() ? 0 : (f[1][0] & 3));
    if (!f[8].empty()) {
      now += absl::Seconds(static_cast<unsigned char>(f[8][0]));
    }
    const char op = f[0].empty() ? 'o' : f[0][0];
    std::vector<NodePatch> patches;
    if (op == 't') {
      patches = registry.Tick(now);
    } else if (op == 'f') {
      registry.Forget(name);
    } else {
      tessera::kube::Node node;
      node.meta.name = name;
      node.meta.resource_version = std::to_string(++rv);
      if (!f[2].empty()) {
        node.meta.annotations.Set("hami.io/node-nvidia-register", f[2]);
      }
      if (!f[3].empty()) {
        node.meta.annotations.Set("hami.io/node-handshake", f[3]);
      }
      if (!f[4].empty()) {
        node.meta.annotations.Set("hami.io/device-cordon", f[4]);
      }
      if (!f[5].empty()) {
        node.meta.labels.Set("pool", f[5]);
      }
      const int ready = f[6].empty() ? 0 : (f[6][0] % 3);
      node.ready = ready == 0   ? tessera::kube::ConditionStatus::kTrue
                   : ready == 1 ? tessera::kube::ConditionStatus::kFalse
                                : tessera::kube::ConditionStatus::kUnknown;
      if (!f[7].empty()) {
        node.allocatable.Set("nvidia.com/gpu", f[7]);
      }
      patches = registry.Observe(node, now);
    }
    CheckInvariants(registry, ledger, patches);
  }
  return 0;
}

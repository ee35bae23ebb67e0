// File: tessera/sim/oracle.h
//
// The oracle of `tessera simulate`: the true usage of every GPU and every pod's share, computed
// from the API server's objects independently of Tessera's code (written from the HAMi protocol),
// compared every second with what Tessera's /metrics export. Invariants: no over-commit, and
// exported == truth except for divergences that end within the convergence window. The truth
// rule and how divergences are classified: docs/simulate.md "The oracle in detail".
//
//   Truth t = ComputeTruth(nodes, pods);            // LIST results of apisim
//   absl::StatusOr<Exported> e = ParseMetrics(metrics_text);
//   oracle.Observe(now, t, e.ok() ? &*e : nullptr, "watch_outage");
//
// Errors: ParseMetrics returns InvalidArgument for a sample without its key labels or with an
// unparsable value; a failed scrape is passed as nullptr and is no observation of invariant 2.
//
// Thread safety: none; one thread drives an Oracle.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/device/model.h"
#include "tessera/kube/objects.h"

namespace tessera::sim {

struct QuotaObservation;  // quota_oracle.h
struct MigObservation;    // mig_oracle.h

struct DeviceUsage {
  std::string node;
  int64_t count = 0, devmem = 0, devcore = 0;  // capacity (truth only)
  int64_t used = 0, usedmem = 0, usedcores = 0;
  // A card in mig mode (truth only): its instances book their profile's core, ⌈compute × 100 /
  // 7⌉, which sums past devcore on a full card (7 × 15 % for seven 1g instances, in HAMi too),
  // so no cores bound; invariant 4 (mig_oracle.h) is its over-commit check.
  bool mig = false;
};

// A pod's share of one device, keyed by {"namespace/name", device UUID}.
using PodDevice = std::pair<std::string, std::string>;
struct PodShare {
  std::string node;
  int64_t usedmem = 0;    // MiB
  int64_t usedcores = 0;  // percent of one GPU
};

struct Truth {
  std::map<std::string, DeviceUsage> devices;  // by UUID
  std::map<PodDevice, PodShare> shares;        // the pods holding devices, per device
  int64_t total_usedmem = 0;                   // MiB over every device
  int64_t holding_pods = 0;
};

Truth ComputeTruth(const std::vector<kube::Node>& nodes, const std::vector<kube::Pod>& pods);

// Calls fn(node, device) for each device registered by `nodes` (a node without the register
// annotation, or with one that does not decode, registers none): the truth's devices.
void ForEachRegisteredDevice(
    const std::vector<kube::Node>& nodes,
    const std::function<void(const kube::Node& node, const device::DeviceInfo& device)>& fn);

// The truth's rule for one pod: its hami.io/vgpu-devices-allocated when it holds them (not
// terminal, bound, hami.io/vgpu-node equal to spec.nodeName, not bind-phase failed, the
// annotation decodes), else nullopt. Which entries count is still the node's registration's.
std::optional<device::PodDevices> HeldAllocation(const kube::Pod& pod);

// The value of label `name` in a Prometheus sample's label block `{a="x",b="y"}`.
std::optional<std::string> SampleLabel(std::string_view labels, std::string_view name);

// Calls fn(line, labels, value) for each sample `family{…} value` of Prometheus text `text`
// (`labels` with its braces, `value` the rest of the line) and returns fn's first error.
// Errors: InvalidArgument for a sample of `family` whose label block is not closed.
absl::Status ForEachSample(
    std::string_view text, std::string_view family,
    const std::function<absl::Status(std::string_view line, std::string_view labels,
                                     std::string_view value)>& fn);

struct ExportedDevice {
  std::string node;
  int64_t usedmem = 0;  // MiB (bytes / 1048576)
  int64_t used = 0;
  int64_t usedcores = 0;
};
struct Exported {
  std::map<std::string, ExportedDevice> devices;  // by device_uuid
  std::map<PodDevice, PodShare> shares;           // by {"namespace/pod", device_uuid}
};

// The HAMi families the oracle judges, from a Prometheus text exposition: per device
// hami_gpu_memory_allocated_bytes, hami_gpu_shared_count and hami_gpu_core_allocated_ratio, keyed
// by the device_uuid label; per pod share hami_vgpu_memory_allocated_bytes and
// hami_vgpu_core_allocated_ratio, keyed by the namespace, pod and device_uuid labels (samples of
// several container_index values of one share are summed). Other families are skipped. A text
// without any of those samples is read in HAMi v2.5's names instead (GPUDeviceMemoryAllocated,
// GPUDeviceSharedNum, GPUDeviceCoreAllocated by deviceuuid; vGPUPodsDeviceAllocated and
// vGPUCorePercentage by podnamespace, podname, deviceuuid). InvalidArgument when a sample of those
// families lacks one of its key labels or has an unparsable value.
absl::StatusOr<Exported> ParseMetrics(std::string_view text);
// tessera_pending_pods_requeued_total (Tessera's requeue writes) from a /metrics page; -1 when
// the page has no such sample or its value is not a count.
int64_t ParseRequeuedTotal(std::string_view text);

struct Divergence {
  std::string device;
  std::string pod;  // "namespace/name" for a pod's share of `device`; empty for the device
  std::string node;
  absl::Time start, end;  // end == InfiniteFuture while open
  std::string cause;      // the last fault injected before it began, or "in-flight"
  std::string detail;     // "truth 4000 MiB / …, exported 0 MiB / …" at its start
  int64_t samples = 0;
  bool violation = false;
  absl::Duration Length(absl::Time now) const {
    return (end == absl::InfiniteFuture() ? now : end) - start;
  }
};

// What diverged, for messages: the device UUID, or "pod namespace/name on UUID".
std::string Subject(const Divergence& d);

struct Violation {
  absl::Time at;
  std::string what;
  bool overcommit = false;  // invariant 1; else a divergence that outlived the window
};

class Oracle {
 public:
  explicit Oracle(absl::Duration window) : window_(window) {}

  // One observation. `exported` null: /metrics could not be read (not compared). `quota`
  // (quota_oracle.h), when given, is judged too: a namespace over a limit is a violation, and
  // its exported usage is compared as a device is, keyed "quota <namespace> <resource>".
  // `mig` (mig_oracle.h) likewise: two instances overlapping on a card are a violation (once
  // per pair while it lasts), and each card's exported realised instances are compared as a
  // device is, keyed "mig <card UUID>".
  void Observe(absl::Time now, const Truth& truth, const Exported* exported,
               const std::string& last_fault, const QuotaObservation* quota = nullptr,
               const MigObservation* mig = nullptr);
  // A violation seen outside the samples (e.g. a device plugin that could not realise a MIG
  // reservation the scheduler wrote).
  void AddViolation(absl::Time now, std::string what) {
    violations_.push_back({now, std::move(what), /*overcommit=*/false});
  }
  // Closes the run: open divergences older than the window become violations.
  void Finish(absl::Time now);

  const std::vector<Divergence>& divergences() const { return divergences_; }
  const std::vector<Violation>& violations() const { return violations_; }
  int64_t transient() const { return transient_; }
  // When each transient difference a fault caused (not in flight) began and was seen healed.
  const std::vector<std::pair<absl::Time, absl::Time>>& transient_fault_spans() const {
    return transient_fault_spans_;
  }
  int64_t observations() const { return observations_; }
  int64_t compared() const { return compared_; }
  // Devices, and pod shares, differing in the last observation.
  size_t open() const { return pending_.size() - open_shares_; }
  size_t open_shares() const { return open_shares_; }

 private:
  // What is compared: {"", device UUID} for a device, {"namespace/name", UUID} for a pod share.
  using Key = PodDevice;
  struct Pending {
    absl::Time start;
    std::string cause, detail, node;
    int64_t samples = 0;
    int64_t recorded = -1;  // index in divergences_ once seen twice
  };
  void Close(Pending& p, absl::Time now);

  absl::Duration window_;
  std::map<Key, Pending> pending_;
  size_t open_shares_ = 0;
  std::vector<Divergence> divergences_;
  std::vector<Violation> violations_;
  // Devices (and "quota <namespace> <resource>", "mig <card> <pair>") currently over-committed
  // (reported once).
  std::map<std::string, bool> overcommitted_;
  int64_t transient_ = 0;
  std::vector<std::pair<absl::Time, absl::Time>> transient_fault_spans_;
  int64_t observations_ = 0;
  int64_t compared_ = 0;
};

}  // namespace tessera::sim

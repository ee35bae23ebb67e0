// File: tessera/schedule/device_rules.h
//
// The seam between the Fitter (fit.h: the vendor-neutral loop over containers, the candidates in
// policy order, the quota, the reasons) and the rules of one device kind (schedule/vendors/):
// which of a container's candidates it takes, and why it skips the others. The Fitter resolves
// each container's kind once per pod (KindOf its request type) and calls the kind's rules once
// per container and node, never per device. A new kind is a DeviceKind, a DeviceRules under
// schedule/vendors/ and its row in device_rules.cc; fit.cc does not change.
//
// Internal to tessera::schedule. Thread safety: a DeviceRules holds per-pod state and scratch;
// one per Fitter.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

#include "tessera/device/model.h"
#include "tessera/schedule/fit.h"

namespace tessera::schedule {

enum class DeviceKind : uint8_t {
  kNvidia,  // vendors/nvidia_fit.h
  kAscend,  // vendors/ascend_fit.h
};
inline constexpr size_t kDeviceKindCount = 2;

// The kind whose rules fit `request`: its family's (the vendor that derived it says which). An
// NVIDIA request whose type is not NVIDIA's fails each candidate as CardTypeMismatch, as HAMi's
// NVIDIA Fit does.
DeviceKind KindOf(const device::ContainerRequest& request);

// One container's fit on one node, as a rule set sees it: what it reads (the request, the node,
// the candidates in policy order), what it fills (the devices taken, the skipped candidates per
// reason) and the Fitter's vendor-neutral check it calls (the namespace quota).
struct ContainerWalk {
  const device::ContainerRequest& request;
  const device::NodeSnapshot& node;
  absl::Span<const device::DeviceUsage> usage;  // this container's view of the node's usage
  // The candidates (the devices whose Type contains the request type): entries[rank[k]] for k
  // in [0, entries.size()) is policy order; the walk goes from the end.
  absl::Span<const Fitter::SortEntry> entries;
  const int32_t* rank;
  absl::Span<const Fitter::Choice> earlier;  // the pod's earlier containers' devices here
  // Out: the devices taken, at most request.nums when the walk returns (fewer: the container
  // does not fit); and per Reason, how many candidates were skipped for it.
  std::vector<Fitter::Taken>* taken;
  std::array<int32_t, kReasonCount> counts{};
  // Out: set by a rule set whose container fails whatever it took (Ascend 910C: the module
  // pairs do not make the request). Its reasons then always name
  // AllocatedCardsInsufficientRequest (with the count taken, even 0) and count against
  // `reason_total` when that is set (else the candidates).
  bool failed = false;
  int32_t reason_total = -1;
  bool app = false;          // an app container (else an init container)
  Fitter* fitter = nullptr;  // the Fitter whose quota check QuotaFits runs

  // Whether the namespace quota is checked on this node (else every card passes it).
  bool quota_limited() const { return fitter->quota_ != nullptr; }
  // Whether the quota takes the pod with `device` added to this container at memreq MiB and
  // coresreq % (beside the devices already taken); a refusal is recorded (Fitter::quota_miss).
  bool QuotaFits(int32_t device, int64_t memreq, int32_t coresreq) const {
    return fitter->QuotaFits(app, device, memreq, coresreq);
  }
};

// The rules of one device kind.
class DeviceRules {
 public:
  virtual ~DeviceRules() = default;
  // Binds the pod (once per pod, before its Fits): its request, constraints and GPU policy
  // outlive the Fit calls.
  virtual void Prepare(const device::PodRequest& request, const device::PodConstraints& constraints,
                       const device::GpuPolicy& policy) = 0;
  // Whether container `container` may ask for more devices than it has candidates (else the
  // Fitter fails it with NodeInsufficientDevice before the walk).
  virtual bool MayExceedCandidates(int container, const ContainerWalk& walk) const = 0;
  // Takes the devices of container `container` from the candidates into walk.taken (emptied
  // before the call) and counts the candidates skipped.
  virtual void Walk(int container, ContainerWalk& walk) = 0;
};

// A new rule set for `kind`.
std::unique_ptr<DeviceRules> NewDeviceRules(DeviceKind kind);

// Helpers the Fitter and the rule sets share.
// strings.Contains(strings.ToLower(haystack), strings.ToLower(needle)) for ASCII.
bool ContainsFold(std::string_view haystack, std::string_view needle);
inline int64_t PercentOf(int32_t total, int32_t pct) {
  return static_cast<int64_t>(total) * pct / 100;
}

}  // namespace tessera::schedule

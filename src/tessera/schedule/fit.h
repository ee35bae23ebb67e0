// File: tessera/schedule/fit.h
//
// Fitting one pod on one node: HAMi v2.10's NVIDIA device fit (docs/hami-protocol.md §4.3/§4.4),
// reproduced check for check, with HAMi's reason names and reason-string format. Pure: no I/O,
// no clock, no global state.
//
// Per container that asks for devices (containers with nullopt or nums <= 0 get an empty entry):
//   1. the devices whose Type contains the request type (case-insensitive) are the candidates;
//      more devices requested than candidates fails with NodeInsufficientDevice;
//   2. each candidate gets a device score (ComputeDeviceScore) against the node's current usage;
//   3. the candidates are sorted per the GPU policy (SortOrderFor) and walked from the END;
//   4. each device passes the checks in HAMi's order (see docs/scheduling.md; the rules of the
//      container's device kind, schedule/vendors/nvidia_fit.h) or is skipped with one reason;
//      the first `nums` devices that pass are taken. Under topology-aware every passing device
//      is collected instead, and with more than `nums` of them the pair scores
//      (NodeDevices::pair_scores) choose: for one GPU the device with the lowest sum of scores
//      towards the other candidates, for several the subset with the highest sum of pair scores
//      (HAMi's computeWorstSingleCard / computeBestCombination; first in visiting order on ties).
// App containers are fitted cumulatively on one copy of the node's usage (later containers see
// earlier ones); each init container is fitted on its own fresh copy and the per-field peak of
// those copies is kept; the usage after the pod is max(app cumulative, init peak) per field.
//
// Init containers are reported like app containers: PodDevices has one entry per container, init
// containers first (the HAMi v2.9+ index space the device plugin consumes), and an init
// container's entry lists the devices it was fitted on. A container without a request has an
// empty entry, so entry i always belongs to container i.
//
// Thread safety: free functions are thread-compatible (they only read their arguments). A Fitter
// holds scratch buffers: one Fitter per thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"

#include "tessera/device/mig.h"
#include "tessera/device/model.h"
#include "tessera/schedule/quota.h"

namespace tessera::schedule {

// The device kinds and their rule sets (device_rules.h, internal).
enum class DeviceKind : uint8_t;
class DeviceRules;
struct ContainerWalk;

// HAMi's reason names (v2.10 pkg/device/common).
enum class Reason : uint8_t {
  kCardNotHealth,
  kCardCordoned,
  kCardTypeMismatch,
  kNumaNotFit,
  kCardUuidMismatch,
  kCardTimeSlicingExhausted,
  kExclusiveDeviceAllocateConflict,
  // The namespace's quota (quota.h) cannot take this card's share: checked where HAMi's NVIDIA
  // Fit checks it, before the card's free memory.
  kResourceQuotaNotFit,
  kCardInsufficientMemory,
  kCardInsufficientCore,
  kCardComputeUnitsExhausted,
  // A card in mode "mig" has no free placement of a profile large enough (HAMi's
  // CustomFilterRule, schedule/mig_fit.h), after the pod's earlier instances on it.
  kCardMigTopologyInfeasible,
  kAllocatedCardsInsufficientRequest,
  kNodeInsufficientDevice,
  // Ascend: the pod asks for hami-core mode on a node that does not allow it.
  kModeNotFit,
};
inline constexpr size_t kReasonCount = 15;

// The wire name, e.g. "CardInsufficientMemory".
std::string_view ReasonName(Reason reason);

// One "<count>/<total> <Reason>" part of a reason string: `count` of the `total` devices
// considered failed for `reason`.
struct ReasonPart {
  Reason reason = Reason::kCardNotHealth;
  int32_t count = 0;
  int32_t total = 0;

  std::string ToString() const;
  friend bool operator==(const ReasonPart&, const ReasonPart&) = default;
};

// The parts of one failure, sorted by their rendered strings (byte order, as HAMi sorts them).
// Fixed capacity, no allocation: at most one part per Reason.
class ReasonParts {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const ReasonPart& operator[](size_t i) const { return parts_[i]; }
  const ReasonPart* begin() const { return parts_.data(); }
  const ReasonPart* end() const { return parts_.data() + size_; }
  void clear() { size_ = 0; }

  // Builds the sorted parts from per-reason counters (zero counters are left out, except the
  // reasons whose bit is set in `keep_zero`).
  void Assign(const std::array<int32_t, kReasonCount>& counts, int32_t total,
              uint32_t keep_zero = 0);
  // A single part (used for NodeInsufficientDevice).
  void AssignOne(ReasonPart part);

  // The rendered parts, e.g. {"1/2 CardInsufficientMemory", "1/2 CardTimeSlicingExhausted"}.
  std::vector<std::string> Strings() const;
  // The parts joined with ", " into `out` (replacing its contents; reuses its capacity).
  void JoinTo(std::string* out) const;
  std::string Joined() const;

 private:
  std::array<ReasonPart, kReasonCount> parts_{};
  size_t size_ = 0;
};

// One ordering key of the device sort. The sorted list is walked from the end, so an "ascending"
// key tries the largest value first.
enum class SortKey : uint8_t {
  kScoreAscending,   // binpack: highest score tried first
  kScoreDescending,  // spread: lowest score tried first
  kNumaAscending,    // highest NUMA id tried first
  kNumaDescending,   // lowest NUMA id tried first (v2.5.2 binpack order)
  kUsedDescending,   // single mutex: idle devices tried first
};

// The resolved device ordering for one pod: keys in order, then device index ascending, then
// position in NodeDevices::devices ascending (so the order is total and deterministic; the walk
// from the end therefore tries the highest index first among otherwise equal devices).
struct SortOrder {
  std::array<SortKey, 3> keys{};  // at most one per dimension: score, NUMA, Used
  size_t size = 0;
  bool uses_score = false;
};

// HAMi v2.10's device sort for `policy` (§4.4; pkg/scheduler/policy/gpu_policy.go):
//   single binpack/spread (and single topology-aware, which sorts as spread): score primary,
//     NUMA ascending as tie-breaker; with numa_bind the v2.5.2 NUMA-grouped order (binpack: NUMA
//     descending, score ascending; spread: NUMA ascending, score descending);
//   single mutex: Used descending, NUMA ascending as tie-breaker, with or without numa_bind;
//   bare numa or a chain: the keys in order (binpack = score ascending, spread = score descending,
//     numa = NUMA ascending); mutex and topology-aware are no keys in a chain, and a chain without
//     a key sorts as spread (score descending); a key on a dimension (score, NUMA) already ordered
//     is dropped, since it can never decide; numa_bind forces NUMA ascending to be the first key.
SortOrder SortOrderFor(const device::GpuPolicy& policy, bool numa_bind);

// True when the policy chain contains mutex (enables the Used > 0 exclusivity check).
bool HasMutex(const device::GpuPolicy& policy);
// True when the policy chain contains topology-aware (HAMi's PolicyContains): the fit collects
// every passing device and chooses among them by pair score (Fitter, docs/scheduling.md).
bool HasTopology(const device::GpuPolicy& policy);

// Under topology-aware, a container of N >= 2 GPUs with k candidates tries every one of the
// C(k, N) subsets as HAMi does while there are at most this many (C(16, 8) = 12,870: every N on
// a node of up to 16 GPUs); beyond it the choice is greedy (docs/compatibility.md).
inline constexpr uint64_t kMaxTopologySubsets = 20000;

// HAMi v2.10 ComputeScore with weights 1,1,1 for one device and one container request:
//   10 * ((req + Used)/Count + (core + Usedcores)/Totalcore + (mem + Usedmem)/Totalmem),
// where req/core/mem are 1/Coresreq/(percentage of Totalmem if set, else Memreq) when the
// device Type equals the request type exactly, and 0 otherwise; 0 when any total is 0.
// Computed in double as x * (1.0 / total) (the fit uses exactly this expression, so equal
// inputs always give equal scores).
double ComputeDeviceScore(const device::DeviceInfo& info, const device::DeviceUsage& usage,
                          const device::ContainerRequest& request);

// The outcome of fitting one pod on one node.
struct FitResult {
  bool fit = false;
  // On success: one entry per container of the request (init first), Type the request's ("NVIDIA",
  // "Ascend910B3").
  device::PodDevices devices;
  // On success: devices' MIG instances (profile and placement), parallel to `devices`; nullopt
  // for a device that is not one. Empty when the pod got no MIG instance.
  device::PodMigReservations mig;
  // On success: usage of every device after the pod (max of app cumulative and init peak).
  std::vector<device::DeviceUsage> usage_after;
  // On failure: the first failing container (index into PodRequest::containers) and why; for a
  // malformed snapshot (usage size differs from the device count) failed_container is -1 and
  // `reason` is "node usage unavailable".
  int failed_container = -1;
  ReasonParts reasons;
  std::string reason;  // the parts joined with ", ", e.g. "1/2 CardInsufficientMemory"
};

// The reason a node whose snapshot is blocked (NodeSnapshot::blocked_by, "ns/name") fails:
// "<kNodeBlockedReasonPrefix> (pod <ns/name>)".
inline constexpr std::string_view kNodeBlockedReasonPrefix =
    "node has an allocation Tessera cannot read";
std::string NodeBlockedReason(std::string_view blocked_by);
// One reason as a metric label value (a small fixed vocabulary): a blocked node's reason without
// the pod name (kNodeBlockedReasonPrefix); any other reason unchanged.
std::string_view ReasonLabel(std::string_view reason);

// Fits `request` on `node` with the constraints and the effective GPU policy (the caller
// resolves the pod-annotation override). A blocked node fails before any device is looked at,
// with failed_container -1 and NodeBlockedReason. Allocates; for the hot path use a Fitter.
FitResult FitPod(const device::NodeSnapshot& node, const device::PodRequest& request,
                 const device::PodConstraints& constraints, const device::GpuPolicy& policy);

// A node's device totals and usage summed over its devices, and HAMi's node score from them:
// 10 × (slots used / slots + cores used / cores + memory used / memory), 0 when a total is 0.
// ComputeNodeScore (score.h) and the Fitter's pass over the devices both sum with this.
struct NodeUsageTotals {
  int64_t count = 0;
  int64_t totalcore = 0;
  int64_t totalmem = 0;
  int64_t used = 0;
  int64_t usedcores = 0;
  int64_t usedmem = 0;

  void Add(const device::DeviceInfo& d, const device::DeviceUsage& u) {
    count += d.count;
    totalcore += d.devcore;
    totalmem += d.devmem;
    used += u.used;
    usedcores += u.usedcores;
    usedmem += u.usedmem;
  }
  double Score() const;
};

// The reusable fit engine behind FitPod and Decide. Prepare once per pod, then Fit per node;
// Fit allocates nothing once its buffers have grown to the node size. The Fitter is the
// vendor-neutral loop (containers, candidates in policy order, quota, reasons); which candidates
// a container takes is its device kind's rule set (device_rules.h, schedule/vendors/).
// Not thread-safe: one Fitter per thread.
class Fitter {
 public:
  Fitter();
  ~Fitter();
  Fitter(Fitter&&) noexcept;
  Fitter& operator=(Fitter&&) noexcept;

  // One device chosen for one container.
  // A MIG instance's usage is its profile's memory and core (HAMi's AddResourceUsage).
  struct Choice {
    int32_t container = 0;
    int32_t device = 0;  // position in NodeDevices::devices
    int32_t usedmem = 0;
    int32_t usedcores = 0;
    int32_t mig_profile = -1;  // index into the card's mig_profiles; -1: not a MIG instance
    device::MigPlacement placement;
  };

  // Binds the pod. `request`, `constraints` and `quota` must outlive the Fit calls. With a
  // limited `quota` (nullptr or unlimited: no check) each card is checked against it, unless an
  // upper bound of the pod's collapsed usage fits: then no card can fail and none is checked.
  // The bound is the plain sum of the requests, settled once per pod when every request is in
  // fixed MiB, and per node with its largest card when one is a percentage (whole cards are
  // 100 %) or under topology-aware (a container's check counts every card it collected).
  // `settle_quota` false checks every card (tests compare the two; same decisions).
  void Prepare(const device::PodRequest& request, const device::PodConstraints& constraints,
               const device::GpuPolicy& policy, const NamespaceQuota* quota = nullptr,
               bool settle_quota = true);

  // Fits the prepared pod on `node`. Returns true when every requesting container fits.
  // Afterwards choices() (on success) or failed_container()/reasons() (on failure) describe the
  // outcome. A snapshot without devices or with usage.size() != devices.size() fails with
  // failed_container() == -1 and empty reasons (the caller reports "node usage unavailable").
  // With want_usage_after false, usage_after() is not maintained (saves work in Decide).
  bool Fit(const device::NodeSnapshot& node, bool want_usage_after = true);

  const std::vector<Choice>& choices() const { return choices_; }
  int failed_container() const { return failed_container_; }
  const ReasonParts& reasons() const { return reasons_; }
  // The smallest ask the quota refused in the Fits since Prepare (nullopt when it refused none;
  // a memory miss is kept over a cores miss).
  const std::optional<QuotaMiss>& quota_miss() const { return quota_miss_; }
  // ComputeNodeScore of the node (valid after a Fit on a well-formed snapshot, fit or not).
  double node_score() const { return node_score_; }
  // Usage after the pod (valid after a successful Fit).
  const std::vector<device::DeviceUsage>& usage_after() const { return after_; }

  // Builds the PodDevices of the last successful Fit on `node` (the same snapshot).
  device::PodDevices BuildPodDevices(const device::NodeSnapshot& node) const;
  // The MIG reservations of the last successful Fit on `node`, parallel to BuildPodDevices;
  // empty when the pod got no MIG instance.
  device::PodMigReservations BuildMigReservations(const device::NodeSnapshot& node) const;

  // Internal: one candidate device with its sort keys, all ascending after sign flips
  // (unused keys 0). Public only so that the implementation's helpers and the rule sets
  // (device_rules.h) can name it.
  struct SortEntry {
    std::array<double, 3> key;
    int64_t tie;  // device index << 32 | position
    int32_t pos;  // position in NodeDevices::devices
  };
  // Internal: one device a rule set took for the container being fitted.
  struct Taken {
    int32_t device;
    int32_t usedmem;
    int32_t usedcores;
    int32_t rank;  // position in the rank list walked
    int32_t mig_profile = -1;
    device::MigPlacement placement = {};
  };

 private:
  friend struct ContainerWalk;  // the rule sets' view of one container's fit: QuotaFits

  // One pass over the node: the entries of the devices whose Type contains `type` against
  // `usage`, scored with `request` (nullptr: without the request part). With `base` it also
  // computes the node score, entry_of_ and any_exact_.
  void Build(const device::NodeSnapshot& node, absl::Span<const device::DeviceUsage> usage,
             std::string_view type, const device::ContainerRequest* request,
             std::vector<SortEntry>* out, bool base);
  template <bool base>
  void BuildImpl(const device::NodeSnapshot& node, absl::Span<const device::DeviceUsage> usage,
                 std::string_view type, const device::ContainerRequest* request,
                 std::vector<SortEntry>* out);
  bool TypeMatches(const std::string& type, std::string_view needle) const;
  void PrepareNeedle(std::string_view type);
  void SetKeys(int32_t numa, int32_t used, double score, SortEntry* e) const;
  // Fits one container against `usage`; the devices taken are added to `apply` (if given).
  bool FitContainer(int container, const device::ContainerRequest& request,
                    const device::NodeSnapshot& node, absl::Span<const device::DeviceUsage> usage,
                    std::vector<device::DeviceUsage>* apply, bool app);
  // One card's share of the pod's earlier containers on this node (for the quota check).
  struct QuotaCard {
    int32_t device = 0;
    int64_t init_mem = 0, init_cores = 0;  // peak over init containers
    int64_t app_mem = 0, app_cores = 0;    // sum over app containers
    int64_t cur_mem = 0, cur_cores = 0;    // QuotaFits: the container being fitted
    // The card's collapsed (memory, cores) with the container being fitted.
    std::pair<int64_t, int64_t> Term(bool app) const {
      if (app) {
        return {std::max(init_mem, app_mem + cur_mem), std::max(init_cores, app_cores + cur_cores)};
      }
      return {std::max(std::max(init_mem, cur_mem), app_mem),
              std::max(std::max(init_cores, cur_cores), app_cores)};
    }
  };
  // Prepare's part for the rule sets: each container's kind (kinds_) and its rules, prepared.
  void PrepareRules(const device::PodRequest& request, const device::PodConstraints& constraints,
                    const device::GpuPolicy& policy);
  // Prepare's part for the quota (after the policy): the pod's bound (bound_*), settling the
  // pod when it can.
  void PrepareQuotaBound(bool settle);
  // The quota the cards of `node` are checked against: nullptr when the bound with the node's
  // largest card (node_max_devmem_, from the base Build) fits (cached per card size and device
  // count: nodes are usually alike).
  const NamespaceQuota* QuotaFor(const device::NodeDevices& node);
  // Collapses choices_ (the earlier containers) into quota_base_; once per container.
  void PrepareQuotaBase();
  // Whether the namespace quota takes the pod's collapsed usage on this node with `device`
  // added to the container being fitted (HAMi's hypothetical PodDevices); records a miss.
  bool QuotaFits(bool app, int32_t device, int64_t memreq, int32_t coresreq);

  // Members are grouped by size (largest first within each part), so the bools share words.
  const device::PodRequest* request_ = nullptr;
  const NamespaceQuota* quota_ = nullptr;      // the node's check: null unless limited
  const NamespaceQuota* pod_quota_ = nullptr;  // the pod's: null unless limited and unsettled
  std::string_view primary_type_;              // the type of the first requesting container
  SortOrder order_;
  std::array<double, 3> key_sign_{};
  std::array<int, 3> key_source_{};  // per key: 0 = score, 1 = NUMA, 2 = Used
  // The last totals whose inverses (1.0 / total, 0 for 0) were taken, with them: a node's cards
  // are usually alike, so a division is rare.
  struct InverseCache {
    int32_t count = -1, core = -1, mem = -1;
    double inv_count = 0, inv_core = 0, inv_mem = 0;
  };
  InverseCache inverses_;
  // The keys' sources when SetKeys need not read key_source_: (score[, NUMA]), (NUMA, score).
  enum class KeyLayout : uint8_t { kAny, kScoreNuma, kNumaScore };
  KeyLayout key_layout_ = KeyLayout::kAny;

  int last_app_ = -1;      // the last app container with a request
  bool topology_ = false;  // the quota bound counts every collected card
  bool two_apps_ = false;  // two or more app containers request devices

  // The rule set of each device kind the Fitter has met (indexed by DeviceKind), and the kind
  // of each container of the prepared pod.
  std::vector<std::unique_ptr<DeviceRules>> rules_;
  std::vector<DeviceKind> kinds_;
  std::vector<uint8_t> primary_typed_;  // per container: its type is primary_type_

  // Scratch, reused across Fit calls.
  std::vector<device::DeviceUsage> app_;
  std::vector<device::DeviceUsage> init_;
  std::vector<device::DeviceUsage> after_;
  std::vector<SortEntry> base_entries_;  // against the node's usage, then against app_
  std::vector<SortEntry> entries_;       // rebuilt per container when the request matters
  std::vector<int32_t> entry_of_;        // device position -> base/app entry, -1 if no match
  std::vector<int32_t> base_rank_;       // entry indices in policy order, per entry list
  std::vector<int32_t> rank_;
  std::vector<Taken> taken_;
  std::vector<Choice> choices_;
  std::vector<QuotaCard> quota_base_;  // PrepareQuotaBase's cards
  // One requesting container's share of the bound: per card memreq MiB or pct % of the card.
  struct BoundAsk {
    int32_t nums;
    int32_t memreq;
    int32_t pct;  // > 0: a percentage (memreq is 0)
    int32_t cores;
  };
  std::vector<BoundAsk> bound_asks_;
  std::pair<int32_t, int32_t> bound_node_{-1, -1};  // (largest card, devices) of bound_settled_
  std::vector<QuotaCard> quota_cards_;              // QuotaFits' scratch
  int64_t quota_base_mem_ = 0;
  int64_t quota_base_cores_ = 0;
  std::optional<QuotaMiss> quota_miss_;
  std::string_view needle_;   // the request type being matched
  std::string needle_lower_;  // needle_, lower-cased
  uint64_t needle_bits_ = 0;
  uint64_t needle_mask_ = 0;
  double node_score_ = 0;
  int32_t node_max_devmem_ = 0;  // the base Build's largest card
  ReasonParts reasons_;
  int failed_container_ = -1;
  bool any_exact_ = false;
  bool base_tracks_app_ = true;  // base entries reflect app_ (false after a rebuilt container)
  bool needle_valid_ = false;
  bool needle_swar_ = false;     // all letters, at most 8: compare the prefix in one word
  bool bound_per_node_ = false;  // pod_quota_ is settled per node (percentage or topology)
  bool bound_settled_ = false;   // the bound for bound_node_ fits
};

}  // namespace tessera::schedule

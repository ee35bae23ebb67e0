// File: tessera/extender/verdict.h
//
// The verdict on a pending GPU pod: why a /filter left it without a node, as a small JSON
// document (at most kMaxVerdictBytes) that Tessera writes to the pod (annotation
// device::kVerdictAnnotation and a FilteringFailed event, verdict_writer.h) and that
// `tessera why` prints. Its fields and the reason vocabulary: docs/explain.md ("tessera why").
//
//   Verdict v = BuildVerdict(diagnosis, {.request = &request, .candidates = candidates,
//                                        .ledger = &ledger});      // cycle::Diagnosis
//   std::string json = EncodeVerdict(v);        // <= kMaxVerdictBytes, stable for equal input
//   absl::StatusOr<Verdict> back = DecodeVerdict(json);
//   std::string text = FormatVerdict(*back, now);  // for people
//
// The document holds no clock reading of its own (only the expiry of a reservation and the time
// of a node lock), so the same cluster state gives the same bytes: the writer compares them to
// write only when the verdict changes.
//
// Errors: DecodeVerdict returns InvalidArgument for anything that is not a verdict document.
// Thread safety: free functions over their arguments; BuildVerdict reads the ledger (which is
// thread-safe) and calls `lock_of`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "tessera/cycle/diagnosis.h"
#include "tessera/device/model.h"
#include "tessera/extender/scheduler.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/score.h"

namespace tessera::extender {

inline constexpr size_t kMaxVerdictBytes = 1024;

// The reason of a pod left without candidates (kube-scheduler sent none).
inline constexpr std::string_view kNoCandidatesReason = "no candidate nodes";

// The reason vocabulary of verdicts and of tessera_pending_pods{reason}: HAMi's device reason
// names ("CardInsufficientMemory", …), the node-level labels (NodeFailureLabel) and
// kNoCandidatesReason. A fixed set: no node or pod name ever appears in it.
std::vector<std::string_view> PendingReasons();

// The reason most failed nodes share: a device reason by its name, a node-level failure by its
// label, ties broken by name; kNoCandidatesReason when there were no candidates.
std::string_view MainReason(const std::vector<FailedNode>& failed_nodes);

// A pod holding part of the nearest-miss device.
struct VerdictHolder {
  std::string pod;  // "namespace/name"
  int64_t mib = 0;
  int64_t cores = 0;
  // Held by a reservation (a filter decision not yet bound): when it expires.
  std::optional<absl::Time> reserved_until;

  friend bool operator==(const VerdictHolder&, const VerdictHolder&) = default;
};

// The device that came closest to fitting the pod's first requesting container, and by how much
// it missed (need - free, per resource; a device may miss on several).
struct NearestMiss {
  std::string node;
  std::string device;  // UUID
  int64_t need_mib = 0, free_mib = 0;
  int64_t need_cores = 0, free_cores = 0;
  int64_t free_slots = 0;              // allocations the device may still take (split count - used)
  std::vector<VerdictHolder> held_by;  // largest memory first, at most kMaxHolders
  int64_t more_holders = 0;            // holders left out
  static constexpr size_t kMaxHolders = 3;

  friend bool operator==(const NearestMiss&, const NearestMiss&) = default;
};

// HAMi's node lock (hami.io/mutex.lock) on the nearest-miss node, held by another pod's bind.
struct LockBlocker {
  std::string node;
  std::string holder;  // "namespace/name"; empty for a legacy lock
  absl::Time since;

  friend bool operator==(const LockBlocker&, const LockBlocker&) = default;
};

struct Verdict {
  std::string reason;  // MainReason
  int64_t nodes = 0;   // candidate nodes
  // Nodes failed per reason (a node failing for two reasons counts under both), most first.
  std::vector<std::pair<std::string, int64_t>> reasons;
  std::optional<NearestMiss> nearest;
  // Blockers outside the devices.
  std::optional<LockBlocker> lock;
  int64_t unregistered = 0;  // candidates without a device registration (plugin not reporting)
  int64_t unhealthy = 0;     // unhealthy or cordoned devices on the candidates
  int64_t blocked = 0;       // candidates blocked by an allocation Tessera cannot read (audit)
  std::string blocked_by;    // the first blocking pod, "namespace/name"
  // The namespace quota that refused the pod ("namespace ml: limits.nvidia.com/gpumem 40000,
  // used 36000 + 8000 asked"); empty when no quota refused it.
  std::string quota;
  // A MIG request no card could place (CardMigTopologyInfeasible): the first such card, the
  // profile, the placement the fewest instances block and the pods holding instances there
  // ("node m1 / GPU-m0: 3g.20gb (19968 MiB): no free placement; …; held by ml/a"); empty
  // otherwise. At most kMaxMigBytes.
  std::string mig;
  static constexpr size_t kMaxMigBytes = 320;
  // Why preemption did not help the pod, from its last preemption ("no eviction of
  // lower-priority pods frees a GPU share on 2 nodes: a, b"; "preemptionPolicy Never"); empty
  // when none was tried or it found victims (Scheduler::NotePreemption).
  std::string preemption;

  friend bool operator==(const Verdict&, const Verdict&) = default;
};

struct VerdictInput {
  const device::PodRequest* request = nullptr;
  absl::Span<const schedule::Candidate> candidates;  // with their snapshots, as decided
  const std::vector<FailedNode>* failed = nullptr;   // FilterOutcome::failed_nodes
  const ledger::Ledger* ledger = nullptr;            // holders and reservation expiries
  // The hami.io/mutex.lock value of a node ("" when none); may be null.
  std::function<std::string(std::string_view node)> lock_of;
  // Whether a registered node withholds its devices: its device plugin stopped reporting (an
  // expired handshake, a JSON node not Ready) or --node-label-selector leaves it out. The ledger
  // keeps such a node with every device unhealthy (docs/serve.md "The node registry"); the
  // verdict counts it as `unregistered`, under "node unregistered", as HAMi's filter would name
  // it, and not its devices as unhealthy. May be null: no node withholds its devices.
  std::function<bool(std::string_view node)> withheld;
};

// The verdict of a filter that found no node. Strings longer than 128 bytes are cut.
Verdict BuildVerdict(const VerdictInput& in);
// The same from the decision cycle's diagnosis (cycle/diagnosis.h): its failed nodes (in.failed
// is ignored) and its quota refusal. What the filter and the why replay write.
Verdict BuildVerdict(const cycle::Diagnosis& diagnosis, VerdictInput in);

// Compact JSON of at most kMaxVerdictBytes: detail is left out (holders, then the lock, then the
// nearest miss, then the rarest reasons) until it fits.
std::string EncodeVerdict(const Verdict& verdict);
// Parses what EncodeVerdict writes; unknown fields are ignored. Errors: InvalidArgument.
absl::StatusOr<Verdict> DecodeVerdict(std::string_view json);
// The verdict for people, several lines, times relative to `now` ("expires in 3m12s").
std::string FormatVerdict(const Verdict& verdict, absl::Time now);

}  // namespace tessera::extender

// File: tessera/ledger/ledger.h
//
// The allocation ledger: which pod holds which share of which GPU, kept incrementally so that a
// filter reads the usage of its candidate nodes in O(candidates), never O(pods). Its inputs are
// level-triggered (each call states the current truth for one key): node registrations
// (SetNode/RemoveNode), observed pods (Apply/Remove, by uid, replacing), and reservations
// (Reserve/Release/ExpireReservations). The holder rule (six numbered cases: which records hold,
// how init and app containers are counted, unreadable allocations that block a node) and the
// stored form: docs/self-healing.md "The ledger", docs/design.md "The ledger".
//
// Errors: the mutators return InvalidArgument for malformed input and change nothing; Reserve
// returns FailedPrecondition for a pod already observed bound (each method says which).
//
// Thread safety: internally synchronised; every method may be called from any thread, and each
// call is atomic with respect to all others (Snapshot and Full see all or none of an update).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "tessera/base/mutex.h"
#include "tessera/device/mig.h"
#include "tessera/device/model.h"

namespace tessera::ledger {

// One observed pod, as the store projects it.
struct PodAllocation {
  std::string uid;
  std::string ns;
  std::string name;
  std::string node;            // hami.io/vgpu-node; empty = carries no allocation
  std::string bound_node;      // spec.nodeName; empty while unbound
  bool terminal = false;       // status.phase is Succeeded or Failed
  bool deleted = false;        // the deletion has completed (a DELETED event's last state)
  bool bind_failed = false;    // hami.io/bind-phase=failed
  device::PodDevices devices;  // hami.io/vgpu-devices-allocated, decoded
  int32_t init_count = 0;      // devices[0, init_count) belong to init containers (>= 0)
  // hami.io/vgpu-devices-allocated is present but does not decode: which devices the pod uses
  // is unknown. `devices` and `init_count` are ignored (stored empty and 0). Holder rule 6.
  bool unreadable = false;
  // hami.io/vgpu-mig-allocations, decoded (empty when absent or when it does not decode, as
  // HAMi ignores such a value): the MIG placements the pod holds (docs/mig.md "The ledger").
  std::vector<device::MigAllocation> mig = {};

  friend bool operator==(const PodAllocation&, const PodAllocation&) = default;
};

// An in-flight filter decision.
struct Reservation {
  std::string uid;
  std::string ns;
  std::string name;
  std::string node;
  device::PodDevices devices;
  absl::Time expires_at;
  int32_t init_count = 0;  // devices[0, init_count) belong to init containers (>= 0)
  // The MIG placements the fit chose (device::MigAllocationsOf), as the filter patch writes them.
  std::vector<device::MigAllocation> mig = {};

  friend bool operator==(const Reservation&, const Reservation&) = default;
};

// One container's share of one device.
struct Holder {
  std::string uid;
  std::string ns;
  std::string name;
  int32_t container = 0;  // init containers first, then app containers
  int32_t usedmem = 0;    // MiB
  int32_t usedcores = 0;  // percent
  bool reserved = false;  // held by a reservation rather than an observed bound pod
  bool init = false;      // an init container's entry (container < the holder's init_count)

  friend bool operator==(const Holder&, const Holder&) = default;
};

// One registered node with its usage and, per device, who holds it.
struct NodeView {
  std::shared_ptr<const device::NodeDevices> devices;
  std::vector<device::DeviceUsage> usage;    // usage[i] belongs to devices->devices[i]
  std::vector<std::vector<Holder>> holders;  // holders[i] likewise; sorted by (uid, container)
  // mig[i]: the MIG instances the device plugin realised (runtime identity set) for the bound
  // pods holding devices->devices[i]; empty on a node without MIG.
  std::vector<std::vector<device::MigAllocation>> mig = {};
};

// What the pods of one namespace hold: the sum, over its holding records and reservations, of
// the collapsed usage (counting rule 5) of the entries that hold a device. It is derived in the
// same step as the per-device usage, so it always equals the namespace's share of that usage.
// Namespace quota reads it (docs/quota.md).
struct NamespaceUsage {
  int64_t usedmem = 0;    // MiB (scaled by memoryFactor, as recorded)
  int64_t usedcores = 0;  // percent
  int32_t holders = 0;    // records and reservations that hold at least one device

  friend bool operator==(const NamespaceUsage&, const NamespaceUsage&) = default;
};

// The whole ledger at one instant (for metrics and /debug/ledger).
struct FullSnapshot {
  std::vector<NodeView> nodes;  // registered nodes, sorted by name
  size_t records = 0;           // stored observed records
  size_t reservations = 0;
  // Every namespace whose pods hold a device, sorted by namespace.
  std::vector<std::pair<std::string, NamespaceUsage>> namespaces;
};

// What changed in the ledger's capacity since a version (Ledger::CapacitySince), at one instant:
// what the requeue of refused pods compares between its rounds (extender/requeue.h).
struct CapacityChanges {
  uint64_t version = 0;  // the ledger's now: the next call's argument
  // The nodes whose usage, registration, blockers or MIG state changed since, as
  // Ledger::Snapshot gives them (nullopt: no longer registered), in no particular order. A node
  // forgotten altogether is not listed: `registered` says how many are registered now.
  std::vector<std::pair<std::string, std::optional<device::NodeSnapshot>>> nodes;
  size_t registered = 0;
  std::vector<std::pair<std::string, NamespaceUsage>> namespaces;  // all of them, sorted
};

// A pod bound to a node other than its hami.io/vgpu-node.
struct Conflict {
  std::string uid, ns, name;
  std::string node;        // annotated
  std::string bound_node;  // spec.nodeName
};

// A device entry of a holding record or reservation that its (registered) node does not have.
struct Orphan {
  std::string uid, ns, name;
  std::string node;
  std::string uuid;
  int32_t container = 0;
  bool reserved = false;
};

// A holding record or reservation whose node is not registered: it holds nothing.
struct Unregistered {
  std::string uid, ns, name;
  std::string node;
  bool reserved = false;
};

// A record whose allocation does not decode and that blocks its node (holder rule 6).
struct Unreadable {
  std::string uid, ns, name;
  std::string node;
};

// A MIG card's books disagree with what a pod holds or the plugin realised (docs/mig.md "The
// ledger"). The kinds:
enum class MigProblemKind : uint8_t {
  // The pod's reservations and devices disagree on the card (HAMi's usage rebuild marks the card
  // unhealthy): the card fails closed until it is resolved. `why` is HAMi's reason.
  kUnusable,
  // The pod's placement overlaps another holder's placement on the same card.
  kOverlap,
  // A bound, holding pod whose reservation the plugin has not realised (no runtime identity yet).
  // The auditor reports it only once it persists past its deadline (auditor.h).
  kUnrealised,
  // The plugin realised an instance (runtime identity present) for a pod that holds nothing
  // (bind failed, or bound to another node): an instance no live pod holds.
  kStrayInstance,
};
std::string_view MigProblemKindName(MigProblemKind kind);  // "unusable", "overlap", ...

struct MigProblem {
  MigProblemKind kind = MigProblemKind::kUnusable;
  std::string uid, ns, name;
  std::string node;
  std::string uuid;  // the card
  std::string why;   // one line
  friend bool operator==(const MigProblem&, const MigProblem&) = default;
};

// A pod's allocation: what Tessera decided for it, or what its annotations say.
struct Decision {
  std::string node;            // hami.io/vgpu-node
  device::PodDevices devices;  // hami.io/vgpu-devices-allocated, decoded
  int32_t init_count = 0;
  std::vector<device::MigAllocation> mig = {};  // hami.io/vgpu-mig-allocations, decoded
  bool unreadable = false;                      // the devices annotation does not decode

  friend bool operator==(const Decision&, const Decision&) = default;
};

// A pinned pod (LedgerOptions::pin_decisions) whose annotations no longer state the decision the
// ledger keeps for it: someone rewrote its allocation after it was bound.
struct Rewritten {
  std::string uid, ns, name;
  Decision kept;      // what the ledger holds (the decision pinned when it was first bound)
  Decision observed;  // what the pod's annotations said at the latest Apply

  friend bool operator==(const Rewritten&, const Rewritten&) = default;
};

// Whether `a` and `b` state the same allocation: the node, the devices with a UUID (container,
// UUID, MiB and cores, in order; blank padding and trailing empty containers do not count), the
// init count clamped to the containers with devices, the readability and the MIG placements
// (container, device, card, profile, placement; not the runtime identity the device plugin
// writes back).
bool SameDecision(const Decision& a, const Decision& b);

// One line for logs, events and /debug: "GPU-1 12000MiB 0%, ..." then the MIG placements
// ("GPU-1 1g.5gb slices 6-6"); "no devices"; or "allocation unreadable".
std::string DecisionText(const Decision& d);

struct Problems {
  std::vector<Conflict> conflicts;         // sorted by uid
  std::vector<Orphan> orphans;             // sorted by (uid, container, uuid)
  std::vector<Unregistered> unregistered;  // sorted by uid
  std::vector<Unreadable> unreadable;      // sorted by uid
  std::vector<MigProblem> mig;             // sorted by (kind, uid, uuid, why)
  std::vector<Rewritten> rewritten;        // sorted by uid
};

enum class DiffKind {
  kStale,    // in a, not in b
  kMissing,  // in b, not in a
  kChanged,  // in both, different node, bound state, flags (unreadable included), init count
             // or devices
};

// A difference in one record (reservation == false) or one reservation (reservation == true).
struct RecordDiff {
  DiffKind kind = DiffKind::kChanged;
  bool reservation = false;
  std::string uid, ns, name;
  std::string node_a;  // the annotated (or reserved) node in a; empty when absent
  std::string node_b;
};

// A device whose usage or holders differ. For a node registered in only one ledger, every
// device of that node with non-zero usage is listed against zero usage.
struct UsageDiff {
  std::string node;
  std::string uuid;
  device::DeviceUsage a, b;
  std::vector<std::string> holders_a, holders_b;  // sorted UIDs, one per container entry
};

// A namespace whose usage differs (absent = zero usage).
struct NamespaceDiff {
  std::string ns;
  NamespaceUsage a, b;
};

// A node registered in only one ledger, or registered with different devices.
struct NodeDiff {
  std::string node;
  bool registered_a = false;
  bool registered_b = false;
};

// What the ledger holds for one pod (Ledger::Held): the record's annotated node and devices when
// it has a readable record, else its reservation's.
struct Held {
  std::string ns;
  std::string name;
  std::string node;
  bool reserved = false;       // from the reservation (the pod has no readable record)
  device::PodDevices devices;  // one entry per container up to the last with a device
};

struct LedgerDiff {
  std::vector<RecordDiff> records;        // sorted by (reservation, uid)
  std::vector<UsageDiff> usage;           // sorted by (node, uuid)
  std::vector<NodeDiff> nodes;            // sorted by node
  std::vector<NamespaceDiff> namespaces;  // sorted by namespace
  bool Empty() const {
    return records.empty() && usage.empty() && nodes.empty() && namespaces.empty();
  }
  // A human-readable multi-line summary, one line per difference (for logs and test failures).
  std::string ToString() const;
};

struct LedgerOptions {
  // Pin each pod's decision: once a readable record is first stored holding (bound to its
  // annotated node, not failed), later Applies of the same uid keep its allocation (node,
  // devices, init count, MIG placements) whatever they carry, until the pod is terminal, deleted
  // or removed. They still update its state (bind-phase, phase) and the MIG instances' runtime
  // identity the device plugin writes back. An Apply whose allocation differs from the pin is
  // reported (Problems::rewritten) until one agrees again. Why: docs/self-healing.md "Pinned
  // decisions". Off: every Apply replaces (a pure projection, for tools and models).
  bool pin_decisions = false;
};

class Ledger {
 public:
  Ledger();
  explicit Ledger(LedgerOptions options);
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Registers `node` (replacing any earlier registration of node->node) and re-derives the
  // usage of every pod recorded or reserved on it: entries naming UUIDs the node no longer has
  // become orphans, entries naming UUIDs it now has start to hold. Re-registering identical
  // devices only swaps the pointer. Errors: InvalidArgument for a null pointer, an empty node
  // name or more than 32,767 devices (nothing changes). Costs O(devices + entries of the pods
  // recorded or reserved on the node).
  absl::Status SetNode(std::shared_ptr<const device::NodeDevices> node);
  // Forgets the registration of `name`: its devices and usage go; records and reservations on
  // it stay and hold nothing until it registers again. Returns false if it was not registered.
  bool RemoveNode(std::string_view name);

  // Replaces everything known about pod `pod.uid` (node included) by `pod`, applying the
  // holder rule above; for a pinned pod, its allocation stays the pinned one (LedgerOptions).
  // Errors: InvalidArgument for an empty uid, strings longer than 65,535 bytes, more than 65,535
  // containers or a negative init_count (nothing changes). Costs O(entries of the pod) plus a few
  // hash lookups; an Apply that changes nothing the ledger keeps (a status-only update) returns
  // after one lookup and a comparison.
  absl::Status Apply(const PodAllocation& pod);
  // Forgets pod `uid` entirely: its record and its reservation. For DELETED events and
  // tombstones. Returns false if nothing was known about it.
  bool Remove(std::string_view uid);

  // Holds `devices` on `node` for pod `uid` until the pod is observed bound, terminal or
  // deleted, is reserved again (this replaces the old reservation), Release(uid), or
  // ExpireReservations passes `expires_at`. `init_count` is the number of leading containers of
  // `devices` that belong to init containers (counting rule 5); `mig` the MIG placements chosen
  // for them (MigAllocationsOf). Errors: InvalidArgument (empty uid or node, sizes and
  // init_count as for Apply); FailedPrecondition when the pod is already observed bound (nothing
  // changes).
  absl::Status Reserve(std::string_view uid, std::string_view ns, std::string_view name,
                       std::string_view node, const device::PodDevices& devices,
                       absl::Time expires_at, int32_t init_count = 0,
                       const std::vector<device::MigAllocation>& mig = {});
  // Ends pod `uid`'s reservation (bind failed). Returns false if it had none.
  bool Release(std::string_view uid);
  // Ends every reservation with expires_at <= now and returns them, sorted by uid.
  // Costs O(reservations).
  std::vector<Reservation> ExpireReservations(absl::Time now);
  // The same, except that reservations for which keep(uid) is true stay (the scheduler keeps
  // those whose bind is in progress or done but not yet observed). `keep` runs under the
  // ledger's lock: it must not call the ledger.
  std::vector<Reservation> ExpireReservations(
      absl::Time now, const std::function<bool(std::string_view uid)>& keep);
  // Moves container `container` of pod `uid` from exactly the devices `from` (UUID, MiB and
  // cores, in order) to `to`, in its record and in its reservation — whichever of the two holds
  // `from` there — in one step under the lock: the pod's usage is replaced, never removed and
  // added back, so a concurrent Remove/Apply of the pod is ordered wholly before or after it (a
  // pod removed first stays removed; other pods' usage is never touched). The NUMA refit's
  // accounting (extender/refit.h). Returns how many of the two were moved (0: neither holds
  // `from` any more, e.g. the informer already applied the change). After a move, until an
  // Apply states `to` for that container (or another allocation, or ends the pod), an Apply that
  // still states `from` is an event older than the refit's patch: it is applied with `to` in its
  // place. Errors: NotFound when
  // nothing is known about `uid`; InvalidArgument for an empty `from` or `to`, a negative
  // container or a UUID longer than 65,535 bytes (nothing changes). O(entries of the pod).
  absl::StatusOr<int> ReplaceContainer(std::string_view uid, int32_t container,
                                       const device::ContainerDevices& from,
                                       const device::ContainerDevices& to);
  // What is held for pod `uid` (record first, else reservation), or nullopt when the ledger
  // knows nothing of it or its record is unreadable. O(entries of the pod).
  std::optional<Held> Find(std::string_view uid) const;

  // Whether pod `uid` has a live reservation. O(1).
  bool HasReservation(std::string_view uid) const;
  // Pod `uid`'s live reservation, or nullopt. O(entries of the pod).
  std::optional<Reservation> ReservationOf(std::string_view uid) const;

  // For each name, the node's devices and usage (and blocked_by, holder rule 6), or nullopt if
  // it is not registered. All nodes are read under one lock, so the result is one consistent
  // instant. O(sum of their devices).
  std::vector<std::optional<device::NodeSnapshot>> Snapshot(
      const std::vector<std::string_view>& node_names) const;
  // Every registered node with per-device usage and holders. O(nodes + records).
  FullSnapshot Full() const;
  // The capacity changes since `version` (0: every registered node). Under the lock: a scan of
  // the node slots, and the changed nodes' devices; O(nodes + changed nodes' devices +
  // namespaces).
  CapacityChanges CapacitySince(uint64_t version) const;
  // The version CapacitySince would report now: it grows with every change of a node's usage,
  // registration, blockers or MIG state. O(1).
  uint64_t CapacityVersion() const;
  // One registered node with per-device usage and holders, or nullopt if it is not registered.
  // O(its devices + the holders on it).
  std::optional<NodeView> View(std::string_view node) const;
  // When pod `uid`'s live reservation expires, or nullopt when it has none. O(1).
  std::optional<absl::Time> ReservationExpiry(std::string_view uid) const;
  // What the pods of namespace `ns` hold (zero when none). O(1): one hash lookup.
  NamespaceUsage UsageOf(std::string_view ns) const;
  // Conflicts, orphans, holders on unregistered nodes and blocking unreadable records.
  // O(records + reservations).
  Problems FindProblems() const;
  // The stored observed records (normalised as stored), sorted by uid. O(records).
  std::vector<PodAllocation> Records() const;
  // The live reservations, sorted by uid. O(reservations).
  std::vector<Reservation> Reservations() const;
  // The records of the pinned pods (LedgerOptions::pin_decisions), sorted by uid: each holds its
  // pinned allocation. The audit's input to Recompute. O(records).
  std::vector<PodAllocation> Pinned() const;

  // A fresh ledger built from scratch: registers `nodes`, pins the records of `pinned` (another
  // ledger's Pinned()) whose uid is among `pods`, stores `pods` (a pinned uid's entry keeps its
  // pinned allocation, by the same rule as Apply; otherwise a later entry with the same uid
  // replaces an earlier one), adds `reservations` (skipping those the holder rule refuses, i.e.
  // for pods observed bound), then derives all usage in one pass. It pins nothing else. Inputs
  // that Apply/SetNode/Reserve would reject are skipped.
  static std::unique_ptr<Ledger> Recompute(
      const std::vector<std::shared_ptr<const device::NodeDevices>>& nodes,
      const std::vector<PodAllocation>& pods, const std::vector<Reservation>& reservations,
      const std::vector<PodAllocation>& pinned = {});

  // Compares a with b entry by entry. Diff(x, x) is empty. Locks both (in address order).
  friend LedgerDiff Diff(const Ledger& a, const Ledger& b);

 private:
  static constexpr uint32_t kNone = 0xffffffffu;

  // One container device of a record or reservation. `uuid` indexes uuids_; `dev` is the index
  // of the matched device on the holder's node while held (-1: orphan or node unregistered).
  struct Entry {
    uint32_t uuid = 0;
    int32_t usedmem = 0;
    int32_t usedcores = 0;
    uint16_t container = 0;
    int16_t dev = -1;
  };
  using Entries = absl::InlinedVector<Entry, 1>;

  struct Res {
    uint32_t node = kNone;
    uint16_t init_count = 0;  // normalised: at most the number of stored containers
    absl::Time expires_at;
    Entries entries;
    std::vector<device::MigAllocation> mig;
  };

  enum class Source : uint8_t { kNothing, kRecord, kReservation };

  // A pod known through a record, a reservation or both. `text` holds uid, ns, name and (only
  // for a conflict) the bound node, back to back; pod_index_ keys point into it.
  struct Pod {
    std::unique_ptr<char[]> text;
    uint16_t uid_len = 0, ns_len = 0, name_len = 0, bound_len = 0;
    uint32_t node = kNone;  // record's annotated node slot
    // Bit-fields keep Pod at 24 bytes before `entries` (the memory budget counts every byte).
    bool has_record : 1 = false;
    bool bound : 1 = false;
    bool bind_failed : 1 = false;
    bool unreadable : 1 = false;  // the record's allocation does not decode (rule 6)
    bool pinned : 1 = false;      // the record is the pod's pinned decision (LedgerOptions)
    Source held = Source::kNothing;
    uint16_t init_count = 0;  // the record's, normalised like Res::init_count
    Entries entries;          // the record's
    std::unique_ptr<Res> res;

    std::string_view uid() const { return {text.get(), uid_len}; }
    std::string_view ns() const { return {text.get() + uid_len, ns_len}; }
    std::string_view name() const { return {text.get() + uid_len + ns_len, name_len}; }
    // Non-empty only when bound to a node other than the annotated one.
    std::string_view bound_elsewhere() const {
      return {text.get() + uid_len + ns_len + name_len, bound_len};
    }
    bool conflict() const { return has_record && bound && bound_len > 0; }
    bool record_holds() const { return has_record && bound && bound_len == 0 && !bind_failed; }
  };

  // One MIG card's books: the placements held (by pod id) and the pods that make it unusable.
  struct MigHeld {
    uint32_t pod = 0;
    device::MigPlacement placement;
  };
  struct MigBad {
    uint32_t pod = 0;
    std::string why;
  };
  struct MigBook {
    std::vector<MigHeld> held;
    std::vector<MigBad> bad;
  };

  struct NodeSlot {
    std::string name;
    std::shared_ptr<const device::NodeDevices> devices;  // null: not registered
    std::vector<uint32_t> device_uuids;                  // interned base UUID per device
    std::vector<device::DeviceUsage> usage;
    std::vector<std::vector<uint32_t>> holders;  // pod ids, one per held entry
    absl::flat_hash_set<uint32_t> members;       // pods with record or reservation here
    std::vector<uint32_t> blockers;              // unreadable holding records (rule 6)
    // Per device, once the node registers a "mig" card or a pod reserves MIG here; else empty.
    std::vector<MigBook> mig;
    bool has_mig_card = false;
    uint64_t changed = 0;  // capacity_version_ at the last change (CapacitySince)
  };

  // Per-device scratch for collapsing one pod's entries (Account/Unaccount).
  struct Collapse {
    int32_t app = 0;
    int64_t app_mem = 0, app_cores = 0;  // sums of int32 values: 64 bits cannot overflow
    int64_t init_mem = 0, init_cores = 0;
    bool init = false;
    bool touched = false;
  };

  struct UuidSlot {
    std::string value;
    uint32_t base = kNone;  // id of the UUID without a MIG suffix (self when none)
    uint32_t refs = 0;
  };

  // All private helpers require mu_.
  uint32_t InternUuid(std::string_view uuid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseUuid(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BuildEntries(const device::PodDevices& devices, Entries* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (sign +1) or subtracts (sign -1) the collapsed usage of `entries` (those with dev >= 0)
  // on `slot` and on namespace `ns`; entries with container < init_count are init containers.
  void AddUsage(const Entries& entries, uint16_t init_count, NodeSlot* slot, std::string_view ns,
                int32_t sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddNamespaceUsage(std::string_view ns, int64_t mem, int64_t cores, int32_t sign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseEntries(const Entries& entries) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NodeSlotFor(std::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeFreeNode(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t FindPod(std::string_view uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NewPod() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreePod(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetText(uint32_t id, std::string_view uid, std::string_view ns, std::string_view name,
               std::string_view bound_elsewhere) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropReservation(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Link(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Account(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The MIG part of Account/Unaccount: the pod's placements and problems on `slot`
  // (device::MigUsageOfPod), or their removal.
  void AccountMig(uint32_t id, const Entries& entries, NodeSlot* slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnaccountMig(uint32_t id, NodeSlot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The MIG allocations of the pod's holding source (record or reservation); empty when none.
  const std::vector<device::MigAllocation>& MigOf(uint32_t id, bool reserved) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FindMigProblems(Problems* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unaccount(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pod's life if it has neither record nor reservation; otherwise links and (when
  // `account`) accounts it. Then frees the node slots `old_a`/`old_b` if unused.
  void Settle(uint32_t id, bool account, uint32_t old_a, uint32_t old_b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status SetNodeLocked(std::shared_ptr<const device::NodeDevices> node, bool account)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const PodAllocation& pod, bool account)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReserveLocked(std::string_view uid, std::string_view ns, std::string_view name,
                             std::string_view node, const device::PodDevices& devices,
                             absl::Time expires_at, int32_t init_count,
                             const std::vector<device::MigAllocation>& mig, bool account)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReleaseLocked(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReplaceContainer on one entry list: true when it held exactly `from` for `container`.
  bool ReplaceEntries(Entries* entries, uint16_t container, const device::ContainerDevices& from,
                      const device::ContainerDevices& to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when storing `pod` would leave record `p` exactly as it is.
  bool SameRecord(const Pod& p, const PodAllocation& pod) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when `pod` states the allocation of pinned record `id` (its node, devices, init count
  // and MIG placements; the MIG runtime identity is not compared).
  bool SameDecision(uint32_t id, const PodAllocation& pod) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether p's entries and init count are pod's devices with a UUID (container, UUID, MiB,
  // cores, in order) and its normalised init count.
  bool SameEntries(const Pod& p, const PodAllocation& pod) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pod `id`'s record as a PodAllocation (Records, Pinned).
  PodAllocation ExportRecord(uint32_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `pod` with the allocation of pinned record `id` in place of its own; a MIG placement the
  // pod still states keeps the runtime identity the pod gives it.
  PodAllocation KeepDecision(uint32_t id, const PodAllocation& pod) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocation record `id` holds.
  Decision DecisionOf(uint32_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `observed`, or (into *moved) `observed` with a pending refit move of pod `id` applied when it
  // still states the move's `from`; the move ends when `observed` states anything else.
  const PodAllocation& FollowMove(uint32_t id, const PodAllocation& observed, PodAllocation* moved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Apply's view of `observed` for pinned record `id` (ledger_pin.cc): `observed` itself when it
  // ends the pod or states the pin, else the pin kept (in *kept) with the rewrite recorded.
  const PodAllocation& HoldPin(uint32_t id, const PodAllocation& observed, PodAllocation* kept)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a refit of pod `id`: forgets its recorded rewrite once that states the moved pin.
  void DropRewriteIfSame(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Problems::rewritten.
  void FindRewritten(Problems* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recompute's first step: pins the records of `pinned` whose uid is among `pods`.
  void RestorePinsLocked(const std::vector<PodAllocation>& pinned,
                         const std::vector<PodAllocation>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RebuildUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  device::PodDevices ExportDevices(const Entries& entries) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Reservation ExportReservation(const Pod& pod) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeView ViewLocked(const NodeSlot& slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  device::NodeSnapshot SnapshotLocked(const NodeSlot& slot) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "ns/name" of the blocker of `slot` with the smallest uid; empty when none.
  std::string BlockedByLocked(const NodeSlot& slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static LedgerDiff DiffLocked(const Ledger& a, const Ledger& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu_, b.mu_);

  mutable Mutex mu_;
  std::vector<Pod> pods_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_pods_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<absl::string_view, uint32_t> pod_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> reserved_ ABSL_GUARDED_BY(mu_);
  size_t records_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<NodeSlot> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> node_index_ ABSL_GUARDED_BY(mu_);
  std::vector<UuidSlot> uuids_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_uuids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> uuid_index_ ABSL_GUARDED_BY(mu_);
  // Per namespace, kept in step with the per-device usage by AddUsage; entries with no holder
  // are erased.
  absl::flat_hash_map<std::string, NamespaceUsage> namespaces_ ABSL_GUARDED_BY(mu_);
  std::vector<Collapse> collapse_ ABSL_GUARDED_BY(mu_);  // indexed by device; all untouched
  std::vector<int16_t> touched_ ABSL_GUARDED_BY(mu_);
  // The records' MIG allocations, by pod id, for the few records that have any (kept out of Pod,
  // whose size the memory budget counts).
  absl::flat_hash_map<uint32_t, std::vector<device::MigAllocation>> record_mig_
      ABSL_GUARDED_BY(mu_);
  const LedgerOptions options_ = {};
  // Bumped by every change of a node's usage, registration, blockers or MIG state.
  uint64_t capacity_version_ ABSL_GUARDED_BY(mu_) = 0;
  // By pod id: what the annotations of a pinned pod state while it differs from its pin.
  absl::flat_hash_map<uint32_t, Decision> rewritten_ ABSL_GUARDED_BY(mu_);
  // By pod id: refit moves (ReplaceContainer) whose patch the informer has not delivered yet.
  struct Move {
    uint16_t container = 0;
    device::ContainerDevices from, to;
  };
  absl::flat_hash_map<uint32_t, Move> moves_ ABSL_GUARDED_BY(mu_);
};

LedgerDiff Diff(const Ledger& a, const Ledger& b);

}  // namespace tessera::ledger

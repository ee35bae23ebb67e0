// File: tessera/accounting/node_registry.h
//
// The node registry of `tessera serve`: from the node informer's deliveries to what the ledger
// knows about each node's devices (docs/hami-protocol.md §1.3, §1.4, §2.1;
// docs/hami-device-plugin.md §4).
//
//   NodeRegistry registry(vendor.get(), &ledger, {.selector = *NodeSelector::Parse(flag)});
//   // informer worker:
//   on_add/on_update:  patches = registry.Observe(node, clock->Now());
//   on_delete:         registry.Forget(node.meta.name);
//   every few seconds: patches = registry.Tick(clock->Now());
//   if (leader) writer.WriteAll(patches);            // HandshakeWriter, below
//   // any thread:      registry.Status()  (for /debug and metrics)
//
// What a node offers. A node *offers* its devices to new pods only when all of these hold:
//   1. it matches --node-label-selector (NodeSelector; an empty selector matches every node);
//   2. its register annotation (vendor.RegisterAnnotation()) is present and has decoded at least
//      once;
//   3. its device plugin is alive:
//      - delimited format (v2.5–v2.7 plugin, which rewrites its registration and
//        `Reported <time>` in the handshake annotation every 30 s): the handshake below;
//      - JSON format (v2.8+ plugin, which writes no handshake): the node's Ready condition is
//        True and its allocatable `options.resource_count_name` (nvidia.com/gpu) is a positive
//        quantity (missing, unparsable or 0: not alive).
//
// How "does not offer" is expressed in the ledger. A node whose registration has decoded is
// always registered in the ledger (SetNode) with the devices it last registered successfully;
// when it does not offer them, every device is registered with health = false, which the fit
// rejects per device (CardNotHealth) exactly as it rejects a device its plugin reports
// unhealthy. This keeps what RemoveNode would lose: the usage and holders of the pods already
// on the node stay counted (metrics, /debug/ledger, the fit of other nodes are unaffected) and
// their records do not turn into "unregistered" problems. HAMi instead drops the node's devices
// on a handshake timeout (its filter then says "node unregistered" and its metrics forget the
// node's usage); Tessera's filter answer for such a node is the same — no pod fits — but the
// accounting stays. The same rule covers a node excluded by the selector and a node whose
// register annotation was removed after it had registered. A node that has never registered
// successfully is not in the ledger at all.
//   Devices are registered sorted by (index, UUID): the plugins list them in Go map order,
// which changes from one write to the next, so a rewrite that lists the same devices in another
// order changes nothing in the ledger.
//   Only Forget (the node object was deleted) calls Ledger::RemoveNode: the node's devices and
// usage leave the ledger; the records of pods annotated to it stay (the ledger keeps them,
// holding nothing, until their own deletion is observed) and are reported by
// Ledger::FindProblems as holders on an unregistered node.
//
// Malformed registrations. A register annotation that does not decode is recorded in the
// node's status (decode_error, decode_errors) and logged once per distinct value; the devices
// last registered successfully, the format and the handshake state are kept, so the ledger does
// not change because of it. The cordon list (hami.io/device-cordon, total) and the liveness
// inputs are still read from the object.
//
// The handshake (delimited nodes only; docs/hami-protocol.md §2.1.2). Per node the registry keeps
// the handshake value and `since`, the time it first observed that value. The plugin is alive
// until a deadline:
//   - `Reported …`, empty/absent or an unknown value: since + handshake_timeout (a fresh
//     `Reported` is the plugin's heartbeat; a follower that never writes sees it change every
//     30 s);
//   - `Requesting_<t>`: t + handshake_timeout, with t read as UTC; when t is missing,
//     unparsable or later than now + handshake_timeout, since + handshake_timeout instead;
//   - `Deleted_<t>`: not alive (a scheduler timed the node out; the plugin's next `Reported`
//     revives it).
// The writes it asks for (returned as NodePatch, with the node's resourceVersion as the
// precondition; nothing is written for JSON or unselected nodes, nor for nodes without a
// registration — unlike HAMi v2.5.2, which stamps every listed node):
//   - alive with `Reported`/absent/unknown, or `Requesting_` without a usable time:
//     `Requesting_<since>` (HAMi's reply to a report; `since` rather than now, so a late retry
//     never extends the deadline);
//   - not alive and not yet `Deleted_`: `Deleted_<now>` (HAMi v2.5.2's NodeCleanUp; the
//     register annotation is never touched).
// Each kind of write (Requesting_ or Deleted_) is asked for once per resourceVersion, and again
// by Tick after `patch_retry_interval` if the node has not changed since (a lost write); a 409
// needs no retry, because the change that caused it arrives as the next Observe. After a
// restart a `Reported` value gets one full timeout of grace, as its `since` is the first
// observation.
//
// Time always comes in as an argument; the registry reads no clock.
//
// Thread safety: NodeRegistry is internally synchronised. Observe, Forget and Tick are meant to
// be called from the informer worker (one at a time, though concurrent calls are safe);
// Status, Registrations and Find may be called from any thread. The registry calls the
// ledger while holding its own lock (lock order: registry, then ledger; the ledger never calls
// back). HandshakeWriter is stateless apart from atomic counters and may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/device/codec.h"
#include "tessera/device/model.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {

// --node-label-selector: "key=value[,key=value...]" (HAMi's map flag; docs/hami-protocol.md §6.1).
// A node matches when it carries every listed label with exactly the listed value. Whitespace
// around keys and values is ignored; the empty string (or only whitespace) selects every node.
class NodeSelector {
 public:
  // Every node.
  NodeSelector() = default;
  // InvalidArgument (quoting the offending pair) when a pair has no '=', a key is not a valid
  // Kubernetes label key ([prefix/]name: name ≤ 63 characters of [A-Za-z0-9_.-] starting and
  // ending alphanumeric, prefix a DNS subdomain ≤ 253), a value is not a valid label value
  // (empty, or like a name), an entry is empty ("a=b,,c=d"), or a key repeats.
  static absl::StatusOr<NodeSelector> Parse(std::string_view flag);

  bool Matches(const kube::StringMap& labels) const;
  bool empty() const { return requirements_.empty(); }
  // Sorted by key.
  const std::vector<std::pair<std::string, std::string>>& requirements() const {
    return requirements_;
  }
  // The canonical form "k1=v1,k2=v2" (sorted by key; "" for the empty selector).
  std::string ToString() const;

 private:
  std::vector<std::pair<std::string, std::string>> requirements_;
};

// Which register format a node's last successfully decoded registration used.
enum class NodeFormat { kNone, kDelimited, kJson };
std::string_view NodeFormatName(NodeFormat format);  // "none", "delimited", "json"

// Whether a node offers its devices, and if not the first reason in this order.
enum class Availability {
  kAvailable,
  kNotSelected,       // its labels do not match --node-label-selector
  kNoRegistration,    // no register annotation, or none that ever decoded
  kHandshakeTimeout,  // delimited: no report within the handshake timeout
  kHandshakeDeleted,  // delimited: the handshake says Deleted_; waiting for the next report
  kNotReady,          // JSON: the node's Ready condition is not True
  kNoAllocatable,     // JSON: allocatable nvidia.com/gpu missing, unparsable or zero
};
// "available", "not-selected", "no-registration", "handshake-timeout", "handshake-deleted",
// "not-ready", "no-allocatable".
std::string_view AvailabilityName(Availability availability);

// One handshake write: set annotation `key` of node `node` to `value`, provided the node is
// still at `resource_version` (empty: unconditionally).
struct NodePatch {
  std::string node;
  std::string key;
  std::string value;
  std::string resource_version;

  friend bool operator==(const NodePatch&, const NodePatch&) = default;
};

// What the registry knows about one node, for /debug and metrics.
struct NodeStatus {
  std::string name;
  std::string resource_version;  // of the last observed object
  NodeFormat format = NodeFormat::kNone;
  bool selected = false;
  Availability availability = Availability::kNoRegistration;
  std::string detail;      // human-readable explanation of `availability`
  bool in_ledger = false;  // registered in the ledger (possibly with every device unhealthy)
  size_t devices = 0;      // devices of the last successful registration
  size_t cordoned = 0;     // UUIDs in hami.io/device-cordon
  std::string handshake;   // delimited: the handshake value last observed
  std::optional<absl::Time> handshake_since;     // delimited: when that value was first seen
  std::optional<absl::Time> handshake_deadline;  // delimited: not alive from this instant on
  std::optional<absl::Time> last_report;         // delimited: last time a new Reported was seen
  std::string decode_error;    // the current registration's decode error; empty when it decoded
  uint64_t decode_errors = 0;  // registrations observed that did not decode, in total
  std::string ledger_error;    // the last Ledger::SetNode error; empty when none
};

class NodeRegistry {
 public:
  struct Options {
    NodeSelector selector;
    // HAMi's CheckHealth window (docs/hami-protocol.md §2.1.2: 60 s in the code).
    absl::Duration handshake_timeout = absl::Seconds(60);
    // How long Tick waits before asking again for a patch whose node has not changed.
    absl::Duration patch_retry_interval = absl::Seconds(15);
    // The extended resource whose allocatable count is a JSON node's liveness.
    std::string resource_count_name = "nvidia.com/gpu";
  };

  // `vendor` and `ledger` must outlive the registry.
  NodeRegistry(const device::Vendor* vendor, ledger::Ledger* ledger, Options options);
  ~NodeRegistry();
  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  // Where the informer handlers send what they produce. `patches` receives each non-empty batch
  // of handshake writes; `tombstone`, when set, hears of each final-state-unknown deletion.
  struct Sinks {
    Clock* clock = nullptr;  // required; must outlive the handlers
    std::function<void(std::vector<NodePatch>)> patches;
    std::function<void(const kube::Node&)> tombstone;
  };
  // The node informer's handlers: add and update are Observe(node, clock->Now()), delete and
  // tombstone are Forget. They hold `this`, which must outlive the informer.
  kube::EventHandlers<kube::Node> Handlers(Sinks sinks);

  // The node as the informer now holds it (add, update, relist, resync). Updates the ledger
  // and returns the handshake writes it asks for (empty for most calls).
  std::vector<NodePatch> Observe(const kube::Node& node, absl::Time now);
  // The node object was deleted (a DELETED event or a tombstone): its devices and usage leave
  // the ledger (Ledger::RemoveNode) and its state is forgotten. Returns false if it was unknown.
  bool Forget(std::string_view name);
  // Periodic: re-evaluates every delimited node's handshake deadline at `now` (a dead plugin
  // produces no event), updates the ledger and returns the writes due. Call it at least every
  // patch_retry_interval; O(delimited nodes).
  std::vector<NodePatch> Tick(absl::Time now);
  // Forgets which writes were asked for, so the next Tick asks again for every write that is
  // due. For a replica that has just become the leader: what it asked for as a follower was
  // dropped, and waiting patch_retry_interval would delay the handshake. O(nodes).
  void ResetAsks();

  // Every known node, sorted by name. O(nodes).
  std::vector<NodeStatus> Status() const;
  // One node, or nullopt when unknown.
  std::optional<NodeStatus> Find(std::string_view name) const;
  // What the registry has registered in the ledger, one per node, sorted by name: the input an
  // audit must give Ledger::Recompute so that it agrees with this registry (ProjectNode alone
  // does not apply availability).
  std::vector<std::shared_ptr<const device::NodeDevices>> Registrations() const;

 private:
  struct NodeState;

  void Evaluate(NodeState& s, absl::Time now, std::vector<NodePatch>* patches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvaluateHandshake(NodeState& s, absl::Time now, std::vector<NodePatch>* patches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AskPatch(NodeState& s, std::string value, absl::Time now, std::vector<NodePatch>* patches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncLedger(NodeState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeStatus StatusOf(const NodeState& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const device::Vendor* const vendor_;
  ledger::Ledger* const ledger_;
  const Options options_;

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<NodeState>> nodes_ ABSL_GUARDED_BY(mu_);
};

// Applies NodePatches with kube::ApiClient::PatchNodeMetadata (a JSON merge patch of one
// annotation, with resourceVersion as the precondition). Only the leader should write: give it
// `is_leader` and it drops patches while that returns false, or call it only when leading.
class HandshakeWriter {
 public:
  enum class Outcome {
    kWritten,
    kConflict,  // 409: the node changed since the observation; the next Observe decides again
    kNotFound,  // 404: the node is gone; its deletion will arrive through the informer
    kSkipped,   // not the leader
    kFailed,    // any other error (logged); Tick asks again after patch_retry_interval
  };
  struct Options {
    std::function<bool()> is_leader;  // empty: always write
  };
  struct Summary {
    size_t written = 0, conflicts = 0, not_found = 0, skipped = 0, failed = 0;
  };

  // `client` must outlive the writer.
  explicit HandshakeWriter(kube::ApiClient* client, Options options = {});

  // Blocking: one PATCH. Never returns an error status; the outcome says what happened.
  Outcome Write(const NodePatch& patch);
  // Write for each patch, in order.
  Summary WriteAll(const std::vector<NodePatch>& patches);

  // Totals since construction (for metrics).
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t conflicts() const { return conflicts_.load(std::memory_order_relaxed); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  kube::ApiClient* const client_;
  const Options options_;
  std::atomic<uint64_t> written_{0}, conflicts_{0}, failures_{0};
};

}  // namespace tessera::accounting

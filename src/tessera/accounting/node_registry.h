// File: tessera/accounting/node_registry.h
//
// NodeRegistry: the node informer's deliveries → what the ledger knows about each node's devices
// (registration, liveness, --node-label-selector, the v2.5–v2.7 handshake). A node that does not
// offer its devices stays registered with every device unhealthy, so the usage of its pods stays
// counted; only Forget (node deleted) removes it. HandshakeWriter performs the handshake PATCHes.
//
//   NodeRegistry registry(vendor.get(), &ledger, {.selector = *NodeSelector::Parse(flag)});
//   patches = registry.Observe(node, clock->Now());   // informer worker; Forget on delete
//   patches = registry.Tick(clock->Now());            // every few seconds; the leader writes them
//
// Errors: a registration that does not decode is kept in the node's status (decode_error) and the
// last good devices stay; NodeSelector::Parse returns InvalidArgument. Time is an argument. The
// rules: docs/serve.md "The node registry", docs/hami-protocol.md §1.3, §1.4, §2.1.
//
// Thread safety: internally synchronised (lock order: registry, then ledger). Observe, Forget and
// Tick from the informer worker; Status, Registrations and Find from any thread.
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

// File: tessera/kube/objects.h
//
// Projections of the Kubernetes objects Tessera reads: only the fields the scheduler, the
// ledger and the node registry use, decoded from the API server's JSON (tessera/kube/decode.h)
// or from YAML files (tessera explain). Everything here is plain data with value semantics.
//
// StringMap is a sorted vector of (key, value) pairs: labels, annotations and resource lists
// are small, and a flat vector is both smaller than a tree and deterministic in iteration order.
// Keys are interned (InternKey): an entry holds a std::string_view into a process-wide table of
// the distinct keys ever stored, so "nvidia.com/gpumem" is kept once, not once per pod. The
// table only grows; what feeds it is bounded by the cluster's vocabulary, not by its size: the
// annotation and label keys the decoder keeps (below), node label keys and resource names.
//
// What the decoder keeps (tessera/kube/decode.h), to hold a tracked pod under 1 KiB:
//   - Pod and Node annotations: only keys under "hami.io/" and "nvidia.com/" (TrackedAnnotation).
//     Every annotation Tessera reads or writes is there (tessera/device/annotations.h: the HAMi
//     protocol, the node lock, the user's GPU constraints); kubectl's last-applied-configuration,
//     prometheus.io/* and the like are dropped.
//   - Pod labels: the same prefixes (TrackedPodLabel). Tessera never reads pod labels; it writes
//     hami.io/vgpu-node, which is kept. Label selectors on pods are applied by the API server.
//   - Node labels: all of them (--node-label-selector may name any key).
//   - Lease metadata: everything (leases are few).
// Maps built in code (Set, the initializer list) keep whatever they are given.
//
// Thread safety: plain values; concurrent const access is safe, mutation needs external locking.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace tessera::kube {

// The interned copy of `key`: a view that stays valid for the life of the process, equal (same
// data pointer) for equal keys. Thread-safe; a thread-local cache makes repeated keys lock-free.
std::string_view InternKey(std::string_view key);

// Whether the decoder keeps annotation `key` of a Pod or Node: "hami.io/..." and "nvidia.com/...".
bool TrackedAnnotation(std::string_view key);
// Whether the decoder keeps label `key` of a Pod: the same prefixes as TrackedAnnotation.
inline bool TrackedPodLabel(std::string_view key) { return TrackedAnnotation(key); }

class StringMap {
 public:
  // The key views an interned string (InternKey); the value is owned.
  using Entry = std::pair<std::string_view, std::string>;
  using const_iterator = std::vector<Entry>::const_iterator;

  StringMap() = default;
  // Later duplicates of a key replace earlier ones.
  StringMap(std::initializer_list<Entry> entries);

  // The value for `key`, or nullptr when absent. The pointer is valid until the next mutation.
  const std::string* Find(std::string_view key) const;
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }
  // The value for `key`, or `fallback` when absent.
  std::string_view Get(std::string_view key, std::string_view fallback = {}) const;
  // Inserts or replaces.
  void Set(std::string_view key, std::string value);
  // Removes `key`; returns whether it was present.
  bool Erase(std::string_view key);
  void Clear() { entries_.clear(); }
  void Reserve(size_t n) { entries_.reserve(n); }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

  friend bool operator==(const StringMap& a, const StringMap& b) {
    return a.entries_ == b.entries_;
  }

 private:
  friend class StringMapBuilder;
  std::vector<Entry> entries_;  // sorted by key, keys unique and interned
};

// For decoders: fills a StringMap from entries already sorted by key with unique keys, without
// the per-entry search of Set. Thread-compatible.
class StringMapBuilder {
 public:
  explicit StringMapBuilder(StringMap* map, size_t n) : map_(map) {
    map_->entries_.clear();
    map_->entries_.reserve(n);
  }
  // `key` must sort after every key appended before.
  void Append(std::string_view key, std::string_view value) {
    map_->entries_.emplace_back(std::piecewise_construct, std::forward_as_tuple(InternKey(key)),
                                std::forward_as_tuple(value));
  }

 private:
  StringMap* map_;
};

// metadata of any object.
struct ObjectMeta {
  std::string uid;
  std::string ns;  // metadata.namespace; empty for cluster-scoped objects
  std::string name;
  std::string resource_version;
  StringMap labels;
  StringMap annotations;
  // metadata.deletionTimestamp as sent (RFC 3339); empty when the object is not being deleted.
  std::string deletion_timestamp;
  std::string creation_timestamp;

  friend bool operator==(const ObjectMeta&, const ObjectMeta&) = default;
};

struct Container {
  std::string name;
  StringMap limits;         // resources.limits: resource name -> quantity string
  StringMap requests;       // resources.requests
  bool privileged = false;  // securityContext.privileged

  friend bool operator==(const Container&, const Container&) = default;
};

enum class PodPhase { kPending, kRunning, kSucceeded, kFailed, kUnknown };

// "Pending", "Running", ... ; an empty or unrecognised phase is kPending / kUnknown respectively.
PodPhase ParsePodPhase(std::string_view phase);
std::string_view PodPhaseName(PodPhase phase);

struct Pod {
  ObjectMeta meta;
  std::string node_name;       // spec.nodeName; empty while unbound
  std::string scheduler_name;  // spec.schedulerName
  std::vector<Container> init_containers;
  std::vector<Container> containers;
  PodPhase phase = PodPhase::kPending;

  // "namespace/name".
  std::string Key() const { return meta.ns + "/" + meta.name; }
  bool Terminal() const { return phase == PodPhase::kSucceeded || phase == PodPhase::kFailed; }
  bool Deleting() const { return !meta.deletion_timestamp.empty(); }

  friend bool operator==(const Pod&, const Pod&) = default;
};

enum class ConditionStatus { kUnknown, kTrue, kFalse };

struct Node {
  ObjectMeta meta;
  StringMap allocatable;                              // status.allocatable
  bool unschedulable = false;                         // spec.unschedulable
  ConditionStatus ready = ConditionStatus::kUnknown;  // status.conditions[type=Ready]

  friend bool operator==(const Node&, const Node&) = default;
};

}  // namespace tessera::kube

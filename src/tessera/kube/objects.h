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
//   - Pod and Node annotations: only keys under "hami.io/", "nvidia.com/" and "huawei.com/", and
//     the Ascend plugin's "hami-vnpu-core" (TrackedAnnotation). Every annotation Tessera reads or
//     writes is there (tessera/device/annotations.h: the HAMi protocol, the node lock, the user's
//     GPU constraints; tessera/device/ascend.h); kubectl's last-applied-configuration,
//     prometheus.io/* and the like are dropped.
//   - Pod labels: the same prefixes (TrackedPodLabel). Tessera never reads pod labels; it writes
//     hami.io/vgpu-node, which is kept. Label selectors on pods are applied by the API server.
//   - Node labels: all of them (--node-label-selector may name any key).
//   - Lease metadata: everything (leases are few).
// Maps built in code (Set, the initializer list) keep whatever they are given.
//
// Thread safety: plain values; concurrent const access is safe, mutation needs external locking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
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

// Whether the decoder keeps annotation `key` of a Pod or Node: "hami.io/...", "nvidia.com/...",
// "huawei.com/..." and "hami-vnpu-core".
bool TrackedAnnotation(std::string_view key);
// Whether the decoder keeps label `key` of a Pod: the same keys as TrackedAnnotation.
inline bool TrackedPodLabel(std::string_view key) { return TrackedAnnotation(key); }

// A string stored in 16 bytes: up to 15 bytes inline, longer ones on the heap. Resource
// quantities ("1", "3000", "100m", "16Gi") are almost always inline, where a std::string entry
// would take 32 bytes. Value semantics; compares and converts as its std::string_view.
class ShortString {
 public:
  ShortString() { SetInline({}); }
  ShortString(std::string_view s) { Assign(s); }  // NOLINT(google-explicit-constructor)
  ShortString(const char* s) : ShortString(std::string_view(s)) {}         // NOLINT
  ShortString(const std::string& s) : ShortString(std::string_view(s)) {}  // NOLINT
  ShortString(const ShortString& other) { Assign(other.view()); }
  ShortString(ShortString&& other) noexcept {
    std::memcpy(bytes_, other.bytes_, sizeof(bytes_));
    other.SetInline({});
  }
  ShortString& operator=(const ShortString& other) {
    if (this != &other) {
      ShortString copy(other);
      *this = std::move(copy);
    }
    return *this;
  }
  ShortString& operator=(ShortString&& other) noexcept {
    if (this != &other) {
      Release();
      std::memcpy(bytes_, other.bytes_, sizeof(bytes_));
      other.SetInline({});
    }
    return *this;
  }
  ~ShortString() { Release(); }

  std::string_view view() const {
    if (OnHeap()) {
      const char* data;
      uint32_t size;
      std::memcpy(&data, bytes_, sizeof(data));
      std::memcpy(&size, bytes_ + sizeof(data), sizeof(size));
      return {data, size};
    }
    return {bytes_, static_cast<size_t>(kInline - static_cast<unsigned char>(bytes_[kInline]))};
  }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor)
  size_t size() const { return view().size(); }
  bool empty() const { return view().empty(); }

  friend bool operator==(const ShortString& a, const ShortString& b) {
    return a.view() == b.view();
  }
  friend bool operator==(const ShortString& a, std::string_view b) { return a.view() == b; }

 private:
  static constexpr size_t kInline = 15;         // bytes_[15] holds kInline - size when inline
  static constexpr unsigned char kHeap = 0xFF;  // ... and this when the text is on the heap

  bool OnHeap() const { return static_cast<unsigned char>(bytes_[kInline]) == kHeap; }
  void SetInline(std::string_view s) {
    std::memset(bytes_, 0, sizeof(bytes_));
    if (!s.empty()) {  // an empty view may have a null data()
      std::memcpy(bytes_, s.data(), s.size());
    }
    bytes_[kInline] = static_cast<char>(kInline - s.size());
  }
  void Assign(std::string_view s) {
    if (s.size() <= kInline) {
      SetInline(s);
      return;
    }
    char* data = new char[s.size()];
    std::memcpy(data, s.data(), s.size());
    const auto size = static_cast<uint32_t>(s.size());
    std::memset(bytes_, 0, sizeof(bytes_));
    std::memcpy(bytes_, &data, sizeof(data));
    std::memcpy(bytes_ + sizeof(data), &size, sizeof(size));
    bytes_[kInline] = static_cast<char>(kHeap);
  }
  void Release() {
    if (OnHeap()) {
      char* data;
      std::memcpy(&data, bytes_, sizeof(data));
      delete[] data;
    }
  }

  alignas(8) char bytes_[16];
};

// A map from interned keys to values of type V, as a vector sorted by key. StringMap (labels,
// annotations, node allocatable) holds std::string values; ResourceList (a container's limits and
// requests, of which a pod has several per container) holds ShortString values, an entry of 32
// bytes instead of 48.
template <typename V>
class BasicStringMap {
 public:
  // The key views an interned string (InternKey); the value is owned.
  using Entry = std::pair<std::string_view, V>;
  using const_iterator = typename std::vector<Entry>::const_iterator;

  BasicStringMap() = default;
  // Later duplicates of a key replace earlier ones.
  BasicStringMap(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) {
      Set(e.first, e.second);
    }
  }

  // The value for `key`, or nullptr when absent. The pointer is valid until the next mutation.
  const V* Find(std::string_view key) const {
    auto it = LowerBound(key);
    return it == entries_.end() || it->first != key ? nullptr : &it->second;
  }
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }
  // The value for `key`, or `fallback` when absent.
  std::string_view Get(std::string_view key, std::string_view fallback = {}) const {
    const V* v = Find(key);
    return v == nullptr ? fallback : std::string_view(*v);
  }
  // Inserts or replaces.
  void Set(std::string_view key, V value) {
    auto it = LowerBound(key);
    if (it != entries_.end() && it->first == key) {
      entries_[it - entries_.begin()].second = std::move(value);
      return;
    }
    entries_.emplace(it, InternKey(key), std::move(value));
  }
  // Removes `key`; returns whether it was present.
  bool Erase(std::string_view key) {
    auto it = LowerBound(key);
    if (it == entries_.end() || it->first != key) {
      return false;
    }
    entries_.erase(it);
    return true;
  }
  void Clear() { entries_.clear(); }
  void Reserve(size_t n) { entries_.reserve(n); }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

  friend bool operator==(const BasicStringMap& a, const BasicStringMap& b) {
    return a.entries_ == b.entries_;
  }

 private:
  template <typename M>
  friend class StringMapBuilder;
  const_iterator LowerBound(std::string_view key) const {
    return std::lower_bound(entries_.begin(), entries_.end(), key,
                            [](const Entry& e, std::string_view k) { return e.first < k; });
  }
  std::vector<Entry> entries_;  // sorted by key, keys unique and interned
};

using StringMap = BasicStringMap<std::string>;
using ResourceList = BasicStringMap<ShortString>;

// For decoders: fills a StringMap or ResourceList from entries already sorted by key with unique
// keys, without the per-entry search of Set. Thread-compatible.
template <typename M>
class StringMapBuilder {
 public:
  explicit StringMapBuilder(M* map, size_t n) : map_(map) {
    map_->entries_.clear();
    map_->entries_.reserve(n);
  }
  // `key` must sort after every key appended before.
  void Append(std::string_view key, std::string_view value) {
    map_->entries_.emplace_back(std::piecewise_construct, std::forward_as_tuple(InternKey(key)),
                                std::forward_as_tuple(value));
  }

 private:
  M* map_;
};

// metadata of any object.
struct ObjectMeta {
  std::string uid;
  std::string ns;  // metadata.namespace; empty for cluster-scoped objects
  std::string name;
  std::string resource_version;
  StringMap labels;
  StringMap annotations;
  // Whether metadata.deletionTimestamp is set: the object is being deleted. (Its time is not
  // kept: nothing reads it, and a pod carries the field for every tracked pod's lifetime.)
  bool deleting = false;

  friend bool operator==(const ObjectMeta&, const ObjectMeta&) = default;
};

struct Container {
  std::string name;
  ResourceList limits;      // resources.limits: resource name -> quantity string
  ResourceList requests;    // resources.requests
  bool privileged = false;  // securityContext.privileged

  friend bool operator==(const Container&, const Container&) = default;
};

enum class PodPhase { kPending, kRunning, kSucceeded, kFailed, kUnknown };

// "Pending", "Running", ... ; an empty or unrecognised phase is kPending / kUnknown respectively.
PodPhase ParsePodPhase(std::string_view phase);
std::string_view PodPhaseName(PodPhase phase);

// Kubernetes' object name rules (apimachinery's IsDNS1123Subdomain and IsDNS1123Label): a
// subdomain is at most 253 characters of [a-z0-9-.] where each dot-separated part starts and
// ends with [a-z0-9] (pod and node names); a label is at most 63 characters of [a-z0-9-]
// starting and ending with [a-z0-9] (namespaces).
bool IsDnsSubdomain(std::string_view name);
bool IsDnsLabel(std::string_view name);

struct Pod {
  ObjectMeta meta;
  std::string node_name;       // spec.nodeName; empty while unbound
  std::string scheduler_name;  // spec.schedulerName
  std::vector<Container> init_containers;
  std::vector<Container> containers;
  PodPhase phase = PodPhase::kPending;
  int32_t priority = 0;        // spec.priority (absent: 0)
  bool preempt_never = false;  // spec.preemptionPolicy is "Never"
  int64_t start_unix = 0;      // status.startTime in Unix seconds (absent: 0)

  // "namespace/name".
  std::string Key() const { return meta.ns + "/" + meta.name; }
  bool Terminal() const { return phase == PodPhase::kSucceeded || phase == PodPhase::kFailed; }
  bool Deleting() const { return meta.deleting; }

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

// File: tessera/kube/store.h
//
// Store<T>: the informer's cache of Pod or Node projections, keyed by "namespace/name" (just
// "name" for cluster-scoped objects, as client-go's MetaNamespaceKeyFunc), with a secondary
// index by metadata.uid and, for pods, an index by spec.nodeName.
//
// Objects are held as std::shared_ptr<const T>: readers get immutable snapshots that stay valid
// however the store changes afterwards, and no call copies a whole object list's contents.
// The indexes are sets of those pointers hashed by the object's own (namespace, name) and uid,
// so the store keeps no copy of a key (16 bytes per object and index). Kubernetes names and
// namespaces never contain '/', so a key "a/b" always means namespace "a", name "b".
//
// Replace() installs a full LIST result and reports which objects it removed: those are the
// deletions a watch gap hid, which the informer delivers as "final state unknown" tombstones.
//
// Thread safety: every method is safe to call concurrently from any thread (one tessera::Mutex
// guards the maps). Returned pointers are immutable and may be kept and read from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "tessera/base/mutex.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/resource_quota.h"

namespace tessera::kube {

// "namespace/name", or "name" when the namespace is empty.
std::string ObjectKey(const ObjectMeta& meta);

template <typename T>
class Store {
 public:
  using Ptr = std::shared_ptr<const T>;

  struct ReplaceResult {
    // Objects whose key is not in the new list, in their last known state, sorted by
    // (namespace, name).
    std::vector<Ptr> deleted;
    // Every listed object with the object it replaced under the same key (nullptr if new), in
    // list order. A delete + re-create during a gap shows up here with a different uid.
    std::vector<std::pair<Ptr, Ptr>> replaced;
  };

  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts or replaces the object with the same key. Returns the previous object, or nullptr.
  Ptr Upsert(T object);
  Ptr Upsert(Ptr object);
  // Removes the object with `key`; returns it, or nullptr if absent.
  Ptr Delete(std::string_view key);
  // Makes the store hold exactly `items` (later duplicates of a key win).
  ReplaceResult Replace(std::vector<T> items);

  Ptr Get(std::string_view key) const;
  Ptr GetByUid(std::string_view uid) const;
  // All objects, sorted by (namespace, name).
  std::vector<Ptr> List() const;
  // Pods whose spec.nodeName is `node`, sorted by (namespace, name); always empty for a
  // Store<Node>.
  std::vector<Ptr> ListByNode(std::string_view node) const;
  // All keys, sorted as strings.
  std::vector<std::string> Keys() const;
  size_t size() const;

 private:
  void IndexLocked(const Ptr& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const Ptr& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // (namespace, name) of an object or of a key being looked up.
  struct KeyRef {
    std::string_view ns;
    std::string_view name;
  };
  static KeyRef SplitKey(std::string_view key);
  struct ByKeyHash {
    using is_transparent = void;
    size_t operator()(const KeyRef& k) const;
    size_t operator()(const Ptr& p) const { return (*this)(KeyRef{p->meta.ns, p->meta.name}); }
  };
  struct ByKeyEq {
    using is_transparent = void;
    static KeyRef Of(const KeyRef& k) { return k; }
    static KeyRef Of(const Ptr& p) { return KeyRef{p->meta.ns, p->meta.name}; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Of(a).ns == Of(b).ns && Of(a).name == Of(b).name;
    }
  };
  struct ByUidHash {
    using is_transparent = void;
    size_t operator()(std::string_view uid) const;
    size_t operator()(const Ptr& p) const { return (*this)(std::string_view(p->meta.uid)); }
  };
  struct ByUidEq {
    using is_transparent = void;
    static std::string_view Of(std::string_view uid) { return uid; }
    static std::string_view Of(const Ptr& p) { return p->meta.uid; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Of(a) == Of(b);
    }
  };
  using KeySet = absl::flat_hash_set<Ptr, ByKeyHash, ByKeyEq>;

  mutable Mutex mu_;
  KeySet by_key_ ABSL_GUARDED_BY(mu_);
  // Objects with a non-empty uid; the last one stored wins a uid shared by two keys.
  absl::flat_hash_set<Ptr, ByUidHash, ByUidEq> by_uid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<Ptr>> by_node_ ABSL_GUARDED_BY(mu_);
};

extern template class Store<Pod>;
extern template class Store<Node>;
extern template class Store<ResourceQuota>;

using PodStore = Store<Pod>;
using NodeStore = Store<Node>;

}  // namespace tessera::kube

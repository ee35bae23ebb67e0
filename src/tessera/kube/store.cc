#include "tessera/kube/store.h"

#include <algorithm>
#include <type_traits>

#include "absl/hash/hash.h"

namespace tessera::kube {

std::string ObjectKey(const ObjectMeta& meta) {
  if (meta.ns.empty()) {
    return meta.name;
  }
  std::string key;
  key.reserve(meta.ns.size() + 1 + meta.name.size());
  key += meta.ns;
  key += '/';
  key += meta.name;
  return key;
}

namespace {
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename T>
const std::string* NodeOf(const T& obj) {
  if constexpr (std::is_same_v<T, Pod>) {
    return obj.node_name.empty() ? nullptr : &obj.node_name;
  } else {
    return nullptr;
  }
}

template <typename P>
void SortByKey(std::vector<P>* v) {
  std::sort(v->begin(), v->end(), [](const P& a, const P& b) {
    if (a->meta.ns != b->meta.ns) {
      return a->meta.ns < b->meta.ns;
    }
    return a->meta.name < b->meta.name;
  });
}
}  // namespace

template <typename T>
typename Store<T>::KeyRef Store<T>::SplitKey(std::string_view key) {
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos) {
    return KeyRef{{}, key};
  }
  return KeyRef{key.substr(0, slash), key.substr(slash + 1)};
}

template <typename T>
size_t Store<T>::ByKeyHash::operator()(const KeyRef& k) const {
  return absl::HashOf(AV(k.ns), AV(k.name));
}

template <typename T>
size_t Store<T>::ByUidHash::operator()(std::string_view uid) const {
  return absl::HashOf(AV(uid));
}

template <typename T>
void Store<T>::IndexLocked(const Ptr& obj) {
  if (!obj->meta.uid.empty()) {
    // The last object stored with a uid is the one GetByUid returns.
    by_uid_.erase(std::string_view(obj->meta.uid));
    by_uid_.insert(obj);
  }
  if (const std::string* node = NodeOf(*obj); node != nullptr) {
    by_node_[*node].insert(obj);
  }
}

template <typename T>
void Store<T>::UnindexLocked(const Ptr& obj) {
  if (!obj->meta.uid.empty()) {
    auto it = by_uid_.find(std::string_view(obj->meta.uid));
    if (it != by_uid_.end() && *it == obj) {
      by_uid_.erase(it);
    }
  }
  if (const std::string* node = NodeOf(*obj); node != nullptr) {
    auto it = by_node_.find(AV(*node));
    if (it != by_node_.end()) {
      it->second.erase(obj);
      if (it->second.empty()) {
        by_node_.erase(it);
      }
    }
  }
}

template <typename T>
typename Store<T>::Ptr Store<T>::Upsert(T object) {
  return Upsert(std::make_shared<const T>(std::move(object)));
}

template <typename T>
typename Store<T>::Ptr Store<T>::Upsert(Ptr object) {
  MutexLock lock(&mu_);
  Ptr old;
  auto it = by_key_.find(object);
  if (it != by_key_.end()) {
    old = *it;
    // The slot is hashed by (namespace, name), equal for both objects: replace in place.
    const_cast<Ptr&>(*it) = object;
    UnindexLocked(old);
  } else {
    by_key_.insert(object);
  }
  IndexLocked(object);
  return old;
}

template <typename T>
typename Store<T>::Ptr Store<T>::Delete(std::string_view key) {
  MutexLock lock(&mu_);
  auto it = by_key_.find(SplitKey(key));
  if (it == by_key_.end()) {
    return nullptr;
  }
  Ptr old = *it;
  by_key_.erase(it);
  UnindexLocked(old);
  return old;
}

template <typename T>
typename Store<T>::ReplaceResult Store<T>::Replace(std::vector<T> items) {
  ReplaceResult result;
  KeySet fresh;
  fresh.reserve(items.size());
  std::vector<Ptr> ordered;
  ordered.reserve(items.size());
  for (T& item : items) {
    auto ptr = std::make_shared<const T>(std::move(item));
    auto [it, inserted] = fresh.insert(ptr);
    if (!inserted) {
      const_cast<Ptr&>(*it) = ptr;  // a later duplicate of a key wins
    }
    ordered.push_back(std::move(ptr));
  }
  MutexLock lock(&mu_);
  for (const Ptr& obj : by_key_) {
    if (!fresh.contains(obj)) {
      result.deleted.push_back(obj);
    }
  }
  result.replaced.reserve(ordered.size());
  for (Ptr& obj : ordered) {
    if (*fresh.find(obj) != obj) {
      continue;  // a later duplicate of this key wins
    }
    auto it = by_key_.find(obj);
    result.replaced.emplace_back(it == by_key_.end() ? nullptr : *it, std::move(obj));
  }
  by_key_ = std::move(fresh);
  by_uid_.clear();
  by_node_.clear();
  for (const Ptr& obj : by_key_) {
    IndexLocked(obj);
  }
  SortByKey(&result.deleted);
  return result;
}

template <typename T>
typename Store<T>::Ptr Store<T>::Get(std::string_view key) const {
  MutexLock lock(&mu_);
  auto it = by_key_.find(SplitKey(key));
  return it == by_key_.end() ? nullptr : *it;
}

template <typename T>
typename Store<T>::Ptr Store<T>::GetByUid(std::string_view uid) const {
  MutexLock lock(&mu_);
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? nullptr : *it;
}

template <typename T>
std::vector<typename Store<T>::Ptr> Store<T>::List() const {
  std::vector<Ptr> out;
  {
    MutexLock lock(&mu_);
    out.reserve(by_key_.size());
    for (const Ptr& obj : by_key_) {
      out.push_back(obj);
    }
  }
  SortByKey(&out);
  return out;
}

template <typename T>
std::vector<typename Store<T>::Ptr> Store<T>::ListByNode(std::string_view node) const {
  std::vector<Ptr> out;
  {
    MutexLock lock(&mu_);
    auto it = by_node_.find(AV(node));
    if (it == by_node_.end()) {
      return out;
    }
    out.assign(it->second.begin(), it->second.end());
  }
  SortByKey(&out);
  return out;
}

template <typename T>
std::vector<std::string> Store<T>::Keys() const {
  std::vector<std::string> out;
  {
    MutexLock lock(&mu_);
    out.reserve(by_key_.size());
    for (const Ptr& obj : by_key_) {
      out.push_back(ObjectKey(obj->meta));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <typename T>
size_t Store<T>::size() const {
  MutexLock lock(&mu_);
  return by_key_.size();
}

template class Store<Pod>;
template class Store<Node>;
template class Store<ResourceQuota>;

}  // namespace tessera::kube

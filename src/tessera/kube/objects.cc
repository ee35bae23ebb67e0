#include "tessera/kube/objects.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"

#include "tessera/base/mutex.h"

namespace tessera::kube {
namespace {

// The process-wide key table: the bytes live in blocks that are never freed or moved.
class KeyTable {
 public:
  std::string_view Intern(std::string_view key) {
    MutexLock lock(&mu_);
    auto it = keys_.find(key);
    if (it != keys_.end()) {
      return *it;
    }
    if (key.size() > kBlock / 4) {
      big_.push_back(std::make_unique<char[]>(key.size()));
      std::memcpy(big_.back().get(), key.data(), key.size());
      return *keys_.insert(std::string_view(big_.back().get(), key.size())).first;
    }
    if (blocks_.empty() || used_ + key.size() > kBlock) {
      blocks_.push_back(std::make_unique<char[]>(kBlock));
      used_ = 0;
    }
    char* at = blocks_.back().get() + used_;
    std::memcpy(at, key.data(), key.size());
    used_ += key.size();
    return *keys_.insert(std::string_view(at, key.size())).first;
  }

 private:
  static constexpr size_t kBlock = 16 << 10;
  Mutex mu_;
  absl::flat_hash_set<std::string_view> keys_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<char[]>> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<char[]>> big_ ABSL_GUARDED_BY(mu_);
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

KeyTable& GlobalKeys() {
  static KeyTable* table = new KeyTable();
  return *table;
}

}  // namespace

std::string_view InternKey(std::string_view key) {
  if (key.empty()) {
    return {};
  }
  // The views in the cache point into the global table, so they outlive the thread.
  thread_local absl::flat_hash_set<std::string_view> cache;
  auto it = cache.find(key);
  if (it != cache.end()) {
    return *it;
  }
  std::string_view interned = GlobalKeys().Intern(key);
  cache.insert(interned);
  return interned;
}

bool TrackedAnnotation(std::string_view key) {
  return key.starts_with("hami.io/") || key.starts_with("nvidia.com/") ||
         key.starts_with("huawei.com/") || key == "hami-vnpu-core";
}

PodPhase ParsePodPhase(std::string_view phase) {
  if (phase.empty() || phase == "Pending") {
    return PodPhase::kPending;
  }
  if (phase == "Running") {
    return PodPhase::kRunning;
  }
  if (phase == "Succeeded") {
    return PodPhase::kSucceeded;
  }
  if (phase == "Failed") {
    return PodPhase::kFailed;
  }
  return PodPhase::kUnknown;
}

std::string_view PodPhaseName(PodPhase phase) {
  switch (phase) {
    case PodPhase::kPending:
      return "Pending";
    case PodPhase::kRunning:
      return "Running";
    case PodPhase::kSucceeded:
      return "Succeeded";
    case PodPhase::kFailed:
      return "Failed";
    case PodPhase::kUnknown:
      break;
  }
  return "Unknown";
}

namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// [a-z0-9]([-a-z0-9]*[a-z0-9])?
bool IsLabelPart(std::string_view s) {
  return !s.empty() && IsLowerAlnum(s.front()) && IsLowerAlnum(s.back()) &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

}  // namespace

bool IsDnsSubdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) {
    return false;
  }
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    if (!IsLabelPart(name.substr(start, dot == std::string_view::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == std::string_view::npos) {
      return true;
    }
    start = dot + 1;
  }
}

bool IsDnsLabel(std::string_view name) { return name.size() <= 63 && IsLabelPart(name); }

}  // namespace tessera::kube

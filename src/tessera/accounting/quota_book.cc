#include "tessera/accounting/quota_book.h"

#include <optional>
#include <utility>

namespace tessera::accounting {

QuotaBook::QuotaBook(Options options) : options_(std::move(options)) {}

schedule::NamespaceQuota QuotaBook::Empty(std::string_view ns) const {
  schedule::NamespaceQuota q;
  q.ns = std::string(ns);
  q.memory_name = options_.memory_name;
  q.cores_name = options_.cores_name;
  q.memory_factor = options_.memory_factor;
  return q;
}

namespace {

// `after` allows more than `before`: the limit went or rose.
bool Loosened(const std::optional<schedule::QuotaLimit>& before,
              const std::optional<schedule::QuotaLimit>& after) {
  return before.has_value() && (!after.has_value() || after->limit > before->limit);
}

}  // namespace

void QuotaBook::NoteLocked(const std::string& ns, const schedule::NamespaceQuota& before,
                           const schedule::NamespaceQuota& after) {
  if (Loosened(before.memory, after.memory) || Loosened(before.cores, after.cores)) {
    loosened_at_[ns] = ++loosenings_;
  }
}

void QuotaBook::RecomputeLocked(const std::string& ns, Namespace* n) {
  const schedule::NamespaceQuota before = n->limits;
  std::vector<schedule::QuotaEntry> entries;
  for (const auto& [object, hard] : n->objects) {
    for (const auto& [key, value] : hard) {
      entries.push_back(schedule::QuotaEntry{object, key, value});
    }
  }
  n->limits = Empty(ns);
  n->skipped.clear();
  schedule::CollectLimits(entries, &n->limits, &n->skipped);
  NoteLocked(ns, before, n->limits);
}

void QuotaBook::UpsertLocked(const kube::ResourceQuota& quota) {
  auto it = namespaces_.find(quota.meta.ns);
  if (it == namespaces_.end()) {
    it = namespaces_.emplace(quota.meta.ns, Namespace()).first;
  }
  std::vector<std::pair<std::string, std::string>>& hard = it->second.objects[quota.meta.name];
  hard.clear();
  for (const auto& [key, value] : quota.hard) {
    hard.emplace_back(std::string(key), std::string(std::string_view(value)));
  }
  RecomputeLocked(it->first, &it->second);
}

void QuotaBook::Upsert(const kube::ResourceQuota& quota) {
  MutexLock lock(&mu_);
  UpsertLocked(quota);
}

void QuotaBook::Remove(std::string_view ns, std::string_view name) {
  MutexLock lock(&mu_);
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end()) {
    return;
  }
  it->second.objects.erase(std::string(name));
  if (it->second.objects.empty()) {
    NoteLocked(it->first, it->second.limits, Empty(ns));
    namespaces_.erase(it);
    return;
  }
  RecomputeLocked(it->first, &it->second);
}

void QuotaBook::Replace(const std::vector<kube::ResourceQuota>& quotas) {
  MutexLock lock(&mu_);
  std::map<std::string, Namespace, std::less<>> before = std::move(namespaces_);
  namespaces_.clear();
  for (const kube::ResourceQuota& q : quotas) {
    UpsertLocked(q);
  }
  for (const auto& [ns, n] : before) {
    auto it = namespaces_.find(ns);
    NoteLocked(ns, n.limits, it == namespaces_.end() ? Empty(ns) : it->second.limits);
  }
}

schedule::NamespaceQuota QuotaBook::Limits(std::string_view ns) const {
  MutexLock lock(&mu_);
  auto it = namespaces_.find(ns);
  return it == namespaces_.end() ? Empty(ns) : it->second.limits;
}

schedule::NamespaceQuota QuotaBook::Quota(std::string_view ns, const ledger::Ledger& ledger) const {
  schedule::NamespaceQuota q = Limits(ns);
  if (q.Limited()) {
    const ledger::NamespaceUsage used = ledger.UsageOf(ns);
    q.usedmem = used.usedmem;
    q.usedcores = used.usedcores;
  }
  return q;
}

std::vector<schedule::NamespaceQuota> QuotaBook::AllLimits() const {
  MutexLock lock(&mu_);
  std::vector<schedule::NamespaceQuota> out;
  for (const auto& [ns, n] : namespaces_) {
    if (n.limits.Limited()) {
      out.push_back(n.limits);
    }
  }
  return out;
}

std::vector<std::string> QuotaBook::LoosenedSince(uint64_t* cursor) const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [ns, at] : loosened_at_) {
    if (at > *cursor) {
      out.push_back(ns);
    }
  }
  *cursor = loosenings_;
  return out;
}

std::vector<std::string> QuotaBook::Skipped() const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [ns, n] : namespaces_) {
    out.insert(out.end(), n.skipped.begin(), n.skipped.end());
  }
  return out;
}

}  // namespace tessera::accounting

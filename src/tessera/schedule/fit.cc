#include "tessera/schedule/fit.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tessera/schedule/device_rules.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::DeviceInfo;
using device::DeviceUsage;
using device::GpuPolicy;
using device::GpuPolicyKey;
using device::NodeDevices;
using device::NodeSnapshot;

constexpr std::array<std::string_view, kReasonCount> kReasonNames = {
    "CardNotHealth",
    "CardCordoned",
    "CardTypeMismatch",
    "NumaNotFit",
    "CardUuidMismatch",
    "CardTimeSlicingExhausted",
    "ExclusiveDeviceAllocateConflict",
    "ResourceQuotaNotFit",
    "CardInsufficientMemory",
    "CardInsufficientCore",
    "CardComputeUnitsExhausted",
    "CardMigTopologyInfeasible",
    "AllocatedCardsInsufficientRequest",
    "NodeInsufficientDevice",
    "ModeNotFit",
};

// Longest rendering: two int32 ("-2147483648" is 11 chars), '/', ' ', the longest name (33).
constexpr size_t kPartBuffer = 64;

size_t RenderPart(const ReasonPart& part, char* buf) {
  char* p = buf;
  char* end = buf + kPartBuffer;
  p = std::to_chars(p, end, part.count).ptr;
  *p++ = '/';
  p = std::to_chars(p, end, part.total).ptr;
  *p++ = ' ';
  std::string_view name = ReasonName(part.reason);
  std::memcpy(p, name.data(), name.size());
  p += name.size();
  return static_cast<size_t>(p - buf);
}

constexpr std::array<char, 256> MakeLowerTable() {
  std::array<char, 256> t{};
  for (int c = 0; c < 256; ++c) {
    t[static_cast<size_t>(c)] = static_cast<char>((c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c);
  }
  return t;
}
constexpr std::array<char, 256> kLower = MakeLowerTable();

char Lower(char c) { return kLower[static_cast<unsigned char>(c)]; }

}  // namespace

bool ContainsFold(std::string_view haystack, std::string_view needle) {
  if (needle.empty()) {
    return true;
  }
  if (needle.size() > haystack.size()) {
    return false;
  }
  const size_t last = haystack.size() - needle.size();
  for (size_t i = 0; i <= last; ++i) {
    size_t j = 0;
    while (j < needle.size() && Lower(haystack[i + j]) == Lower(needle[j])) {
      ++j;
    }
    if (j == needle.size()) {
      return true;
    }
  }
  return false;
}

namespace {

// The sort key of a chain token; nullopt for mutex and topology-aware, which HAMi v2.10's
// lessByChain (gpu_policy.go:gpuSortKeyChain) drops: they are filters, not keys.
std::optional<SortKey> KeyFor(GpuPolicyKey key) {
  switch (key) {
    case GpuPolicyKey::kBinpack:
      return SortKey::kScoreAscending;
    case GpuPolicyKey::kSpread:
      return SortKey::kScoreDescending;
    case GpuPolicyKey::kNuma:
      return SortKey::kNumaAscending;
    case GpuPolicyKey::kMutex:
    case GpuPolicyKey::kTopologyAware:
      return std::nullopt;
  }
  return std::nullopt;
}

bool Contains(const GpuPolicy& policy, GpuPolicyKey key) {
  return std::find(policy.chain.begin(), policy.chain.end(), key) != policy.chain.end();
}

int Dimension(SortKey key) {
  switch (key) {
    case SortKey::kScoreAscending:
    case SortKey::kScoreDescending:
      return 0;
    case SortKey::kNumaAscending:
    case SortKey::kNumaDescending:
      return 1;
    case SortKey::kUsedDescending:
      return 2;
  }
  return 0;
}

void Push(SortOrder* order, SortKey key) {
  for (size_t i = 0; i < order->size; ++i) {
    if (Dimension(order->keys[i]) == Dimension(key)) {
      return;  // this dimension already orders the devices: a second key never decides
    }
  }
  order->keys[order->size++] = key;
  if (Dimension(key) == 0) {
    order->uses_score = true;
  }
}

// The request's contribution to a device score (zero unless the Type matches exactly).
struct ScoreRequest {
  double req = 0;
  double core = 0;
  double mem = 0;
};

}  // namespace

double NodeUsageTotals::Score() const {
  if (count == 0 || totalcore == 0 || totalmem == 0) {
    return 0;
  }
  return 10.0 * (static_cast<double>(used) / static_cast<double>(count) +
                 static_cast<double>(usedcores) / static_cast<double>(totalcore) +
                 static_cast<double>(usedmem) / static_cast<double>(totalmem));
}

std::string_view ReasonName(Reason reason) {
  auto i = static_cast<size_t>(reason);
  return i < kReasonNames.size() ? kReasonNames[i] : std::string_view("Unknown");
}

std::string ReasonPart::ToString() const {
  char buf[kPartBuffer];
  return std::string(buf, RenderPart(*this, buf));
}

void ReasonParts::Assign(const std::array<int32_t, kReasonCount>& counts, int32_t total,
                         uint32_t keep_zero) {
  size_ = 0;
  for (size_t r = 0; r < kReasonCount; ++r) {
    if (counts[r] != 0 || (keep_zero >> r & 1U) != 0) {
      parts_[size_++] = ReasonPart{static_cast<Reason>(r), counts[r], total};
    }
  }
  if (size_ < 2) {
    return;
  }
  // Sorted as their rendered strings "<count>/<total> <name>" sort (insertion sort: at most
  // kReasonCount parts, only on failure). The total is the same in every part and no digit is
  // '/', so that is the order of "<count>/", then of the names: nothing else is rendered.
  std::array<std::array<char, 12>, kReasonCount> head;  // "<count>/"
  std::array<size_t, kReasonCount> len;
  std::array<size_t, kReasonCount> order;
  for (size_t i = 0; i < size_; ++i) {
    char* p = std::to_chars(head[i].data(), head[i].data() + 11, parts_[i].count).ptr;
    *p++ = '/';
    len[i] = static_cast<size_t>(p - head[i].data());
    order[i] = i;
  }
  auto less = [&](size_t a, size_t b) {
    const std::string_view ha(head[a].data(), len[a]);
    const std::string_view hb(head[b].data(), len[b]);
    if (ha != hb) {
      return ha < hb;
    }
    return ReasonName(parts_[a].reason) < ReasonName(parts_[b].reason);
  };
  for (size_t i = 1; i < size_; ++i) {
    size_t v = order[i];
    size_t j = i;
    while (j > 0 && less(v, order[j - 1])) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = v;
  }
  std::array<ReasonPart, kReasonCount> sorted;
  for (size_t i = 0; i < size_; ++i) {
    sorted[i] = parts_[order[i]];
  }
  parts_ = sorted;
}

void ReasonParts::AssignOne(ReasonPart part) {
  parts_[0] = part;
  size_ = 1;
}

std::vector<std::string> ReasonParts::Strings() const {
  std::vector<std::string> out;
  out.reserve(size_);
  for (const auto& part : *this) {
    out.push_back(part.ToString());
  }
  return out;
}

void ReasonParts::JoinTo(std::string* out) const {
  out->clear();
  std::array<std::array<char, kPartBuffer>, kReasonCount> text;
  std::array<size_t, kReasonCount> len;
  size_t total = 0;
  for (size_t i = 0; i < size_; ++i) {
    len[i] = RenderPart(parts_[i], text[i].data());
    total += len[i] + (i > 0 ? 2 : 0);
  }
  out->reserve(total);  // one allocation at most
  for (size_t i = 0; i < size_; ++i) {
    if (i > 0) {
      out->append(", ");
    }
    out->append(text[i].data(), len[i]);
  }
}

std::string ReasonParts::Joined() const {
  std::string out;
  JoinTo(&out);
  return out;
}

SortOrder SortOrderFor(const GpuPolicy& policy, bool numa_bind) {
  SortOrder order;
  // A single topology-aware is not binpack and not mutex: HAMi's single-policy sort is spread's.
  if (policy.chain.size() == 1 &&
      (policy.chain[0] == GpuPolicyKey::kBinpack || policy.chain[0] == GpuPolicyKey::kSpread ||
       policy.chain[0] == GpuPolicyKey::kTopologyAware)) {
    const bool binpack = policy.chain[0] == GpuPolicyKey::kBinpack;
    if (numa_bind) {
      Push(&order, binpack ? SortKey::kNumaDescending : SortKey::kNumaAscending);
      Push(&order, binpack ? SortKey::kScoreAscending : SortKey::kScoreDescending);
    } else {
      Push(&order, binpack ? SortKey::kScoreAscending : SortKey::kScoreDescending);
      Push(&order, SortKey::kNumaAscending);
    }
    return order;
  }
  if (policy.chain.empty()) {
    // No policy at all: HAMi's flag default, spread.
    return SortOrderFor(GpuPolicy{}, numa_bind);
  }
  if (policy.chain.size() == 1 && policy.chain[0] == GpuPolicyKey::kMutex) {
    // HAMi orders a single mutex before it looks at numa-bind: NUMA is not forced first (the
    // fit still resets its collection at every NUMA change).
    Push(&order, SortKey::kUsedDescending);
    Push(&order, SortKey::kNumaAscending);
    return order;
  }
  if (numa_bind) {
    Push(&order, SortKey::kNumaAscending);
  }
  bool any_key = false;
  for (GpuPolicyKey key : policy.chain) {
    if (std::optional<SortKey> k = KeyFor(key); k.has_value()) {
      Push(&order, *k);
      any_key = true;
    }
  }
  if (!any_key) {
    Push(&order, SortKey::kScoreDescending);  // no key named ("mutex,topology-aware"): spread
  }
  return order;
}

bool HasMutex(const GpuPolicy& policy) { return Contains(policy, GpuPolicyKey::kMutex); }

bool HasTopology(const GpuPolicy& policy) { return Contains(policy, GpuPolicyKey::kTopologyAware); }

namespace {

ScoreRequest ScorePart(bool exact_type, int32_t devmem, const ContainerRequest& request) {
  ScoreRequest r;
  if (exact_type) {
    r.req = 1;
    r.core = request.coresreq;
    if (request.mem_percentage != 0 && request.mem_percentage != device::kPercentageUnset) {
      r.mem = static_cast<double>(PercentOf(devmem, request.mem_percentage));
    } else {
      r.mem = request.memreq;
    }
  }
  return r;
}

// The one score expression; the inverses are 1.0 / total (0 when any total is 0).
[[gnu::always_inline]] inline double Score(double inv_count, double inv_core, double inv_mem,
                                           const DeviceUsage& u, const ScoreRequest& r) {
  if (inv_count == 0 || inv_core == 0 || inv_mem == 0) {
    return 0;
  }
  return 10.0 *
         ((r.req + u.used) * inv_count + (r.core + static_cast<double>(u.usedcores)) * inv_core +
          (r.mem + static_cast<double>(u.usedmem)) * inv_mem);
}

double Inverse(int32_t total) { return total == 0 ? 0.0 : 1.0 / total; }

}  // namespace

double ComputeDeviceScore(const DeviceInfo& info, const DeviceUsage& usage,
                          const ContainerRequest& request) {
  return Score(Inverse(info.count), Inverse(info.devcore), Inverse(info.devmem), usage,
               ScorePart(info.type == request.type, info.devmem, request));
}

Fitter::Fitter() = default;
Fitter::~Fitter() = default;
Fitter::Fitter(Fitter&&) noexcept = default;
Fitter& Fitter::operator=(Fitter&&) noexcept = default;

void Fitter::PrepareRules(const device::PodRequest& request,
                          const device::PodConstraints& constraints, const GpuPolicy& policy) {
  // Each container's kind; each kind met gets its rules (kept for later pods) and the pod.
  kinds_.assign(request.containers.size(), DeviceKind::kNvidia);
  std::array<bool, kDeviceKindCount> used{};
  for (size_t c = 0; c < request.containers.size(); ++c) {
    const auto& req = request.containers[c];
    if (req.has_value() && req->nums > 0) {
      kinds_[c] = KindOf(*req);
      used[static_cast<size_t>(kinds_[c])] = true;
    }
  }
  rules_.resize(kDeviceKindCount);
  for (size_t k = 0; k < kDeviceKindCount; ++k) {
    if (!used[k]) {
      continue;
    }
    if (rules_[k] == nullptr) {
      rules_[k] = NewDeviceRules(static_cast<DeviceKind>(k));
    }
    rules_[k]->Prepare(request, constraints, policy);
  }
}

void Fitter::Prepare(const device::PodRequest& request, const device::PodConstraints& constraints,
                     const GpuPolicy& policy, const NamespaceQuota* quota, bool settle_quota) {
  request_ = &request;
  quota_ = nullptr;
  quota_miss_.reset();
  needle_valid_ = false;
  order_ = SortOrderFor(policy, constraints.numa_bind);
  for (size_t k = 0; k < order_.size; ++k) {
    const SortKey key = order_.keys[k];
    key_source_[k] = Dimension(key);
    key_sign_[k] = (key == SortKey::kScoreAscending || key == SortKey::kNumaAscending) ? 1.0 : -1.0;
  }
  for (size_t k = order_.size; k < key_sign_.size(); ++k) {
    key_source_[k] = 0;
    key_sign_[k] = 0.0;
  }
  // Score, then NUMA or nothing; NUMA, then score (an unused key's sign is 0).
  key_layout_ = KeyLayout::kAny;
  if (order_.size >= 1 && order_.size <= 2 && key_source_[0] == 0 &&
      (order_.size == 1 || key_source_[1] == 1)) {
    key_layout_ = KeyLayout::kScoreNuma;
  } else if (order_.size == 2 && key_source_[0] == 1 && key_source_[1] == 0) {
    key_layout_ = KeyLayout::kNumaScore;
  }
  primary_type_ = device::kNvidiaVendor;
  for (const auto& c : request.containers) {
    if (c.has_value() && c->nums > 0) {
      primary_type_ = c->type;
      break;
    }
  }
  // Per container, once per pod: whether its type is the primary one (the base entries'),
  // instead of a string comparison per container and node.
  primary_typed_.assign(request.containers.size(), 0);
  for (size_t c = 0; c < request.containers.size(); ++c) {
    const auto& req = request.containers[c];
    primary_typed_[c] = req.has_value() && req->type == primary_type_ ? 1 : 0;
  }
  last_app_ = -1;
  int apps = 0;
  for (size_t c = request.init_count; c < request.containers.size(); ++c) {
    if (request.containers[c].has_value() && request.containers[c]->nums > 0) {
      last_app_ = static_cast<int>(c);
      ++apps;
    }
  }
  two_apps_ = apps >= 2;
  topology_ = HasTopology(policy);
  PrepareRules(request, constraints, policy);
  pod_quota_ = quota != nullptr && quota->Limited() ? quota : nullptr;
  PrepareQuotaBound(settle_quota);
}

inline bool Fitter::TypeMatches(const std::string& type, std::string_view needle) const {
  // Fast path: real Types start with the vendor name ("NVIDIA-Tesla T4", "NVIDIA A100-…").
  // For an all-letter needle of at most 8 bytes, byte b equals letter L case-insensitively iff
  // (b | 0x20) == L, so one 8-byte load compares the prefix.
  if (needle_swar_ && type.size() >= 8) {
    uint64_t word;
    std::memcpy(&word, type.data(), 8);
    if (((word | 0x2020202020202020ULL) & needle_mask_) == needle_bits_) {
      return true;
    }
  } else {
    const size_t k = needle_lower_.size();
    if (type.size() >= k) {
      size_t j = 0;
      while (j < k && Lower(type[j]) == needle_lower_[j]) {
        ++j;
      }
      if (j == k) {
        return true;
      }
    }
  }
  return ContainsFold(type, needle);
}

void Fitter::PrepareNeedle(std::string_view type) {
  needle_lower_.assign(type.begin(), type.end());
  needle_swar_ = std::endian::native == std::endian::little && !type.empty() && type.size() <= 8;
  needle_bits_ = 0;
  needle_mask_ = 0;
  for (size_t j = 0; j < needle_lower_.size(); ++j) {
    char& c = needle_lower_[j];
    c = Lower(c);
    if (c < 'a' || c > 'z') {
      needle_swar_ = false;
    }
    if (j < 8) {
      // Little-endian: byte j of the word is bits 8j..8j+7.
      needle_bits_ |= static_cast<uint64_t>(static_cast<unsigned char>(c)) << (8 * j);
      needle_mask_ |= 0xFFULL << (8 * j);
    }
  }
  needle_ = type;
  needle_valid_ = true;
}

[[gnu::always_inline]] inline void Fitter::SetKeys(int32_t numa, int32_t used, double score,
                                                   SortEntry* e) const {
  // The usual orders without the table lookups.
  if (key_layout_ == KeyLayout::kScoreNuma) {
    e->key[0] = key_sign_[0] * score;
    e->key[1] = key_sign_[1] * static_cast<double>(numa);
    e->key[2] = 0;
    return;
  }
  if (key_layout_ == KeyLayout::kNumaScore) {
    e->key[0] = key_sign_[0] * static_cast<double>(numa);
    e->key[1] = key_sign_[1] * score;
    e->key[2] = 0;
    return;
  }
  const std::array<double, 3> src{score, static_cast<double>(numa), static_cast<double>(used)};
  // Unused keys have sign 0 and stay 0.
  e->key[0] = key_sign_[0] * src[static_cast<size_t>(key_source_[0])];
  e->key[1] = key_sign_[1] * src[static_cast<size_t>(key_source_[1])];
  e->key[2] = key_sign_[2] * src[static_cast<size_t>(key_source_[2])];
}

template <bool base>
void Fitter::BuildImpl(const NodeSnapshot& node, absl::Span<const DeviceUsage> usage,
                       std::string_view type, const ContainerRequest* request,
                       std::vector<SortEntry>* out) {
  const auto& devs = node.devices->devices;
  const size_t n = devs.size();
  out->resize(n);
  if constexpr (base) {
    entry_of_.resize(n);
    any_exact_ = false;
  }
  SortEntry* e = out->data();
  size_t m = 0;
  NodeUsageTotals totals;
  int32_t max_devmem = 0;
  // Nodes are usually homogeneous: reuse the inverses of the previous device's totals.
  int32_t last_count = -1;
  int32_t last_core = -1;
  int32_t last_mem = -1;
  double inv_count = 0;
  double inv_core = 0;
  double inv_mem = 0;
  if (!needle_valid_ || needle_ != type) {
    PrepareNeedle(type);
  }
  const ScoreRequest none;
  for (size_t i = 0; i < n; ++i) {
    const DeviceInfo& d = devs[i];
    const DeviceUsage& u = usage[i];
    if constexpr (base) {
      totals.Add(d, u);
      max_devmem = std::max(max_devmem, d.devmem);
    }
    const bool exact = d.type == type;
    if (!exact && !TypeMatches(d.type, type)) {
      if constexpr (base) {
        entry_of_[i] = -1;
      }
      continue;
    }
    if constexpr (base) {
      entry_of_[i] = static_cast<int32_t>(m);
      any_exact_ |= exact;
    }
    double score = 0;
    if (order_.uses_score) {
      if (d.count != last_count) {
        last_count = d.count;
        inv_count = Inverse(d.count);
      }
      if (d.devcore != last_core) {
        last_core = d.devcore;
        inv_core = Inverse(d.devcore);
      }
      if (d.devmem != last_mem) {
        last_mem = d.devmem;
        inv_mem = Inverse(d.devmem);
      }
      if (request == nullptr) {
        score = Score(inv_count, inv_core, inv_mem, u, none);
      } else {
        score = Score(inv_count, inv_core, inv_mem, u, ScorePart(exact, d.devmem, *request));
      }
    }
    SetKeys(d.numa, u.used, score, &e[m]);
    e[m].pos = static_cast<int32_t>(i);
    e[m].tie = (static_cast<int64_t>(d.index) << 32) | static_cast<int64_t>(i);
    ++m;
  }
  out->resize(m);
  if (two_apps_) {  // FitContainer's updates of the base entries read them
    inverses_ = InverseCache{last_count, last_core, last_mem, inv_count, inv_core, inv_mem};
  }
  if constexpr (base) {
    node_score_ = totals.Score();
    node_max_devmem_ = max_devmem;
  }
}

void Fitter::Build(const NodeSnapshot& node, absl::Span<const DeviceUsage> usage,
                   std::string_view type, const ContainerRequest* request,
                   std::vector<SortEntry>* out, bool base) {
  if (base) {
    BuildImpl<true>(node, usage, type, request, out);
  } else {
    BuildImpl<false>(node, usage, type, request, out);
  }
}

namespace {

// The device order: keys, then index, then position. Walking "from the end" of the sorted list
// is taking the greatest remaining entry under this order.
[[gnu::always_inline]] inline bool EntryLess(const std::array<double, 3>& ka, int64_t ta,
                                             const std::array<double, 3>& kb, int64_t tb) {
  if (ka[0] != kb[0]) {
    return ka[0] < kb[0];
  }
  if (ka[1] != kb[1]) {
    return ka[1] < kb[1];
  }
  if (ka[2] != kb[2]) {
    return ka[2] < kb[2];
  }
  return ta < tb;
}

[[gnu::always_inline]] inline bool RankLess(const std::vector<Fitter::SortEntry>& e, int32_t a,
                                            int32_t b) {
  return EntryLess(e[static_cast<size_t>(a)].key, e[static_cast<size_t>(a)].tie,
                   e[static_cast<size_t>(b)].key, e[static_cast<size_t>(b)].tie);
}

// rank := the entry indices sorted ascending (the order is total, so any algorithm gives the
// same result: insertion sort for the usual handful of GPUs, std::sort for large nodes).
void SortRank(const std::vector<Fitter::SortEntry>& entries, std::vector<int32_t>* rank) {
  const size_t m = entries.size();
  rank->resize(m);
  int32_t* r = rank->data();
  for (size_t j = 0; j < m; ++j) {
    r[j] = static_cast<int32_t>(j);
  }
  if (m <= 16) {
    for (size_t i = 1; i < m; ++i) {
      const int32_t v = r[i];
      size_t j = i;
      while (j > 0 && RankLess(entries, v, r[j - 1])) {
        r[j] = r[j - 1];
        --j;
      }
      r[j] = v;
    }
  } else {
    std::sort(r, r + m, [&entries](int32_t a, int32_t b) { return RankLess(entries, a, b); });
  }
}

// Entry `e`, normally at rank[p] (an earlier move may have shifted it), changed its keys: move
// it to its place in the otherwise sorted `rank`.
void Reposition(const std::vector<Fitter::SortEntry>& entries, std::vector<int32_t>* rank, size_t p,
                int32_t e) {
  auto& r = *rank;
  if (p >= r.size() || r[p] != e) {
    p = 0;
    while (r[p] != e) {
      ++p;
    }
  }
  while (p + 1 < r.size() && RankLess(entries, r[p + 1], e)) {
    r[p] = r[p + 1];
    ++p;
  }
  while (p > 0 && RankLess(entries, e, r[p - 1])) {
    r[p] = r[p - 1];
    --p;
  }
  r[p] = e;
}

}  // namespace

void Fitter::PrepareQuotaBound(bool settle) {
  // The pod's collapsed usage on a node is at most the plain sum of its requests: per container,
  // its cards times what it asks per card (fixed MiB, or its percentage of the card), cores
  // clamped to 100 as the fit clamps them; a negative ask counts 0, which only raises the bound.
  // A container's cards are nums, but under topology-aware HAMi's check counts every passing
  // card it has collected so far: up to the node's device count. A percentage grows with the
  // card, so with the node's largest card it bounds every card's ask.
  bound_asks_.clear();
  bound_node_ = {-1, -1};
  bound_settled_ = false;
  bound_per_node_ = false;
  if (pod_quota_ == nullptr || !settle) {
    return;
  }
  bool fixed = !topology_;
  int64_t mem = 0, cores = 0;
  for (const auto& c : request_->containers) {
    if (!c.has_value() || c->nums <= 0) {
      continue;
    }
    BoundAsk ask{c->nums, std::max(c->memreq, 0), 0, std::clamp(c->coresreq, 0, 100)};
    if (c->memreq <= 0 && c->mem_percentage != device::kPercentageUnset) {
      ask.pct = std::max(c->mem_percentage, 0);
      fixed = false;
    }
    mem += int64_t{ask.nums} * ask.memreq;
    cores += int64_t{ask.nums} * ask.cores;
    bound_asks_.push_back(ask);
  }
  if (fixed) {
    if (pod_quota_->Fits(mem, cores)) {
      pod_quota_ = nullptr;  // settled for every node: no card can fail the check
    }
    return;  // otherwise every card is checked
  }
  bound_per_node_ = true;
}

const NamespaceQuota* Fitter::QuotaFor(const device::NodeDevices& node) {
  if (pod_quota_ == nullptr || !bound_per_node_) {
    return pod_quota_;  // no limit, settled for the pod, or every card checked
  }
  const int32_t devmem = node_max_devmem_;
  const std::pair<int32_t, int32_t> key{devmem, static_cast<int32_t>(node.devices.size())};
  if (key != bound_node_) {
    int64_t mem = 0, cores = 0;
    for (const BoundAsk& a : bound_asks_) {
      const int64_t cards = topology_ ? std::max(a.nums, key.second) : a.nums;
      mem += cards * (a.pct > 0 ? PercentOf(devmem, a.pct) : a.memreq);
      cores += cards * a.cores;
    }
    bound_node_ = key;
    bound_settled_ = pod_quota_->Fits(mem, cores);
  }
  return bound_settled_ ? nullptr : pod_quota_;
}

void Fitter::PrepareQuotaBase() {
  // The pod's entries on this node from its earlier containers, collapsed per card:
  // max(peak over init entries, sum over app entries), as the ledger counts them.
  const auto init_count = static_cast<int32_t>(request_->init_count);
  quota_base_.clear();
  quota_base_mem_ = 0;
  quota_base_cores_ = 0;
  for (const Choice& c : choices_) {
    QuotaCard* card = nullptr;
    for (QuotaCard& q : quota_base_) {
      if (q.device == c.device) {
        card = &q;
        break;
      }
    }
    if (card == nullptr) {
      card = &quota_base_.emplace_back(QuotaCard{c.device});
    }
    if (c.container < init_count) {
      card->init_mem = std::max<int64_t>(card->init_mem, c.usedmem);
      card->init_cores = std::max<int64_t>(card->init_cores, c.usedcores);
    } else {
      card->app_mem += c.usedmem;
      card->app_cores += c.usedcores;
    }
  }
  for (const QuotaCard& q : quota_base_) {
    quota_base_mem_ += std::max(q.init_mem, q.app_mem);
    quota_base_cores_ += std::max(q.init_cores, q.app_cores);
  }
}

bool Fitter::QuotaFits(bool app, int32_t device, int64_t memreq, int32_t coresreq) {
  // The collapsed total with this container's cards so far and `device` added. A container
  // visits a card once, except a MIG card, which it may take several times: its entries on one
  // card add up (cur_*) before the card's term is collapsed with the earlier containers'.
  int64_t mem = quota_base_mem_, cores = quota_base_cores_;
  quota_cards_.clear();
  auto add = [&](int32_t dev, int64_t m, int64_t c) {
    QuotaCard* card = nullptr;
    for (QuotaCard& q : quota_cards_) {
      if (q.device == dev) {
        card = &q;
      }
    }
    if (card == nullptr) {
      card = &quota_cards_.emplace_back(QuotaCard{dev});
      for (const QuotaCard& q : quota_base_) {
        if (q.device == dev) {
          *card = q;
        }
      }
      // The earlier containers' term leaves; the card's term with this container comes back.
      mem -= std::max(card->init_mem, card->app_mem);
      cores -= std::max(card->init_cores, card->app_cores);
      card->cur_mem = 0;
      card->cur_cores = 0;
    } else {
      mem -= card->Term(app).first;
      cores -= card->Term(app).second;
    }
    card->cur_mem += m;
    card->cur_cores += c;
    mem += card->Term(app).first;
    cores += card->Term(app).second;
  };
  for (const Taken& t : taken_) {
    add(t.device, t.usedmem, t.usedcores);
  }
  add(device, memreq, coresreq);
  if (quota_->Fits(mem, cores)) {
    return true;
  }
  const bool memory = quota_->memory.has_value() && quota_->usedmem + mem > quota_->MemoryLimit();
  const int64_t asked = memory ? mem : cores;
  if (!quota_miss_.has_value() || (quota_miss_->memory == memory && asked < quota_miss_->asked) ||
      (memory && !quota_miss_->memory)) {
    quota_miss_ = QuotaMiss{memory, asked};
  }
  return false;
}

bool Fitter::FitContainer(int container, const ContainerRequest& request, const NodeSnapshot& snap,
                          absl::Span<const DeviceUsage> usage, std::vector<DeviceUsage>* apply,
                          bool app) {
  const NodeDevices& node = *snap.devices;
  const auto& devs = node.devices;

  // 1. The devices of the request's type with their sort keys against this container's view
  // of the usage. Normally the keys do not depend on the request (no device Type equals the
  // request type exactly), so they come from the per-node build (init containers: the node's
  // usage) or from the app entries kept in step with app_. Otherwise they are rebuilt.
  const std::vector<SortEntry>* entries;
  const std::vector<int32_t>* rank;
  const bool same_type = primary_typed_[static_cast<size_t>(container)] != 0;
  const bool fast = !any_exact_ && same_type;
  if (!fast) {
    Build(snap, usage, request.type, &request, &entries_, /*base=*/false);
    SortRank(entries_, &rank_);
    entries = &entries_;
    rank = &rank_;
  } else {
    // Init containers run before any app container, so the base entries match the node's
    // usage for them; app containers update the base entries in place as they take devices.
    if (app && !base_tracks_app_) {
      Build(snap, usage, request.type, nullptr, &base_entries_, /*base=*/false);
      SortRank(base_entries_, &base_rank_);
      base_tracks_app_ = true;
    }
    entries = &base_entries_;
    rank = &base_rank_;
  }
  const size_t m = entries->size();
  const auto total = static_cast<int32_t>(m);
  DeviceRules& rules = *rules_[static_cast<size_t>(kinds_[static_cast<size_t>(container)])];
  ContainerWalk walk{.request = request,
                     .node = snap,
                     .usage = usage,
                     .entries = absl::MakeConstSpan(*entries),
                     .rank = rank->data(),
                     .earlier = choices_,
                     .taken = &taken_,
                     .app = app,
                     .fitter = this};
  if (request.nums > total && !rules.MayExceedCandidates(container, walk)) {
    failed_container_ = container;
    reasons_.AssignOne(ReasonPart{Reason::kNodeInsufficientDevice, request.nums, total});
    return false;
  }

  // 2. The kind's rules take the devices (walking the sorted candidates from the end).
  taken_.clear();
  if (quota_ != nullptr) {
    PrepareQuotaBase();
  }
  rules.Walk(container, walk);
  if (walk.failed || taken_.size() < static_cast<size_t>(request.nums)) {
    constexpr auto kAllocated = static_cast<size_t>(Reason::kAllocatedCardsInsufficientRequest);
    walk.counts[kAllocated] = static_cast<int32_t>(taken_.size());
    failed_container_ = container;
    reasons_.Assign(walk.counts, walk.reason_total >= 0 ? walk.reason_total : total,
                    walk.failed ? uint32_t{1} << kAllocated : 0);
    return false;
  }
  for (const Taken& t : taken_) {
    choices_.push_back(
        Choice{container, t.device, t.usedmem, t.usedcores, t.mig_profile, t.placement});
    if (apply == nullptr) {
      continue;
    }
    DeviceUsage& w = (*apply)[static_cast<size_t>(t.device)];
    w.used += 1;
    w.usedmem += t.usedmem;
    w.usedcores += t.usedcores;
    if (app && fast && container < last_app_) {
      // Keep the base entries in step with app_ (for the app containers still to come).
      const DeviceInfo& d = devs[static_cast<size_t>(t.device)];
      double score = 0;
      if (order_.uses_score) {
        InverseCache& c = inverses_;  // usually the node's totals, from the build
        if (d.count != c.count) {
          c.count = d.count;
          c.inv_count = Inverse(d.count);
        }
        if (d.devcore != c.core) {
          c.core = d.devcore;
          c.inv_core = Inverse(d.devcore);
        }
        if (d.devmem != c.mem) {
          c.mem = d.devmem;
          c.inv_mem = Inverse(d.devmem);
        }
        score = Score(c.inv_count, c.inv_core, c.inv_mem, w, ScoreRequest{});
      }
      const int32_t e = entry_of_[static_cast<size_t>(t.device)];
      SetKeys(d.numa, w.used, score, &base_entries_[static_cast<size_t>(e)]);
      Reposition(base_entries_, &base_rank_, static_cast<size_t>(t.rank), e);
    }
  }
  if (app && !fast) {
    base_tracks_app_ = false;  // app_ changed behind the base entries
  }
  return true;
}

namespace {

void MaxInto(std::vector<DeviceUsage>* into, const std::vector<DeviceUsage>& from) {
  for (size_t i = 0; i < from.size(); ++i) {
    DeviceUsage& a = (*into)[i];
    a.used = std::max(a.used, from[i].used);
    a.usedmem = std::max(a.usedmem, from[i].usedmem);
    a.usedcores = std::max(a.usedcores, from[i].usedcores);
  }
}

}  // namespace

bool Fitter::Fit(const NodeSnapshot& node, bool want_usage_after) {
  choices_.clear();
  reasons_.clear();
  failed_container_ = -1;
  node_score_ = 0;
  if (node.devices == nullptr || node.usage.size() != node.devices->devices.size()) {
    return false;
  }
  Build(node, node.usage, primary_type_, nullptr, &base_entries_, /*base=*/true);
  quota_ = QuotaFor(*node.devices);
  SortRank(base_entries_, &base_rank_);
  base_tracks_app_ = true;
  const auto& containers = request_->containers;
  const size_t init_count = std::min(request_->init_count, containers.size());

  // Init containers: each on a fresh copy; keep the per-field peak in after_.
  bool any_init = false;
  for (size_t c = 0; c < init_count; ++c) {
    const auto& req = containers[c];
    if (!req.has_value() || req->nums <= 0) {
      continue;
    }
    if (!any_init && want_usage_after) {
      after_.assign(node.usage.begin(), node.usage.end());
    }
    any_init = true;
    if (want_usage_after) {
      init_.assign(node.usage.begin(), node.usage.end());
    }
    // Without usage_after nothing reads an init container's copy: fit it on the node's usage.
    if (!FitContainer(static_cast<int>(c), *req, node, node.usage,
                      want_usage_after ? &init_ : nullptr, /*app=*/false)) {
      return false;
    }
    if (want_usage_after) {
      MaxInto(&after_, init_);
    }
  }
  // App containers: cumulative on one copy.
  app_.assign(node.usage.begin(), node.usage.end());
  for (size_t c = init_count; c < containers.size(); ++c) {
    const auto& req = containers[c];
    if (!req.has_value() || req->nums <= 0) {
      continue;
    }
    if (!FitContainer(static_cast<int>(c), *req, node, app_, &app_, /*app=*/true)) {
      return false;
    }
  }
  if (want_usage_after) {
    if (any_init) {
      MaxInto(&after_, app_);
    } else {
      after_ = app_;
    }
  }
  return true;
}

device::PodMigReservations Fitter::BuildMigReservations(const NodeSnapshot& node) const {
  device::PodMigReservations out;
  const bool any = std::any_of(choices_.begin(), choices_.end(),
                               [](const Choice& c) { return c.mig_profile >= 0; });
  if (!any) {
    return out;
  }
  out.resize(request_->containers.size());
  for (const Choice& ch : choices_) {
    if (ch.mig_profile < 0) {
      out[ch.container].emplace_back(std::nullopt);
      continue;
    }
    const DeviceInfo& d = node.devices->devices[static_cast<size_t>(ch.device)];
    out[ch.container].emplace_back(device::MigReservation{
        d.mig_profiles[static_cast<size_t>(ch.mig_profile)].name, ch.placement});
  }
  return out;
}

device::PodDevices Fitter::BuildPodDevices(const NodeSnapshot& node) const {
  device::PodDevices out(request_->containers.size());
  for (const Choice& ch : choices_) {
    // The request's type, as HAMi writes it ("NVIDIA", "Ascend910B3").
    out[ch.container].push_back(device::ContainerDevice{
        node.devices->devices[ch.device].id,
        request_->containers[static_cast<size_t>(ch.container)]->type, ch.usedmem, ch.usedcores});
  }
  return out;
}

std::string NodeBlockedReason(std::string_view blocked_by) {
  std::string out(kNodeBlockedReasonPrefix);
  out += " (pod ";
  out.append(blocked_by);
  out += ')';
  return out;
}

std::string_view ReasonLabel(std::string_view reason) {
  return reason.starts_with(kNodeBlockedReasonPrefix) ? kNodeBlockedReasonPrefix : reason;
}

FitResult FitPod(const NodeSnapshot& node, const device::PodRequest& request,
                 const device::PodConstraints& constraints, const GpuPolicy& policy) {
  FitResult result;
  if (!node.blocked_by.empty()) {
    result.reason = NodeBlockedReason(node.blocked_by);
    return result;
  }
  Fitter fitter;
  fitter.Prepare(request, constraints, policy);
  result.fit = fitter.Fit(node);
  if (result.fit) {
    result.devices = fitter.BuildPodDevices(node);
    result.mig = fitter.BuildMigReservations(node);
    result.usage_after = fitter.usage_after();
    return result;
  }
  result.failed_container = fitter.failed_container();
  result.reasons = fitter.reasons();
  if (result.failed_container < 0) {
    result.reason = "node usage unavailable";
  } else {
    result.reasons.JoinTo(&result.reason);
  }
  return result;
}

}  // namespace tessera::schedule

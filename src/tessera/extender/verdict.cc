#include "tessera/extender/verdict.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/device/codec.h"
#include "tessera/schedule/fit.h"
#include "tessera/schedule/mig_fit.h"

namespace tessera::extender {
namespace {

constexpr size_t kMaxField = 128;

// At most `max` bytes, not splitting a UTF-8 character.
std::string Cut(std::string_view s, size_t max = kMaxField) {
  if (s.size() <= max) {
    return std::string(s);
  }
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) {
    --n;
  }
  return std::string(s.substr(0, n));
}

// Compact JSON; bytes that are not UTF-8 (a device id is whatever the plugin wrote) become U+FFFD.
std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string TimeText(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

bool ParseTimeText(const nlohmann::json& j, absl::Time* out) {
  if (!j.is_string()) {
    return false;
  }
  std::string err;
  return absl::ParseTime(absl::RFC3339_full, j.get<std::string>(), out, &err);
}

// The memory one device of `request` asks on a device of `devmem` MiB.
int64_t NeedMib(const device::ContainerRequest& request, int64_t devmem) {
  if (request.memreq > 0) {
    return request.memreq;
  }
  if (request.mem_percentage != device::kPercentageUnset) {
    return devmem * request.mem_percentage / 100;
  }
  return devmem;
}

// Whether `text` contains `part`, ASCII letters compared without case (no copy is made).
bool ContainsIgnoringCase(std::string_view text, std::string_view part) {
  return std::search(text.begin(), text.end(), part.begin(), part.end(),
                     [](char a, char b) {
                       return absl::ascii_tolower(static_cast<unsigned char>(a)) ==
                              absl::ascii_tolower(static_cast<unsigned char>(b));
                     }) != text.end() ||
         part.empty();
}

bool Cordoned(const device::NodeDevices& node, std::string_view uuid) {
  return std::binary_search(node.cordoned.begin(), node.cordoned.end(), uuid);
}

// The holders of device `index` of `view`, one entry per pod, largest memory first.
void FillHolders(const ledger::NodeView& view, size_t index, const ledger::Ledger& ledger,
                 NearestMiss* miss) {
  std::map<std::string, VerdictHolder> by_uid;
  for (const ledger::Holder& h : view.holders[index]) {
    VerdictHolder& v = by_uid[h.uid];
    v.pod = Cut(h.ns + "/" + h.name);
    v.mib += h.usedmem;
    v.cores += h.usedcores;
    if (h.reserved && !v.reserved_until) {
      v.reserved_until = ledger.ReservationExpiry(h.uid);
    }
  }
  std::vector<VerdictHolder> all;
  all.reserve(by_uid.size());
  for (auto& [uid, v] : by_uid) {
    all.push_back(std::move(v));
  }
  std::sort(all.begin(), all.end(), [](const VerdictHolder& a, const VerdictHolder& b) {
    return std::tie(b.mib, b.cores, a.pod) < std::tie(a.mib, a.cores, b.pod);
  });
  const size_t keep = std::min(all.size(), NearestMiss::kMaxHolders);
  miss->held_by.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep));
  miss->more_holders = static_cast<int64_t>(all.size() - keep);
}

// The closest device over the candidates that failed on their devices, for the first
// container that asks for devices: fewest resources short, then least memory short, then least
// cores short, then node name, then device index (never the candidates' order, which
// kube-scheduler changes from one retry to the next: a verdict must not change with it).
std::optional<NearestMiss> FindNearest(const VerdictInput& in) {
  const device::ContainerRequest* request = nullptr;
  for (const auto& c : in.request->containers) {
    if (c.has_value() && c->nums > 0) {
      request = &*c;
      break;
    }
  }
  if (request == nullptr) {
    return std::nullopt;
  }
  // The key is computed for every device; the strings only for a new best.
  std::optional<NearestMiss> best;
  std::tuple<int, int64_t, int64_t> best_key;
  std::string_view best_node;
  size_t best_index = 0;
  for (const schedule::Candidate& c : in.candidates) {
    if (!c.snapshot || c.snapshot->devices == nullptr || !c.snapshot->blocked_by.empty()) {
      continue;
    }
    const device::NodeDevices& node = *c.snapshot->devices;
    if (c.snapshot->usage.size() != node.devices.size()) {
      continue;
    }
    for (size_t i = 0; i < node.devices.size(); ++i) {
      const device::DeviceInfo& d = node.devices[i];
      if (!d.health || d.mode == "mig" || Cordoned(node, d.id) ||
          !ContainsIgnoringCase(d.type, request->type)) {
        continue;
      }
      const device::DeviceUsage& u = c.snapshot->usage[i];
      const int64_t need_mib = NeedMib(*request, d.devmem);
      const int64_t free_mib = d.devmem - u.usedmem;
      const int64_t free_cores = d.devcore - u.usedcores;
      const int64_t free_slots = d.count - u.used;
      const int64_t mem_short = std::max<int64_t>(0, need_mib - free_mib);
      const int64_t core_short = std::max<int64_t>(0, request->coresreq - free_cores);
      const int shorts =
          (mem_short > 0 ? 1 : 0) + (core_short > 0 ? 1 : 0) + (free_slots <= 0 ? 1 : 0);
      const auto key = std::make_tuple(shorts, mem_short, core_short);
      if (best && (best_key < key || (key == best_key && best_node <= c.name))) {
        continue;
      }
      best = NearestMiss{.node = Cut(c.name),
                         .device = Cut(d.id),
                         .need_mib = need_mib,
                         .free_mib = free_mib,
                         .need_cores = request->coresreq,
                         .free_cores = free_cores,
                         .free_slots = free_slots,
                         .held_by = {},
                         .more_holders = 0};
      best_key = key;
      best_node = c.name;
      best_index = i;
    }
  }
  if (best && in.ledger != nullptr) {
    if (std::optional<ledger::NodeView> view = in.ledger->View(best->node);
        view && best_index < view->holders.size()) {
      FillHolders(*view, best_index, *in.ledger, &*best);
    }
  }
  return best;
}

// Verdict::mig: the first candidate that failed as CardMigTopologyInfeasible, its first MIG card
// where no adequate placement is free (for the first requesting container that has one), and the
// pods holding that card.
std::string FindMigMiss(const VerdictInput& in, const std::vector<FailedNode>& failed) {
  for (const FailedNode& f : failed) {
    const bool mig = std::any_of(f.parts.begin(), f.parts.end(), [](const auto& part) {
      return part.reason == schedule::Reason::kCardMigTopologyInfeasible;
    });
    if (!mig) {
      continue;
    }
    const auto c =
        std::find_if(in.candidates.begin(), in.candidates.end(),
                     [&](const schedule::Candidate& cand) { return cand.name == f.node; });
    if (c == in.candidates.end() || !c->snapshot || c->snapshot->devices == nullptr) {
      continue;
    }
    for (const auto& container : in.request->containers) {
      if (!container.has_value() || container->nums <= 0) {
        continue;
      }
      const std::vector<std::string> lines = schedule::ExplainMigNode(*c->snapshot, *container);
      if (lines.empty()) {
        continue;
      }
      std::string out = fmt::format("node {} / {}", f.node, lines.front());
      const std::string_view uuid =
          std::string_view(lines.front()).substr(0, lines.front().find(':'));
      const int index = c->snapshot->devices->Find(uuid);
      std::optional<ledger::NodeView> view =
          in.ledger != nullptr ? in.ledger->View(f.node) : std::nullopt;
      if (index >= 0 && view && static_cast<size_t>(index) < view->holders.size()) {
        std::vector<std::string> pods;
        for (const ledger::Holder& h : view->holders[static_cast<size_t>(index)]) {
          std::string pod = h.ns + "/" + h.name;
          if (std::find(pods.begin(), pods.end(), pod) == pods.end()) {
            pods.push_back(std::move(pod));
          }
        }
        std::sort(pods.begin(), pods.end());
        for (size_t i = 0; i < pods.size(); ++i) {
          out += (i == 0 ? "; held by " : ", ") + pods[i];
        }
      }
      return Cut(out, Verdict::kMaxMigBytes);
    }
  }
  return "";
}

nlohmann::json HolderJson(const VerdictHolder& h) {
  nlohmann::json j = {{"pod", h.pod}, {"mib", h.mib}, {"cores", h.cores}};
  if (h.reserved_until) {
    j["reserved_until"] = TimeText(*h.reserved_until);
  }
  return j;
}

nlohmann::json ToJson(const Verdict& v, size_t holders, bool lock, bool nearest, size_t reasons) {
  nlohmann::json j = nlohmann::json::object();
  j["v"] = 1;
  j["reason"] = v.reason;
  j["nodes"] = v.nodes;
  nlohmann::json r = nlohmann::json::array();
  for (size_t i = 0; i < std::min(reasons, v.reasons.size()); ++i) {
    r.push_back({v.reasons[i].first, v.reasons[i].second});
  }
  j["reasons"] = std::move(r);
  if (nearest && v.nearest) {
    const NearestMiss& m = *v.nearest;
    nlohmann::json n = {{"node", m.node},
                        {"device", m.device},
                        {"need_mib", m.need_mib},
                        {"free_mib", m.free_mib},
                        {"need_cores", m.need_cores},
                        {"free_cores", m.free_cores},
                        {"free_slots", m.free_slots}};
    nlohmann::json held = nlohmann::json::array();
    const size_t keep = std::min(holders, m.held_by.size());
    for (size_t i = 0; i < keep; ++i) {
      held.push_back(HolderJson(m.held_by[i]));
    }
    n["held_by"] = std::move(held);
    n["more_holders"] = m.more_holders + static_cast<int64_t>(m.held_by.size() - keep);
    j["nearest"] = std::move(n);
  }
  if (lock && v.lock) {
    j["lock"] = {
        {"node", v.lock->node}, {"holder", v.lock->holder}, {"since", TimeText(v.lock->since)}};
  }
  j["unregistered"] = v.unregistered;
  j["unhealthy"] = v.unhealthy;
  j["blocked"] = v.blocked;
  if (!v.blocked_by.empty()) {
    j["blocked_by"] = v.blocked_by;
  }
  if (!v.quota.empty()) {
    j["quota"] = v.quota;
  }
  if (!v.mig.empty()) {
    j["mig"] = v.mig;
  }
  if (!v.preemption.empty()) {
    j["preemption"] = v.preemption;
  }
  return j;
}

bool GetInt(const nlohmann::json& j, std::string_view key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end()) {
    return true;  // absent: 0
  }
  if (!it->is_number_integer()) {
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

bool GetString(const nlohmann::json& j, std::string_view key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end()) {
    return true;
  }
  if (!it->is_string()) {
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("not a Tessera verdict: {}", what));
}

std::string Ago(absl::Duration d) { return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1))); }

}  // namespace

std::vector<std::string_view> PendingReasons() {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < schedule::kReasonCount; ++i) {
    out.push_back(schedule::ReasonName(static_cast<schedule::Reason>(i)));
  }
  for (size_t i = 0; i < kNodeFailureCount; ++i) {
    if (std::string_view label = NodeFailureLabel(static_cast<NodeFailure>(i)); !label.empty()) {
      out.push_back(label);
    }
  }
  out.push_back(kNoCandidatesReason);
  return out;
}

namespace {

// Nodes failed per reason, indexed as PendingReasons() without kNoCandidatesReason.
std::array<int64_t, schedule::kReasonCount + kNodeFailureCount> CountReasons(
    const std::vector<FailedNode>& failed_nodes) {
  std::array<int64_t, schedule::kReasonCount + kNodeFailureCount> counts{};
  for (const FailedNode& f : failed_nodes) {
    if (f.failure != NodeFailure::kDevices) {
      ++counts[schedule::kReasonCount + static_cast<size_t>(f.failure)];
      continue;
    }
    for (const schedule::ReasonPart& part : f.parts) {
      ++counts[static_cast<size_t>(part.reason)];
    }
  }
  return counts;
}

std::string_view CountName(size_t i) {
  return i < schedule::kReasonCount
             ? schedule::ReasonName(static_cast<schedule::Reason>(i))
             : NodeFailureLabel(static_cast<NodeFailure>(i - schedule::kReasonCount));
}

}  // namespace

namespace {
using ReasonCounts = std::array<int64_t, schedule::kReasonCount + kNodeFailureCount>;

// The name of the largest count, ties by name; kNoCandidatesReason for no failed nodes.
std::string_view MainReasonOf(const ReasonCounts& counts, bool any_failed) {
  if (!any_failed) {
    return kNoCandidatesReason;
  }
  std::string_view best;
  int64_t best_count = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::string_view name = CountName(i);
    if (counts[i] > best_count || (counts[i] == best_count && counts[i] > 0 && name < best)) {
      best = name;
      best_count = counts[i];
    }
  }
  return best;
}
}  // namespace

std::string_view MainReason(const std::vector<FailedNode>& failed_nodes) {
  return MainReasonOf(CountReasons(failed_nodes), !failed_nodes.empty());
}

Verdict BuildVerdict(const VerdictInput& in) {
  Verdict v;
  static const std::vector<FailedNode> kNone;
  const std::vector<FailedNode>* failed = in.failed != nullptr ? in.failed : &kNone;
  std::vector<FailedNode> relabelled;  // a copy only when a node that failed is withheld
  if (in.withheld) {
    for (size_t i = 0; i < failed->size(); ++i) {
      const FailedNode& f = (*failed)[i];
      if (f.failure == NodeFailure::kDevices && in.withheld(f.node)) {
        if (relabelled.empty()) {
          relabelled = *failed;
          failed = &relabelled;
        }
        relabelled[i].failure = NodeFailure::kUnregistered;
        relabelled[i].parts = schedule::ReasonParts();
      }
    }
  }
  const ReasonCounts counts = CountReasons(*failed);
  v.reason = std::string(MainReasonOf(counts, !failed->empty()));
  v.nodes = static_cast<int64_t>(in.candidates.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) {
      v.reasons.emplace_back(std::string(CountName(i)), counts[i]);
    }
  }
  std::stable_sort(v.reasons.begin(), v.reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  v.unregistered = counts[schedule::kReasonCount + static_cast<size_t>(NodeFailure::kUnregistered)];
  for (const schedule::Candidate& c : in.candidates) {
    if (!c.snapshot || c.snapshot->devices == nullptr || (in.withheld && in.withheld(c.name))) {
      continue;
    }
    if (!c.snapshot->blocked_by.empty()) {
      if (v.blocked++ == 0) {
        v.blocked_by = Cut(c.snapshot->blocked_by);
      }
    }
    const device::NodeDevices& node = *c.snapshot->devices;
    for (const device::DeviceInfo& d : node.devices) {
      v.unhealthy += (!d.health || Cordoned(node, d.id)) ? 1 : 0;
    }
  }
  if (in.request != nullptr) {
    v.nearest = FindNearest(in);
    if (counts[static_cast<size_t>(schedule::Reason::kCardMigTopologyInfeasible)] > 0) {
      v.mig = FindMigMiss(in, *failed);
    }
  }
  if (v.nearest && in.lock_of) {
    absl::StatusOr<device::NodeLock> lock = device::ParseNodeLock(in.lock_of(v.nearest->node));
    if (lock.ok()) {
      v.lock = LockBlocker{.node = v.nearest->node,
                           .holder = lock->legacy ? "" : Cut(lock->ns + "/" + lock->name),
                           .since = absl::FromUnixSeconds(absl::ToUnixSeconds(lock->time))};
    }
  }
  return v;
}

Verdict BuildVerdict(const cycle::Diagnosis& diagnosis, VerdictInput in) {
  in.failed = &diagnosis.failed;
  Verdict v = BuildVerdict(in);
  v.quota = diagnosis.quota;
  return v;
}

std::string EncodeVerdict(const Verdict& v) {
  size_t holders = NearestMiss::kMaxHolders;
  bool lock = true;
  bool nearest = true;
  size_t reasons = v.reasons.size();
  for (;;) {
    std::string out = Dump(ToJson(v, holders, lock, nearest, reasons));
    if (out.size() <= kMaxVerdictBytes) {
      return out;
    }
    if (nearest && v.nearest && holders > 0 && !v.nearest->held_by.empty()) {
      holders = std::min(holders, v.nearest->held_by.size()) - 1;
    } else if (lock && v.lock) {
      lock = false;
    } else if (nearest && v.nearest) {
      nearest = false;
    } else if (reasons > 0) {
      --reasons;
    } else {
      // Only the strings are left (a decoded verdict's may be long): cut them.
      Verdict bare = v;
      bare.reason = Cut(v.reason);
      bare.blocked_by.clear();
      bare.quota = Cut(v.quota);
      bare.mig = Cut(v.mig);
      bare.preemption = Cut(v.preemption);
      return Dump(ToJson(bare, 0, false, false, 0));
    }
  }
}

absl::StatusOr<Verdict> DecodeVerdict(std::string_view json) {
  if (json.size() > 4 * kMaxVerdictBytes) {
    return Bad(fmt::format("{} bytes (at most {})", json.size(), 4 * kMaxVerdictBytes));
  }
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Bad("not a JSON object");
  }
  int64_t version = 0;
  if (!GetInt(j, "v", &version) || version != 1) {
    return Bad("\"v\" is not 1");
  }
  Verdict v;
  if (!GetString(j, "reason", &v.reason) || !GetInt(j, "nodes", &v.nodes) ||
      !GetInt(j, "unregistered", &v.unregistered) || !GetInt(j, "unhealthy", &v.unhealthy) ||
      !GetInt(j, "blocked", &v.blocked) || !GetString(j, "blocked_by", &v.blocked_by) ||
      !GetString(j, "quota", &v.quota) || !GetString(j, "mig", &v.mig) ||
      !GetString(j, "preemption", &v.preemption)) {
    return Bad("a field has the wrong type");
  }
  if (auto it = j.find("reasons"); it != j.end()) {
    if (!it->is_array()) {
      return Bad("\"reasons\" is not an array");
    }
    for (const nlohmann::json& r : *it) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_string() || !r[1].is_number_integer()) {
        return Bad("a reason is not [name, count]");
      }
      v.reasons.emplace_back(r[0].get<std::string>(), r[1].get<int64_t>());
    }
  }
  if (auto it = j.find("nearest"); it != j.end()) {
    if (!it->is_object()) {
      return Bad("\"nearest\" is not an object");
    }
    NearestMiss m;
    if (!GetString(*it, "node", &m.node) || !GetString(*it, "device", &m.device) ||
        !GetInt(*it, "need_mib", &m.need_mib) || !GetInt(*it, "free_mib", &m.free_mib) ||
        !GetInt(*it, "need_cores", &m.need_cores) || !GetInt(*it, "free_cores", &m.free_cores) ||
        !GetInt(*it, "free_slots", &m.free_slots) ||
        !GetInt(*it, "more_holders", &m.more_holders)) {
      return Bad("a field of \"nearest\" has the wrong type");
    }
    if (auto h = it->find("held_by"); h != it->end()) {
      if (!h->is_array()) {
        return Bad("\"held_by\" is not an array");
      }
      for (const nlohmann::json& e : *h) {
        VerdictHolder holder;
        if (!e.is_object() || !GetString(e, "pod", &holder.pod) || !GetInt(e, "mib", &holder.mib) ||
            !GetInt(e, "cores", &holder.cores)) {
          return Bad("a holder is malformed");
        }
        if (auto t = e.find("reserved_until"); t != e.end()) {
          absl::Time until;
          if (!ParseTimeText(*t, &until)) {
            return Bad("\"reserved_until\" is not an RFC 3339 time");
          }
          holder.reserved_until = until;
        }
        m.held_by.push_back(std::move(holder));
      }
    }
    v.nearest = std::move(m);
  }
  if (auto it = j.find("lock"); it != j.end()) {
    LockBlocker lock;
    if (!it->is_object() || !GetString(*it, "node", &lock.node) ||
        !GetString(*it, "holder", &lock.holder) || !it->contains("since") ||
        !ParseTimeText((*it)["since"], &lock.since)) {
      return Bad("\"lock\" is malformed");
    }
    v.lock = std::move(lock);
  }
  return v;
}

std::string FormatVerdict(const Verdict& v, absl::Time now) {
  std::string out;
  if (v.nodes == 0) {
    out += "no candidate nodes: kube-scheduler's own filters left none for Tessera\n";
  } else {
    out += fmt::format("no node fits: {} candidate node{} failed, mostly {}\n", v.nodes,
                       v.nodes == 1 ? "" : "s", v.reason);
  }
  for (const auto& [reason, n] : v.reasons) {
    out += fmt::format("  {:>5} node{} {}\n", n, n == 1 ? " " : "s", reason);
  }
  if (v.nearest) {
    const NearestMiss& m = *v.nearest;
    out += fmt::format("nearest miss: node {} / {}: needs {} MiB, {} free", m.node, m.device,
                       m.need_mib, m.free_mib);
    if (m.need_cores > 0) {
      out += fmt::format("; needs {}% cores, {}% free", m.need_cores, m.free_cores);
    }
    if (m.free_slots <= 0) {
      out += "; no allocation slot left";
    }
    out += "\n";
    for (const VerdictHolder& h : m.held_by) {
      if (h.reserved_until) {
        const absl::Duration left = *h.reserved_until - now;
        out += fmt::format("  {} MiB held by the reservation of {}, {}\n", h.mib, h.pod,
                           left > absl::ZeroDuration() ? "expires in " + Ago(left)
                                                       : "expired " + Ago(-left) + " ago");
      } else {
        out += fmt::format("  {} MiB held by {}\n", h.mib, h.pod);
      }
    }
    if (m.more_holders > 0) {
      out += fmt::format("  … and {} more pod{}\n", m.more_holders, m.more_holders == 1 ? "" : "s");
    }
  }
  if (v.lock) {
    out += fmt::format("node lock on {} held by {} since {} ({} ago)\n", v.lock->node,
                       v.lock->holder.empty() ? "(a legacy lock)" : v.lock->holder,
                       TimeText(v.lock->since), Ago(now - v.lock->since));
  }
  if (v.unregistered > 0) {
    out += fmt::format(
        "{} node{} without a device registration (the device plugin stopped reporting or the "
        "handshake expired)\n",
        v.unregistered, v.unregistered == 1 ? "" : "s");
  }
  if (v.unhealthy > 0) {
    out += fmt::format("{} device{} unhealthy or cordoned\n", v.unhealthy,
                       v.unhealthy == 1 ? "" : "s");
  }
  if (v.blocked > 0) {
    out += fmt::format("{} node{} blocked by an allocation Tessera cannot read (pod {})\n",
                       v.blocked, v.blocked == 1 ? "" : "s", v.blocked_by);
  }
  if (!v.quota.empty()) {
    out += fmt::format("quota: {}\n", v.quota);
  }
  if (!v.mig.empty()) {
    out += fmt::format("mig: {}\n", v.mig);
  }
  if (!v.preemption.empty()) {
    out += fmt::format("preemption: {}\n", v.preemption);
  }
  return out;
}

}  // namespace tessera::extender

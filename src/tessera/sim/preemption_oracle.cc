#include "tessera/sim/preemption_oracle.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/kube/decode.h"
#include "tessera/sim/oracle.h"

namespace tessera::sim {

using nlohmann::json;

namespace {

// Evictions of one pod's round follow each other within this; a later one is another round.
constexpr absl::Duration kRound = absl::Seconds(5);
// A nomination outlives its preemptor's pending time at most this long (kept lenient).
constexpr absl::Duration kNominationLife = absl::Minutes(5);

std::optional<int64_t> Quantity(const kube::ResourceList& list, const std::string& name) {
  const kube::ShortString* found = list.Find(name);
  if (found == nullptr) {
    return std::nullopt;
  }
  int64_t v = 0;
  const std::string_view s = found->view();
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) {
    return -1;  // not a plain count: not modelled
  }
  return v;
}

// A quantity from the limits, else the requests (HAMi's order); 0 when neither has it.
int64_t Limit(const kube::Container& c, const std::string& name) {
  std::optional<int64_t> v = Quantity(c.limits, name);
  if (!v.has_value()) {
    v = Quantity(c.requests, name);
  }
  return v.value_or(0);
}

absl::StatusOr<absl::Time> ParseTime(const std::string& text) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &err)) {
    return absl::InvalidArgumentError(fmt::format("evictions: bad time \"{}\": {}", text, err));
  }
  return t;
}

std::string Key(const kube::Pod& p) { return p.meta.ns + "/" + p.meta.name; }

}  // namespace

absl::StatusOr<std::vector<EvictionRecord>> ParseEvictions(std::string_view body) {
  const json doc = json::parse(body, nullptr, false);
  if (!doc.is_object() || !doc.contains("evictions") || !doc["evictions"].is_array()) {
    return absl::InvalidArgumentError("evictions: want {\"evictions\":[...]}");
  }
  kube::Decoder decoder;
  std::vector<EvictionRecord> out;
  for (const json& e : doc["evictions"]) {
    if (!e.is_object() || !e.contains("nodePods") || !e["nodePods"].is_array() ||
        !e.value("at", json()).is_string()) {
      return absl::InvalidArgumentError("evictions: a record without nodePods or at");
    }
    EvictionRecord r;
    r.ns = e.value("namespace", "");
    r.name = e.value("name", "");
    r.uid = e.value("uid", "");
    r.node = e.value("node", "");
    absl::StatusOr<absl::Time> at = ParseTime(e["at"].get<std::string>());
    if (!at.ok()) {
      return at.status();
    }
    r.at = *at;
    for (const json& p : e["nodePods"]) {
      absl::StatusOr<kube::Pod> pod = decoder.DecodePod(p.dump());
      if (!pod.ok()) {
        return absl::InvalidArgumentError(fmt::format("evictions: a pod of {}/{}: {}", r.ns, r.name,
                                                      std::string(pod.status().message())));
      }
      r.node_pods.push_back(*std::move(pod));
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<PreemptedEvent>> ParsePreemptedEvents(std::string_view body) {
  const json doc = json::parse(body, nullptr, false);
  if (!doc.is_object() || !doc.contains("items") || !doc["items"].is_array()) {
    return absl::InvalidArgumentError("events: want an EventList");
  }
  constexpr std::string_view kOn = "to free a GPU share on ";
  constexpr std::string_view kFor = " for ";
  constexpr std::string_view kPriority = " (priority ";
  std::vector<PreemptedEvent> out;
  for (const json& e : doc["items"]) {
    if (!e.is_object() || e.value("reason", "") != "Preempted" ||
        !e.value("involvedObject", json()).is_object()) {
      continue;
    }
    const std::string message = e.value("message", "");
    const size_t on = message.find(kOn);
    const size_t for_at = on == std::string::npos ? on : message.find(kFor, on + kOn.size());
    const size_t pri =
        for_at == std::string::npos ? for_at : message.find(kPriority, for_at + kFor.size());
    if (pri == std::string::npos) {
      continue;
    }
    PreemptedEvent ev;
    ev.victim_uid = e["involvedObject"].value("uid", "");
    ev.node = message.substr(on + kOn.size(), for_at - on - kOn.size());
    ev.preemptor = message.substr(for_at + kFor.size(), pri - for_at - kFor.size());
    if (!ev.victim_uid.empty()) {
      out.push_back(std::move(ev));
    }
  }
  return out;
}

std::optional<bool> FitsOnNode(const kube::Pod& pod, const kube::Node& node,
                               const std::vector<kube::Pod>& pods) {
  for (const auto& [key, value] : pod.meta.annotations) {
    if (key.starts_with("nvidia.com/") || key.starts_with("hami.io/")) {
      return std::nullopt;  // a device selector, NUMA binding, a mode: not modelled
    }
  }
  const kube::Container* gpu = nullptr;
  for (const std::vector<kube::Container>* list : {&pod.init_containers, &pod.containers}) {
    for (const kube::Container& c : *list) {
      if (Limit(c, "nvidia.com/gpu") != 0) {
        if (gpu != nullptr || list == &pod.init_containers) {
          return std::nullopt;  // several GPU containers: HAMi's fit is sequential
        }
        gpu = &c;
      }
    }
  }
  if (gpu == nullptr) {
    return std::nullopt;
  }
  const int64_t count = Limit(*gpu, "nvidia.com/gpu");
  const int64_t mem = Limit(*gpu, "nvidia.com/gpumem");
  int64_t pct = Limit(*gpu, "nvidia.com/gpumem-percentage");
  int64_t cores = Limit(*gpu, "nvidia.com/gpucores");
  if (count < 0 || mem < 0 || pct < 0 || cores < 0 || pct > 100) {
    return std::nullopt;
  }
  if (mem == 0 && pct == 0) {
    pct = 100;  // neither memory nor a percentage: the whole card
  }
  cores = std::min<int64_t>(cores, 100);
  const Truth usage = ComputeTruth({node}, pods);
  int64_t fitting = 0;
  ForEachRegisteredDevice({node}, [&](const kube::Node&, const device::DeviceInfo& d) {
    if (!d.health || d.mode == "mig" || !absl::StrContains(d.type, "NVIDIA")) {
      return;
    }
    const DeviceUsage& u = usage.devices.at(d.id);
    const int64_t want = mem > 0 ? mem : int64_t{d.devmem} * pct / 100;
    if (u.used >= d.count || d.devmem - u.usedmem < want || d.devcore - u.usedcores < cores) {
      return;
    }
    if (d.devcore == 100 && cores == 100 && u.used > 0) {
      return;  // exclusive use wants an idle card
    }
    if (d.devcore != 0 && u.usedcores == d.devcore && cores == 0) {
      return;  // every core taken
    }
    ++fitting;
  });
  return fitting >= count;
}

PreemptionFindings JudgePreemptions(const PreemptionInput& in) {
  PreemptionFindings f;
  std::map<std::string, const PreemptedEvent*> by_uid;
  for (const PreemptedEvent& e : in.events) {
    by_uid.emplace(e.victim_uid, &e);
  }
  std::vector<const EvictionRecord*> records;
  for (const EvictionRecord& r : in.evictions) {
    records.push_back(&r);
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const auto* a, const auto* b) { return a->at < b->at; });
  // (preemptor, node) → rounds, each the victims' records in eviction order.
  std::map<std::pair<std::string, std::string>, std::vector<std::vector<const EvictionRecord*>>>
      groups;
  for (const EvictionRecord* r : records) {
    auto ev = by_uid.find(r->uid);
    if (ev == by_uid.end()) {
      ++f.unattributed;
      continue;
    }
    ++f.victims;
    if (ev->second->node != r->node) {
      f.violations.push_back(
          {r->at, fmt::format("{}/{} on {} was evicted to free a share on {}: it cannot help",
                              r->ns, r->name, r->node, ev->second->node)});
      continue;
    }
    auto& rounds = groups[{ev->second->preemptor, r->node}];
    if (rounds.empty() || r->at - rounds.back().back()->at > kRound) {
      rounds.emplace_back();
    }
    rounds.back().push_back(r);
  }
  std::map<std::string, const kube::Node*> nodes;
  for (const kube::Node& n : in.nodes) {
    nodes[n.meta.name] = &n;
  }
  // Every round's first eviction on each node, to find other preemptors' nominations.
  std::vector<std::tuple<std::string, absl::Time, std::string>> firsts;  // node, time, preemptor
  for (const auto& [key, rounds] : groups) {
    for (const auto& round : rounds) {
      firsts.emplace_back(key.second, round.front()->at, key.first);
    }
  }
  for (const auto& [key, rounds] : groups) {
    const std::string& preemptor = key.first;  // named: lambdas below capture them
    const std::string& node = key.second;
    for (const auto& round : rounds) {
      ++f.preemptions;
      const EvictionRecord& first = *round.front();
      const absl::Time t = first.at;
      auto who = in.pods.find(preemptor);
      if (who == in.pods.end()) {
        ++f.unjudged_request;  // not a pod of the workload
        continue;
      }
      const PreemptionInput::WorkloadPod& p = who->second;
      if (p.node.empty()) {
        ++f.never_bound;
      } else {
        ++(p.node == node ? f.bound_there : f.bound_elsewhere);
      }
      std::set<std::string> victims, victim_keys;
      std::string names;
      for (const EvictionRecord* r : round) {
        victims.insert(r->uid);
        victim_keys.insert(r->ns + "/" + r->name);
        names += fmt::format("{}{}/{}", names.empty() ? "" : ", ", r->ns, r->name);
      }
      for (const EvictionRecord* r : round) {
        for (const kube::Pod& v : first.node_pods) {
          if (v.meta.uid == r->uid && v.priority >= p.pod.priority) {
            f.violations.push_back(
                {r->at, fmt::format("{} (priority {}) was evicted for {} (priority {}) on {}: "
                                    "not of lower priority",
                                    Key(v), v.priority, preemptor, p.pod.priority, node)});
          }
        }
      }
      if (p.bound_at <= t - in.quiet) {
        f.violations.push_back(
            {t, fmt::format("{} was evicted for {}, bound to {} {} before", names, preemptor,
                            p.node, absl::FormatDuration(t - p.bound_at))});
        continue;
      }
      // Where the recorded state may not be the one the scheduler decided on: not judged.
      const bool changed =
          p.bound_at <= t ||
          std::any_of(in.departures.begin(), in.departures.end(), [&](const auto& d) {
            return d.node == node && d.at >= t - in.quiet && d.at <= t + in.quiet / 4 &&
                   victim_keys.count(d.pod) == 0;
          });
      auto node_it = nodes.find(node);
      if (changed || node_it == nodes.end()) {
        ++f.unjudged_changed;
        continue;
      }
      const bool nominated = std::any_of(firsts.begin(), firsts.end(), [&](const auto& other) {
        const auto& [n, at, pod] = other;
        if (n != node || pod == preemptor || at >= t || t - at > kNominationLife) {
          return false;
        }
        auto o = in.pods.find(pod);
        return o == in.pods.end() || o->second.bound_at > t;  // still waiting at t
      });
      if (nominated) {
        ++f.unjudged_nominated;
        continue;
      }
      // The node's pods at the first eviction; a pending pod reserved here counts as placed.
      std::vector<kube::Pod> state;
      for (const kube::Pod& q : first.node_pods) {
        if (Key(q) == preemptor) {
          continue;
        }
        state.push_back(q);
        if (state.back().node_name.empty()) {
          state.back().node_name = node;
        }
      }
      bool modelled = true;
      for (const EvictionRecord* kept : round) {
        std::vector<kube::Pod> without;
        for (const kube::Pod& q : state) {
          if (q.meta.uid == kept->uid || victims.count(q.meta.uid) == 0) {
            without.push_back(q);
          }
        }
        std::optional<bool> fits = FitsOnNode(p.pod, *node_it->second, without);
        if (!fits.has_value()) {
          modelled = false;
          break;
        }
        if (*fits) {
          f.violations.push_back(
              {kept->at,
               fmt::format("{}/{} was a needless victim: {} (priority {}) fits on {} with it kept "
                           "and the other victims evicted (victims: {})",
                           kept->ns, kept->name, preemptor, p.pod.priority, node, names)});
        }
      }
      ++(modelled ? f.judged : f.unjudged_request);
    }
  }
  return f;
}

}  // namespace tessera::sim

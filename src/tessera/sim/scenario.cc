#include "tessera/sim/scenario.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include "tessera/device/mig_geometry.h"
#include "tessera/sim/embedded_scenarios.h"

namespace tessera::sim {

namespace {

constexpr std::string_view kKindNames[] = {"drop_events",  "sever_watches",  "compact",
                                           "watch_outage", "apisim_restart", "tessera_kill",
                                           "node_delete",  "plugin_stop",    "error_storm"};

absl::Status Bad(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(fmt::format("scenario: {}: {}", key, why));
}

absl::StatusOr<absl::Duration> Dur(const YAML::Node& n, const std::string& key) {
  absl::Duration d;
  const std::string text = n.as<std::string>();
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    return Bad(key, fmt::format("want a duration such as 30s, got \"{}\"", text));
  }
  return d;
}

absl::Status CheckKeys(const YAML::Node& map, const std::string& where,
                       std::initializer_list<std::string_view> keys) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    bool known = false;
    for (std::string_view want : keys) {
      known = known || want == k;
    }
    if (!known) {
      return Bad(where.empty() ? k : fmt::format("{}.{}", where, k), "unknown key");
    }
  }
  return absl::OkStatus();
}

#define TESSERA_SCN_ASSIGN(lhs, expr) \
  do {                                \
    auto _v = (expr);                 \
    if (!_v.ok()) return _v.status(); \
    (lhs) = *_v;                      \
  } while (false)

absl::StatusOr<FaultSpec> ParseFault(const YAML::Node& f, size_t i) {
  const std::string where = fmt::format("faults[{}]", i);
  if (!f.IsMap()) {
    return Bad(where, "want a map");
  }
  absl::Status keys = CheckKeys(f, where,
                                {"kind", "at", "every", "duration", "type", "probability", "code",
                                 "count", "delete_burst", "compact", "force"});
  if (!keys.ok()) {
    return keys;
  }
  if (!f["kind"]) {
    return Bad(where + ".kind", "missing");
  }
  FaultSpec s{};
  s.duration = absl::Seconds(5);
  s.event_type = "DELETED";
  s.probability = 1.0;
  s.code = 500;
  s.count = 1;
  const std::string kind = f["kind"].as<std::string>();
  bool found = false;
  for (size_t k = 0; k < std::size(kKindNames); ++k) {
    if (kKindNames[k] == kind) {
      s.kind = static_cast<FaultKind>(k);
      found = true;
    }
  }
  if (!found) {
    return Bad(where + ".kind", fmt::format("unknown fault \"{}\"", kind));
  }
  if (!f["at"]) {
    return Bad(where + ".at", "missing");
  }
  TESSERA_SCN_ASSIGN(s.at, Dur(f["at"], where + ".at"));
  if (f["every"]) {
    TESSERA_SCN_ASSIGN(s.every, Dur(f["every"], where + ".every"));
  }
  if (f["duration"]) {
    TESSERA_SCN_ASSIGN(s.duration, Dur(f["duration"], where + ".duration"));
  }
  if (f["type"]) {
    s.event_type = f["type"].as<std::string>();
    if (s.event_type != "" && s.event_type != "ADDED" && s.event_type != "MODIFIED" &&
        s.event_type != "DELETED") {
      return Bad(where + ".type", "want ADDED, MODIFIED, DELETED or \"\"");
    }
  }
  if (f["probability"]) {
    s.probability = f["probability"].as<double>();
  }
  if (s.probability < 0 || s.probability > 1) {
    return Bad(where + ".probability", "want a number in [0, 1]");
  }
  if (f["code"]) {
    s.code = f["code"].as<int>();
  }
  if (s.code != 429 && (s.code < 500 || s.code > 599)) {
    return Bad(where + ".code", "want 429 or a 5xx code");
  }
  if (f["count"]) {
    s.count = f["count"].as<int>();
  }
  if (f["delete_burst"]) {
    s.delete_burst = f["delete_burst"].as<int>();
  }
  s.compact = true;
  if (f["compact"]) {
    s.compact = f["compact"].as<bool>();
  }
  s.force = false;
  if (f["force"]) {
    s.force = f["force"].as<bool>();
  }
  return s;
}

// A string value: a YAML scalar (a list or a map is an error, not its text).
absl::StatusOr<std::string> Text(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) {
    return Bad(key, "want a string");
  }
  return n.as<std::string>();
}

absl::StatusOr<Comparison> ParseComparison(const YAML::Node& c, const std::string& primary_args) {
  if (!c.IsMap()) {
    return Bad("compare", "want a map with scheduler_args (and label, primary_label)");
  }
  absl::Status keys = CheckKeys(c, "compare", {"scheduler_args", "label", "primary_label"});
  if (!keys.ok()) {
    return keys;
  }
  Comparison out;
  if (!c["scheduler_args"]) {
    return Bad("compare.scheduler_args", "missing (the serve flags of the comparison run)");
  }
  TESSERA_SCN_ASSIGN(out.scheduler_args, Text(c["scheduler_args"], "compare.scheduler_args"));
  out.scheduler_args = NormalizeSchedulerArgs(out.scheduler_args);
  if (!out.scheduler_args.empty() && out.scheduler_args.front() != '-') {
    return Bad("compare.scheduler_args",
               fmt::format("want flags of tessera serve such as --resync-period=0, got \"{}\"",
                           out.scheduler_args));
  }
  if (out.scheduler_args == NormalizeSchedulerArgs(primary_args)) {
    return Bad("compare.scheduler_args",
               "the same as scheduler_args: the comparison would repeat the primary run");
  }
  if (c["label"]) {
    TESSERA_SCN_ASSIGN(out.label, Text(c["label"], "compare.label"));
  }
  if (c["primary_label"]) {
    TESSERA_SCN_ASSIGN(out.primary_label, Text(c["primary_label"], "compare.primary_label"));
  }
  if (out.label.empty() || out.primary_label.empty() || out.label == out.primary_label) {
    return Bad("compare", "label and primary_label must be non-empty and differ");
  }
  return out;
}

absl::StatusOr<std::vector<QuotaNamespace>> ParseNamespaces(const YAML::Node& list) {
  if (!list.IsSequence()) {
    return Bad("namespaces", "want a list of {name, gpumem, gpucores}");
  }
  std::vector<QuotaNamespace> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("namespaces[{}]", i);
    absl::Status keys = CheckKeys(list[i], where, {"name", "gpumem", "gpucores"});
    if (!keys.ok()) {
      return keys;
    }
    QuotaNamespace ns;
    if (!list[i]["name"]) {
      return Bad(where + ".name", "missing");
    }
    TESSERA_SCN_ASSIGN(ns.name, Text(list[i]["name"], where + ".name"));
    if (ns.name.empty() || ns.name.size() > 63 ||
        !std::all_of(ns.name.begin(), ns.name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
        })) {
      return Bad(where + ".name", "want a DNS label (lower-case letters, digits, '-')");
    }
    for (const auto& [key, slot] : {std::pair{"gpumem", &ns.gpumem}, {"gpucores", &ns.gpucores}}) {
      if (list[i][key]) {
        *slot = list[i][key].as<int64_t>();
        if (**slot < 0) {
          return Bad(where + "." + key, "want a non-negative limit");
        }
      }
    }
    for (const QuotaNamespace& other : out) {
      if (other.name == ns.name) {
        return Bad(where + ".name", "listed twice");
      }
    }
    out.push_back(std::move(ns));
  }
  return out;
}

// Every name a model of the geometry tables, none twice, at least one.
absl::Status CheckMigModels(const std::vector<std::string>& models) {
  std::string known;
  for (const device::MigGpuModel& m : device::MigGpuModels()) {
    known += fmt::format("{}{}", known.empty() ? "" : ", ", m.model);
  }
  if (models.empty()) {
    return Bad("cluster.mig_models", fmt::format("want at least one of {}", known));
  }
  for (size_t i = 0; i < models.size(); ++i) {
    const bool found =
        std::any_of(device::MigGpuModels().begin(), device::MigGpuModels().end(),
                    [&](const device::MigGpuModel& m) { return m.model == models[i]; });
    if (!found) {
      return Bad("cluster.mig_models",
                 fmt::format("unknown model \"{}\" (known: {})", models[i], known));
    }
    if (std::find(models.begin(), models.begin() + static_cast<std::ptrdiff_t>(i), models[i]) !=
        models.begin() + static_cast<std::ptrdiff_t>(i)) {
      return Bad("cluster.mig_models", fmt::format("\"{}\" listed twice", models[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Scenario::NamespaceOf(std::string_view pod) const {
  if (namespaces.empty()) {
    return "default";
  }
  uint64_t n = 0;
  for (char c : pod) {
    if (c >= '0' && c <= '9') {
      n = n * 10 + static_cast<uint64_t>(c - '0');
    }
  }
  return namespaces[n % namespaces.size()].name;
}

bool Scenario::IsDelimitedNode(int index) const {
  return std::floor((index + 1) * delimited_share) > std::floor(index * delimited_share);
}

std::vector<bool> Scenario::MigNodes() const {
  std::vector<bool> out(static_cast<size_t>(std::max(nodes, 0)), false);
  std::vector<int> json_nodes;
  for (int i = 0; i < nodes; ++i) {
    if (!IsDelimitedNode(i)) {
      json_nodes.push_back(i);
    }
  }
  const int64_t want =
      std::min<int64_t>(std::llround(nodes * mig_share), static_cast<int64_t>(json_nodes.size()));
  for (int64_t j = 0; j < want; ++j) {
    out[static_cast<size_t>(
        json_nodes[static_cast<size_t>(j * static_cast<int64_t>(json_nodes.size()) / want)])] =
        true;
  }
  return out;
}

std::string_view FaultKindName(FaultKind k) { return kKindNames[static_cast<int>(k)]; }

std::string NormalizeSchedulerArgs(const std::string& args) {
  std::string out;
  for (absl::string_view piece : absl::StrSplit(args, ' ', absl::SkipEmpty())) {
    absl::StrAppend(&out, out.empty() ? "" : " ", piece);
  }
  return out;
}

absl::StatusOr<Scenario> ParseScenario(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("scenario: bad YAML: {}", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("scenario: want a YAML map");
  }
  Scenario s;
  try {
    absl::Status keys =
        CheckKeys(root, "",
                  {"name", "description", "seed", "duration", "drain", "convergence_window",
                   "scheduler_args", "compare", "cluster", "workload", "faults", "namespaces"});
    if (!keys.ok()) {
      return keys;
    }
    if (root["name"]) {
      s.name = root["name"].as<std::string>();
    }
    if (root["description"]) {
      s.description = root["description"].as<std::string>();
    }
    if (root["seed"]) {
      s.seed = root["seed"].as<uint64_t>();
    }
    if (root["duration"]) {
      TESSERA_SCN_ASSIGN(s.duration, Dur(root["duration"], "duration"));
    }
    if (root["drain"]) {
      TESSERA_SCN_ASSIGN(s.drain, Dur(root["drain"], "drain"));
    }
    if (root["convergence_window"]) {
      TESSERA_SCN_ASSIGN(s.window, Dur(root["convergence_window"], "convergence_window"));
    }
    if (root["scheduler_args"]) {
      TESSERA_SCN_ASSIGN(s.scheduler_args, Text(root["scheduler_args"], "scheduler_args"));
    }
    if (root["compare"]) {
      TESSERA_SCN_ASSIGN(s.compare, ParseComparison(root["compare"], s.scheduler_args));
    }
    if (const YAML::Node c = root["cluster"]; c) {
      keys = CheckKeys(c, "cluster",
                       {"nodes", "gpus_per_node", "slots", "delimited_share", "gpu_types",
                        "devmem_mib", "mig_share", "mig_models"});
      if (!keys.ok()) {
        return keys;
      }
      if (c["nodes"]) {
        s.nodes = c["nodes"].as<int>();
      }
      if (c["gpus_per_node"]) {
        s.gpus_per_node = c["gpus_per_node"].as<int>();
      }
      if (c["slots"]) {
        s.slots = c["slots"].as<int>();
      }
      if (c["delimited_share"]) {
        s.delimited_share = c["delimited_share"].as<double>();
      }
      if (c["gpu_types"]) {
        s.gpu_types = c["gpu_types"].as<std::vector<std::string>>();
      }
      if (c["devmem_mib"]) {
        s.devmem_mib = c["devmem_mib"].as<std::vector<int>>();
      }
      if (c["mig_share"]) {
        s.mig_share = c["mig_share"].as<double>();
      }
      if (const YAML::Node m = c["mig_models"]; m) {
        if (!m.IsSequence()) {
          return Bad("cluster.mig_models", "want a list of GPU models such as [A100-40GB]");
        }
        s.mig_models = m.as<std::vector<std::string>>();
      }
    }
    if (const YAML::Node w = root["workload"]; w) {
      keys = CheckKeys(w, "workload",
                       {"create_rate", "pods", "delete_rate", "lifetime", "full_nodes_share",
                        "shapes", "priorities"});
      if (!keys.ok()) {
        return keys;
      }
      if (w["create_rate"]) {
        s.create_rate = w["create_rate"].as<double>();
      }
      if (w["pods"]) {
        s.max_pods = w["pods"].as<int>();
      }
      if (w["delete_rate"]) {
        s.delete_rate = w["delete_rate"].as<double>();
      }
      if (w["full_nodes_share"]) {
        s.full_nodes_share = w["full_nodes_share"].as<double>();
      }
      if (const YAML::Node l = w["lifetime"]; l) {
        if (!l.IsSequence() || l.size() != 2) {
          return Bad("workload.lifetime", "want [min, max]");
        }
        TESSERA_SCN_ASSIGN(s.lifetime_min, Dur(l[0], "workload.lifetime"));
        TESSERA_SCN_ASSIGN(s.lifetime_max, Dur(l[1], "workload.lifetime"));
      }
      if (const YAML::Node sh = w["shapes"]; sh) {
        if (!sh.IsMap()) {
          return Bad("workload.shapes", "want a map of shape: weight");
        }
        s.shapes.clear();
        for (auto it = sh.begin(); it != sh.end(); ++it) {
          const std::string name = it->first.as<std::string>();
          std::optional<Shape> shape = ParseShape(name);
          if (!shape.has_value()) {
            return Bad("workload.shapes." + name, "unknown shape");
          }
          s.shapes[*shape] = it->second.as<double>();
        }
      }
      if (const YAML::Node pr = w["priorities"]; pr) {
        if (!pr.IsMap() || pr.size() == 0) {
          return Bad("workload.priorities", "want a map of priority: weight");
        }
        for (auto it = pr.begin(); it != pr.end(); ++it) {
          const int64_t value = it->first.as<int64_t>();
          const std::string where = fmt::format("workload.priorities.{}", value);
          // A user-defined PriorityClass takes at most one billion; the class name wants no sign.
          if (value < 0 || value > 1000000000) {
            return Bad(where, "want a priority in [0, 1000000000]");
          }
          const double weight = it->second.as<double>();
          if (!(weight > 0)) {
            return Bad(where, "want a positive weight");
          }
          s.priorities[static_cast<int32_t>(value)] = weight;
        }
      }
    }
    if (const YAML::Node f = root["faults"]; f) {
      if (!f.IsSequence()) {
        return Bad("faults", "want a list");
      }
      for (size_t i = 0; i < f.size(); ++i) {
        absl::StatusOr<FaultSpec> spec = ParseFault(f[i], i);
        if (!spec.ok()) {
          return spec.status();
        }
        s.faults.push_back(*spec);
      }
    }
    if (const YAML::Node n = root["namespaces"]; n) {
      TESSERA_SCN_ASSIGN(s.namespaces, ParseNamespaces(n));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("scenario: {}", e.what()));
  }
  if (s.nodes <= 0 || s.gpus_per_node <= 0 || s.slots <= 0) {
    return Bad("cluster", "nodes, gpus_per_node and slots must be positive");
  }
  if (s.gpu_types.empty() || s.gpu_types.size() != s.devmem_mib.size()) {
    return Bad("cluster.gpu_types", "want as many gpu_types as devmem_mib, at least one");
  }
  if (!(s.delimited_share >= 0 && s.delimited_share <= 1)) {
    return Bad("cluster.delimited_share", "want a share in [0, 1]");
  }
  if (!(s.mig_share >= 0 && s.mig_share <= 1)) {
    return Bad("cluster.mig_share", "want a share of the nodes in [0, 1]");
  }
  if (absl::Status m = CheckMigModels(s.mig_models); !m.ok()) {
    return m;
  }
  if (s.nodes > 0) {
    int json_nodes = 0;
    for (int i = 0; i < s.nodes; ++i) {
      json_nodes += s.IsDelimitedNode(i) ? 0 : 1;
    }
    if (std::llround(s.nodes * s.mig_share) > json_nodes) {
      return Bad(
          "cluster.mig_share",
          fmt::format("{} of {} nodes wanted in mig mode, but with delimited_share {} only "
                      "{} run the JSON (v2.10) plugin that MIG needs",
                      std::llround(s.nodes * s.mig_share), s.nodes, s.delimited_share, json_nodes));
    }
  }
  if (s.create_rate <= 0 || s.max_pods < 0 || s.delete_rate < 0) {
    return Bad("workload", "create_rate must be positive, pods and delete_rate non-negative");
  }
  if (s.lifetime_max < s.lifetime_min) {
    return Bad("workload.lifetime", "max below min");
  }
  return s;
}

const std::map<std::string, std::string>& EmbeddedScenarios() {
  static const auto* const kMap = new std::map<std::string, std::string>(EmbeddedScenarioTexts());
  return *kMap;
}

absl::StatusOr<Scenario> LoadScenario(const std::string& name_or_path) {
  auto it = EmbeddedScenarios().find(name_or_path);
  std::string text;
  if (it != EmbeddedScenarios().end()) {
    text = it->second;
  } else {
    std::ifstream in(name_or_path);
    if (!in) {
      std::string names;
      for (const auto& [n, t] : EmbeddedScenarios()) {
        names += (names.empty() ? "" : ", ") + n;
      }
      return absl::NotFoundError(
          fmt::format("scenario \"{}\" is neither a built-in scenario ({}) nor a readable file",
                      name_or_path, names));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  absl::StatusOr<Scenario> s = ParseScenario(text);
  if (s.ok() && s->name.empty()) {
    s->name = name_or_path;
  }
  return s;
}

}  // namespace tessera::sim

#include "tessera/explain/top.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "fmt/args.h"
#include "fmt/format.h"

#include "tessera/base/status_macros.h"

namespace tessera::explain {
namespace {

using nlohmann::json;

// Strict reads of the document: every error names the field's path.
class Reader {
 public:
  Reader(const json& value, std::string path) : value_(value), path_(std::move(path)) {}

  absl::StatusOr<Reader> Member(std::string_view key, json::value_t want) const {
    auto it = value_.find(key);
    const std::string path = path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
    if (it == value_.end()) {
      return absl::InvalidArgumentError(fmt::format("{}: missing", path));
    }
    const bool ok = want == json::value_t::number_integer
                        ? it->is_number_integer()
                        : (want == json::value_t::string    ? it->is_string()
                           : want == json::value_t::boolean ? it->is_boolean()
                           : want == json::value_t::array   ? it->is_array()
                                                            : it->is_object());
    if (!ok) {
      return absl::InvalidArgumentError(fmt::format("{}: expected {}", path, Name(want)));
    }
    return Reader(*it, path);
  }
  absl::StatusOr<std::string> String(std::string_view key) const {
    absl::StatusOr<Reader> r = Member(key, json::value_t::string);
    if (!r.ok()) {
      return r.status();
    }
    return r->value_.get<std::string>();
  }
  absl::StatusOr<int64_t> Int(std::string_view key) const {
    absl::StatusOr<Reader> r = Member(key, json::value_t::number_integer);
    if (!r.ok()) {
      return r.status();
    }
    return r->value_.get<int64_t>();
  }
  absl::StatusOr<bool> Bool(std::string_view key) const {
    absl::StatusOr<Reader> r = Member(key, json::value_t::boolean);
    if (!r.ok()) {
      return r.status();
    }
    return r->value_.get<bool>();
  }
  // The elements of an array member, each with its path.
  absl::StatusOr<std::vector<Reader>> Elements(std::string_view key, json::value_t want) const {
    absl::StatusOr<Reader> r = Member(key, json::value_t::array);
    if (!r.ok()) {
      return r.status();
    }
    std::vector<Reader> out;
    for (size_t i = 0; i < r->value_.size(); ++i) {
      const std::string path = fmt::format("{}[{}]", r->path_, i);
      if (r->value_[i].type() != want) {
        return absl::InvalidArgumentError(fmt::format("{}: expected {}", path, Name(want)));
      }
      out.emplace_back(r->value_[i], path);
    }
    return out;
  }
  bool Has(std::string_view key) const { return value_.contains(key); }

 private:
  static std::string_view Name(json::value_t t) {
    switch (t) {
      case json::value_t::number_integer:
        return "an integer";
      case json::value_t::string:
        return "a string";
      case json::value_t::boolean:
        return "a boolean";
      case json::value_t::array:
        return "an array";
      default:
        return "an object";
    }
  }

  const json& value_;
  std::string path_;
};

absl::StatusOr<TopPod> DecodePod(const Reader& r) {
  TopPod p;
  TESSERA_ASSIGN_OR_RETURN(p.ns, r.String("namespace"));
  TESSERA_ASSIGN_OR_RETURN(p.name, r.String("name"));
  TESSERA_ASSIGN_OR_RETURN(p.uid, r.String("uid"));
  TESSERA_ASSIGN_OR_RETURN(p.container, r.Int("container"));
  TESSERA_ASSIGN_OR_RETURN(p.init, r.Bool("init"));
  TESSERA_ASSIGN_OR_RETURN(p.usedmem, r.Int("usedmem_mib"));
  TESSERA_ASSIGN_OR_RETURN(p.usedcores, r.Int("usedcores"));
  TESSERA_ASSIGN_OR_RETURN(p.reserved, r.Bool("reserved"));
  return p;
}

absl::StatusOr<TopDevice> DecodeDevice(const Reader& r) {
  TopDevice d;
  TESSERA_ASSIGN_OR_RETURN(d.uuid, r.String("uuid"));
  TESSERA_ASSIGN_OR_RETURN(d.index, r.Int("index"));
  TESSERA_ASSIGN_OR_RETURN(d.type, r.String("type"));
  TESSERA_ASSIGN_OR_RETURN(d.health, r.Bool("health"));
  TESSERA_ASSIGN_OR_RETURN(d.cordoned, r.Bool("cordoned"));
  TESSERA_ASSIGN_OR_RETURN(d.count, r.Int("count"));
  TESSERA_ASSIGN_OR_RETURN(d.devmem, r.Int("devmem_mib"));
  TESSERA_ASSIGN_OR_RETURN(d.devcore, r.Int("devcore"));
  TESSERA_ASSIGN_OR_RETURN(d.used, r.Int("used"));
  TESSERA_ASSIGN_OR_RETURN(d.usedmem, r.Int("usedmem_mib"));
  TESSERA_ASSIGN_OR_RETURN(d.usedcores, r.Int("usedcores"));
  TESSERA_ASSIGN_OR_RETURN(std::vector<Reader> pods, r.Elements("pods", json::value_t::object));
  for (const Reader& p : pods) {
    TESSERA_ASSIGN_OR_RETURN(TopPod pod, DecodePod(p));
    d.pods.push_back(std::move(pod));
  }
  return d;
}

absl::StatusOr<TopNode> DecodeNode(const Reader& r) {
  TopNode n;
  TESSERA_ASSIGN_OR_RETURN(n.name, r.String("name"));
  if (r.Has("availability")) {
    TESSERA_ASSIGN_OR_RETURN(n.availability, r.String("availability"));
    TESSERA_ASSIGN_OR_RETURN(n.detail, r.String("detail"));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<Reader> devices,
                           r.Elements("devices", json::value_t::object));
  for (const Reader& d : devices) {
    TESSERA_ASSIGN_OR_RETURN(TopDevice device, DecodeDevice(d));
    n.devices.push_back(std::move(device));
  }
  return n;
}

// One line per problem of ProblemsJson's four kinds: each kind's string fields, in order, fill
// its sentence.
absl::Status DecodeProblems(const Reader& r, std::vector<std::string>* out) {
  struct Kind {
    std::string_view key;
    std::vector<std::string_view> fields;  // fmt arguments, in order
    std::string_view sentence;
  };
  static const auto* const kKinds = new std::vector<Kind>{
      {"conflicts",
       {"namespace", "name", "bound_node", "annotated_node"},
       "conflict: {}/{} is bound to {} but its allocation names {}"},
      {"orphans",
       {"namespace", "name", "uuid", "node"},
       "orphan: {}/{} holds {}, which {} does not register"},
      {"unregistered",
       {"namespace", "name", "node"},
       "unregistered: {}/{} holds devices of {}, which has no device registration"},
      {"unreadable",
       {"namespace", "name", "node"},
       "unreadable: {}/{} on {} has an allocation that does not decode (its node is blocked)"},
  };
  for (const Kind& kind : *kKinds) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<Reader> items,
                             r.Elements(kind.key, json::value_t::object));
    for (const Reader& item : items) {
      fmt::dynamic_format_arg_store<fmt::format_context> args;
      for (std::string_view field : kind.fields) {
        TESSERA_ASSIGN_OR_RETURN(std::string value, item.String(field));
        args.push_back(value);  // the store keeps its own copy
      }
      out->push_back(fmt::vformat(kind.sentence, args));
    }
  }
  return absl::OkStatus();
}

std::string Left(absl::Duration d) {
  if (d <= absl::ZeroDuration()) {
    return "expired";
  }
  const int64_t s = absl::ToInt64Seconds(d);
  return s >= 60 ? fmt::format("expires in {}m{:02}s", s / 60, s % 60)
                 : fmt::format("expires in {}s", s);
}

}  // namespace

int64_t TopNode::FreeMem() const {
  int64_t free = 0;
  for (const TopDevice& d : devices) {
    if (d.health && !d.cordoned) {
      free += d.FreeMem();
    }
  }
  return free;
}

absl::StatusOr<TopView> DecodeTop(std::string_view ledger_json) {
  const json doc = json::parse(ledger_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("not a /debug/ledger document: expected a JSON object");
  }
  const Reader root(doc, "");
  TopView view;
  TESSERA_ASSIGN_OR_RETURN(view.synced, root.Bool("synced"));
  TESSERA_ASSIGN_OR_RETURN(Reader leadership, root.Member("leadership", json::value_t::object));
  TESSERA_ASSIGN_OR_RETURN(view.role, leadership.String("role"));
  TESSERA_ASSIGN_OR_RETURN(std::vector<Reader> nodes,
                           root.Elements("nodes", json::value_t::object));
  for (const Reader& n : nodes) {
    TESSERA_ASSIGN_OR_RETURN(TopNode node, DecodeNode(n));
    view.nodes.push_back(std::move(node));
  }
  // Reservation expiries, joined to the pods by uid.
  std::map<std::string, absl::Time> expiry;
  TESSERA_ASSIGN_OR_RETURN(std::vector<Reader> reservations,
                           root.Elements("reservations", json::value_t::object));
  for (const Reader& r : reservations) {
    std::string uid, at;
    TESSERA_ASSIGN_OR_RETURN(uid, r.String("uid"));
    TESSERA_ASSIGN_OR_RETURN(at, r.String("expires_at"));
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, at, &t, &err)) {
      return absl::InvalidArgumentError(
          fmt::format("reservations: expires_at {}: not an RFC 3339 time", json(at).dump()));
    }
    expiry[uid] = t;
  }
  for (TopNode& n : view.nodes) {
    for (TopDevice& d : n.devices) {
      for (TopPod& p : d.pods) {
        if (auto it = expiry.find(p.uid); p.reserved && it != expiry.end()) {
          p.expires_at = it->second;
        }
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(Reader problems, root.Member("problems", json::value_t::object));
  TESSERA_RETURN_IF_ERROR(DecodeProblems(problems, &view.problems));
  return view;
}

TopView FilterTop(TopView view, const TopOptions& options) {
  const bool device_filter = !options.ns.empty() || options.min_free > 0;
  std::vector<TopNode> kept;
  for (TopNode& n : view.nodes) {
    if (!options.node.empty() && n.name != options.node) {
      continue;
    }
    std::vector<TopDevice> devices;
    for (TopDevice& d : n.devices) {
      if (d.FreeMem() < options.min_free) {
        continue;
      }
      if (!options.ns.empty()) {
        std::erase_if(d.pods, [&](const TopPod& p) { return p.ns != options.ns; });
        if (d.pods.empty()) {
          continue;
        }
      }
      devices.push_back(std::move(d));
    }
    n.devices = std::move(devices);
    if (device_filter && n.devices.empty()) {
      continue;
    }
    kept.push_back(std::move(n));
  }
  if (options.sort == TopSort::kFree) {
    for (TopNode& n : kept) {
      std::stable_sort(
          n.devices.begin(), n.devices.end(),
          [](const TopDevice& a, const TopDevice& b) { return a.FreeMem() > b.FreeMem(); });
    }
    std::stable_sort(kept.begin(), kept.end(),
                     [](const TopNode& a, const TopNode& b) { return a.FreeMem() > b.FreeMem(); });
  }
  view.nodes = std::move(kept);
  if (!options.ns.empty()) {
    const std::string needle = " " + options.ns + "/";
    std::erase_if(view.problems,
                  [&](const std::string& p) { return p.find(needle) == std::string::npos; });
  }
  return view;
}

std::string RenderTopText(const TopView& view, absl::Time now) {
  // Rows of cells, then columns as wide as their widest cell; a pod's row names it under
  // DEVICE, indented, with its memory under MEMORY and its cores under CORES.
  constexpr size_t kColumns = 8;
  using Row = std::array<std::string, kColumns>;
  std::vector<Row> rows = {
      {"NODE", "DEVICE", "TYPE", "MEMORY MiB", "FREE MiB", "CORES", "SHARES", "STATE"}};
  for (const TopNode& n : view.nodes) {
    std::string node_state;
    if (!n.availability.empty() && n.availability != "available") {
      node_state = n.detail.empty() ? n.availability : n.availability + ": " + n.detail;
    }
    bool first = true;
    for (const TopDevice& d : n.devices) {
      std::string state = !d.health ? "unhealthy" : d.cordoned ? "cordoned" : "";
      if (first && !node_state.empty()) {
        state += state.empty() ? node_state : ", " + node_state;
      }
      rows.push_back({first ? n.name : "", fmt::format("{} ({})", d.uuid, d.index), d.type,
                      fmt::format("{}/{}", d.usedmem, d.devmem), std::to_string(d.FreeMem()),
                      fmt::format("{}/{}", d.usedcores, d.devcore),
                      fmt::format("{}/{}", d.used, d.count), std::move(state)});
      first = false;
      for (const TopPod& p : d.pods) {
        std::string pod_state = "bound";
        if (p.reserved) {
          pod_state = p.expires_at ? "reserved, " + Left(*p.expires_at - now) : "reserved";
        }
        rows.push_back(
            {"", fmt::format("  {}/{} [{}{}]", p.ns, p.name, p.init ? "init " : "", p.container),
             "", std::to_string(p.usedmem), "", std::to_string(p.usedcores), "",
             std::move(pod_state)});
      }
    }
    if (n.devices.empty()) {
      rows.push_back({n.name, "-", "-", "-", "-", "-", "-", node_state});
    }
  }
  std::array<size_t, kColumns> width{};
  for (const Row& r : rows) {
    for (size_t c = 0; c < kColumns; ++c) {
      width[c] = std::max(width[c], r[c].size());
    }
  }
  std::string out;
  if (!view.synced) {
    out += "(serve has not synced with the API server yet: the ledger may be incomplete)\n";
  }
  for (const Row& r : rows) {
    std::string line;
    for (size_t c = 0; c < kColumns; ++c) {
      const bool right = c >= 3 && c <= 6;  // the numbers
      line += right ? fmt::format("{:>{}}", r[c], width[c]) : fmt::format("{:<{}}", r[c], width[c]);
      line += c + 1 < kColumns ? "  " : "";
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line + "\n";
  }
  if (!view.problems.empty()) {
    out += "\nPROBLEMS\n";
    for (const std::string& p : view.problems) {
      out += "  " + p + "\n";
    }
  }
  return out;
}

json TopJson(const TopView& view) {
  json nodes = json::array();
  for (const TopNode& n : view.nodes) {
    json devices = json::array();
    for (const TopDevice& d : n.devices) {
      json pods = json::array();
      for (const TopPod& p : d.pods) {
        json pod = {{"namespace", p.ns},
                    {"name", p.name},
                    {"uid", p.uid},
                    {"container", p.container},
                    {"init", p.init},
                    {"usedmem_mib", p.usedmem},
                    {"usedcores", p.usedcores},
                    {"state", p.reserved ? "reserved" : "bound"}};
        if (p.expires_at) {
          pod["expires_at"] =
              absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", *p.expires_at, absl::UTCTimeZone());
        }
        pods.push_back(std::move(pod));
      }
      devices.push_back({{"uuid", d.uuid},
                         {"index", d.index},
                         {"type", d.type},
                         {"health", d.health},
                         {"cordoned", d.cordoned},
                         {"devmem_mib", d.devmem},
                         {"usedmem_mib", d.usedmem},
                         {"freemem_mib", d.FreeMem()},
                         {"devcore", d.devcore},
                         {"usedcores", d.usedcores},
                         {"count", d.count},
                         {"used", d.used},
                         {"pods", std::move(pods)}});
    }
    nodes.push_back({{"name", n.name},
                     {"availability", n.availability},
                     {"detail", n.detail},
                     {"freemem_mib", n.FreeMem()},
                     {"devices", std::move(devices)}});
  }
  return {{"synced", view.synced},
          {"role", view.role},
          {"nodes", std::move(nodes)},
          {"problems", view.problems}};
}

}  // namespace tessera::explain

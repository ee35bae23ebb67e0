// The extender wire codec.
//
// Decoding uses simdjson On-Demand rather than nlohmann because the request carries whole Pod
// and Node objects whose exact text must be kept (raw_pod, WireNode::raw) and then decoded by
// kube::DecodePod / kube::DecodeNode: On-Demand hands out each object's span of the input
// (raw_json()) without building a DOM, whereas nlohmann would build a DOM of every node only to
// re-serialise it (and not byte for byte). A Nodes request of 500 full nodes is ~2.5 MB, where
// nlohmann costs tens of milliseconds. Every simdjson access is checked and the first error ends
// the decode (continuing after an On-Demand error is undefined behaviour: docs/architecture.md
// "Conventions").
//
// Encoding is a small hand-written writer: the replies are flat, and Go's escaping rules must be
// followed exactly (json::AppendGoString; nlohmann escapes differently: it does not escape <, >,
// & or U+2028).
#include "tessera/extender/wire.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "fmt/format.h"
#include "simdjson.h"

#include "tessera/json/frame_splitter.h"
#include "tessera/json/text.h"
#include "tessera/kube/decode.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {
namespace {

namespace od = simdjson::ondemand;

// Go's encoding/json rule for a key: the field whose name equals it exactly, else the first
// field whose name equals it under case folding; -1 when none does.
int MatchField(std::string_view key, const std::string_view* names, int count) {
  for (int i = 0; i < count; ++i) {
    if (key == names[i]) {
      return i;
    }
  }
  for (int i = 0; i < count; ++i) {
    if (json::KeyEqualsFold(key, names[i])) {
      return i;
    }
  }
  return -1;
}

std::string_view TrimTrailingSpace(std::string_view s) {
  while (!s.empty() && json::IsJsonSpace(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

// A name from the request for an error message: quoted, non-printable bytes escaped, cut after
// 64 bytes.
std::string QuoteName(std::string_view name) {
  return fmt::format("\"{}{}\"", absl::CEscape(std::string(name.substr(0, 64))),
                     name.size() > 64 ? "..." : "");
}

// Requests larger than this release the thread's parser buffers after decoding.
constexpr size_t kRetainBytes = size_t{256} << 10;

// One decode of one request body. Every method returns false on the first error, having set
// error_; nothing is read from simdjson after an error.
class RequestDecoder {
 public:
  explicit RequestDecoder(std::string_view what) : what_(what) {}
  ~RequestDecoder() {
    if (input_.size() > kRetainBytes) {
      Parser() = od::parser();
      Validator() = simdjson::dom::parser();
    }
  }
  RequestDecoder(const RequestDecoder&) = delete;
  RequestDecoder& operator=(const RequestDecoder&) = delete;

  // Parses the first JSON value of `body`, which must be an object, into *object. Trailing data
  // after it is ignored, as Go's json.Decoder does.
  bool Open(std::string_view body, od::object* object) {
    size_t start = 0;
    while (start < body.size() && json::IsJsonSpace(body[start])) {
      ++start;
    }
    if (start == body.size()) {
      return Fail("", "unexpected end of JSON input");
    }
    if (body[start] != '{') {
      return Fail("", "expected a JSON object");
    }
    // Find where the first object ends (string-aware bracket depth), so that whatever follows
    // it never reaches the parser. The splitter keeps frames completed before an error.
    json::FrameSplitter splitter(kMaxRequestBytes * 4 + body.size());
    std::vector<std::string> frames;
    splitter.Feed(body.substr(start), &frames).IgnoreError();
    if (frames.empty()) {
      return Fail("", "unexpected end of JSON input");
    }
    input_ = std::move(frames.front());
    const size_t size = input_.size();
    input_.resize(size + simdjson::SIMDJSON_PADDING, '\0');  // zeroed padding, then the size back
    input_.resize(size);
    // On-Demand does not look inside values it skips, so the object is first checked whole, as
    // Go's json.Decoder checks it: `{"Pod":{"x":tru}}` is an error, not a pod with an unknown
    // field, and a Pod or Node passed back to kube-scheduler verbatim is always valid JSON.
    if (auto e = Validator().parse(input_.data(), size, false).error(); e) {
      return JsonFail("", e);
    }
    if (auto e = Parser().iterate(input_.data(), size, input_.capacity()).get(doc_); e) {
      return JsonFail("", e);
    }
    if (auto e = doc_.get_object().get(*object); e) {
      return JsonFail("", e);
    }
    return true;
  }

  // Iterates the fields of `object`, calling on_field(index, value) for those matching `names`
  // (index into names) and skipping the others.
  template <typename F>
  bool Fields(od::object& object, const std::string_view* names, int count, F&& on_field) {
    for (auto field_result : object) {
      od::field field;
      if (auto e = std::move(field_result).get(field); e) {
        return JsonFail("", e);
      }
      std::string_view key;
      if (auto e = field.unescaped_key().get(key); e) {
        return JsonFail("", e);
      }
      const int index = MatchField(key, names, count);
      if (index < 0) {
        continue;  // unknown keys are ignored; On-Demand skips the value
      }
      if (!on_field(index, field.value())) {
        return false;
      }
    }
    return true;
  }

  bool IsNull(od::value& v, bool* is_null) {
    od::json_type t;
    if (auto e = v.type().get(t); e) {
      return JsonFail("", e);
    }
    *is_null = t == od::json_type::null;
    if (*is_null) {
      bool n = false;
      if (auto e = v.is_null().get(n); e || !n) {
        return e ? JsonFail("", e) : Fail("", "invalid literal");
      }
    }
    return true;
  }

  bool String(std::string_view field, od::value& v, std::string* out) {
    od::json_type t;
    if (auto e = v.type().get(t); e) {
      return JsonFail(field, e);
    }
    if (t == od::json_type::null) {
      bool n = false;
      if (auto e = v.is_null().get(n); e || !n) {
        return e ? JsonFail(field, e) : Fail(field, "invalid literal");
      }
      return true;  // null leaves a Go string unchanged
    }
    if (t != od::json_type::string) {
      return Fail(field, "expected string");
    }
    std::string_view s;
    if (auto e = v.get_string().get(s); e) {
      return JsonFail(field, e);
    }
    out->assign(s.data(), s.size());
    return true;
  }

  // v as an object; anything else fails with "expected object".
  bool Object(std::string_view field, od::value& v, od::object* out) {
    od::json_type t;
    if (auto e = v.type().get(t); e) {
      return JsonFail(field, e);
    }
    if (t != od::json_type::object) {
      return Fail(field, "expected object");
    }
    if (auto e = v.get_object().get(*out); e) {
      return JsonFail(field, e);
    }
    return true;
  }

  // v as an array; anything else fails with `expected`.
  bool Array(std::string_view field, od::value& v, std::string_view expected, od::array* out) {
    od::json_type t;
    if (auto e = v.type().get(t); e) {
      return JsonFail(field, e);
    }
    if (t != od::json_type::array) {
      return Fail(field, expected);
    }
    if (auto e = v.get_array().get(*out); e) {
      return JsonFail(field, e);
    }
    return true;
  }

  // An object's exact text (without trailing whitespace); the value is consumed.
  // The request's "Pod": its raw object, or null (no pod: *have false).
  bool PodValue(od::value& v, std::string* raw, bool* have) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    raw->clear();
    *have = !is_null;
    return is_null || RawObject("Pod", v, raw);
  }

  // The pod of a request whose "Pod" was read by PodValue: kMissingPodMessage when absent, the
  // decoder's error naming "Pod" when it does not decode.
  absl::StatusOr<kube::Pod> RequestPod(bool have, const std::string& raw) {
    if (!have) {
      return absl::InvalidArgumentError(kMissingPodMessage);
    }
    absl::StatusOr<kube::Pod> pod = kube::DecodePod(raw);
    if (!pod.ok()) {
      Fail("Pod", std::string(pod.status().message()));
      return Error();
    }
    return pod;
  }

  bool RawObject(std::string_view field, od::value& v, std::string* raw) {
    od::object object;
    if (!Object(field, v, &object)) {
      return false;
    }
    std::string_view text;
    if (auto e = object.raw_json().get(text); e) {
      return JsonFail(field, e);
    }
    text = TrimTrailingSpace(text);
    raw->assign(text.data(), text.size());
    return true;
  }

  bool StringArray(std::string_view field, od::value& v,
                   std::optional<std::vector<std::string>>* out) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    if (is_null) {
      out->reset();
      return true;
    }
    od::array array;
    if (!Array(field, v, "expected array of strings", &array)) {
      return false;
    }
    std::vector<std::string> names;
    size_t index = 0;
    for (auto element_result : array) {
      od::value element;
      if (auto e = std::move(element_result).get(element); e) {
        return JsonFail(field, e);
      }
      // The element's field name is formatted only on error: this loop runs once per node.
      od::json_type element_type;
      if (auto e = element.type().get(element_type); e) {
        return JsonFail(fmt::format("{}[{}]", field, index), e);
      }
      if (element_type == od::json_type::string) {
        std::string_view name;
        if (auto e = element.get_string().get(name); e) {
          return JsonFail(fmt::format("{}[{}]", field, index), e);
        }
        names.emplace_back(name);
      } else if (std::string name; String(fmt::format("{}[{}]", field, index), element, &name)) {
        names.push_back(std::move(name));  // null: ""
      } else {
        return false;
      }
      ++index;
    }
    *out = std::move(names);
    return true;
  }

  // v1.NodeList: {"metadata":…,"items":[…]}; only items is read.
  bool Nodes(od::value& v, std::optional<std::vector<WireNode>>* out) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    if (is_null) {
      out->reset();
      return true;
    }
    od::object list;
    if (!Object("Nodes", v, &list)) {
      return false;
    }
    static constexpr std::string_view kNames[] = {"items"};
    std::vector<WireNode> nodes;
    bool ok = Fields(list, kNames, 1, [&](int, od::value& items) {
      bool items_null = false;
      if (!IsNull(items, &items_null)) {
        return false;
      }
      nodes.clear();  // a repeated key replaces the list
      if (items_null) {
        return true;
      }
      od::array array;
      if (!Array("Nodes.items", items, "expected array", &array)) {
        return false;
      }
      size_t index = 0;
      for (auto element_result : array) {
        od::value element;
        if (auto e = std::move(element_result).get(element); e) {
          return JsonFail("Nodes.items", e);
        }
        const std::string field = fmt::format("Nodes.items[{}]", index);
        WireNode node;
        if (!RawObject(field, element, &node.raw)) {
          return false;
        }
        absl::StatusOr<kube::Node> decoded = kube::DecodeNode(node.raw);
        if (!decoded.ok()) {
          return Fail(field, std::string(decoded.status().message()));
        }
        node.node = *std::move(decoded);
        nodes.push_back(std::move(node));
        ++index;
      }
      return true;
    });
    if (!ok) {
      return false;
    }
    *out = std::move(nodes);
    return true;
  }

  // NodeNameToVictims (`full`: whole pods) or NodeNameToMetaVictims. null drops the map; an
  // object adds its nodes to the map already decoded, because Go decodes into an existing map
  // (a repeated key merges), while a node repeated within the map replaces its victims.
  bool VictimMap(std::string_view field, od::value& v, bool full,
                 std::optional<std::map<std::string, WireVictims>>* out) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    if (is_null) {
      out->reset();
      return true;
    }
    od::object object;
    if (!Object(field, v, &object)) {
      return false;
    }
    if (!out->has_value()) {
      out->emplace();
    }
    for (auto entry_result : object) {
      od::field entry;
      if (auto e = std::move(entry_result).get(entry); e) {
        return JsonFail(field, e);
      }
      std::string_view key;
      if (auto e = entry.unescaped_key().get(key); e) {
        return JsonFail(field, e);
      }
      std::string node(key);
      if (!kube::IsDnsSubdomain(node)) {
        return Fail(field, fmt::format("node {} is not a valid node name (an RFC 1123 subdomain)",
                                       QuoteName(node)));
      }
      WireVictims victims;
      od::value value = entry.value();
      if (!Victims(field, node, value, full, &victims)) {
        return false;
      }
      (**out)[std::move(node)] = std::move(victims);
    }
    return true;
  }

  // One node's Victims / MetaVictims; null is a node without victims.
  bool Victims(std::string_view field, const std::string& node, od::value& v, bool full,
               WireVictims* out) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    if (is_null) {
      return true;
    }
    od::object object;
    if (!Object(fmt::format("{}[\"{}\"]", field, node), v, &object)) {
      return false;
    }
    static constexpr std::string_view kNames[] = {"Pods", "NumPDBViolations"};
    return Fields(object, kNames, 2, [&](int index, od::value& value) {
      if (index == 1) {
        return NonNegativeInt64(
            [&] { return fmt::format("{}[\"{}\"].NumPDBViolations", field, node); }, value,
            &out->num_pdb_violations);
      }
      return VictimPods(field, node, value, full, &out->pod_uids);
    });
  }

  // Victims.Pods ([]*v1.Pod, each to its metadata.uid) or MetaVictims.Pods ([]*MetaPod). null
  // is no victims; a repeated key replaces the list. Every victim must have a uid.
  bool VictimPods(std::string_view field, const std::string& node, od::value& v, bool full,
                  std::vector<std::string>* out) {
    bool is_null = false;
    if (!IsNull(v, &is_null)) {
      return false;
    }
    out->clear();
    if (is_null) {
      return true;
    }
    od::array array;
    if (!Array(fmt::format("{}[\"{}\"].Pods", field, node), v, "expected array", &array)) {
      return false;
    }
    size_t index = 0;
    for (auto element_result : array) {
      // The element's field name is formatted only on error.
      auto where = [&] { return fmt::format("{}[\"{}\"].Pods[{}]", field, node, index); };
      od::value element;
      if (auto e = std::move(element_result).get(element); e) {
        return JsonFail(where(), e);
      }
      if (!IsNull(element, &is_null)) {
        return false;
      }
      if (is_null) {
        return Fail(where(), "victim is null (no uid)");
      }
      std::string uid;
      if (full) {
        std::string raw;
        if (!RawObject(where(), element, &raw)) {
          return false;
        }
        absl::StatusOr<kube::Pod> pod = kube::DecodePod(raw);
        if (!pod.ok()) {
          return Fail(where(), std::string(pod.status().message()));
        }
        uid = std::move(pod->meta.uid);
      } else {
        od::object meta_pod;
        if (!Object(where(), element, &meta_pod)) {
          return false;
        }
        static constexpr std::string_view kNames[] = {"UID"};
        if (!Fields(meta_pod, kNames, 1,
                    [&](int, od::value& u) { return String(where() + ".UID", u, &uid); })) {
          return false;
        }
      }
      if (uid.empty()) {
        return Fail(where(), full ? "victim pod has no metadata.uid" : "victim has no UID");
      }
      out->push_back(std::move(uid));
      ++index;
    }
    return true;
  }

  // An int64 that must not be negative, read as Go reads a JSON number into an int64 (no
  // fraction, no exponent, no overflow); null leaves *out unchanged, as in Go. `field` formats
  // the field's name (called only on error).
  template <typename FieldName>
  bool NonNegativeInt64(FieldName&& field, od::value& v, int64_t* out) {
    od::json_type t;
    if (auto e = v.type().get(t); e) {
      return JsonFail(field(), e);
    }
    if (t == od::json_type::null) {
      bool n = false;
      if (auto e = v.is_null().get(n); e || !n) {
        return e ? JsonFail(field(), e) : Fail(field(), "invalid literal");
      }
      return true;
    }
    if (t != od::json_type::number) {
      return Fail(field(), "expected integer");
    }
    // The literal, for the message; read before get_int64, which consumes the value.
    const std::string_view text = TrimTrailingSpace(v.raw_json_token());
    int64_t n = 0;
    if (auto e = v.get_int64().get(n); e) {
      if (e != simdjson::INCORRECT_TYPE && e != simdjson::NUMBER_OUT_OF_RANGE) {
        return JsonFail(field(), e);
      }
      const bool fraction = text.find_first_of(".eE") != std::string_view::npos;
      return Fail(
          field(),
          fmt::format("{} {}", fraction ? "expected integer, got" : "integer out of int64 range:",
                      text.substr(0, 64)));
    }
    if (n < 0) {
      return Fail(field(), fmt::format("must not be negative, got {}", n));
    }
    *out = n;
    return true;
  }

  absl::Status Error() const { return absl::InvalidArgumentError(error_); }

  bool Fail(std::string_view field, std::string_view problem) {
    error_ = field.empty() ? fmt::format("{}: {}", what_, problem)
                           : fmt::format("{}: {}: {}", what_, field, problem);
    return false;
  }

 private:
  bool JsonFail(std::string_view field, simdjson::error_code e) {
    return Fail(field, fmt::format("invalid JSON ({})", simdjson::error_message(e)));
  }

  std::string_view what_;
  std::string error_;
  // A parser per thread keeps its buffers across requests; one grown by a large request is
  // dropped afterwards (see ~RequestDecoder).
  static od::parser& Parser() {
    thread_local od::parser parser;
    return parser;
  }
  static simdjson::dom::parser& Validator() {
    thread_local simdjson::dom::parser parser;
    return parser;
  }

  std::string input_;
  od::document doc_;
};

// ---- encoding ----------------------------------------------------------------------------------

void AppendStringMap(std::string* out, const std::map<std::string, std::string>& map) {
  out->push_back('{');
  bool first = true;
  for (const auto& [key, value] : map) {  // std::map orders keys bytewise, as Go sorts them
    if (!first) {
      out->push_back(',');
    }
    first = false;
    json::AppendGoString(out, key);
    out->push_back(':');
    json::AppendGoString(out, value);
  }
  out->push_back('}');
}

}  // namespace

std::vector<std::string> FilterArgs::CandidateNames() const {
  if (node_names.has_value()) {
    return *node_names;
  }
  std::vector<std::string> names;
  if (nodes.has_value()) {
    names.reserve(nodes->size());
    for (const WireNode& n : *nodes) {
      names.push_back(n.node.meta.name);
    }
  }
  return names;
}

absl::StatusOr<FilterArgs> DecodeFilterArgs(std::string_view json) {
  auto decoder = std::make_unique<RequestDecoder>("extender args");
  od::object object;
  if (!decoder->Open(json, &object)) {
    return decoder->Error();
  }
  static constexpr std::string_view kNames[] = {"Pod", "Nodes", "NodeNames"};
  FilterArgs args;
  bool have_pod = false;
  RequestDecoder& d = *decoder;
  const bool ok = d.Fields(object, kNames, 3, [&](int index, od::value& v) {
    switch (index) {
      case 0:
        return d.PodValue(v, &args.raw_pod, &have_pod);
      case 1:
        return d.Nodes(v, &args.nodes);
      default:
        return d.StringArray("NodeNames", v, &args.node_names);
    }
  });
  if (!ok) {
    return d.Error();
  }
  absl::StatusOr<kube::Pod> pod = d.RequestPod(have_pod, args.raw_pod);
  if (!pod.ok()) {
    return pod.status();
  }
  args.pod = *std::move(pod);
  return args;
}

absl::StatusOr<BindArgs> DecodeBindArgs(std::string_view json) {
  auto decoder = std::make_unique<RequestDecoder>("extender binding args");
  od::object object;
  if (!decoder->Open(json, &object)) {
    return decoder->Error();
  }
  static constexpr std::string_view kNames[] = {"PodName", "PodNamespace", "PodUID", "Node"};
  BindArgs args;
  std::string* const targets[] = {&args.pod_name, &args.pod_namespace, &args.pod_uid, &args.node};
  RequestDecoder& d = *decoder;
  const bool ok = d.Fields(object, kNames, 4, [&](int index, od::value& v) {
    return d.String(kNames[index], v, targets[index]);
  });
  if (!ok) {
    return d.Error();
  }
  // Checked before anything reaches the API: an empty name would make GET .../pods/{name} a
  // LIST of the collection, and a name with '/' or '%' could address another resource.
  auto refuse = [](std::string_view field, std::string_view value, std::string_view rule) {
    return absl::InvalidArgumentError(
        value.empty() ? fmt::format("extender binding args: {} is required", field)
                      : fmt::format("extender binding args: {} \"{}\" is not a valid {}", field,
                                    absl::CEscape(std::string(value.substr(0, 64))) +
                                        (value.size() > 64 ? "..." : ""),
                                    rule));
  };
  if (!kube::IsDnsSubdomain(args.pod_name)) {
    return refuse("PodName", args.pod_name, "pod name (an RFC 1123 subdomain)");
  }
  if (!kube::IsDnsLabel(args.pod_namespace)) {
    return refuse("PodNamespace", args.pod_namespace, "namespace (an RFC 1123 label)");
  }
  if (!kube::IsDnsSubdomain(args.node)) {
    return refuse("Node", args.node, "node name (an RFC 1123 subdomain)");
  }
  return args;
}

absl::StatusOr<PreemptArgs> DecodePreemptArgs(std::string_view json) {
  auto decoder = std::make_unique<RequestDecoder>("extender preemption args");
  od::object object;
  if (!decoder->Open(json, &object)) {
    return decoder->Error();
  }
  static constexpr std::string_view kNames[] = {"Pod", "NodeNameToVictims",
                                                "NodeNameToMetaVictims"};
  PreemptArgs args;
  bool have_pod = false;
  std::optional<std::map<std::string, WireVictims>> full;
  std::optional<std::map<std::string, WireVictims>> meta;
  RequestDecoder& d = *decoder;
  const bool ok = d.Fields(object, kNames, 3, [&](int index, od::value& v) {
    switch (index) {
      case 0:
        return d.PodValue(v, &args.raw_pod, &have_pod);
      case 1:
        return d.VictimMap(kNames[1], v, /*full=*/true, &full);
      default:
        return d.VictimMap(kNames[2], v, /*full=*/false, &meta);
    }
  });
  if (!ok) {
    return d.Error();
  }
  if (have_pod && full.has_value() && meta.has_value()) {
    d.Fail("", "both NodeNameToVictims and NodeNameToMetaVictims are set; expected one of them");
    return d.Error();
  }
  absl::StatusOr<kube::Pod> pod = d.RequestPod(have_pod, args.raw_pod);
  if (!pod.ok()) {
    return pod.status();
  }
  args.pod = *std::move(pod);
  args.meta = meta.has_value();
  if (meta.has_value()) {
    args.victims = *std::move(meta);
  } else if (full.has_value()) {
    args.victims = *std::move(full);
  }
  return args;
}

std::string EncodeFilterResult(const FilterResult& result) {
  std::string out;
  size_t reserve = 128 + result.error.size();
  for (const auto* map : {&result.failed_nodes, &result.failed_and_unresolvable_nodes}) {
    for (const auto& [key, value] : *map) {
      reserve += key.size() + value.size() + 6;
    }
  }
  if (result.node_names.has_value()) {
    for (const std::string& name : *result.node_names) {
      reserve += name.size() + 3;
    }
  }
  if (result.nodes.has_value()) {
    for (const std::string& raw : *result.nodes) {
      reserve += raw.size() + 1;
    }
  }
  out.reserve(reserve);
  out.append("{\"Nodes\":");
  if (result.nodes.has_value()) {
    out.append("{\"metadata\":{},\"items\":[");
    for (size_t i = 0; i < result.nodes->size(); ++i) {
      if (i > 0) {
        out.push_back(',');
      }
      out.append((*result.nodes)[i]);
    }
    out.append("]}");
  } else {
    out.append("null");
  }
  out.append(",\"NodeNames\":");
  if (result.node_names.has_value()) {
    out.push_back('[');
    for (size_t i = 0; i < result.node_names->size(); ++i) {
      if (i > 0) {
        out.push_back(',');
      }
      json::AppendGoString(&out, (*result.node_names)[i]);
    }
    out.push_back(']');
  } else {
    out.append("null");
  }
  out.append(",\"FailedNodes\":");
  AppendStringMap(&out, result.failed_nodes);
  out.append(",\"FailedAndUnresolvableNodes\":");
  AppendStringMap(&out, result.failed_and_unresolvable_nodes);
  out.append(",\"Error\":");
  json::AppendGoString(&out, result.error);
  out.push_back('}');
  return out;
}

std::string EncodePreemptResult(const PreemptResult& result) {
  std::string out;
  size_t reserve = 32;
  for (const auto& [node, victims] : result.victims) {
    reserve += node.size() + 48;
    for (const std::string& uid : victims.pod_uids) {
      reserve += uid.size() + 12;
    }
  }
  out.reserve(reserve);
  out.append("{\"NodeNameToMetaVictims\":{");
  bool first = true;
  for (const auto& [node, victims] : result.victims) {  // bytewise order, as Go sorts map keys
    if (!first) {
      out.push_back(',');
    }
    first = false;
    json::AppendGoString(&out, node);
    out.append(":{\"Pods\":[");
    for (size_t i = 0; i < victims.pod_uids.size(); ++i) {
      if (i > 0) {
        out.push_back(',');
      }
      out.append("{\"UID\":");
      json::AppendGoString(&out, victims.pod_uids[i]);
      out.push_back('}');
    }
    out.append("],\"NumPDBViolations\":");
    out.append(std::to_string(victims.num_pdb_violations));
    out.push_back('}');
  }
  out.append("}}");
  return out;
}

std::string EncodeBindResult(const BindResult& result) {
  std::string out = "{\"Error\":";
  json::AppendGoString(&out, result.error);
  out.push_back('}');
  return out;
}

}  // namespace tessera::extender

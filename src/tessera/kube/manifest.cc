#include "tessera/kube/manifest.h"

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

#include "tessera/base/status_macros.h"
#include "tessera/json/frame_splitter.h"
#include "tessera/json/text.h"
#include "tessera/kube/decode.h"

namespace tessera::kube {
namespace {

using Json = nlohmann::json;

// Keys whose values are string maps in the Kubernetes schema.
bool IsStringMapKey(std::string_view key) {
  return key == "labels" || key == "annotations" || key == "nodeSelector" || key == "limits" ||
         key == "requests" || key == "allocatable" || key == "capacity";
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
bool IsJsonNumber(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && IsDigit(s[i])) {
      ++i;
    }
    return i > start;
  };
  if (i < s.size() && s[i] == '-') {
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) {
      return false;
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
      ++i;
    }
    if (!digits()) {
      return false;
    }
  }
  return i == s.size();
}

Json PlainScalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
    return nullptr;
  }
  if (s == "true" || s == "True" || s == "TRUE") {
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    return false;
  }
  if (IsJsonNumber(s)) {
    Json n = Json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (!n.is_discarded()) {
      return n;
    }
  }
  return s;
}

Json ScalarToJson(const std::string& tag, const std::string& value, bool as_string) {
  if (as_string || tag == "!" || tag == "tag:yaml.org,2002:str") {
    return value;
  }
  if (tag == "?" || tag.empty() || tag == "tag:yaml.org,2002:int" ||
      tag == "tag:yaml.org,2002:float" || tag == "tag:yaml.org,2002:bool" ||
      tag == "tag:yaml.org,2002:null") {
    return PlainScalar(value);
  }
  return value;  // an application tag: keep the text
}

// JSON values built from one input, counting each expansion of an alias, may exceed the input's
// length (a bound on the values it spells out) by this much, so that nested aliases ("billion
// laughs") cannot blow up memory.
constexpr size_t kMaxAliasValues = size_t{1} << 18;

// Builds one JSON value per YAML document from yaml-cpp's parse events. Using the event API
// (rather than YAML::LoadAll) lets the loader see where each document starts: yaml-cpp 0.7
// loops forever emitting empty documents on some malformed inputs (e.g. `"",`), which is
// detected as a document that starts where the previous one did.
//
// `string_values` of a frame is set for a string map (labels, limits, ...) and makes its scalar
// values strings.
class JsonBuilder : public YAML::EventHandler {
 public:
  explicit JsonBuilder(size_t max_values) : max_values_(max_values) {}

  void OnDocumentStart(const YAML::Mark& mark) override {
    start_ = mark;
    stack_.clear();
    anchors_.clear();
    root_ = nullptr;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Add(mark, nullptr, anchor, 1);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) {
      Fail(mark, "unknown alias");
      return;
    }
    Add(mark, it->second.first, 0, it->second.second);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (!stack_.empty() && stack_.back().is_map && !stack_.back().have_key) {
      Add(mark, value, anchor, 1);  // a mapping key: its text
      return;
    }
    Add(mark, ScalarToJson(tag, value, InStringMap()), anchor, 1);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(mark, Json::array(), false, anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(mark, Json::object(), true, anchor);
  }
  void OnMapEnd() override { Close(); }

  const YAML::Mark& start() const { return start_; }
  const absl::Status& error() const { return error_; }
  Json TakeRoot() { return std::move(root_); }

 private:
  struct Frame {
    Json value;
    bool is_map = false;
    bool have_key = false;
    bool string_values = false;
    std::string key;
    YAML::anchor_t anchor = 0;
    size_t values = 1;  // JSON values in this subtree
    YAML::Mark mark;
  };

  bool InStringMap() const { return !stack_.empty() && stack_.back().string_values; }

  void Fail(const YAML::Mark& mark, const std::string& what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          fmt::format("line {}, column {}: {}", mark.line + 1, mark.column + 1, what));
    }
  }

  void Open(const YAML::Mark& mark, Json value, bool is_map, YAML::anchor_t anchor) {
    Frame frame;
    frame.value = std::move(value);
    frame.is_map = is_map;
    frame.anchor = anchor;
    frame.mark = mark;
    if (!stack_.empty()) {
      const Frame& parent = stack_.back();
      frame.string_values = parent.string_values || (parent.is_map && IsStringMapKey(parent.key));
    }
    stack_.push_back(std::move(frame));
  }

  void Close() {
    if (stack_.empty()) {
      return;
    }
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    Add(frame.mark, std::move(frame.value), frame.anchor, frame.values);
  }

  void Add(const YAML::Mark& mark, Json value, YAML::anchor_t anchor, size_t values) {
    if (!error_.ok()) {
      return;
    }
    total_values_ += values;
    if (total_values_ > max_values_) {
      Fail(mark, "document expands to too many values (aliases?)");
      return;
    }
    if (anchor != 0) {
      anchors_[anchor] = {value, values};
    }
    if (stack_.empty()) {
      root_ = std::move(value);
      return;
    }
    Frame& top = stack_.back();
    top.values += values;
    if (!top.is_map) {
      top.value.push_back(std::move(value));
      return;
    }
    if (!top.have_key) {
      if (!value.is_string()) {
        Fail(mark, "mapping key is not a string");
        return;
      }
      top.key = value.get<std::string>();
      top.have_key = true;
      return;
    }
    top.value[top.key] = std::move(value);
    top.have_key = false;
  }

  YAML::Mark start_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, std::pair<Json, size_t>> anchors_;
  Json root_;
  const size_t max_values_;
  size_t total_values_ = 0;
  absl::Status error_;
};

std::string StringField(const Json& object, const char* key) {
  if (!object.is_object()) {
    return {};
  }
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return {};
  }
  return it->get<std::string>();
}

// "Pod default/x", "Node gpu-1", "Service" when unnamed.
std::string Describe(const std::string& kind, const Json& object) {
  std::string label = kind;
  auto meta = object.find("metadata");
  if (meta != object.end()) {
    std::string name = StringField(*meta, "name");
    std::string ns = StringField(*meta, "namespace");
    if (!name.empty()) {
      label += ' ';
      label += ns.empty() ? name : ns + "/" + name;
    }
  }
  return label;
}

class Loader {
 public:
  explicit Loader(std::string_view source) : source_(source) {}

  // One top-level document (1-based index).
  absl::Status AddDocument(const Json& doc, size_t index) {
    const std::string where = fmt::format("{}: document {}", source_, index);
    if (doc.is_null()) {
      return absl::OkStatus();  // an empty YAML document
    }
    if (!doc.is_object()) {
      return absl::InvalidArgumentError(where + ": expected an object");
    }
    const std::string kind = StringField(doc, "kind");
    if (kind == "List" || kind == "PodList" || kind == "NodeList" || kind == "ResourceQuotaList") {
      auto items = doc.find("items");
      if (items == doc.end() || items->is_null()) {
        return absl::OkStatus();
      }
      if (!items->is_array()) {
        return absl::InvalidArgumentError(where + " (" + kind + "): items: expected array");
      }
      const std::string implied = kind == "PodList"             ? "Pod"
                                  : kind == "NodeList"          ? "Node"
                                  : kind == "ResourceQuotaList" ? "ResourceQuota"
                                                                : "";
      for (size_t i = 0; i < items->size(); ++i) {
        const Json& item = (*items)[i];
        const std::string item_where = fmt::format("{} items[{}]", where, i);
        if (!item.is_object()) {
          return absl::InvalidArgumentError(item_where + ": expected an object");
        }
        std::string item_kind = StringField(item, "kind");
        if (item_kind.empty()) {
          item_kind = implied;
        }
        TESSERA_RETURN_IF_ERROR(AddObject(item, item_kind, item_where));
      }
      return absl::OkStatus();
    }
    return AddObject(doc, kind, where);
  }

  Manifests Take() { return std::move(result_); }

 private:
  absl::Status AddObject(const Json& object, const std::string& kind, const std::string& where) {
    if (kind != "Pod" && kind != "Node" && kind != "ResourceQuota") {
      result_.warnings.push_back(kind.empty() ? where + ": object without kind skipped"
                                              : where + ": skipped " + Describe(kind, object));
      return absl::OkStatus();
    }
    const std::string text = object.dump(-1, ' ', false, Json::error_handler_t::replace);
    absl::Status status;
    if (kind == "Pod") {
      absl::StatusOr<Pod> pod = decoder_.DecodePod(text);
      if (pod.ok()) {
        result_.pods.push_back(*std::move(pod));
        return absl::OkStatus();
      }
      status = pod.status();
    } else if (kind == "ResourceQuota") {
      absl::StatusOr<ResourceQuota> quota = decoder_.DecodeResourceQuota(text);
      if (quota.ok()) {
        result_.quotas.push_back(*std::move(quota));
        return absl::OkStatus();
      }
      status = quota.status();
    } else {
      absl::StatusOr<Node> node = decoder_.DecodeNode(text);
      if (node.ok()) {
        result_.nodes.push_back(*std::move(node));
        return absl::OkStatus();
      }
      status = node.status();
    }
    std::string field = FieldError(status);
    if (field.empty()) {
      field = std::string(status.message());
    }
    return absl::InvalidArgumentError(where + " (" + Describe(kind, object) + "): " + field);
  }

  std::string source_;
  Decoder decoder_;
  Manifests result_;
};

absl::StatusOr<Manifests> LoadJson(std::string_view text, std::string_view source) {
  json::FrameSplitter splitter(text.size() + 1);
  std::vector<std::string> frames;
  absl::Status split = splitter.Feed(text, &frames);
  if (!split.ok()) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", source, std::string(split.message())));
  }
  if (splitter.InFrame()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: document {}: unterminated JSON object", source, frames.size() + 1));
  }
  Loader loader(source);
  for (size_t i = 0; i < frames.size(); ++i) {
    Json doc = Json::parse(frames[i], nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: document {}: invalid JSON", source, i + 1));
    }
    TESSERA_RETURN_IF_ERROR(loader.AddDocument(doc, i + 1));
  }
  return loader.Take();
}

absl::StatusOr<Manifests> LoadYaml(std::string_view text, std::string_view source) {
  Loader loader(source);
  std::stringstream input{std::string(text)};
  YAML::Parser parser(input);
  JsonBuilder builder(text.size() + kMaxAliasValues);
  int last_start = -1;
  for (size_t index = 1;; ++index) {
    if (!parser.HandleNextDocument(builder)) {
      break;
    }
    if (!builder.error().ok()) {
      return absl::InvalidArgumentError(fmt::format("{}: document {}: {}", source, index,
                                                    std::string(builder.error().message())));
    }
    if (builder.start().pos <= last_start || index > text.size() + 1) {
      return absl::InvalidArgumentError(
          fmt::format("{}: line {}, column {}: invalid YAML (the parser makes no progress)", source,
                      builder.start().line + 1, builder.start().column + 1));
    }
    last_start = builder.start().pos;
    TESSERA_RETURN_IF_ERROR(loader.AddDocument(builder.TakeRoot(), index));
  }
  return loader.Take();
}

}  // namespace

absl::StatusOr<Manifests> LoadManifests(std::string_view text, std::string_view source_name) {
  size_t first = 0;
  while (first < text.size() && json::IsJsonSpace(text[first])) {
    ++first;
  }
  try {
    if (first < text.size() && text[first] == '{') {
      return LoadJson(text, source_name);
    }
    return LoadYaml(text, source_name);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(fmt::format("{}: {}", source_name, e.msg));
    }
    return absl::InvalidArgumentError(fmt::format("{}: line {}, column {}: {}", source_name,
                                                  e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", source_name, e.what()));
  }
}

absl::StatusOr<Manifests> LoadManifestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string message = fmt::format("{}: {}", path, ErrnoText(err));
    if (err == ENOENT) {
      return absl::NotFoundError(message);
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(message);
    }
    return absl::UnavailableError(message);
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(fmt::format("{}: read error", path));
  }
  return LoadManifests(contents.str(), path);
}

}  // namespace tessera::kube

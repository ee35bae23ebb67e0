#include "tessera/kube/decode.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "fmt/format.h"
#include "simdjson.h"

#include "tessera/json/text.h"

namespace tessera::kube {
namespace {

namespace od = simdjson::ondemand;

constexpr char kFieldErrorPayload[] = "type.tessera.dev/kube.FieldError";

std::string_view KindOf(const Pod*) { return "Pod"; }
std::string_view KindOf(const Node*) { return "Node"; }
std::string_view KindOf(const Lease*) { return "Lease"; }
std::string_view KindOf(const ResourceQuota*) { return "ResourceQuota"; }
std::string_view KindOf(const PodDisruptionBudget*) { return "PodDisruptionBudget"; }

ConditionStatus ParseConditionStatus(std::string_view s) {
  if (s == "True") {
    return ConditionStatus::kTrue;
  }
  if (s == "False") {
    return ConditionStatus::kFalse;
  }
  return ConditionStatus::kUnknown;
}

bool ParseEventType(std::string_view s, WatchEventType* out) {
  if (s == "ADDED") {
    *out = WatchEventType::kAdded;
  } else if (s == "MODIFIED") {
    *out = WatchEventType::kModified;
  } else if (s == "DELETED") {
    *out = WatchEventType::kDeleted;
  } else if (s == "BOOKMARK") {
    *out = WatchEventType::kBookmark;
  } else if (s == "ERROR") {
    *out = WatchEventType::kError;
  } else {
    return false;
  }
  return true;
}

// "Pod default/x", "Node gpu-1", or just "Pod" when the name is not known (yet).
std::string ObjectLabel(std::string_view kind, const ObjectMeta& meta) {
  std::string label(kind);
  if (!meta.name.empty()) {
    label += ' ';
    if (!meta.ns.empty()) {
      label += meta.ns;
      label += '/';
    }
    label += meta.name;
  }
  return label;
}

}  // namespace

std::string_view WatchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      break;
  }
  return "ERROR";
}

std::string FieldError(const absl::Status& status) {
  auto payload = status.GetPayload(kFieldErrorPayload);
  if (!payload.has_value()) {
    return {};
  }
  return std::string(*payload);
}

// The decoding machinery. Every decode function returns true on success; on failure it records
// what went wrong (Fail) and each enclosing level adds its path segment (Push) on the way out,
// so the happy path builds no error strings. Every simdjson access is checked and the first
// error ends the decode (continuing after an On-Demand error is undefined behaviour).
class Decoder::Impl {
 public:
  explicit Impl(size_t retain_bytes) : retain_bytes_(retain_bytes) {}

  template <typename T>
  absl::StatusOr<T> DecodeObject(std::string_view json) {
    T out;
    od::document doc;
    od::value root;
    ResetError();
    if (!Parse(json, &doc, &root) || !DecodeValue(root, &out) || !AtEnd(doc)) {
      return Error(ObjectLabel(KindOf(&out), MetaOf(out)));
    }
    Release();
    return out;
  }

  absl::StatusOr<ApiStatus> DecodeStatus(std::string_view json) {
    ApiStatus out;
    od::document doc;
    od::value root;
    ResetError();
    if (!Parse(json, &doc, &root) || !DecodeApiStatus(root, &out) || !AtEnd(doc)) {
      return Error("Status");
    }
    Release();
    return out;
  }

  template <typename T, typename L>
  absl::StatusOr<L> DecodeList(std::string_view json, std::string* in_place,
                               std::string_view list_kind) {
    L out;
    od::document doc;
    od::value root;
    ResetError();
    const bool parsed =
        in_place != nullptr ? ParseInPlace(in_place, &doc, &root) : Parse(json, &doc, &root);
    if (!parsed || !DecodeListValue<T>(root, list_kind, &out) || !AtEnd(doc)) {
      return Error(label_.empty() ? std::string(list_kind) : label_);
    }
    Release();
    return out;
  }

  template <typename T>
  absl::StatusOr<WatchEvent<T>> DecodeEvent(std::string_view json) {
    WatchEvent<T> out;
    od::document doc;
    od::value root;
    ResetError();
    if (!Parse(json, &doc, &root) || !DecodeEventValue(root, &out) || !AtEnd(doc)) {
      return Error(label_.empty() ? std::string("watch event") : label_);
    }
    Release();
    return out;
  }

 private:
  static const ObjectMeta& MetaOf(const Pod& p) { return p.meta; }
  static const ObjectMeta& MetaOf(const Node& n) { return n.meta; }
  static const ObjectMeta& MetaOf(const Lease& l) { return l.meta; }
  static const ObjectMeta& MetaOf(const ResourceQuota& q) { return q.meta; }
  static const ObjectMeta& MetaOf(const PodDisruptionBudget& b) { return b.meta; }

  // ---- error bookkeeping ----

  void ResetError() {
    rev_path_.clear();
    what_.clear();
    label_.clear();
  }

  bool Fail(std::string what) {
    what_ = std::move(what);
    return false;
  }
  bool JsonFail(simdjson::error_code e) {
    return Fail(fmt::format("invalid JSON ({})", simdjson::error_message(e)));
  }
  // Adds a path segment on the way out of a failed decode; always returns false.
  bool Push(std::string_view field) {
    rev_path_.emplace_back(field);
    return false;
  }
  bool PushIndex(size_t index) {
    rev_path_.push_back(fmt::format("[{}]", index));
    return false;
  }
  bool PushKey(std::string_view key) {
    if (key.find_first_of("./[]") == std::string_view::npos && !key.empty()) {
      return Push(key);
    }
    rev_path_.push_back(fmt::format("[\"{}\"]", key));
    return false;
  }
  std::string PathString() const {
    std::string path;
    for (auto it = rev_path_.rbegin(); it != rev_path_.rend(); ++it) {
      if (!path.empty() && (*it)[0] != '[') {
        path += '.';
      }
      path += *it;
    }
    return path;
  }
  absl::Status Error(const std::string& label) {
    std::string field = PathString();
    if (!field.empty()) {
      field += ": ";
    }
    field += what_;
    absl::Status status = absl::InvalidArgumentError(label + ": " + field);
    status.SetPayload(kFieldErrorPayload, absl::Cord(field));
    Release();
    return status;
  }

  // ---- input and parser ----

  bool Parse(std::string_view json, od::document* doc, od::value* root) {
    const size_t need = json.size() + simdjson::SIMDJSON_PADDING;
    if (need > capacity_) {
      buffer_.reset(new char[need]);
      capacity_ = need;
    }
    if (!json.empty()) {
      std::memcpy(buffer_.get(), json.data(), json.size());
    }
    std::memset(buffer_.get() + json.size(), 0, simdjson::SIMDJSON_PADDING);
    input_begin_ = buffer_.get();
    input_limit_ = buffer_.get() + capacity_;
    simdjson::padded_string_view input(buffer_.get(), json.size(), capacity_);
    return Iterate(input, doc, root);
  }

  bool Iterate(simdjson::padded_string_view input, od::document* doc, od::value* root) {
    if (auto e = parser_.iterate(input).get(*doc); e) {
      return JsonFail(e);
    }
    auto e = doc->get_value().get(*root);
    if (e == simdjson::SCALAR_DOCUMENT_AS_VALUE) {
      return Fail("expected object");
    }
    if (e) {
      return JsonFail(e);
    }
    return true;
  }

  bool ParseInPlace(std::string* body, od::document* doc, od::value* root) {
    const size_t size = body->size();
    body->reserve(size + simdjson::SIMDJSON_PADDING);
    // Zero the padding through the public API, then restore the size (no reallocation).
    body->resize(size + simdjson::SIMDJSON_PADDING, '\0');
    body->resize(size);
    input_begin_ = body->data();
    input_limit_ = body->data() + body->capacity();
    simdjson::padded_string_view input(body->data(), size, body->capacity());
    return Iterate(input, doc, root);
  }

  // After the top-level value: anything but the end of input is an error.
  bool AtEnd(od::document& doc) {
    const char* loc = nullptr;
    if (doc.current_location().get(loc) == simdjson::SUCCESS) {
      return Fail(fmt::format("trailing content at offset {}", loc - input_begin_));
    }
    return true;
  }

  void Release() {
    if (capacity_ > retain_bytes_) {
      buffer_.reset();
      capacity_ = 0;
      parser_ = od::parser();
    }
    if (scratch_.capacity() > 4096) {
      scratch_ = {};
    }
  }

  // ---- typed accessors (null is "absent": the output is left unchanged) ----

  bool TypeOf(od::value& v, od::json_type* t) {
    if (auto e = v.type().get(*t); e) {
      return JsonFail(e);
    }
    return true;
  }

  // Consumes a null; fails on a malformed literal.
  bool ConsumeNull(od::value& v) {
    bool is_null = false;
    if (auto e = v.is_null().get(is_null); e) {
      return JsonFail(e);
    }
    return is_null || Fail("invalid literal");
  }

  // The start of each typed read: reads v's type; a null is consumed and sets *is_null, any
  // other type than `want` fails with `expected`. False on error (already reported).
  bool Expect(od::value& v, od::json_type want, const char* expected, bool* is_null) {
    od::json_type t;
    if (!TypeOf(v, &t)) {
      return false;
    }
    *is_null = t == od::json_type::null;
    if (*is_null) {
      return ConsumeNull(v);
    }
    return t == want || Fail(expected);
  }

  // Reads a string into *out; returns false on error. *present tells whether it was not null.
  bool StringView(od::value& v, std::string_view* out, bool* present) {
    bool is_null = false;
    if (!Expect(v, od::json_type::string, "expected string", &is_null)) {
      return false;
    }
    if (is_null) {
      *present = false;
      return true;
    }
    // Most strings have no escape sequence: view their bytes in the input instead of having
    // simdjson copy them into its string buffer.
    std::string_view token = v.raw_json_token();
    while (!token.empty() && json::IsJsonSpace(token.back())) {
      token.remove_suffix(1);
    }
    if (token.size() >= 2 && token.front() == '"' && token.back() == '"' &&
        std::memchr(token.data() + 1, '\\', token.size() - 2) == nullptr) {
      od::raw_json_string raw;
      if (auto e = v.get_raw_json_string().get(raw); e) {
        return JsonFail(e);
      }
      *out = token.substr(1, token.size() - 2);
      *present = true;
      return true;
    }
    if (auto e = v.get_string().get(*out); e) {
      return JsonFail(e);
    }
    *present = true;
    return true;
  }

  // The key starting at `raw` (just after its opening quote) when it holds no escape sequence;
  // false when it does (the caller unescapes it). Stage 1 has checked that the string closes
  // inside the padded input.
  bool PlainKey(const char* raw, std::string_view* out) const {
    const void* quote = std::memchr(raw, '"', static_cast<size_t>(input_limit_ - raw));
    if (quote == nullptr) {
      return false;
    }
    const size_t n = static_cast<size_t>(static_cast<const char*>(quote) - raw);
    if (std::memchr(raw, '\\', n) != nullptr) {
      return false;
    }
    *out = std::string_view(raw, n);
    return true;
  }

  bool String(od::value& v, std::string* out) {
    std::string_view s;
    bool present = false;
    if (!StringView(v, &s, &present)) {
      return false;
    }
    if (present) {
      out->assign(s.data(), s.size());
    }
    return true;
  }

  bool OptionalString(od::value& v, std::optional<std::string>* out) {
    std::string_view s;
    bool present = false;
    if (!StringView(v, &s, &present)) {
      return false;
    }
    if (present) {
      out->emplace(s);
    } else {
      out->reset();
    }
    return true;
  }

  // A quantity: a JSON string, or a JSON number kept as its literal text.
  bool QuantityView(od::value& v, std::string_view* out, bool* present) {
    od::json_type t;
    if (!TypeOf(v, &t)) {
      return false;
    }
    if (t == od::json_type::number) {
      std::string_view token = v.raw_json_token();
      while (!token.empty() && json::IsJsonSpace(token.back())) {
        token.remove_suffix(1);
      }
      double ignored = 0;
      if (auto e = v.get_double().get(ignored); e) {
        return JsonFail(e);
      }
      *out = token;
      *present = true;
      return true;
    }
    if (t != od::json_type::string && t != od::json_type::null) {
      return Fail("expected string or number");
    }
    return StringView(v, out, present);
  }

  // A metav1.Time (RFC 3339, as Go's time.Parse reads it) as Unix seconds; null: 0.
  bool StartTime(od::value& v, int64_t* out) {
    std::string_view text;
    bool present = false;
    if (!StringView(v, &text, &present)) {
      return false;
    }
    if (!present) {
      *out = 0;
      return true;
    }
    // Every pod carries one, so the API server's own form ("2026-12-07T12:00:01Z", what
    // metav1.Time writes) is read without allocating; any other RFC 3339 form goes to absl.
    if (std::optional<int64_t> utc = UtcSeconds(text)) {
      *out = *utc;
      return true;
    }
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, std::string(text), &t, &err)) {
      return Fail("expected an RFC 3339 time");
    }
    *out = absl::ToUnixSeconds(t);
    return true;
  }

  // "YYYY-MM-DDTHH:MM:SSZ" with fields in range, as Unix seconds; nullopt for anything else.
  static std::optional<int64_t> UtcSeconds(std::string_view s) {
    if (s.size() != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
        s[16] != ':' || s[19] != 'Z') {
      return std::nullopt;
    }
    int v[6] = {};
    const int at[6] = {0, 5, 8, 11, 14, 17};
    const int width[6] = {4, 2, 2, 2, 2, 2};
    for (int f = 0; f < 6; ++f) {
      for (int i = at[f]; i < at[f] + width[f]; ++i) {
        if (s[i] < '0' || s[i] > '9') {
          return std::nullopt;
        }
        v[f] = v[f] * 10 + (s[i] - '0');
      }
    }
    const absl::CivilSecond c(v[0], v[1], v[2], v[3], v[4], v[5]);
    // CivilSecond normalises out-of-range fields (month 13); such text is not this form.
    if (c.month() != v[1] || c.day() != v[2] || c.hour() != v[3] || c.minute() != v[4] ||
        c.second() != v[5]) {
      return std::nullopt;
    }
    return absl::ToUnixSeconds(absl::FromCivil(c, absl::UTCTimeZone()));
  }

  bool Bool(od::value& v, bool* out) {
    bool is_null = false;
    if (!Expect(v, od::json_type::boolean, "expected boolean", &is_null)) {
      return false;
    }
    if (is_null) {
      return true;
    }
    if (auto e = v.get_bool().get(*out); e) {
      return JsonFail(e);
    }
    return true;
  }

  template <typename Int>
  bool Integer(od::value& v, std::optional<Int>* out) {
    bool is_null = false;
    if (!Expect(v, od::json_type::number, "expected integer", &is_null)) {
      return false;
    }
    if (is_null) {
      out->reset();
      return true;
    }
    int64_t n = 0;
    auto e = v.get_int64().get(n);
    if (e == simdjson::INCORRECT_TYPE || e == simdjson::NUMBER_OUT_OF_RANGE) {
      return Fail("expected integer");
    }
    if (e) {
      return JsonFail(e);
    }
    if (n < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
        n > static_cast<int64_t>(std::numeric_limits<Int>::max())) {
      return Fail("integer out of range");
    }
    *out = static_cast<Int>(n);
    return true;
  }

  // Calls f(key, value) for each field of an object; null is an empty object.
  template <typename F>
  bool Fields(od::value& v, F&& f) {
    bool is_null = false;
    if (!Expect(v, od::json_type::object, "expected object", &is_null)) {
      return false;
    }
    if (is_null) {
      return true;
    }
    od::object obj;
    if (auto e = v.get_object().get(obj); e) {
      return JsonFail(e);
    }
    for (auto field_result : obj) {
      od::field field;
      if (auto e = std::move(field_result).get(field); e) {
        return JsonFail(e);
      }
      std::string_view key;
      if (!PlainKey(field.key().raw(), &key)) {
        if (auto e = field.unescaped_key().get(key); e) {
          return JsonFail(e);
        }
      }
      od::value value = field.value();
      if (!f(key, value)) {
        return false;
      }
    }
    return true;
  }

  // Calls f(index, value) for each element of an array; null is an empty array.
  template <typename F>
  bool Elements(od::value& v, F&& f) {
    bool is_null = false;
    if (!Expect(v, od::json_type::array, "expected array", &is_null)) {
      return false;
    }
    if (is_null) {
      return true;
    }
    od::array arr;
    if (auto e = v.get_array().get(arr); e) {
      return JsonFail(e);
    }
    size_t index = 0;
    for (auto element_result : arr) {
      od::value element;
      if (auto e = std::move(element_result).get(element); e) {
        return JsonFail(e);
      }
      if (!f(index, element)) {
        return false;
      }
      ++index;
    }
    return true;
  }

  // Decodes {"k": "v", ...} into *out (replacing it). Values are strings, or quantities when
  // `quantities` is set; a null value skips the key. Keys `keep` rejects are skipped (their
  // values are still checked, so a malformed object fails whatever it holds).
  using KeyFilter = bool (*)(std::string_view);
  template <typename M>
  bool StringMapValue(od::value& v, M* out, bool quantities, KeyFilter keep = nullptr) {
    scratch_.clear();
    bool ok = Fields(v, [&](std::string_view key, od::value& value) {
      if (keep != nullptr && !keep(key)) {
        // A dropped key: check the value's type only. Its text is neither read nor unescaped
        // (kubectl's last-applied-configuration is a long, escaped string).
        od::json_type t{};
        if (!TypeOf(value, &t)) {
          return PushKey(key);
        }
        if (t == od::json_type::null) {
          return ConsumeNull(value) || PushKey(key);
        }
        const bool good = t == od::json_type::string || (quantities && t == od::json_type::number);
        return good ||
               (Fail(quantities ? "expected string or number" : "expected string"), PushKey(key));
      }
      std::string_view s;
      bool present = false;
      bool good = quantities ? QuantityView(value, &s, &present) : StringView(value, &s, &present);
      if (!good) {
        return PushKey(key);
      }
      if (present && (keep == nullptr || keep(key))) {
        scratch_.emplace_back(key, s);
      }
      return true;
    });
    if (!ok) {
      return false;
    }
    auto by_key = [](const auto& a, const auto& b) { return a.first < b.first; };
    // Go writes map keys sorted, so the sort is usually skipped.
    if (!std::is_sorted(scratch_.begin(), scratch_.end(), by_key)) {
      std::stable_sort(scratch_.begin(), scratch_.end(), by_key);
    }
    size_t unique = 0;
    for (size_t i = 0; i < scratch_.size(); ++i) {
      if (i + 1 == scratch_.size() || scratch_[i + 1].first != scratch_[i].first) {
        ++unique;
      }
    }
    StringMapBuilder<M> builder(out, unique);
    for (size_t i = 0; i < scratch_.size(); ++i) {
      if (i + 1 < scratch_.size() && scratch_[i + 1].first == scratch_[i].first) {
        continue;  // a later duplicate wins
      }
      builder.Append(scratch_[i].first, scratch_[i].second);
    }
    return true;
  }

  bool CheckKind(od::value& v, std::string_view want, std::string_view alt = {}) {
    std::string_view kind;
    bool present = false;
    if (!StringView(v, &kind, &present)) {
      return false;
    }
    if (present && !kind.empty() && kind != want && kind != alt) {
      return Fail(fmt::format("kind {}, expected {}", kind, want));
    }
    return true;
  }

  // ---- objects ----

  // `keep_label` and `keep_annotation` select the keys kept (nullptr: all); see objects.h.
  bool Meta(od::value& v, ObjectMeta* m, KeyFilter keep_label, KeyFilter keep_annotation) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "name") {
        return String(value, &m->name) || Push(key);
      }
      if (key == "namespace") {
        return String(value, &m->ns) || Push(key);
      }
      if (key == "uid") {
        return String(value, &m->uid) || Push(key);
      }
      if (key == "resourceVersion") {
        return String(value, &m->resource_version) || Push(key);
      }
      if (key == "labels") {
        return StringMapValue(value, &m->labels, false, keep_label) || Push(key);
      }
      if (key == "annotations") {
        return StringMapValue(value, &m->annotations, false, keep_annotation) || Push(key);
      }
      if (key == "deletionTimestamp") {
        std::string_view s;
        bool present = false;
        if (!StringView(value, &s, &present)) {
          return Push(key);
        }
        m->deleting = present && !s.empty();
        return true;
      }
      return true;
    });
  }

  // metadata of a BOOKMARK: only resourceVersion and annotations.
  bool BookmarkMeta(od::value& v, ObjectMeta* m) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "resourceVersion") {
        return String(value, &m->resource_version) || Push(key);
      }
      if (key == "annotations") {
        return StringMapValue(value, &m->annotations, false) || Push(key);
      }
      return true;
    });
  }

  bool ContainerValue(od::value& v, Container* c) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "name") {
        return String(value, &c->name) || Push(key);
      }
      if (key == "resources") {
        return Fields(value,
                      [&](std::string_view rkey, od::value& rvalue) {
                        if (rkey == "limits") {
                          return StringMapValue(rvalue, &c->limits, true) || Push(rkey);
                        }
                        if (rkey == "requests") {
                          return StringMapValue(rvalue, &c->requests, true) || Push(rkey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "securityContext") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "privileged") {
                          return Bool(svalue, &c->privileged) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      return true;
    });
  }

  bool Containers(od::value& v, std::vector<Container>* out) {
    out->clear();
    return Elements(v, [&](size_t index, od::value& element) {
      return ContainerValue(element, &out->emplace_back()) || PushIndex(index);
    });
  }

  bool DecodeValue(od::value& v, Pod* pod) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "metadata") {
        return Meta(value, &pod->meta, &TrackedPodLabel, &TrackedAnnotation) || Push(key);
      }
      if (key == "spec") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "nodeName") {
                          return String(svalue, &pod->node_name) || Push(skey);
                        }
                        if (skey == "schedulerName") {
                          return String(svalue, &pod->scheduler_name) || Push(skey);
                        }
                        if (skey == "containers") {
                          return Containers(svalue, &pod->containers) || Push(skey);
                        }
                        if (skey == "initContainers") {
                          return Containers(svalue, &pod->init_containers) || Push(skey);
                        }
                        if (skey == "priority") {
                          std::optional<int32_t> priority;
                          if (!Integer(svalue, &priority)) {
                            return Push(skey);
                          }
                          pod->priority = priority.value_or(0);
                        }
                        if (skey == "preemptionPolicy") {
                          std::string_view policy;
                          bool present = false;
                          if (!StringView(svalue, &policy, &present)) {
                            return Push(skey);
                          }
                          pod->preempt_never = present && policy == "Never";
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "status") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "phase") {
                          std::string_view phase;
                          bool present = false;
                          if (!StringView(svalue, &phase, &present)) {
                            return Push(skey);
                          }
                          pod->phase = ParsePodPhase(present ? phase : std::string_view());
                        }
                        if (skey == "startTime") {
                          return StartTime(svalue, &pod->start_unix) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "Pod") || Push(key);
      }
      return true;
    });
  }

  bool NodeConditions(od::value& v, ConditionStatus* ready) {
    return Elements(v, [&](size_t index, od::value& element) {
      std::string_view type;
      std::string_view status;
      bool ok = Fields(element, [&](std::string_view key, od::value& value) {
        bool present = false;
        if (key == "type") {
          return StringView(value, &type, &present) || Push(key);
        }
        if (key == "status") {
          return StringView(value, &status, &present) || Push(key);
        }
        return true;
      });
      if (!ok) {
        return PushIndex(index);
      }
      if (type == "Ready") {
        *ready = ParseConditionStatus(status);
      }
      return true;
    });
  }

  bool DecodeValue(od::value& v, Node* node) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "metadata") {
        return Meta(value, &node->meta, nullptr, &TrackedAnnotation) || Push(key);
      }
      if (key == "spec") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "unschedulable") {
                          return Bool(svalue, &node->unschedulable) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "status") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "allocatable") {
                          return StringMapValue(svalue, &node->allocatable, true) || Push(skey);
                        }
                        if (skey == "conditions") {
                          return NodeConditions(svalue, &node->ready) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "Node") || Push(key);
      }
      return true;
    });
  }

  bool DecodeValue(od::value& v, Lease* lease) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "metadata") {
        return Meta(value, &lease->meta, nullptr, nullptr) || Push(key);
      }
      if (key == "spec") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "holderIdentity") {
                          return OptionalString(svalue, &lease->holder_identity) || Push(skey);
                        }
                        if (skey == "leaseDurationSeconds") {
                          return Integer(svalue, &lease->lease_duration_seconds) || Push(skey);
                        }
                        if (skey == "acquireTime") {
                          return OptionalString(svalue, &lease->acquire_time) || Push(skey);
                        }
                        if (skey == "renewTime") {
                          return OptionalString(svalue, &lease->renew_time) || Push(skey);
                        }
                        if (skey == "leaseTransitions") {
                          return Integer(svalue, &lease->lease_transitions) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "Lease") || Push(key);
      }
      return true;
    });
  }

  // Labels and annotations are dropped; spec.hard keeps the "limits.*" keys (their values are
  // still checked as quantities, like every kept or dropped entry).
  static bool NoKey(std::string_view /*key*/) { return false; }
  bool DecodeValue(od::value& v, ResourceQuota* quota) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "metadata") {
        return Meta(value, &quota->meta, &NoKey, &NoKey) || Push(key);
      }
      if (key == "spec") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "hard") {
                          return StringMapValue(svalue, &quota->hard, true, &QuotaLimitKey) ||
                                 Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "ResourceQuota") || Push(key);
      }
      return true;
    });
  }

  bool StringList(od::value& v, std::vector<std::string>* out) {
    out->clear();
    return Elements(v, [&](size_t index, od::value& element) {
      std::string_view s;
      bool present = false;
      if (!StringView(element, &s, &present)) {
        return PushIndex(index);
      }
      if (!present) {
        Fail("expected string");
        return PushIndex(index);
      }
      out->emplace_back(s);
      return true;
    });
  }

  // metav1.LabelSelector; null leaves *out nullopt.
  bool Selector(od::value& v, std::optional<LabelSelector>* out) {
    od::json_type t;
    if (!TypeOf(v, &t)) {
      return false;
    }
    if (t == od::json_type::null) {
      out->reset();
      return ConsumeNull(v);
    }
    LabelSelector& sel = out->emplace();
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "matchLabels") {
        return StringMapValue(value, &sel.match_labels, false) || Push(key);
      }
      if (key == "matchExpressions") {
        sel.match_expressions.clear();
        return Elements(value,
                        [&](size_t index, od::value& element) {
                          LabelSelectorRequirement& r = sel.match_expressions.emplace_back();
                          return Fields(element,
                                        [&](std::string_view rkey, od::value& rvalue) {
                                          if (rkey == "key") {
                                            return String(rvalue, &r.key) || Push(rkey);
                                          }
                                          if (rkey == "operator") {
                                            return String(rvalue, &r.op) || Push(rkey);
                                          }
                                          if (rkey == "values") {
                                            return StringList(rvalue, &r.values) || Push(rkey);
                                          }
                                          return true;
                                        }) ||
                                 PushIndex(index);
                        }) ||
               Push(key);
      }
      return true;
    });
  }

  // Labels and annotations are dropped; of status.disruptedPods only the names are kept.
  bool DecodeValue(od::value& v, PodDisruptionBudget* pdb) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "metadata") {
        return Meta(value, &pdb->meta, &NoKey, &NoKey) || Push(key);
      }
      if (key == "spec") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "selector") {
                          return Selector(svalue, &pdb->selector) || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "status") {
        return Fields(value,
                      [&](std::string_view skey, od::value& svalue) {
                        if (skey == "disruptionsAllowed") {
                          std::optional<int32_t> allowed;
                          if (!Integer(svalue, &allowed)) {
                            return Push(skey);
                          }
                          pdb->disruptions_allowed = allowed.value_or(0);
                        }
                        if (skey == "disruptedPods") {
                          pdb->disrupted_pods.clear();
                          const bool ok = Fields(svalue, [&](std::string_view name, od::value& t) {
                            std::string_view ignored;
                            bool present = false;
                            if (!StringView(t, &ignored, &present)) {
                              return PushKey(name);
                            }
                            pdb->disrupted_pods.emplace_back(name);
                            return true;
                          });
                          std::sort(pdb->disrupted_pods.begin(), pdb->disrupted_pods.end());
                          return ok || Push(skey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "PodDisruptionBudget") || Push(key);
      }
      return true;
    });
  }

  bool DecodeApiStatus(od::value& v, ApiStatus* s) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "status") {
        return String(value, &s->status) || Push(key);
      }
      if (key == "reason") {
        return String(value, &s->reason) || Push(key);
      }
      if (key == "message") {
        return String(value, &s->message) || Push(key);
      }
      if (key == "code") {
        std::optional<int32_t> code;
        if (!Integer(value, &code)) {
          return Push(key);
        }
        s->code = code.value_or(0);
        return true;
      }
      if (key == "details") {
        return Fields(value,
                      [&](std::string_view dkey, od::value& dvalue) {
                        if (dkey == "retryAfterSeconds") {
                          std::optional<int32_t> seconds;
                          if (!Integer(dvalue, &seconds)) {
                            return Push(dkey);
                          }
                          s->retry_after_seconds = seconds.value_or(0);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, "Status") || Push(key);
      }
      return true;
    });
  }

  template <typename T, typename L>
  bool DecodeListValue(od::value& v, std::string_view list_kind, L* out) {
    return Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "items") {
        out->items.clear();
        return Elements(value, [&](size_t index, od::value& element) {
          T& item = out->items.emplace_back();
          if (DecodeValue(element, &item)) {
            return true;
          }
          label_ = fmt::format("{} items[{}] ({})", list_kind, index,
                               ObjectLabel(KindOf(&item), MetaOf(item)));
          return false;
        });
      }
      if (key == "metadata") {
        return Fields(value,
                      [&](std::string_view mkey, od::value& mvalue) {
                        if (mkey == "resourceVersion") {
                          return String(mvalue, &out->meta.resource_version) || Push(mkey);
                        }
                        if (mkey == "continue") {
                          return String(mvalue, &out->meta.continue_token) || Push(mkey);
                        }
                        if (mkey == "remainingItemCount") {
                          return Integer(mvalue, &out->meta.remaining_item_count) || Push(mkey);
                        }
                        return true;
                      }) ||
               Push(key);
      }
      if (key == "kind") {
        return CheckKind(value, list_kind, "List") || Push(key);
      }
      return true;
    });
  }

  // The object of an event whose type is known.
  template <typename T>
  bool EventObject(od::value& v, WatchEvent<T>* out) {
    switch (out->type) {
      case WatchEventType::kError:
        return DecodeApiStatus(v, &out->status);
      case WatchEventType::kBookmark:
        return Fields(v, [&](std::string_view key, od::value& value) {
          if (key == "metadata") {
            return BookmarkMeta(value, &out->object.meta) || Push(key);
          }
          if (key == "kind") {
            return CheckKind(value, KindOf(&out->object)) || Push(key);
          }
          return true;
        });
      default:
        return DecodeValue(v, &out->object);
    }
  }

  template <typename T>
  bool DecodeEventValue(od::value& v, WatchEvent<T>* out) {
    bool have_type = false;
    bool have_object = false;
    std::string_view deferred;  // raw object seen before "type"
    bool ok = Fields(v, [&](std::string_view key, od::value& value) {
      if (key == "type") {
        std::string_view type;
        bool present = false;
        if (!StringView(value, &type, &present)) {
          return Push(key);
        }
        if (!present || !ParseEventType(type, &out->type)) {
          Fail(fmt::format("unknown watch event type \"{}\"", type));
          return Push(key);
        }
        have_type = true;
        return true;
      }
      if (key == "object") {
        have_object = true;
        if (have_type) {
          return EventObject(value, out) || Push(key);
        }
        od::json_type t;
        if (!TypeOf(value, &t)) {
          return Push(key);
        }
        if (t != od::json_type::object) {
          Fail("expected object");
          return Push(key);
        }
        od::object obj;
        if (auto e = value.get_object().get(obj); e) {
          return JsonFail(e) || Push(key);
        }
        if (auto e = obj.raw_json().get(deferred); e) {
          return JsonFail(e) || Push(key);
        }
        return true;
      }
      return true;
    });
    if (!ok) {
      SetEventLabel(*out, have_type);
      return false;
    }
    if (!have_type) {
      return Fail("missing type");
    }
    if (!have_object) {
      SetEventLabel(*out, true);
      return Fail("missing object");
    }
    if (!deferred.empty()) {
      // The object came before the type: parse its bytes again now that the type is known. The
      // bytes lie inside buffer_, which has padding after the end of the whole input.
      const size_t room = static_cast<size_t>(input_limit_ - deferred.data());
      simdjson::padded_string_view input(deferred.data(), deferred.size(), room);
      od::document doc;
      od::value root;
      if (auto e = deferred_parser_.iterate(input).get(doc); e) {
        return JsonFail(e) || Push("object");
      }
      if (auto e = doc.get_value().get(root); e) {
        return JsonFail(e) || Push("object");
      }
      if (!EventObject(root, out)) {
        SetEventLabel(*out, true);
        return Push("object");
      }
    }
    return true;
  }

  template <typename T>
  void SetEventLabel(const WatchEvent<T>& event, bool have_type) {
    if (!have_type) {
      label_ = "watch event";
    } else if (event.type == WatchEventType::kError) {
      label_ = "watch ERROR event";
    } else {
      label_ = fmt::format("watch {} event ({})", WatchEventTypeName(event.type),
                           ObjectLabel(KindOf(&event.object), event.object.meta));
    }
  }

  const size_t retain_bytes_;
  od::parser parser_;
  od::parser deferred_parser_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
  const char* input_begin_ = nullptr;  // the bytes being parsed (buffer_ or an in-place body)
  const char* input_limit_ = nullptr;  // end of the readable (padded) region after input_begin_
  std::vector<std::pair<std::string_view, std::string_view>> scratch_;
  std::vector<std::string> rev_path_;
  std::string what_;
  std::string label_;
};

Decoder::Decoder(size_t retain_bytes) : impl_(std::make_unique<Impl>(retain_bytes)) {}
Decoder::~Decoder() = default;

absl::StatusOr<Pod> Decoder::DecodePod(std::string_view json) {
  return impl_->DecodeObject<Pod>(json);
}
absl::StatusOr<Node> Decoder::DecodeNode(std::string_view json) {
  return impl_->DecodeObject<Node>(json);
}
absl::StatusOr<Lease> Decoder::DecodeLease(std::string_view json) {
  return impl_->DecodeObject<Lease>(json);
}
absl::StatusOr<ResourceQuota> Decoder::DecodeResourceQuota(std::string_view json) {
  return impl_->DecodeObject<ResourceQuota>(json);
}
absl::StatusOr<ApiStatus> Decoder::DecodeStatus(std::string_view json) {
  return impl_->DecodeStatus(json);
}
absl::StatusOr<PodList> Decoder::DecodePodList(std::string_view json) {
  return impl_->DecodeList<Pod, PodList>(json, nullptr, "PodList");
}
absl::StatusOr<NodeList> Decoder::DecodeNodeList(std::string_view json) {
  return impl_->DecodeList<Node, NodeList>(json, nullptr, "NodeList");
}
absl::StatusOr<ResourceQuotaList> Decoder::DecodeResourceQuotaList(std::string_view json) {
  return impl_->DecodeList<ResourceQuota, ResourceQuotaList>(json, nullptr, "ResourceQuotaList");
}
absl::StatusOr<ResourceQuotaList> Decoder::DecodeResourceQuotaListInPlace(std::string* body) {
  return impl_->DecodeList<ResourceQuota, ResourceQuotaList>({}, body, "ResourceQuotaList");
}
absl::StatusOr<PodDisruptionBudget> Decoder::DecodePodDisruptionBudget(std::string_view json) {
  return impl_->DecodeObject<PodDisruptionBudget>(json);
}
absl::StatusOr<PodDisruptionBudgetList> Decoder::DecodePodDisruptionBudgetList(
    std::string_view json) {
  return impl_->DecodeList<PodDisruptionBudget, PodDisruptionBudgetList>(json, nullptr,
                                                                         "PodDisruptionBudgetList");
}
absl::StatusOr<PodList> Decoder::DecodePodListInPlace(std::string* body) {
  return impl_->DecodeList<Pod, PodList>({}, body, "PodList");
}
absl::StatusOr<NodeList> Decoder::DecodeNodeListInPlace(std::string* body) {
  return impl_->DecodeList<Node, NodeList>({}, body, "NodeList");
}
template <typename T>
absl::StatusOr<WatchEvent<T>> Decoder::DecodeWatchEvent(std::string_view json) {
  return impl_->DecodeEvent<T>(json);
}
template absl::StatusOr<WatchEvent<Pod>> Decoder::DecodeWatchEvent<Pod>(std::string_view);
template absl::StatusOr<WatchEvent<Node>> Decoder::DecodeWatchEvent<Node>(std::string_view);
template absl::StatusOr<WatchEvent<Lease>> Decoder::DecodeWatchEvent<Lease>(std::string_view);
template absl::StatusOr<WatchEvent<ResourceQuota>> Decoder::DecodeWatchEvent<ResourceQuota>(
    std::string_view);

namespace {
Decoder& ThreadDecoder() {
  thread_local Decoder decoder;
  return decoder;
}
}  // namespace

absl::StatusOr<Pod> DecodePod(std::string_view json) { return ThreadDecoder().DecodePod(json); }
absl::StatusOr<Node> DecodeNode(std::string_view json) { return ThreadDecoder().DecodeNode(json); }
absl::StatusOr<Lease> DecodeLease(std::string_view json) {
  return ThreadDecoder().DecodeLease(json);
}
absl::StatusOr<ApiStatus> DecodeStatus(std::string_view json) {
  return ThreadDecoder().DecodeStatus(json);
}
absl::StatusOr<PodList> DecodePodList(std::string_view json) {
  return ThreadDecoder().DecodePodList(json);
}
absl::StatusOr<NodeList> DecodeNodeList(std::string_view json) {
  return ThreadDecoder().DecodeNodeList(json);
}
absl::StatusOr<ResourceQuota> DecodeResourceQuota(std::string_view json) {
  return ThreadDecoder().DecodeResourceQuota(json);
}
absl::StatusOr<ResourceQuotaList> DecodeResourceQuotaList(std::string_view json) {
  return ThreadDecoder().DecodeResourceQuotaList(json);
}
absl::StatusOr<PodDisruptionBudget> DecodePodDisruptionBudget(std::string_view json) {
  return ThreadDecoder().DecodePodDisruptionBudget(json);
}
absl::StatusOr<PodDisruptionBudgetList> DecodePodDisruptionBudgetList(std::string_view json) {
  return ThreadDecoder().DecodePodDisruptionBudgetList(json);
}
template <typename T>
absl::StatusOr<WatchEvent<T>> DecodeWatchEvent(std::string_view json) {
  return ThreadDecoder().DecodeWatchEvent<T>(json);
}
template absl::StatusOr<WatchEvent<Pod>> DecodeWatchEvent<Pod>(std::string_view);
template absl::StatusOr<WatchEvent<Node>> DecodeWatchEvent<Node>(std::string_view);
template absl::StatusOr<WatchEvent<Lease>> DecodeWatchEvent<Lease>(std::string_view);
template absl::StatusOr<WatchEvent<ResourceQuota>> DecodeWatchEvent<ResourceQuota>(
    std::string_view);

}  // namespace tessera::kube

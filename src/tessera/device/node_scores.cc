#include "tessera/device/node_scores.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "simdjson.h"
#include <fmt/format.h>

#include "tessera/device/codec_internal.h"
#include "tessera/json/text.h"

namespace tessera::device {
namespace {

using internal::Quote;

absl::Status EntryError(size_t n, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("node scores: entry {}: {}", n, what));
}

std::string_view TypeName(simdjson::dom::element_type type) {
  switch (type) {
    case simdjson::dom::element_type::ARRAY:
      return "an array";
    case simdjson::dom::element_type::OBJECT:
      return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
    case simdjson::dom::element_type::DOUBLE:
      return "a number";
    case simdjson::dom::element_type::STRING:
      return "a string";
    case simdjson::dom::element_type::BOOL:
      return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE:
      return "null";
  }
  return "a value";
}

// One score: an integer in int64 range (Go strconv.ParseInt on the literal), null = 0.
absl::Status ReadScore(simdjson::dom::element v, size_t n, std::string_view key, int64_t* out) {
  switch (v.type()) {
    case simdjson::dom::element_type::NULL_VALUE:
      *out = 0;
      return absl::OkStatus();
    case simdjson::dom::element_type::INT64:
      *out = v.get_int64().value_unsafe();
      return absl::OkStatus();
    case simdjson::dom::element_type::UINT64:
      return EntryError(n, fmt::format("score {}: out of int64 range ({})", Quote(key),
                                       v.get_uint64().value_unsafe()));
    case simdjson::dom::element_type::DOUBLE:
      return EntryError(n, fmt::format("score {}: not an integer ({})", Quote(key),
                                       v.get_double().value_unsafe()));
    default:
      return EntryError(
          n, fmt::format("score {}: {}, want an integer", Quote(key), TypeName(v.type())));
  }
}

absl::Status ReadEntry(simdjson::dom::element element, size_t n, GpuPairScores* out) {
  if (element.is_null()) {
    return absl::OkStatus();  // Go's zero value: no uuid, no scores
  }
  simdjson::dom::object object;
  if (element.get_object().get(object) != simdjson::SUCCESS) {
    return EntryError(n, fmt::format("{}, want an object", TypeName(element.type())));
  }
  for (simdjson::dom::key_value_pair field : object) {
    if (json::KeyEqualsFold(field.key, "uuid")) {
      if (field.value.is_null()) {
        continue;  // Go ignores null for a string: the value so far stays
      }
      std::string_view uuid;
      if (field.value.get_string().get(uuid) != simdjson::SUCCESS) {
        return EntryError(n, fmt::format("uuid: {}, want a string", TypeName(field.value.type())));
      }
      out->uuid.assign(uuid);
    } else if (json::KeyEqualsFold(field.key, "score")) {
      // Go decodes a repeated "score" into the same map: the keys accumulate.
      if (field.value.is_null()) {
        out->scores.clear();  // a null map field is set to nil
        continue;
      }
      simdjson::dom::object scores;
      if (field.value.get_object().get(scores) != simdjson::SUCCESS) {
        return EntryError(n,
                          fmt::format("score: {}, want an object", TypeName(field.value.type())));
      }
      for (simdjson::dom::key_value_pair s : scores) {
        int64_t value = 0;
        if (absl::Status st = ReadScore(s.value, n, s.key, &value); !st.ok()) {
          return st;
        }
        out->scores.emplace_back(std::string(s.key), value);
      }
    }
    // Other keys are ignored, as Go does.
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GpuPairScores>> DecodeNodeScores(std::string_view value) {
  thread_local simdjson::dom::parser parser;
  simdjson::padded_string padded(value);
  simdjson::dom::element root;
  if (auto e = parser.parse(padded).get(root); e != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(
        fmt::format("node scores: not JSON ({}): {}", simdjson::error_message(e), Quote(value)));
  }
  std::vector<GpuPairScores> out;
  if (root.is_null()) {
    return out;  // Go leaves the slice nil: no scores
  }
  simdjson::dom::array array;
  if (root.get_array().get(array) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(
        fmt::format("node scores: {}, want an array", TypeName(root.type())));
  }
  out.reserve(array.size());
  for (simdjson::dom::element element : array) {
    GpuPairScores entry;
    if (absl::Status s = ReadEntry(element, out.size(), &entry); !s.ok()) {
      return s;
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::string EncodeNodeScores(const std::vector<GpuPairScores>& scores) {
  std::string out = "[";
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i > 0) {
      out += ',';
    }
    out += '{';
    const GpuPairScores& e = scores[i];
    if (!e.uuid.empty()) {
      out += "\"uuid\":";
      json::AppendGoString(&out, e.uuid);
    }
    // A Go map: one value per key (the last), keys in byte order.
    std::map<std::string_view, int64_t> sorted;
    for (const auto& [key, value] : e.scores) {
      sorted[key] = value;
    }
    if (!sorted.empty()) {
      if (!e.uuid.empty()) {
        out += ',';
      }
      out += "\"score\":{";
      bool first = true;
      for (const auto& [key, value] : sorted) {
        if (!first) {
          out += ',';
        }
        first = false;
        json::AppendGoString(&out, key);
        out += ':';
        out += std::to_string(value);
      }
      out += '}';
    }
    out += '}';
  }
  out += ']';
  return out;
}

std::vector<int64_t> PairScoreMatrix(const std::vector<DeviceInfo>& devices,
                                     const std::vector<GpuPairScores>& scores) {
  const size_t n = devices.size();
  if (n > kMaxScoredDevices) {
    return {};  // scores ignored: the matrix would be too large (see the header)
  }
  // Device ids by position, sorted for lookup (ids are unique within a registration).
  std::vector<std::pair<std::string_view, size_t>> by_id;
  by_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    by_id.emplace_back(devices[i].id, i);
  }
  std::sort(by_id.begin(), by_id.end());
  auto find = [&by_id](std::string_view id) -> std::optional<size_t> {
    auto it =
        std::lower_bound(by_id.begin(), by_id.end(), std::pair<std::string_view, size_t>(id, 0));
    if (it == by_id.end() || it->first != id) {
      return std::nullopt;
    }
    return it->second;
  };
  std::vector<int64_t> matrix(n * n, 0);
  std::vector<bool> seen(n, false);
  bool any = false;
  for (const GpuPairScores& e : scores) {
    std::optional<size_t> row = find(e.uuid);
    if (!row.has_value() || seen[*row]) {
      continue;  // no such device, or not the first element for it
    }
    seen[*row] = true;
    for (const auto& [key, value] : e.scores) {
      if (std::optional<size_t> col = find(key); col.has_value()) {
        matrix[*row * n + *col] = value;  // a repeated key: the last value stays
      }
    }
  }
  for (int64_t v : matrix) {
    any |= v != 0;
  }
  if (!any) {
    matrix.clear();
    matrix.shrink_to_fit();
  }
  return matrix;
}

}  // namespace tessera::device

#include "tessera/kube/pod_disruption_budget.h"

#include <string_view>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace tessera::kube {
namespace {

// A selector string separates terms with ',' and values with ',' inside "( )"; keys and values
// of valid labels use only these bytes.
bool SelectorSafe(std::string_view s) {
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == '/';
    if (!ok) {
      return false;
    }
  }
  return true;
}

absl::Status Bad(std::string_view what, std::string_view text) {
  return absl::InvalidArgumentError(
      fmt::format("label selector: {} \"{}\" cannot be written as a selector string", what,
                  text.substr(0, 64)));
}

}  // namespace

absl::StatusOr<std::string> SelectorText(const LabelSelector& selector) {
  std::string out;
  auto term = [&](std::string_view text) {
    if (!out.empty()) {
      out.push_back(',');
    }
    out.append(text);
  };
  for (const auto& [key, value] : selector.match_labels) {
    if (key.empty() || !SelectorSafe(key)) {
      return Bad("key", key);
    }
    if (!SelectorSafe(value)) {
      return Bad("value", value);
    }
    term(fmt::format("{}={}", key, value));
  }
  for (const LabelSelectorRequirement& r : selector.match_expressions) {
    if (r.key.empty() || !SelectorSafe(r.key)) {
      return Bad("key", r.key);
    }
    for (const std::string& v : r.values) {
      if (!SelectorSafe(v)) {
        return Bad("value", v);
      }
    }
    if (r.op == "In" || r.op == "NotIn") {
      if (r.values.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("label selector: {} {} needs values", r.key, r.op));
      }
      term(fmt::format("{} {} ({})", r.key, r.op == "In" ? "in" : "notin",
                       fmt::join(r.values, ",")));
    } else if (r.op == "Exists" || r.op == "DoesNotExist") {
      if (!r.values.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("label selector: {} {} takes no values", r.key, r.op));
      }
      term(r.op == "Exists" ? r.key : "!" + r.key);
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "label selector: unknown operator \"{}\" for key {}", r.op.substr(0, 32), r.key));
    }
  }
  return out;
}

}  // namespace tessera::kube

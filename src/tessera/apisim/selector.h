// File: tessera/apisim/selector.h
//
// Kubernetes label and field selectors as the API server parses them from the `labelSelector`
// and `fieldSelector` query parameters.
//
//   label:  k=v  k==v  k!=v  k in (a,b)  k notin (a,b)  k  !k  k>N  k<N   (comma = AND)
//   field:  k=v  k==v  k!=v                                                (comma = AND;
//           `\` escapes `,` `=` `\` in values)
//
// `!=`, `notin` and `!k` also match objects that lack the key. An empty selector matches
// everything. Parsing is total: any input yields a selector or an InvalidArgument naming the
// problem. Selectors are immutable values, safe to share between threads.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::apisim {

using Fields = std::map<std::string, std::string, std::less<>>;

class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist, kGreater, kLess };
  struct Requirement {
    std::string key;
    Op op = Op::kEquals;
    std::vector<std::string> values;
  };

  // Parses `text`; an error names the offending term.
  static absl::StatusOr<LabelSelector> Parse(std::string_view text);

  bool Matches(const Fields& labels) const;
  bool empty() const { return requirements_.empty(); }
  const std::vector<Requirement>& requirements() const { return requirements_; }

 private:
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  struct Term {
    std::string field;
    bool negated = false;  // `!=`
    std::string value;
  };

  static absl::StatusOr<FieldSelector> Parse(std::string_view text);

  // A missing field compares as the empty string (as the API server does).
  bool Matches(const Fields& fields) const;
  bool empty() const { return terms_.empty(); }
  const std::vector<Term>& terms() const { return terms_; }

 private:
  std::vector<Term> terms_;
};

}  // namespace tessera::apisim

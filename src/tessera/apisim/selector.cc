#include "tessera/apisim/selector.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/status/status.h"
#include "fmt/core.h"

namespace tessera::apisim {
namespace {

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_' || c == '/';
}

bool IsValueChar(char c) { return IsKeyChar(c) && c != '/'; }

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  bool Consume(std::string_view token) {
    if (s_.substr(pos_, token.size()) == token) {
      pos_ += token.size();
      return true;
    }
    return false;
  }
  std::string Read(bool (*pred)(char)) {
    size_t start = pos_;
    while (pos_ < s_.size() && pred(s_[pos_])) {
      ++pos_;
    }
    return std::string(s_.substr(start, pos_ - start));
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

absl::Status ValidateKey(std::string_view key) {
  if (key.empty() || key.size() > 317 || key.front() == '/' || key.back() == '/' ||
      std::count(key.begin(), key.end(), '/') > 1) {
    return absl::InvalidArgumentError(fmt::format("invalid label key \"{}\"", key));
  }
  return absl::OkStatus();
}

absl::Status ValidateValue(std::string_view value) {
  if (value.size() > 63) {
    return absl::InvalidArgumentError(
        fmt::format("invalid label value \"{}\": must be no more than 63 characters", value));
  }
  return absl::OkStatus();
}

bool ParseInt(const std::string& s, long long* out) {
  if (s.empty()) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) {
    return false;
  }
  *out = v;
  return true;
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector sel;
  Lexer lx(text);
  lx.SkipSpace();
  if (lx.AtEnd()) {
    return sel;
  }
  while (true) {
    lx.SkipSpace();
    Requirement req;
    bool negated_exists = lx.Consume("!");
    lx.SkipSpace();
    req.key = lx.Read(IsKeyChar);
    if (absl::Status s = ValidateKey(req.key); !s.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "unable to parse requirement at position {}: {}", lx.pos(), std::string(s.message())));
    }
    lx.SkipSpace();
    if (negated_exists) {
      req.op = Op::kDoesNotExist;
    } else if (lx.AtEnd() || lx.Peek() == ',') {
      req.op = Op::kExists;
    } else if (lx.Consume("!=")) {
      req.op = Op::kNotEquals;
    } else if (lx.Consume("==") || lx.Consume("=")) {
      req.op = Op::kEquals;
    } else if (lx.Consume(">")) {
      req.op = Op::kGreater;
    } else if (lx.Consume("<")) {
      req.op = Op::kLess;
    } else if (lx.Consume("notin")) {
      req.op = Op::kNotIn;
    } else if (lx.Consume("in")) {
      req.op = Op::kIn;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "unable to parse requirement: found '{}', expected an operator at position {}", lx.Peek(),
          lx.pos()));
    }
    lx.SkipSpace();
    switch (req.op) {
      case Op::kEquals:
      case Op::kNotEquals: {
        std::string v = lx.Read(IsValueChar);
        if (absl::Status s = ValidateValue(v); !s.ok()) {
          return s;
        }
        req.values.push_back(std::move(v));
        break;
      }
      case Op::kGreater:
      case Op::kLess: {
        std::string v = lx.Read(IsValueChar);
        long long unused = 0;
        if (!ParseInt(v, &unused)) {
          return absl::InvalidArgumentError(
              fmt::format("for 'Gt', 'Lt' operators, the value must be an integer, got \"{}\"", v));
        }
        req.values.push_back(std::move(v));
        break;
      }
      case Op::kIn:
      case Op::kNotIn: {
        if (!lx.Consume("(")) {
          return absl::InvalidArgumentError(
              fmt::format("found '{}', expected: '(' at position {}", lx.Peek(), lx.pos()));
        }
        while (true) {
          lx.SkipSpace();
          std::string v = lx.Read(IsValueChar);
          if (absl::Status s = ValidateValue(v); !s.ok()) {
            return s;
          }
          req.values.push_back(std::move(v));
          lx.SkipSpace();
          if (lx.Consume(")")) {
            break;
          }
          if (!lx.Consume(",")) {
            return absl::InvalidArgumentError(fmt::format(
                "found '{}', expected: ',' or ')' at position {}", lx.Peek(), lx.pos()));
          }
        }
        break;
      }
      case Op::kExists:
      case Op::kDoesNotExist:
        break;
    }
    sel.requirements_.push_back(std::move(req));
    lx.SkipSpace();
    if (lx.AtEnd()) {
      break;
    }
    if (!lx.Consume(",")) {
      return absl::InvalidArgumentError(fmt::format(
          "found '{}', expected: ',' or end of selector at position {}", lx.Peek(), lx.pos()));
    }
  }
  return sel;
}

bool LabelSelector::Matches(const Fields& labels) const {
  for (const Requirement& r : requirements_) {
    auto it = labels.find(r.key);
    const bool has = it != labels.end();
    switch (r.op) {
      case Op::kEquals:
        if (!has || it->second != r.values[0]) {
          return false;
        }
        break;
      case Op::kNotEquals:
        if (has && it->second == r.values[0]) {
          return false;
        }
        break;
      case Op::kIn:
        if (!has || std::find(r.values.begin(), r.values.end(), it->second) == r.values.end()) {
          return false;
        }
        break;
      case Op::kNotIn:
        if (has && std::find(r.values.begin(), r.values.end(), it->second) != r.values.end()) {
          return false;
        }
        break;
      case Op::kExists:
        if (!has) {
          return false;
        }
        break;
      case Op::kDoesNotExist:
        if (has) {
          return false;
        }
        break;
      case Op::kGreater:
      case Op::kLess: {
        long long have = 0;
        long long want = 0;
        if (!has || !ParseInt(it->second, &have) || !ParseInt(r.values[0], &want)) {
          return false;
        }
        if (r.op == Op::kGreater ? !(have > want) : !(have < want)) {
          return false;
        }
        break;
      }
    }
  }
  return true;
}

absl::StatusOr<FieldSelector> FieldSelector::Parse(std::string_view text) {
  FieldSelector sel;
  if (text.find_first_not_of(" \t") == std::string_view::npos) {
    return sel;
  }
  // Split on unescaped commas, keeping escapes for the next step.
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {
      parts.back() += c;
      parts.back() += text[++i];
    } else if (c == ',') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  for (const std::string& part : parts) {
    Term term;
    std::string* target = &term.field;
    bool found_op = false;
    for (size_t i = 0; i < part.size(); ++i) {
      char c = part[i];
      if (c == '\\') {
        if (i + 1 >= part.size()) {
          return absl::InvalidArgumentError(
              fmt::format("invalid field selector: trailing escape in \"{}\"", part));
        }
        char n = part[++i];
        if (n != '\\' && n != ',' && n != '=') {
          return absl::InvalidArgumentError(
              fmt::format("invalid field selector: invalid escape sequence \\{}", n));
        }
        *target += n;
        continue;
      }
      if (!found_op) {
        if (c == '!' && i + 1 < part.size() && part[i + 1] == '=') {
          term.negated = true;
          found_op = true;
          ++i;
          target = &term.value;
          continue;
        }
        if (c == '=') {
          found_op = true;
          if (i + 1 < part.size() && part[i + 1] == '=') {
            ++i;
          }
          target = &term.value;
          continue;
        }
      }
      *target += c;
    }
    // Trim spaces around the field name.
    auto b = term.field.find_first_not_of(' ');
    auto e = term.field.find_last_not_of(' ');
    term.field = b == std::string::npos ? "" : term.field.substr(b, e - b + 1);
    if (!found_op || term.field.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("invalid selector: '{}'; can't understand '{}'", text, part));
    }
    sel.terms_.push_back(std::move(term));
  }
  return sel;
}

bool FieldSelector::Matches(const Fields& fields) const {
  static const std::string kEmpty;
  for (const Term& t : terms_) {
    auto it = fields.find(t.field);
    const std::string& have = it == fields.end() ? kEmpty : it->second;
    if ((have == t.value) == t.negated) {
      return false;
    }
  }
  return true;
}

}  // namespace tessera::apisim

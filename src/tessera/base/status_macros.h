// File: tessera/base/status_macros.h
//
// Propagation macros for absl::Status and absl::StatusOr<T>, which Abseil 20220623 does not
// ship. Every Tessera library returns absl::Status / absl::StatusOr<T> across its boundary and
// uses these macros inside.
//
//   absl::Status DoThing() {
//     TESSERA_RETURN_IF_ERROR(Step1());
//     TESSERA_ASSIGN_OR_RETURN(auto value, Step2());
//     return absl::OkStatus();
//   }
//
// Thread safety: macros only; no state.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define TESSERA_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::absl::Status tessera_status_ = (expr); \
    if (!tessera_status_.ok()) {             \
      return tessera_status_;                \
    }                                        \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise assigns
// (moves) the value into `lhs`, which may be a declaration such as `auto x`.
#define TESSERA_ASSIGN_OR_RETURN(lhs, rexpr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_STATUS_CONCAT_(tessera_statusor_, __LINE__), lhs, rexpr)

// `statusor` is a name and `lhs` may be a declaration, so neither can be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TESSERA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) {                                      \
    return std::move(statusor).status();                     \
  }                                                          \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace tessera {

// Returns `status` with `prefix` and ": " prepended to its message, keeping the code. An OK
// status is returned unchanged. Used to add the object and field to a decoder's error.
absl::Status Annotate(const absl::Status& status, std::string_view prefix);

// The text of an errno value ("No such file or directory"), safe to call from any thread
// (std::strerror may share one buffer between threads).
std::string ErrnoText(int err);

}  // namespace tessera

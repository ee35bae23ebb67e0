// File: tessera/device/quantity.h
//
// Kubernetes resource quantities ("2", "500m", "1.5Gi", "1e3"), as they appear in container
// resources.limits / resources.requests. The accepted language is Kubernetes' documented grammar:
//
//   quantity  ::= [ "+" | "-" ] number suffix
//   number    ::= digits | digits "." | digits "." digits | "." digits
//   suffix    ::= "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"     (powers of 1000)
//               | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"                    (powers of 1024)
//               | ( "e" | "E" ) [ "+" | "-" ] digits                         (power of ten)
//
// Nothing else is accepted: no whitespace, no digitless numbers ("Gi", ".", "-"), no second
// point, no fractional exponent.
//
// Values are held exactly, as a whole number of nano-units (10^-9) — Kubernetes' resolution —
// with a sign. Like Kubernetes, a non-zero value finer than 1n is rounded up (away from zero) to
// the next nano-unit: "1e-12" is 1n. Unlike Kubernetes, which silently caps larger values, a
// value whose magnitude exceeds 2^63-1 units is rejected as out of range.
//
// Thread safety: Quantity is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::device {

// How a quantity was written; it selects the canonical rendering (ToString), like Kubernetes'
// Quantity.Format. It does not take part in comparisons.
enum class QuantityFormat {
  kDecimalSI,        // "", n, u, m, k, M, G, T, P, E
  kBinarySI,         // Ki, Mi, Gi, Ti, Pi, Ei
  kDecimalExponent,  // e3, E-2
};

class Quantity {
 public:
  // Zero, decimal SI.
  Quantity() = default;
  // `value` units; INT64_MIN, whose magnitude exceeds the maximum, becomes -(2^63-1).
  static Quantity FromInt64(int64_t value, QuantityFormat format = QuantityFormat::kDecimalSI);

  bool IsZero() const { return nanos_ == 0; }
  bool IsNegative() const { return negative_; }
  QuantityFormat format() const { return format_; }

  // The value as an integer, with the meaning of Kubernetes' Quantity.AsInt64 as HAMi uses it:
  // "2k" -> 2000, "1Gi" -> 1073741824, "-3" -> -3. Returns InvalidArgument when the value has a
  // fractional part ("500m", "1.5"); the message names the quantity. Never out of range, since
  // a Quantity's magnitude is at most 2^63-1.
  absl::StatusOr<int64_t> AsInt64() const;

  // The value in units rounded up (towards +infinity), Kubernetes' Quantity.Value as HAMi's
  // Ascend webhook uses it: "1.5" -> 2, "-1.5" -> -1, "100m" -> 1, "1Ki" -> 1024.
  int64_t Value() const;

  // The value in thousandths, rounded up (towards +infinity) like Kubernetes' MilliValue:
  // "1.5" -> 1500, "1n" -> 1. Returns OutOfRangeError when the result does not fit int64
  // (magnitudes of about 9.2e15 units and more).
  absl::StatusOr<int64_t> MilliValue() const;

  // Kubernetes' canonical form: the largest suffix of the quantity's format that keeps the
  // mantissa an integer ("1.5Gi" -> "1536Mi", "0.5" -> "500m", "1500" -> "1500", "1e3" -> "1e3",
  // "2000" -> "2k"). Binary quantities that are not whole or are below 1024 in magnitude are
  // rendered as decimal SI. ParseQuantity(q.ToString()) == q for every Quantity q.
  std::string ToString() const;

  // Value equality: "1Ki" == "1024" == "1.024k". The format is ignored.
  friend bool operator==(const Quantity& a, const Quantity& b) {
    return a.negative_ == b.negative_ && a.nanos_ == b.nanos_;
  }

 private:
  friend absl::StatusOr<Quantity> ParseQuantity(std::string_view text);

  // Magnitude in nano-units; at most (2^63-1) * 10^9. Zero is never negative.
  unsigned __int128 nanos_ = 0;
  bool negative_ = false;
  QuantityFormat format_ = QuantityFormat::kDecimalSI;
};

// Parses `text` (see the grammar above). Returns InvalidArgument naming the input and what is
// wrong (empty, no digits, unknown suffix, malformed exponent, ...), or OutOfRange when the
// magnitude exceeds 2^63-1 units.
absl::StatusOr<Quantity> ParseQuantity(std::string_view text);

// `text` quoted for an error message: printable ASCII kept, everything else escaped, inputs
// longer than 64 bytes shortened with "...". Shared by the device-config and request errors.
std::string QuoteForError(std::string_view text);

}  // namespace tessera::device

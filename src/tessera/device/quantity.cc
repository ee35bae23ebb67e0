#include "tessera/device/quantity.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace tessera::device {
namespace {

using u128 = unsigned __int128;

constexpr int64_t kNanosPerUnit = 1'000'000'000;
constexpr u128 kMaxUnits = static_cast<u128>(std::numeric_limits<int64_t>::max());
constexpr u128 kMaxNanos = kMaxUnits * kNanosPerUnit;
// kMaxNanos has 28 decimal digits: 9223372036854775807000000000.
constexpr int kMaxNanosDigits = 28;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string U128ToString(u128 v) {
  if (v == 0) {
    return "0";
  }
  std::string out;
  while (v != 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// The suffixes, read by both the parser and ToString: decimal SI ones are powers of 1000 from
// n (10^-9) to E (10^18), binary SI ones powers of 1024 from Ki to Ei.
constexpr std::string_view kDecimalSuffixes[] = {"n", "u", "m", "", "k", "M", "G", "T", "P", "E"};
constexpr int kDecimalSuffixMinExponent = -9;  // kDecimalSuffixes[i] is 10^(-9 + 3i)
constexpr std::string_view kBinarySuffixes[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};

struct Suffix {
  QuantityFormat format = QuantityFormat::kDecimalSI;
  int64_t decimal_exponent = 0;  // power of ten
  int binary_exponent = 0;       // power of two
};

// Interprets the text after the number. nullopt when it is not a suffix.
std::optional<Suffix> ParseSuffix(std::string_view s) {
  Suffix out;
  if (s.empty()) {
    return out;
  }
  for (size_t i = 0; i < std::size(kDecimalSuffixes); ++i) {
    if (s == kDecimalSuffixes[i]) {
      out.decimal_exponent = kDecimalSuffixMinExponent + 3 * static_cast<int>(i);
      return out;
    }
  }
  for (size_t i = 1; i < std::size(kBinarySuffixes); ++i) {
    if (s == kBinarySuffixes[i]) {
      out.format = QuantityFormat::kBinarySI;
      out.binary_exponent = 10 * static_cast<int>(i);
      return out;
    }
  }
  // A decimal exponent: [eE][+-]?digits, the digits fitting an int64 (as Kubernetes requires).
  // A lone "E" is exa (above); a lone "e" is nothing.
  if (s.size() < 2 || (s[0] != 'e' && s[0] != 'E')) {
    return std::nullopt;
  }
  size_t i = 1;
  bool negative = false;
  if (s[i] == '+' || s[i] == '-') {
    negative = s[i] == '-';
    ++i;
  }
  if (i == s.size()) {
    return std::nullopt;
  }
  u128 magnitude = 0;
  for (; i < s.size(); ++i) {
    if (!IsDigit(s[i])) {
      return std::nullopt;
    }
    magnitude = magnitude * 10 + static_cast<unsigned>(s[i] - '0');
    if (magnitude > static_cast<u128>(std::numeric_limits<int64_t>::max()) + 1) {
      return std::nullopt;
    }
  }
  if (!negative && magnitude > static_cast<u128>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  out.format = QuantityFormat::kDecimalExponent;
  out.decimal_exponent = negative ? static_cast<int64_t>(-static_cast<__int128>(magnitude))
                                  : static_cast<int64_t>(magnitude);
  return out;
}

// Multiplies the decimal digit string `digits` (most significant first) by two, in place.
void DoubleDigits(std::string& digits) {
  int carry = 0;
  for (size_t i = digits.size(); i-- > 0;) {
    int d = (digits[i] - '0') * 2 + carry;
    digits[i] = static_cast<char>('0' + d % 10);
    carry = d / 10;
  }
  if (carry != 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + carry));
  }
}

absl::Status Invalid(std::string_view text, std::string_view what) {
  return absl::InvalidArgumentError(
      fmt::format("invalid quantity {}: {}", QuoteForError(text), what));
}

absl::Status OutOfRange(std::string_view text) {
  return absl::OutOfRangeError(
      fmt::format("quantity {} is out of range: its magnitude exceeds 9223372036854775807 (2^63-1)",
                  QuoteForError(text)));
}

}  // namespace

std::string QuoteForError(std::string_view text) {
  constexpr size_t kMaxShown = 64;
  std::string out = "\"";
  std::string_view shown = text.substr(0, std::min(text.size(), kMaxShown));
  for (char c : shown) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  out.push_back('"');
  if (text.size() > kMaxShown) {
    out += fmt::format("... ({} bytes)", text.size());
  }
  return out;
}

Quantity Quantity::FromInt64(int64_t value, QuantityFormat format) {
  Quantity q;
  q.format_ = format;
  q.negative_ = value < 0;
  // |INT64_MIN| exceeds the maximum magnitude; clamp it to -(2^63-1) rather than overflow.
  u128 magnitude =
      value < 0 ? static_cast<u128>(-(static_cast<__int128>(value))) : static_cast<u128>(value);
  q.nanos_ = std::min(magnitude, kMaxUnits) * kNanosPerUnit;
  return q;
}

absl::StatusOr<Quantity> ParseQuantity(std::string_view text) {
  if (text.empty()) {
    return Invalid(text, "empty");
  }
  size_t i = 0;
  bool negative = false;
  if (text[0] == '+' || text[0] == '-') {
    negative = text[0] == '-';
    ++i;
  }
  size_t int_begin = i;
  while (i < text.size() && IsDigit(text[i])) {
    ++i;
  }
  std::string_view int_digits = text.substr(int_begin, i - int_begin);
  std::string_view frac_digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    size_t frac_begin = i;
    while (i < text.size() && IsDigit(text[i])) {
      ++i;
    }
    frac_digits = text.substr(frac_begin, i - frac_begin);
  }
  if (int_digits.empty() && frac_digits.empty()) {
    return Invalid(text, "no digits before the suffix");
  }
  std::string_view suffix_text = text.substr(i);
  std::optional<Suffix> suffix = ParseSuffix(suffix_text);
  if (!suffix.has_value()) {
    if (!suffix_text.empty() && (suffix_text[0] == 'e' || suffix_text[0] == 'E')) {
      return Invalid(text, fmt::format("malformed exponent {} (want e or E, an optional sign "
                                       "and whole decimal digits)",
                                       QuoteForError(suffix_text)));
    }
    return Invalid(text,
                   fmt::format("unknown suffix {} (want one of n u m k M G T P E, Ki Mi Gi Ti "
                               "Pi Ei, or a decimal exponent such as e3)",
                               QuoteForError(suffix_text)));
  }

  Quantity q;
  q.format_ = suffix->format;

  // All significant digits, without leading or trailing zeros; each stripped trailing zero
  // raises the decimal exponent by one.
  std::string digits;
  digits.reserve(int_digits.size() + frac_digits.size());
  digits.append(int_digits);
  digits.append(frac_digits);
  size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) {
    return q;  // zero, whatever the sign and suffix
  }
  size_t last = digits.find_last_not_of('0');
  size_t trailing_zeros = digits.size() - 1 - last;
  digits = digits.substr(first, last - first + 1);

  // value = digits * 10^exponent * 2^binary_exponent nano-units. Clamp the written exponent
  // so the arithmetic below cannot overflow; anything beyond the clamp is out of range (or
  // below 1n) either way, because the digit count is bounded by the input size.
  constexpr int64_t kExponentClamp = int64_t{1} << 50;
  int64_t exponent = std::clamp(suffix->decimal_exponent, -kExponentClamp, kExponentClamp) -
                     static_cast<int64_t>(frac_digits.size()) +
                     static_cast<int64_t>(trailing_zeros) + 9;
  auto n = static_cast<int64_t>(digits.size());
  q.negative_ = negative;

  // digits * 10^exponent >= 10^(n-1+exponent); 10^28 already exceeds the maximum.
  if (n - 1 + exponent >= kMaxNanosDigits) {
    return OutOfRange(text);
  }
  // digits * 10^exponent * 2^60 < 10^(n+exponent+19): when that is at most 1, the value is a
  // positive fraction of one nano-unit, which rounds up to 1n.
  if (n + exponent + 19 <= 0) {
    q.nanos_ = 1;
    return q;
  }
  // Fast path, which nearly every real quantity takes: nothing below the nano-unit, so the
  // value is an exact integer product. digits * 10^exponent < 10^28 fits 128 bits.
  if (n <= 19 && exponent >= 0) {
    u128 v = 0;
    for (char c : digits) {
      v = v * 10 + static_cast<unsigned>(c - '0');
    }
    for (int64_t e = 0; e < exponent; ++e) {
      v *= 10;
    }
    if (v > (kMaxNanos >> suffix->binary_exponent)) {
      return OutOfRange(text);
    }
    q.nanos_ = v << suffix->binary_exponent;
    return q;
  }
  for (int b = 0; b < suffix->binary_exponent; ++b) {
    DoubleDigits(digits);
  }
  bool round_up = false;
  if (exponent >= 0) {
    digits.append(static_cast<size_t>(exponent), '0');
  } else {
    auto drop = static_cast<size_t>(-exponent);
    if (drop >= digits.size()) {
      round_up = true;  // digits is non-zero
      digits = "0";
    } else {
      std::string_view dropped = std::string_view(digits).substr(digits.size() - drop);
      round_up = dropped.find_first_not_of('0') != std::string_view::npos;
      digits.resize(digits.size() - drop);
    }
  }
  if (static_cast<int64_t>(digits.size()) > kMaxNanosDigits) {
    return OutOfRange(text);
  }
  u128 nanos = 0;
  for (char c : digits) {
    nanos = nanos * 10 + static_cast<unsigned>(c - '0');
  }
  if (round_up) {
    ++nanos;
  }
  if (nanos > kMaxNanos) {
    return OutOfRange(text);
  }
  q.nanos_ = nanos;
  return q;
}

absl::StatusOr<int64_t> Quantity::AsInt64() const {
  if (nanos_ % kNanosPerUnit != 0) {
    return absl::InvalidArgumentError(
        fmt::format("quantity {} is not an integer", QuoteForError(ToString())));
  }
  auto units = static_cast<int64_t>(nanos_ / kNanosPerUnit);
  return negative_ ? -units : units;
}

absl::StatusOr<int64_t> Quantity::MilliValue() const {
  constexpr u128 kNanosPerMilli = 1'000'000;
  u128 millis = nanos_ / kNanosPerMilli;
  if (!negative_ && nanos_ % kNanosPerMilli != 0) {
    ++millis;  // towards +infinity; a negative value truncates towards zero, i.e. upwards
  }
  if (millis > static_cast<u128>(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(fmt::format(
        "quantity {} in thousandths does not fit a 64-bit integer", QuoteForError(ToString())));
  }
  auto m = static_cast<int64_t>(millis);
  return negative_ ? -m : m;
}

int64_t Quantity::Value() const {
  u128 units = nanos_ / kNanosPerUnit;
  if (!negative_ && nanos_ % kNanosPerUnit != 0) {
    ++units;  // towards +infinity; a negative value truncates towards zero, i.e. upwards
  }
  // The magnitude is at most 2^63-1 units, so the rounded-up value fits.
  auto v = static_cast<int64_t>(units);
  return negative_ ? -v : v;
}

std::string Quantity::ToString() const {
  if (nanos_ == 0) {
    return "0";
  }
  std::string sign = negative_ ? "-" : "";
  if (format_ == QuantityFormat::kBinarySI && nanos_ % kNanosPerUnit == 0 &&
      nanos_ >= u128{1024} * kNanosPerUnit) {
    u128 units = nanos_ / kNanosPerUnit;
    size_t k = 0;
    while (k + 1 < std::size(kBinarySuffixes) && units % 1024 == 0) {
      units /= 1024;
      ++k;
    }
    return sign + U128ToString(units) + std::string(kBinarySuffixes[k]);
  }
  // Decimal: mantissa * 10^exponent with the exponent a multiple of three, as large as keeps
  // the mantissa whole. The magnitude bound keeps the exponent at or below 18.
  u128 mantissa = nanos_;
  int exponent = kDecimalSuffixMinExponent;
  while (mantissa % 1000 == 0 && exponent < 18) {
    mantissa /= 1000;
    exponent += 3;
  }
  std::string suffix;
  if (format_ == QuantityFormat::kDecimalExponent) {
    suffix = exponent == 0 ? "" : fmt::format("e{}", exponent);
  } else {
    suffix = std::string(kDecimalSuffixes[(exponent - kDecimalSuffixMinExponent) / 3]);
  }
  return sign + U128ToString(mantissa) + suffix;
}

}  // namespace tessera::device

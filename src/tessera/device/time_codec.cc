// The time-carrying node annotations: hami.io/mutex.lock and hami.io/node-handshake. The
// layouts follow Go's time package: time.RFC3339, time.DateTime and time.Time.String().
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/civil_time.h"
#include <fmt/core.h>

#include "tessera/device/codec.h"
#include "tessera/device/codec_internal.h"

namespace tessera::device {
namespace {

using internal::Quote;

// Consumes exactly `width` ASCII digits from the front of `s`.
std::optional<int> TakeDigits(std::string_view& s, size_t width) {
  if (s.size() < width) {
    return std::nullopt;
  }
  int value = 0;
  for (size_t i = 0; i < width; ++i) {
    if (s[i] < '0' || s[i] > '9') {
      return std::nullopt;
    }
    value = value * 10 + (s[i] - '0');
  }
  s.remove_prefix(width);
  return value;
}

bool TakeChar(std::string_view& s, char c) {
  if (s.empty() || s.front() != c) {
    return false;
  }
  s.remove_prefix(1);
  return true;
}

bool IsLeap(int year) { return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0; }

int DaysIn(int year, int month) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && IsLeap(year) ? 29 : kDays[month - 1];
}

// "YYYY-MM-DD<sep>HH:MM:SS[.digits]" at the front of `s` as a UTC-naive instant (the caller
// applies the offset). Go accepts a fraction even when the layout has none; digits past the
// ninth are ignored.
std::optional<absl::Time> TakeCivil(std::string_view& s, char sep) {
  std::optional<int> year = TakeDigits(s, 4);
  if (!year || !TakeChar(s, '-')) {
    return std::nullopt;
  }
  std::optional<int> month = TakeDigits(s, 2);
  if (!month || *month < 1 || *month > 12 || !TakeChar(s, '-')) {
    return std::nullopt;
  }
  std::optional<int> day = TakeDigits(s, 2);
  if (!day || *day < 1 || *day > DaysIn(*year, *month) || !TakeChar(s, sep)) {
    return std::nullopt;
  }
  std::optional<int> hour = TakeDigits(s, 2);
  if (!hour || *hour > 23 || !TakeChar(s, ':')) {
    return std::nullopt;
  }
  std::optional<int> minute = TakeDigits(s, 2);
  if (!minute || *minute > 59 || !TakeChar(s, ':')) {
    return std::nullopt;
  }
  std::optional<int> second = TakeDigits(s, 2);
  if (!second || *second > 59) {
    return std::nullopt;
  }
  int64_t nanos = 0;
  if (s.size() >= 2 && s[0] == '.' && s[1] >= '0' && s[1] <= '9') {
    s.remove_prefix(1);
    int digits = 0;
    while (!s.empty() && s.front() >= '0' && s.front() <= '9') {
      if (digits < 9) {
        nanos = nanos * 10 + (s.front() - '0');
        ++digits;
      }
      s.remove_prefix(1);
    }
    for (; digits < 9; ++digits) {
      nanos *= 10;
    }
  }
  absl::CivilSecond civil(*year, *month, *day, *hour, *minute, *second);
  return absl::FromCivil(civil, absl::UTCTimeZone()) + absl::Nanoseconds(nanos);
}

// Go time.RFC3339 as time.Parse reads it.
std::optional<absl::Time> ParseRfc3339(std::string_view s) {
  std::optional<absl::Time> t = TakeCivil(s, 'T');
  if (!t) {
    return std::nullopt;
  }
  if (s == "Z") {
    return t;
  }
  bool negative = s.size() == 6 && s[0] == '-';
  if (s.size() != 6 || (s[0] != '+' && s[0] != '-')) {
    return std::nullopt;
  }
  s.remove_prefix(1);
  std::optional<int> hh = TakeDigits(s, 2);
  if (!hh || *hh > 23 || !TakeChar(s, ':')) {
    return std::nullopt;
  }
  std::optional<int> mm = TakeDigits(s, 2);
  if (!mm || *mm > 59) {
    return std::nullopt;
  }
  absl::Duration offset = absl::Hours(*hh) + absl::Minutes(*mm);
  return negative ? *t + offset : *t - offset;
}

// "<prefix>_<2006-01-02 15:04:05>" -> the time, read as UTC.
std::optional<absl::Time> ParseDateTimeAfterUnderscore(std::string_view rest) {
  if (!TakeChar(rest, '_')) {
    return std::nullopt;
  }
  std::optional<absl::Time> t = TakeCivil(rest, ' ');
  if (!t || !rest.empty()) {
    return std::nullopt;
  }
  return t;
}

// Go time.Time.String(): "2006-01-02 15:04:05.999999999 -0700 MST" plus an optional
// " m=±<seconds>" monotonic reading. The zone abbreviation is not interpreted.
std::optional<absl::Time> ParseGoTimeString(std::string_view s) {
  std::optional<absl::Time> t = TakeCivil(s, ' ');
  if (!t || !TakeChar(s, ' ') || s.empty() || (s[0] != '+' && s[0] != '-')) {
    return std::nullopt;
  }
  bool negative = s[0] == '-';
  s.remove_prefix(1);
  std::optional<int> hh = TakeDigits(s, 2);
  std::optional<int> mm = TakeDigits(s, 2);
  if (!hh || !mm || *hh > 23 || *mm > 59 || !TakeChar(s, ' ')) {
    return std::nullopt;
  }
  size_t zone_end = s.find(' ');
  std::string_view zone = s.substr(0, zone_end);
  if (zone.empty()) {
    return std::nullopt;
  }
  if (zone_end != std::string_view::npos && s.substr(zone_end).rfind(" m=", 0) != 0) {
    return std::nullopt;
  }
  absl::Duration offset = absl::Hours(*hh) + absl::Minutes(*mm);
  return negative ? *t + offset : *t - offset;
}

std::string FormatCivil(absl::Time time, char sep) {
  absl::CivilSecond c = absl::ToCivilSecond(time, absl::UTCTimeZone());
  return fmt::format("{:04d}-{:02d}-{:02d}{}{:02d}:{:02d}:{:02d}", c.year(), c.month(), c.day(),
                     sep, c.hour(), c.minute(), c.second());
}

}  // namespace

absl::StatusOr<NodeLock> ParseNodeLock(std::string_view value) {
  std::vector<std::string_view> parts = internal::Split(value, ',');
  if (parts.size() != 1 && parts.size() != 3) {
    return absl::InvalidArgumentError(
        fmt::format("node lock: want <RFC3339 time>,<namespace>,<name> or a bare time, got {} "
                    "comma-separated parts: {}",
                    parts.size(), Quote(value)));
  }
  std::optional<absl::Time> time = ParseRfc3339(parts[0]);
  if (!time) {
    return absl::InvalidArgumentError(
        fmt::format("node lock: time is not RFC 3339: {}", Quote(parts[0])));
  }
  NodeLock lock;
  lock.time = *time;
  if (parts.size() == 1) {
    lock.legacy = true;
    return lock;
  }
  if (parts[1].empty() || parts[2].empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "node lock: empty {}: {}", parts[1].empty() ? "namespace" : "name", Quote(value)));
  }
  lock.ns = std::string(parts[1]);
  lock.name = std::string(parts[2]);
  return lock;
}

std::string FormatNodeLock(absl::Time time, std::string_view ns, std::string_view name) {
  return fmt::format("{}Z,{},{}", FormatCivil(time, 'T'), ns, name);
}

bool NodeLockOwnedBy(const NodeLock& lock, std::string_view ns, std::string_view name) {
  return !lock.legacy && lock.ns == ns && lock.name == name;
}

Handshake ParseHandshake(std::string_view value) {
  Handshake h;
  if (value.empty()) {
    h.kind = HandshakeKind::kAbsent;
  } else if (value.rfind("Requesting", 0) == 0) {
    h.kind = HandshakeKind::kRequesting;
    h.time = ParseDateTimeAfterUnderscore(value.substr(10));
  } else if (value.rfind("Deleted", 0) == 0) {
    h.kind = HandshakeKind::kDeleted;
    h.time = ParseDateTimeAfterUnderscore(value.substr(7));
  } else if (value.rfind("Reported", 0) == 0) {
    h.kind = HandshakeKind::kReported;
    std::string_view rest = value.substr(8);
    if (TakeChar(rest, ' ')) {
      h.time = ParseGoTimeString(rest);
    }
  } else {
    h.kind = HandshakeKind::kOther;
  }
  return h;
}

std::string FormatHandshakeRequesting(absl::Time time) {
  return "Requesting_" + FormatCivil(time, ' ');
}

std::string FormatHandshakeDeleted(absl::Time time) { return "Deleted_" + FormatCivil(time, ' '); }

std::string FormatHandshakeReported(absl::Time time) {
  absl::Time floor =
      absl::FromCivil(absl::ToCivilSecond(time, absl::UTCTimeZone()), absl::UTCTimeZone());
  int64_t nanos = absl::ToInt64Nanoseconds(time - floor);
  std::string fraction;
  if (nanos > 0) {
    fraction = fmt::format(".{:09d}", nanos);
    while (fraction.back() == '0') {
      fraction.pop_back();
    }
  }
  return fmt::format("Reported {}{} +0000 UTC", FormatCivil(time, ' '), fraction);
}

}  // namespace tessera::device

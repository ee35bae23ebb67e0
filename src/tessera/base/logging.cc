#include "tessera/base/logging.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tessera/base/mutex.h"
#include "tessera/base/utf8.h"

namespace tessera {
namespace {

std::atomic<int> g_verbosity{0};
std::atomic<LogFormat> g_format{LogFormat::kText};

Mutex& SinkMutex() {
  static Mutex* mu = new Mutex();
  return *mu;
}

LogSink& Sink() ABSL_EXCLUSIVE_LOCKS_REQUIRED(SinkMutex()) {
  static LogSink* sink = new LogSink();
  return *sink;
}

constexpr char kSeverityLetters[] = {'I', 'W', 'E', 'F'};

const char* BaseName(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') {
      base = p + 1;
    }
  }
  return base;
}

// Appends `s` as a Go-quoted (text) or JSON string: quotes, backslashes and control bytes
// escaped, well-formed UTF-8 as it is; a byte that is not part of well-formed UTF-8 becomes
// \xNN in text (as Go's strconv.Quote writes it) and U+FFFD in JSON (as klog's JSON logger
// writes it), so that a JSON line stays valid whatever bytes a value carries (a request path).
void AppendQuoted(std::string* out, std::string_view s, bool json) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t n = base::Utf8SequenceLength(s.substr(i));
      if (n > 0) {
        out->append(s.substr(i, n));
        i += n;
      } else {
        out->append(json ? std::string("\\ufffd")
                         : fmt::format("\\x{:02x}", static_cast<unsigned char>(c)));
        ++i;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out->append(fmt::format("\\u{:04x}", static_cast<int>(c)));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

bool IsError(LogSeverity severity) {
  return severity == LogSeverity::kError || severity == LogSeverity::kFatal;
}

std::string FormatText(LogSeverity severity, const struct timespec& ts, const char* file, int line,
                       std::string_view message, bool structured,
                       const std::vector<logging_internal::Field>& fields) {
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  const long tid = static_cast<long>(syscall(SYS_gettid));
  std::string out =
      fmt::format("{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{}] ",
                  kSeverityLetters[static_cast<int>(severity)], tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, tid, BaseName(file), line);
  if (!structured) {
    out.append(message);
    return out;
  }
  AppendQuoted(&out, message, /*json=*/false);
  for (const logging_internal::Field& f : fields) {
    out.push_back(' ');
    out.append(f.key);
    out.push_back('=');
    if (f.quoted) {
      AppendQuoted(&out, f.value, /*json=*/false);
    } else {
      out.append(f.value);
    }
  }
  return out;
}

std::string FormatJson(LogSeverity severity, int v, const struct timespec& ts, const char* file,
                       int line, std::string_view message,
                       const std::vector<logging_internal::Field>& fields) {
  std::string out = fmt::format("{{\"ts\":{}.{:06},\"caller\":", static_cast<int64_t>(ts.tv_sec),
                                ts.tv_nsec / 1000);
  AppendQuoted(&out, fmt::format("{}:{}", BaseName(file), line), /*json=*/true);
  out.append(",\"msg\":");
  AppendQuoted(&out, message, /*json=*/true);
  const logging_internal::Field* err = nullptr;
  for (const logging_internal::Field& f : fields) {
    if (f.key == "err") {
      err = &f;
    }
  }
  if (IsError(severity)) {
    out.append(",\"err\":");
    if (err != nullptr) {
      AppendQuoted(&out, err->value, /*json=*/true);
    } else {
      out.append("null");
    }
  } else {
    out.append(fmt::format(",\"v\":{}", v));
  }
  for (const logging_internal::Field& f : fields) {
    if (&f == err && IsError(severity)) {
      continue;
    }
    out.push_back(',');
    AppendQuoted(&out, f.key, /*json=*/true);
    out.push_back(':');
    if (f.quoted) {
      AppendQuoted(&out, f.value, /*json=*/true);
    } else {
      out.append(f.value);
    }
  }
  out.push_back('}');
  return out;
}

}  // namespace

void SetLogVerbosity(int v) { g_verbosity.store(v, std::memory_order_relaxed); }
int LogVerbosity() { return g_verbosity.load(std::memory_order_relaxed); }

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") {
    return LogFormat::kText;
  }
  if (name == "json") {
    return LogFormat::kJson;
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown logging format \"{}\": want text or json", name));
}

void SetLogFormat(LogFormat format) { g_format.store(format, std::memory_order_relaxed); }
LogFormat GetLogFormat() { return g_format.load(std::memory_order_relaxed); }

LogSink SetLogSink(LogSink sink) {
  MutexLock lock(&SinkMutex());
  LogSink previous = std::move(Sink());
  Sink() = std::move(sink);
  return previous;
}

namespace logging_internal {

void Emit(LogSeverity severity, int v, const char* file, int line, std::string_view message,
          bool structured, const std::vector<Field>& fields) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  std::string text = GetLogFormat() == LogFormat::kJson
                         ? FormatJson(severity, v, ts, file, line, message, fields)
                         : FormatText(severity, ts, file, line, message, structured, fields);
  MutexLock lock(&SinkMutex());
  if (Sink()) {
    Sink()(severity, text);
    return;
  }
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

void Emit(LogSeverity severity, const char* file, int line, std::string_view message) {
  Emit(severity, 0, file, line, message, false, {});
}

void EmitFatal(const char* file, int line, std::string_view message) {
  Emit(LogSeverity::kFatal, file, line, message);
  std::abort();
}

}  // namespace logging_internal
}  // namespace tessera

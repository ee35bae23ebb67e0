// File: tessera/base/logging.h
//
// klog-style logging, in klog's two formats (--logging-format, as every kube component has it).
// Text (the default) has the layout Kubernetes operators know:
//
//   I1202 13:34:07.494821   12345 ledger.cc:88] node gpu-1 device GPU-abc: 4096 MiB free
//   I1202 13:34:07.494900   12345 scheduler.cc:90] "filter" pod="ml/train" candidates=3
//
// (severity letter, month and day, UTC wall time with microseconds, thread id, file:line,
// message). JSON is klog's JSON shape, one object per line:
//
//   {"ts":1764682447.494821,"caller":"ledger.cc:88","msg":"node gpu-1 ...","v":0}
//   {"ts":1764682447.4949,"caller":"scheduler.cc:90","msg":"filter","v":2,"pod":"ml/train",
//    "candidates":3}
//   {"ts":1764682447.5,"caller":"service.cc:12","msg":"watch failed","err":"UNAVAILABLE: ..."}
//
// ts is Unix time in seconds; "v" is the line's verbosity (0 for TESSERA_LOG, n for
// TESSERA_VLOG(n)); an error line has no "v" but "err" (its "err" key/value, else null).
// Warnings are info lines at v=0, as klog's JSON logger has it. Messages use fmt syntax:
//
//   TESSERA_LOG(kInfo, "node {} has {} free devices", node, n);
//   TESSERA_VLOG(2, "filter took {} us", micros);     // shown only with verbosity >= 2
//
// Structured lines (klog's InfoS / ErrorS) carry a constant message and key/value pairs: strings
// are quoted (Go-style escapes in text), numbers and bools are not:
//
//   TESSERA_VLOGS(2, "filter", "pod", pod, "candidates", n);
//   TESSERA_LOGS(kError, "watch failed", "err", status.ToString(), "resource", "pods");
//
// Lines go to stderr unless a sink is installed (tests install one to capture lines). Never log
// a bearer token, a private key or a client certificate. A VLOG above the verbosity costs one
// relaxed atomic load: its arguments are not evaluated.
//
// Thread safety: every function here is safe to call from any thread; one line is written
// atomically with respect to other lines.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include <fmt/core.h>

namespace tessera {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Lines with a verbosity above this are dropped. Default 0 (only TESSERA_LOG and TESSERA_VLOG(0)).
void SetLogVerbosity(int v);
int LogVerbosity();

enum class LogFormat { kText, kJson };
// --logging-format's values: "text" and "json"; anything else is InvalidArgument.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);
// Default kText. Applies to every line emitted after the call.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();

// Installs a sink that receives each formatted line (without the trailing newline) instead of
// stderr. Pass nullptr to restore stderr. Returns the previous sink.
using LogSink = std::function<void(LogSeverity, std::string_view line)>;
LogSink SetLogSink(LogSink sink);

namespace logging_internal {

// One key/value of a structured line; `quoted` for strings, false for numbers and bools.
struct Field {
  std::string_view key;
  std::string value;
  bool quoted = true;
};

template <typename T>
Field MakeField(std::string_view key, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return {key, value ? "true" : "false", false};
  } else if constexpr (std::is_arithmetic_v<T>) {
    return {key, fmt::format("{}", value), false};
  } else {
    return {key, fmt::format("{}", value), true};
  }
}

inline void AppendFields(std::vector<Field>&) {}
template <typename V, typename... Rest>
void AppendFields(std::vector<Field>& out, std::string_view key, const V& value,
                  const Rest&... rest) {
  out.push_back(MakeField(key, value));
  AppendFields(out, rest...);
}

template <typename... KeyValues>
std::vector<Field> Fields(const KeyValues&... kv) {
  static_assert(sizeof...(KeyValues) % 2 == 0, "key/value pairs: an even number of arguments");
  std::vector<Field> out;
  out.reserve(sizeof...(KeyValues) / 2);
  AppendFields(out, kv...);
  return out;
}

// `v`: the line's verbosity level. `structured`: the message is a constant and `fields` its
// key/values (text quotes the message); else `message` is already formatted and `fields` empty.
void Emit(LogSeverity severity, int v, const char* file, int line, std::string_view message,
          bool structured, const std::vector<Field>& fields);
void Emit(LogSeverity severity, const char* file, int line, std::string_view message);
[[noreturn]] void EmitFatal(const char* file, int line, std::string_view message);
}  // namespace logging_internal

}  // namespace tessera

#define TESSERA_LOG(severity, ...)                                                        \
  ::tessera::logging_internal::Emit(::tessera::LogSeverity::severity, __FILE__, __LINE__, \
                                    ::fmt::format(__VA_ARGS__))

#define TESSERA_VLOG(level, ...)                                                          \
  do {                                                                                    \
    if (::tessera::LogVerbosity() >= (level)) {                                           \
      ::tessera::logging_internal::Emit(::tessera::LogSeverity::kInfo, (level), __FILE__, \
                                        __LINE__, ::fmt::format(__VA_ARGS__), false, {}); \
    }                                                                                     \
  } while (false)

// Structured: TESSERA_LOGS(kInfo, "message", "key", value, ...).
#define TESSERA_LOGS(severity, message, ...)                                                 \
  ::tessera::logging_internal::Emit(::tessera::LogSeverity::severity, 0, __FILE__, __LINE__, \
                                    (message), true,                                         \
                                    ::tessera::logging_internal::Fields(__VA_ARGS__))

#define TESSERA_VLOGS(level, message, ...)                                                 \
  do {                                                                                     \
    if (::tessera::LogVerbosity() >= (level)) {                                            \
      ::tessera::logging_internal::Emit(::tessera::LogSeverity::kInfo, (level), __FILE__,  \
                                        __LINE__, (message), true,                         \
                                        ::tessera::logging_internal::Fields(__VA_ARGS__)); \
    }                                                                                      \
  } while (false)

// Crashes with a message when `cond` is false. For impossible environment failures only (thread
// creation, memory); never for input, which gets a Status.
#define TESSERA_CHECK(cond)                                                               \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::tessera::logging_internal::EmitFatal(__FILE__, __LINE__, "check failed: " #cond); \
    }                                                                                     \
  } while (false)

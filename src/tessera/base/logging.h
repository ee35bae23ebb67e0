// File: tessera/base/logging.h
//
// klog-style logging. Every line has the layout Kubernetes operators know:
//
//   I1202 13:34:07.494821   12345 ledger.cc:88] node gpu-1 device GPU-abc: 4096 MiB free
//
// (severity letter, month and day, wall time with microseconds, thread id, file:line, message).
// Messages use fmt syntax:
//
//   TESSERA_LOG(kInfo, "node {} has {} free devices", node, n);
//   TESSERA_VLOG(2, "filter took {} us", micros);     // shown only with verbosity >= 2
//
// Lines go to stderr unless a sink is installed (tests install one to capture lines). Never log
// a bearer token, a private key or a client certificate.
//
// Thread safety: every function here is safe to call from any thread; one line is written
// atomically with respect to other lines.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <fmt/core.h>

namespace tessera {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Lines with a verbosity above this are dropped. Default 0 (only TESSERA_LOG and TESSERA_VLOG(0)).
void SetLogVerbosity(int v);
int LogVerbosity();

// Installs a sink that receives each formatted line (without the trailing newline) instead of
// stderr. Pass nullptr to restore stderr. Returns the previous sink.
using LogSink = std::function<void(LogSeverity, std::string_view line)>;
LogSink SetLogSink(LogSink sink);

namespace logging_internal {
void Emit(LogSeverity severity, const char* file, int line, std::string_view message);
[[noreturn]] void EmitFatal(const char* file, int line, std::string_view message);
}  // namespace logging_internal

}  // namespace tessera

#define TESSERA_LOG(severity, ...)                                                        \
  ::tessera::logging_internal::Emit(::tessera::LogSeverity::severity, __FILE__, __LINE__, \
                                    ::fmt::format(__VA_ARGS__))

#define TESSERA_VLOG(level, ...)                \
  do {                                          \
    if (::tessera::LogVerbosity() >= (level)) { \
      TESSERA_LOG(kInfo, __VA_ARGS__);          \
    }                                           \
  } while (false)

// Crashes with a message when `cond` is false. For impossible environment failures only (thread
// creation, memory); never for input, which gets a Status.
#define TESSERA_CHECK(cond)                                                               \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::tessera::logging_internal::EmitFatal(__FILE__, __LINE__, "check failed: " #cond); \
    }                                                                                     \
  } while (false)

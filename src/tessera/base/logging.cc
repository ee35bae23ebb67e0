#include "tessera/base/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tessera/base/mutex.h"

namespace tessera {
namespace {

std::atomic<int> g_verbosity{0};

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

std::string FormatLine(LogSeverity severity, const char* file, int line, std::string_view message) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  const long tid = static_cast<long>(syscall(SYS_gettid));
  return fmt::format("{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{}] {}",
                     kSeverityLetters[static_cast<int>(severity)], tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, tid, BaseName(file), line,
                     message);
}

}  // namespace

void SetLogVerbosity(int v) { g_verbosity.store(v, std::memory_order_relaxed); }
int LogVerbosity() { return g_verbosity.load(std::memory_order_relaxed); }

LogSink SetLogSink(LogSink sink) {
  MutexLock lock(&SinkMutex());
  LogSink previous = std::move(Sink());
  Sink() = std::move(sink);
  return previous;
}

namespace logging_internal {

void Emit(LogSeverity severity, const char* file, int line, std::string_view message) {
  std::string text = FormatLine(severity, file, line, message);
  MutexLock lock(&SinkMutex());
  if (Sink()) {
    Sink()(severity, text);
    return;
  }
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

void EmitFatal(const char* file, int line, std::string_view message) {
  Emit(LogSeverity::kFatal, file, line, message);
  std::abort();
}

}  // namespace logging_internal
}  // namespace tessera

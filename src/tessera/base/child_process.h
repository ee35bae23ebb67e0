// File: tessera/base/child_process.h
//
// A child process that announces itself on its first stdout line, as `tessera apisim` and
// `tessera serve` do ("listening on URL"): spawned with posix_spawn (safe while other threads
// run), stdin from /dev/null, stderr appended to a log file (or inherited), stdout read until its
// first line, then drained by a thread so the child never blocks on a full pipe. Used by
// `tessera simulate` (sim/simulation.cc) and by the tests' ApisimProcess (testing/).
//
//   ChildProcess p;
//   absl::StatusOr<std::string> line = p.Start("/proc/self/exe", {"apisim", ...}, "apisim.log");
//   p.Signal(SIGKILL); p.Stop();
//
// Thread safety: one thread drives a ChildProcess.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `binary args...` and returns its first stdout line (without the line end).
  // Unavailable when it exits or says nothing within `timeout` (the log file then tells why);
  // the process is then reaped. An empty `log_path` leaves the child this process's stderr.
  absl::StatusOr<std::string> Start(const std::string& binary, const std::vector<std::string>& args,
                                    const std::string& log_path,
                                    absl::Duration timeout = absl::Seconds(30));
  // The running process's ID (-1 when none).
  pid_t pid() const { return pid_; }
  // Sends `sig` (no-op when not running).
  void Signal(int sig);
  // SIGTERM, up to `grace` for it to exit, then SIGKILL; reaps. Returns the wait status or -1.
  int Stop(absl::Duration grace = absl::Seconds(10));
  // SIGKILL and reap.
  void Kill();
  bool running() const { return pid_ > 0; }
  // Whether the process has exited (reaps it then).
  bool Exited();

 private:
  void Reap(int* status);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::thread drain_;
};

}  // namespace tessera

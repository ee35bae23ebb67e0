// File: tessera/kube/apisim_process_testutil.h
//
// Test-only: runs `tessera apisim` as a subprocess for the kube integration tests.
//
//   ApisimProcess sim;
//   std::string url = sim.Start(ApisimProcess::DefaultBinary(), {"--token", "t"});
//   ...
//   sim.Stop();  // SIGTERM (the simulator saves --state), then SIGKILL after a deadline
//
// Start() spawns the simulator with posix_spawn (safe while other threads run), waits at most
// `timeout` for its first stdout line "listening on URL" and returns URL, or "" when the binary
// is missing, the process exits or the line does not come in time (the process is then killed).
// Stop() and the destructor always reap the process: SIGTERM, wait up to 10 s, then SIGKILL.
//
// The simulator binary: $TESSERA_APISIM_BIN, else TESSERA_DEFAULT_APISIM_BIN (the tessera binary
// of the build tree, a build dependency of the test).
//
// Thread safety: none; one test thread drives an ApisimProcess.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <spawn.h>

#ifndef TESSERA_DEFAULT_APISIM_BIN
#define TESSERA_DEFAULT_APISIM_BIN ""
#endif

extern char** environ;

namespace tessera::kube::testutil {

class ApisimProcess {
 public:
  ApisimProcess() = default;
  ~ApisimProcess() { Stop(); }
  ApisimProcess(const ApisimProcess&) = delete;
  ApisimProcess& operator=(const ApisimProcess&) = delete;

  static std::string DefaultBinary() {
    const char* env = getenv("TESSERA_APISIM_BIN");
    return env != nullptr ? env : TESSERA_DEFAULT_APISIM_BIN;
  }

  // Runs `binary apisim [--listen 127.0.0.1:0 unless args has --listen] args...`.
  std::string Start(const std::string& binary, const std::vector<std::string>& args = {},
                    absl::Duration timeout = absl::Seconds(20)) {
    Stop();
    if (binary.empty() || access(binary.c_str(), X_OK) != 0) {
      return "";
    }
    std::vector<std::string> argv_s = {binary, "apisim"};
    bool has_listen = false;
    for (const std::string& a : args) {
      has_listen = has_listen || a == "--listen";
    }
    if (!has_listen) {
      argv_s.push_back("--listen");
      argv_s.push_back("127.0.0.1:0");
    }
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) {
      return "";
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      return "";
    }
    pid_ = pid;
    out_fd_ = fds[0];
    std::string line;
    const absl::Time deadline = absl::Now() + timeout;
    while (line.find('\n') == std::string::npos) {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) {
        Kill();
        return "";
      }
      pollfd p = {out_fd_, POLLIN, 0};
      const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (n < 0 && errno != EINTR) {
        Kill();
        return "";
      }
      if (n <= 0) {
        continue;
      }
      char buf[256];
      const ssize_t got = read(out_fd_, buf, sizeof(buf));
      if (got <= 0) {  // the process closed stdout: it exited
        Kill();
        return "";
      }
      line.append(buf, static_cast<size_t>(got));
    }
    line = line.substr(0, line.find('\n'));
    while (!line.empty() && line.back() == '\r') {
      line.pop_back();
    }
    const std::string prefix = "listening on ";
    if (line.rfind(prefix, 0) != 0) {
      Kill();
      return "";
    }
    return line.substr(prefix.size());
  }

  // The running process's ID (-1 when none).
  pid_t pid() const { return pid_; }

  // SIGTERM, then SIGKILL when the process has not exited within `grace`. Returns the exit
  // status as waitpid reports it (-1 when nothing was running).
  int Stop(absl::Duration grace = absl::Seconds(10)) {
    int status = -1;
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      const absl::Time deadline = absl::Now() + grace;
      while (true) {
        const pid_t r = waitpid(pid_, &status, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) {
          break;
        }
        if (absl::Now() >= deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      pid_ = -1;
    }
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
    return status;
  }

  bool running() const { return pid_ > 0; }

 private:
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
};

}  // namespace tessera::kube::testutil

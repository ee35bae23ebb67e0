#include "tessera/base/child_process.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include <fmt/core.h>
#include <spawn.h>

extern char** environ;

namespace tessera {

ChildProcess::~ChildProcess() { Stop(absl::Seconds(5)); }

absl::StatusOr<std::string> ChildProcess::Start(const std::string& binary,
                                                const std::vector<std::string>& args,
                                                const std::string& log_path,
                                                absl::Duration timeout) {
  Stop();
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_s.size() + 1);
  for (std::string& a : argv_s) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // The child must not inherit the parent's blocked signals (serve blocks SIGTERM itself).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::UnavailableError(fmt::format("cannot start {}: errno {}", binary, rc));
  }
  pid_ = pid;
  out_fd_ = fds[0];
  std::string line;
  const absl::Time deadline = absl::Now() + timeout;
  while (line.find('\n') == std::string::npos) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      Kill();
      return absl::UnavailableError(fmt::format("{} said nothing within {} (see {})",
                                                args.empty() ? binary : args[0],
                                                absl::FormatDuration(timeout), log_path));
    }
    pollfd p = {out_fd_, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200)));
    if (n < 0 && errno != EINTR) {
      Kill();
      return absl::InternalError("poll failed");
    }
    if (n <= 0) {
      continue;
    }
    char buf[512];
    const ssize_t got = read(out_fd_, buf, sizeof(buf));
    if (got <= 0) {
      Kill();
      return absl::UnavailableError(
          fmt::format("{} exited at start (see {})", args.empty() ? binary : args[0], log_path));
    }
    line.append(buf, static_cast<size_t>(got));
  }
  line = line.substr(0, line.find('\n'));
  while (!line.empty() && line.back() == '\r') {
    line.pop_back();
  }
  const int fd = out_fd_;
  drain_ = std::thread([fd] {
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  });
  return line;
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) {
    kill(pid_, sig);
  }
}

void ChildProcess::Reap(int* status) {
  if (pid_ > 0) {
    while (waitpid(pid_, status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  if (drain_.joinable()) {
    drain_.join();  // the pipe reaches EOF once the child (its only writer) is gone
  }
  if (out_fd_ >= 0) {
    close(out_fd_);
    out_fd_ = -1;
  }
}

bool ChildProcess::Exited() {
  if (pid_ <= 0) {
    return true;
  }
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    Reap(&status);
    return true;
  }
  return false;
}

int ChildProcess::Stop(absl::Duration grace) {
  int status = -1;
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    while (true) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) {
        pid_ = -1;
        break;
      }
      if (absl::Now() >= deadline) {
        kill(pid_, SIGKILL);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  Reap(&status);
  return status;
}

void ChildProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
  }
  int status = 0;
  Reap(&status);
}

}  // namespace tessera

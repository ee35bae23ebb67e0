#include "tessera/sim/control_plane.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include <fmt/core.h>
#include <spawn.h>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"

extern char** environ;

namespace tessera::sim {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shell-quoted word for DIR/NAME.cmd (the script reads it back with `eval`).
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The command lines of every process naming `needle` (this process excluded).
std::vector<std::string> ProcessesNaming(const std::string& needle) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos ||
        std::atoi(pid.c_str()) == getpid()) {
      continue;
    }
    std::string cmdline = ReadAll(e.path().string() + "/cmdline");
    for (char& c : cmdline) {
      if (c == '\0') {
        c = ' ';
      }
    }
    const std::string stat = ReadAll(e.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') {
      continue;  // a zombie holds nothing
    }
    if (cmdline.find(needle) != std::string::npos) {
      std::string line = pid;
      line += ": ";
      line += cmdline;
      out.push_back(std::move(line));
    }
  }
  return out;
}

// A port of 127.0.0.1 free at this moment (bound to 0, read back, released).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return absl::InternalError(fmt::format("socket: errno {}", errno));
  }
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  if (port <= 0) {
    return absl::InternalError("no free port on 127.0.0.1");
  }
  return port;
}

// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool Listening(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return false;
  }
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// `text` with every `from` replaced by `to`; NotFound when there is none.
absl::StatusOr<std::string> ReplaceAll(std::string text, const std::string& from,
                                       const std::string& to, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos)) {
    text.replace(pos, from.size(), to);
    pos += to.size();
    ++n;
  }
  if (n == 0) {
    return absl::NotFoundError(fmt::format("{} does not name {}", what, from));
  }
  return text;
}

}  // namespace

absl::StatusOr<ControlPlaneEnv> ParseControlPlaneEnv(const std::string& text) {
  ControlPlaneEnv env;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      continue;
    }
    const std::string key(line.substr(0, eq));
    const std::string value(line.substr(eq + 1));
    if (key == "CONTROLPLANE_DIR") {
      env.dir = value;
    } else if (key == "KUBECONFIG") {
      env.kubeconfig = value;
    } else if (key == "APISERVER_PORT") {
      env.apiserver_port = std::atoi(value.c_str());
    } else if (key == "TESSERA_PORT") {
      env.tessera_port = std::atoi(value.c_str());
    } else if (key == "TESSERA_METRICS_PORT") {
      env.metrics_port = std::atoi(value.c_str());
    }
  }
  if (env.kubeconfig.empty() || env.apiserver_port <= 0 || env.tessera_port <= 0 ||
      env.metrics_port <= 0) {
    return absl::InvalidArgumentError(
        "the control plane's env lacks KUBECONFIG, APISERVER_PORT, TESSERA_PORT or "
        "TESSERA_METRICS_PORT");
  }
  return env;
}

std::vector<std::string> DefaultControlPlaneScripts() {
  std::vector<std::string> out;
#ifdef TESSERA_SOURCE_DIR
  out.emplace_back(TESSERA_SOURCE_DIR "/tools/controlplane.sh");
#endif
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (!ec) {
    out.push_back((cwd / "tools/controlplane.sh").string());
  }
  return out;
}

absl::StatusOr<std::string> FindControlPlaneScript(const std::string& flag,
                                                   const std::vector<std::string>& candidates) {
  std::error_code ec;
  if (!flag.empty()) {
    if (!std::filesystem::is_regular_file(flag, ec)) {
      return absl::NotFoundError(
          fmt::format("--controlplane-script {}: no such file (want tools/controlplane.sh of a "
                      "Tessera checkout)",
                      flag));
    }
    return flag;
  }
  std::string tried;
  for (const std::string& c : candidates) {
    if (std::filesystem::is_regular_file(c, ec)) {
      return c;
    }
    tried += (tried.empty() ? "" : ", ") + c;
  }
  return absl::NotFoundError(fmt::format(
      "tools/controlplane.sh not found (tried {}): pass --controlplane-script PATH to the "
      "script of a Tessera checkout (docs/e2e.md)",
      tried));
}

absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv, const std::string& log,
                               absl::Duration timeout, const std::atomic<bool>* interrupt,
                               Clock* clock) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::FailedPreconditionError(fmt::format(
        "cannot run {}: {}", argv[0], std::error_code(rc, std::generic_category()).message()));
  }
  const absl::Time deadline = clock->Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
      }
      return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
    if (w < 0 && errno != EINTR) {
      return absl::InternalError(fmt::format("waitpid for {}: errno {}", argv[0], errno));
    }
    const bool interrupted = interrupt != nullptr && interrupt->load();
    if (clock->Now() >= deadline || interrupted) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      std::string cmd;
      for (const std::string& a : argv) {
        cmd += (cmd.empty() ? "" : " ") + a;
      }
      if (interrupted) {
        return absl::CancelledError(fmt::format("`{}` interrupted and killed", cmd));
      }
      return absl::DeadlineExceededError(
          fmt::format("`{}` did not finish within {} and was killed (read {})", cmd,
                      absl::FormatDuration(timeout), log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

RealControlPlane::RealControlPlane(std::string script, std::string dir, std::string log,
                                   const std::atomic<bool>* interrupt, Clock* clock)
    : script_(std::move(script)),
      dir_(std::move(dir)),
      log_(std::move(log)),
      interrupt_(interrupt),
      clock_(clock) {}

RealControlPlane::~RealControlPlane() {
  absl::Status s = Down();
  if (!s.ok()) {
    TESSERA_LOG(kError, "simulate: {}", s.ToString());
  }
}

absl::Status RealControlPlane::Script(const std::vector<std::string>& args, absl::Duration timeout,
                                      bool interruptible) {
  std::vector<std::string> argv = {"/bin/bash", script_};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string cmd = "tools/controlplane.sh";
  for (const std::string& a : args) {
    cmd += " " + a;
  }
  { std::ofstream(log_, std::ios::app) << "--- tessera simulate runs: " << cmd << "\n"; }
  absl::StatusOr<int> rc;
  {
    MutexLock l(&mu_);
    rc = RunCommand(argv, log_, timeout, interruptible ? interrupt_ : nullptr, clock_);
  }
  if (!rc.ok()) {
    return rc.status();
  }
  if (*rc != 0) {
    return absl::FailedPreconditionError(
        fmt::format("`{}` failed (exit {}); read {}", cmd, *rc, log_));
  }
  return absl::OkStatus();
}

absl::Status RealControlPlane::Up(const std::string& tessera,
                                  const std::vector<std::string>& up_args) {
  std::vector<std::string> args = {"up", "--tessera", tessera};
  args.insert(args.end(), up_args.begin(), up_args.end());
  args.push_back(dir_);
  up_ = true;  // from here on, Down() has something to stop (up cleans up its own failure too)
  // A first build of etcd, kube-apiserver and kube-scheduler takes minutes on 2 cores.
  absl::Status s = Script(args, absl::Minutes(30));
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        fmt::format("the real control plane did not start: {}", std::string(s.message())));
  }
  absl::StatusOr<ControlPlaneEnv> env = ParseControlPlaneEnv(ReadAll(dir_ + "/env"));
  if (!env.ok()) {
    return absl::FailedPreconditionError(
        fmt::format("{}/env: {}", dir_, std::string(env.status().message())));
  }
  env_ = *env;
  return absl::OkStatus();
}

absl::Status RealControlPlane::AddServeArgs(const std::vector<std::string>& args) {
  if (args.empty()) {
    return absl::OkStatus();
  }
  const std::string path = dir_ + "/tessera.cmd";
  std::string cmd = ReadAll(path);
  if (cmd.empty()) {
    return absl::FailedPreconditionError(path + " is missing or empty: did up start serve?");
  }
  for (const std::string& a : args) {
    cmd += ShellQuote(a) + " ";
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << cmd;
  out.close();
  if (!out) {
    return absl::InternalError("cannot write " + path);
  }
  return Restart("tessera", false);
}

absl::Status RealControlPlane::UseHami(const std::string& hami,
                                       const std::vector<std::string>& args) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(hami, ec) || access(hami.c_str(), X_OK) != 0) {
    return absl::NotFoundError(fmt::format("HAMi's scheduler {} is not an executable", hami));
  }
  TESSERA_ASSIGN_OR_RETURN(const int port, FreePort());
  TESSERA_ASSIGN_OR_RETURN(const int metrics_port, FreePort());
  // The command line names DIR and "hami", as the script's alive() wants.
  std::vector<std::string> argv = {"env",
                                   "KUBECONFIG=" + env_.kubeconfig,
                                   hami,
                                   "--http_bind",
                                   fmt::format("127.0.0.1:{}", port),
                                   "--cert_file",
                                   dir_ + "/tessera.crt",
                                   "--key_file",
                                   dir_ + "/tessera.key",
                                   "--metrics-bind-address",
                                   fmt::format("127.0.0.1:{}", metrics_port),
                                   "--scheduler-name",
                                   "hami-scheduler",
                                   "--device-config-file",
                                   dir_ + "/device-config.yaml",
                                   "-v=1"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string cmd;
  for (const std::string& a : argv) {
    cmd += ShellQuote(a) + " ";
  }
  {
    std::ofstream out(dir_ + "/hami.cmd", std::ios::binary | std::ios::trunc);
    out << cmd;
    if (!out) {
      return absl::InternalError("cannot write " + dir_ + "/hami.cmd");
    }
  }
  hami_ = true;  // from here on, Down() stops it
  TESSERA_RETURN_IF_ERROR(Restart("hami", false));
  const absl::Time deadline = clock_->Now() + absl::Seconds(30);
  while (!Listening(port) || !Listening(metrics_port)) {
    if (!Alive("hami")) {
      return absl::FailedPreconditionError(
          fmt::format("HAMi's scheduler exited at start: read {}/hami.log", dir_));
    }
    if (clock_->Now() > deadline) {
      return absl::DeadlineExceededError(
          fmt::format("HAMi's scheduler did not listen on {} and {} within 30 s: read {}/hami.log",
                      port, metrics_port, dir_));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // kube-scheduler's extender and the webhook: serve's URL becomes HAMi's.
  const std::string from = fmt::format("https://127.0.0.1:{}", env_.tessera_port);
  const std::string to = fmt::format("https://127.0.0.1:{}", port);
  const std::string config = dir_ + "/scheduler-config.yaml";
  TESSERA_ASSIGN_OR_RETURN(std::string sched,
                           ReplaceAll(ReadAll(config), from, to, "scheduler-config.yaml"));
  TESSERA_ASSIGN_OR_RETURN(std::string hook,
                           ReplaceAll(ReadAll(dir_ + "/webhook.yaml"), from, to, "webhook.yaml"));
  {
    std::ofstream out(config, std::ios::binary | std::ios::trunc);
    out << sched;
    std::ofstream hout(dir_ + "/webhook-hami.yaml", std::ios::binary | std::ios::trunc);
    hout << hook;
    if (!out || !hout) {
      return absl::InternalError("cannot rewrite " + config + " or write webhook-hami.yaml");
    }
  }
  absl::StatusOr<int> rc =
      RunCommand({"/usr/bin/env", "kubectl", "--kubeconfig", env_.kubeconfig,
                  "--request-timeout=20s", "apply", "-f", dir_ + "/webhook-hami.yaml"},
                 log_, absl::Seconds(60), interrupt_, clock_);
  if (!rc.ok() || *rc != 0) {
    return absl::FailedPreconditionError(
        fmt::format("kubectl apply of the webhook pointed at HAMi failed; read {}", log_));
  }
  // serve stops; kube-scheduler restarts with HAMi as its extender.
  (void)Signal("tessera", SIGTERM);
  for (int i = 0; i < 150 && Alive("tessera"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (Alive("tessera")) {
    (void)Signal("tessera", SIGKILL);
  }
  TESSERA_RETURN_IF_ERROR(Restart("kube-scheduler", false));
  env_.extender = "hami";
  env_.tessera_port = port;
  env_.metrics_port = metrics_port;
  return absl::OkStatus();
}

absl::Status RealControlPlane::Restart(const std::string& name, bool kill) {
  std::vector<std::string> args = {"restart"};
  if (kill) {
    args.push_back("--kill");
  }
  args.push_back(dir_);
  args.push_back(name);
  return Script(args, absl::Seconds(60));
}

absl::StatusOr<pid_t> RealControlPlane::Pid(const std::string& name) {
  const std::string text = ReadAll(dir_ + "/" + name + ".pid");
  const pid_t pid = static_cast<pid_t>(std::atoi(text.c_str()));
  if (pid <= 0) {
    return absl::NotFoundError(fmt::format("{} is not running ({}/{}.pid)", name, dir_, name));
  }
  std::string cmdline = ReadAll(fmt::format("/proc/{}/cmdline", pid));
  if (cmdline.find(dir_) == std::string::npos) {
    return absl::NotFoundError(fmt::format("{} (pid {}) is not running", name, pid));
  }
  return pid;
}

absl::Status RealControlPlane::Signal(const std::string& name, int sig) {
  absl::StatusOr<pid_t> pid = Pid(name);
  if (!pid.ok()) {
    return pid.status();
  }
  if (kill(*pid, sig) != 0) {
    return absl::InternalError(fmt::format("kill -{} {} ({}): errno {}", sig, *pid, name, errno));
  }
  return absl::OkStatus();
}

bool RealControlPlane::Alive(const std::string& name) {
  absl::StatusOr<pid_t> pid = Pid(name);
  if (!pid.ok()) {
    return false;
  }
  const std::string stat = ReadAll(fmt::format("/proc/{}/stat", *pid));
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

absl::Status RealControlPlane::Down() {
  if (!up_) {
    return absl::OkStatus();
  }
  up_ = false;
  (void)Signal("tessera", SIGCONT);  // a frozen serve would hold up its SIGTERM
  if (hami_) {                       // not one of the script's processes
    hami_ = false;
    (void)Signal("hami", SIGCONT);
    (void)Signal("hami", SIGTERM);
    for (int i = 0; i < 100 && Alive("hami"); ++i) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (Alive("hami")) {
      (void)Signal("hami", SIGKILL);
    }
  }
  absl::Status s = Script({"down", dir_}, absl::Seconds(120), /*interruptible=*/false);
  // Nothing of this control plane may survive (its processes name DIR on their command line).
  std::vector<std::string> left;
  for (int i = 0; i < 50; ++i) {
    left = ProcessesNaming(dir_ + "/");
    if (left.empty()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!left.empty()) {
    std::string list;
    for (const std::string& p : left) {
      list += (list.empty() ? "" : "; ") + p;
    }
    return absl::InternalError(
        fmt::format("processes of the control plane in {} survive down: {}", dir_, list));
  }
  return s;
}

}  // namespace tessera::sim

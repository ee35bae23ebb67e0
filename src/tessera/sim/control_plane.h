// File: tessera/sim/control_plane.h
//
// The real control plane of `tessera simulate --control-plane=real`: stock etcd,
// kube-apiserver and kube-scheduler with `tessera serve` as the extender, started, restarted and
// stopped through tools/controlplane.sh (docs/e2e.md). This class only runs that script and reads
// what it writes into its directory (`env`, `<name>.pid`, `<name>.cmd`); it starts nothing itself.
//
//   RealControlPlane cp("tools/controlplane.sh", "/tmp/run/controlplane",
//   "/tmp/run/controlplane.log"); TESSERA_RETURN_IF_ERROR(cp.Up("/abs/tessera",
//   {"--etcd-compaction-interval", "2s"})); cp.env().kubeconfig;                           // admin
//   kubeconfig cp.Restart("kube-apiserver", /*kill=*/true);   // severs every watch
//   cp.Signal("tessera", SIGSTOP);
//   cp.Down();                                     // also run by the destructor
//
// UseHami puts HAMi's own scheduler in serve's place (process "hami"; env().extender names the
// process kube-scheduler calls, so faults aimed at the scheduler under test follow it).
//
// Every script run has a deadline (a run past it is killed with its process group and is an
// error naming the command and the log). Down() thaws a frozen serve first, then checks that no
// process with the directory on its command line survives.
//
// Thread safety: Restart, Signal, Alive may be called from several threads (script runs are
// serialised); Up and Down from one thread while nothing else runs.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"

namespace tessera::sim {

// What `tools/controlplane.sh up` recorded in DIR/env.
struct ControlPlaneEnv {
  std::string dir;
  std::string kubeconfig;  // admin (O=system:masters)
  int apiserver_port = 0;
  int tessera_port = 0;  // HTTPS: extender and webhook
  int metrics_port = 0;  // plain HTTP: /metrics, /debug
  // The process (DIR/NAME.pid) kube-scheduler calls as its extender; the two ports are its.
  std::string extender = "tessera";
};

// Parses the `KEY=VALUE` lines of DIR/env. InvalidArgument when a port is missing.
absl::StatusOr<ControlPlaneEnv> ParseControlPlaneEnv(const std::string& text);

// Where the script is looked for without --controlplane-script: tools/controlplane.sh of the
// source tree this binary was built from, then under the current directory.
std::vector<std::string> DefaultControlPlaneScripts();

// The script to run: `flag` when set (NotFound if it is not a file), else the first of
// `candidates` that exists. NotFound names every path tried and the flag to pass.
absl::StatusOr<std::string> FindControlPlaneScript(const std::string& flag,
                                                   const std::vector<std::string>& candidates);

// Runs `argv` (argv[0] a path) with stdin /dev/null and stdout+stderr appended to `log`, in its
// own process group; returns its exit code. DeadlineExceeded (the group killed) after `timeout`.
// With `interrupt`, a run still going when it becomes true is killed the same way (Cancelled).
absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv, const std::string& log,
                               absl::Duration timeout, const std::atomic<bool>* interrupt = nullptr,
                               Clock* clock = Clock::Real());

class RealControlPlane {
 public:
  // `interrupt` (may be null): Up, Restart and AddServeArgs give up when it is set; Down never.
  // `clock` times the waits (deadlines).
  RealControlPlane(std::string script, std::string dir, std::string log,
                   const std::atomic<bool>* interrupt = nullptr, Clock* clock = Clock::Real());
  ~RealControlPlane();
  RealControlPlane(const RealControlPlane&) = delete;
  RealControlPlane& operator=(const RealControlPlane&) = delete;

  // `script up --tessera TESSERA UP_ARGS... DIR`, then reads DIR/env. The deadline covers a
  // first build of the control-plane binaries (tools/controlplane.sh build, minutes).
  absl::Status Up(const std::string& tessera, const std::vector<std::string>& up_args);
  // Appends `args` to serve's recorded command line (DIR/tessera.cmd) and restarts it (SIGTERM),
  // so that it runs with them; the caller waits for readiness.
  absl::Status AddServeArgs(const std::vector<std::string>& args);
  // HAMi's scheduler binary `hami` (its cmd/scheduler, test/hami/build.sh --own) in serve's
  // place: started as process "hami" with the admin kubeconfig, deploy/base's device config,
  // serve's certificate, /metrics on a port of its own and `args`; kube-scheduler's extender
  // and the webhook pointed at it; serve stopped. env() then names it and its ports. Down()
  // stops it.
  absl::Status UseHami(const std::string& hami, const std::vector<std::string>& args);
  // `script restart [--kill] DIR NAME`: returns once NAME runs again (not ready).
  absl::Status Restart(const std::string& name, bool kill);
  // Sends `sig` to NAME (from DIR/NAME.pid, checked against its command line).
  absl::Status Signal(const std::string& name, int sig);
  // Whether NAME's recorded process runs.
  bool Alive(const std::string& name);
  // SIGCONT to serve (it may be frozen), `script down DIR`, then no process with DIR on its
  // command line may remain. Idempotent.
  absl::Status Down();

  const ControlPlaneEnv& env() const { return env_; }

 private:
  absl::StatusOr<pid_t> Pid(const std::string& name);
  absl::Status Script(const std::vector<std::string>& args, absl::Duration timeout,
                      bool interruptible = true);

  const std::string script_, dir_, log_;
  const std::atomic<bool>* const interrupt_;
  Clock* const clock_;
  ControlPlaneEnv env_;
  Mutex mu_;  // one script run at a time
  bool up_ = false;
  bool hami_ = false;  // UseHami started "hami" (the script's down does not know it)
};

}  // namespace tessera::sim

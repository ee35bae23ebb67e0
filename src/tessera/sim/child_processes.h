// File: tessera/sim/child_processes.h
//
// ChildProcesses runs the two children of a `tessera simulate` run on apisim: `tessera apisim`
// (HTTPS with a random token and a self-signed certificate, its state in WORK_DIR/apisim.state,
// its kubeconfig written to WORK_DIR/kubeconfig) and `tessera serve` against it, and restarts
// them for the faults (apisim_restart, tessera_kill). A restart keeps a child's ports; the port
// may still be held for a moment, so a restart retries for about 5 s.
//
// Errors: FailedPrecondition when a child cannot start or prints an unexpected first line (the
// message names the child; its log is WORK_DIR/apisim.log or serve.log); Internal when a file of
// the set-up cannot be written.
//
// Thread safety: every method may be called from any thread; starts, stops and restarts run
// one at a time.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

#include "tessera/base/child_process.h"
#include "tessera/base/mutex.h"

namespace tessera::sim {

// Writes `content` to `path` (replacing it); Internal when it cannot.
absl::Status WriteWorkFile(const std::string& path, const std::string& content);

class ChildProcesses {
 public:
  // `binary`: the tessera executable; `work_dir` exists.
  ChildProcesses(std::string binary, std::string work_dir);

  // Starts apisim, then serve with `serve_extra` appended to its flags.
  absl::Status Start(const std::vector<std::string>& serve_extra);
  // apisim stopped (its state saved) and started again on its port.
  absl::Status RestartApisim();
  // serve SIGKILLed.
  void KillServe();
  // serve started again on its ports.
  absl::Status RestartServe();
  // serve started again when it is not running (a kill whose restart is due).
  void EnsureServe();
  void StopServe();
  void StopApisim();

  int http_port();
  int metrics_port();

 private:
  absl::Status StartApisim(bool restart) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status StartServe(bool restart) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string binary_, work_dir_;
  Mutex mutex_;
  ChildProcess apisim_ ABSL_GUARDED_BY(mutex_);
  ChildProcess serve_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::string> apisim_args_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::string> serve_args_ ABSL_GUARDED_BY(mutex_);
  int apisim_port_ ABSL_GUARDED_BY(mutex_) = 0;
  int http_port_ ABSL_GUARDED_BY(mutex_) = 0;
  int metrics_port_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tessera::sim

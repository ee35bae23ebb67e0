// File: tessera/testing/apisim_process.h
//
// Test-only (library tessera::testing). `tessera apisim` as a child process, for tests that need
// the simulator out of process (kill it, restart it on its saved state, a second one).
//
//   ApisimProcess sim;
//   std::string url = sim.Start(ApisimProcess::DefaultBinary(), {"--token", "t"});
//   ...
//   sim.Stop();  // SIGTERM (the simulator saves --state), then SIGKILL after a deadline
//
// Start() runs `binary apisim [--listen 127.0.0.1:0 unless args has --listen] args...` through
// base's ChildProcess (its stderr is this process's) and returns the URL of its first stdout
// line "listening on URL", or "" when the binary is missing, the process exits or the line does
// not come within `timeout` (the process is then killed). Stop() and the destructor always reap.
//
// The simulator binary: $TESSERA_APISIM_BIN, else TESSERA_DEFAULT_APISIM_BIN, which a test
// defines as the build tree's `tessera` (and depends on it).
//
// Thread safety: none; one test thread drives an ApisimProcess.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/time/time.h"

#include "tessera/base/child_process.h"

#ifndef TESSERA_DEFAULT_APISIM_BIN
#define TESSERA_DEFAULT_APISIM_BIN ""
#endif

namespace tessera::testing {

class ApisimProcess {
 public:
  // Inline so that the test's own TESSERA_DEFAULT_APISIM_BIN applies.
  static std::string DefaultBinary() {
    const char* env = std::getenv("TESSERA_APISIM_BIN");
    return env != nullptr ? env : TESSERA_DEFAULT_APISIM_BIN;
  }

  std::string Start(const std::string& binary, const std::vector<std::string>& args = {},
                    absl::Duration timeout = absl::Seconds(20));
  // SIGTERM, then SIGKILL when the process has not exited within `grace`. Returns the wait
  // status (-1 when nothing was running).
  int Stop(absl::Duration grace = absl::Seconds(10)) { return process_.Stop(grace); }
  pid_t pid() const { return process_.pid(); }
  bool running() const { return process_.running(); }

 private:
  ChildProcess process_;
};

}  // namespace tessera::testing

// File: cmd/tessera/hami_compat.h
//
// HAMi's scheduler command line, taken as it is, so that the image runs unchanged under HAMi's
// Helm chart (`command: [scheduler, --http_bind=0.0.0.0:443, ..., --debug, -v=4]`; the rendered
// lists are test/deploy/testdata/hami_chart_args.json). docs/serve.md "HAMi's command line".
//
//   - SchedulerArgv: invoked as `scheduler` (a symlink or copy of the binary with that name),
//     the binary runs `serve`; and the argument syntax of Go's pflag that CLI11 reads otherwise
//     (`-v=4`: a one-letter flag with `=`) is rewritten to CLI11's (`-v 4`).
//   - IgnoredFlags: flags HAMi's scheduler (v2.5.2 and v2.10.0) or klog accept that mean nothing
//     here. They are accepted, and each one given is logged once with what Tessera does instead,
//     so no chart value makes the container exit on a flag.
//
// Errors: none; an unknown flag is still a usage error of the command that parses it.
// Thread safety: call from main() before any thread starts.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tessera::cmd {

// The program name HAMi's chart runs.
inline constexpr std::string_view kHamiProgramName = "scheduler";

// `argv` as CLI11 should parse it: with "serve" after argv[0] when argv[0]'s base name is
// kHamiProgramName, and each "-x=value" (one dash, one letter, '=') split into "-x" "value".
std::vector<std::string> SchedulerArgv(int argc, const char* const* argv);

// Flags accepted for compatibility only, with the sinks CLI11 writes into.
class IgnoredFlags {
 public:
  // klog's flags other than -v (which RunCli implements): --logtostderr, --vmodule, --log_file,
  // ... Output always goes to standard error in Tessera's own format.
  void AddKlogFlags(CLI::App& app);
  // HAMi scheduler flags with no effect here: --debug, --profiling, --kube-timeout,
  // --enable-ascend and --enable-iluvatar, the other vendors' resource-name flags, and v2.5.2's
  // --default-mem/--default-cores/--default-gpu.
  void AddHamiFlags(CLI::App& app);
  // Logs one line per flag given on the command line: the flag, its value and why it does
  // nothing here. Call after parsing.
  void LogGiven() const;

 private:
  void AddBool(CLI::App& app, const std::string& name, std::string why);
  void AddValue(CLI::App& app, const std::string& name, std::string why);

  std::deque<std::string> values_;  // deque: CLI11 keeps pointers to the elements
  std::deque<bool> bools_;
  std::vector<std::pair<CLI::Option*, std::string>> notes_;
};

}  // namespace tessera::cmd

// File: cmd/tessera/start_log.h
//
// The lines a long-running command logs at start, as kube components do: the version (with the
// build's revision) and every effective flag of the selected subcommand — the global flags and
// the subcommand's, given or defaulted — as one structured line each, so that a log shows what
// the process ran with:
//
//   I1205 ... start_log.cc:40] "starting" command="serve" version="0.1.0" revision="7df2792b388b"
//   I1205 ... start_log.cc:52] "flags" --audit-period="5m" --http_bind="0.0.0.0:443" ...
//
// Only `serve` logs them (the one-shot commands print their own output). Flags whose name
// mentions a token or a password are left out; none exists today.
//
// Thread safety: call from main's thread, after parsing.
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace tessera::cmd {

// Logs the two lines when the subcommand `app` selected is `serve`; else does nothing.
void LogStart(const CLI::App& app);

}  // namespace tessera::cmd

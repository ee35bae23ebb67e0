// File: cmd/tessera/commands.h
//
// The subcommands of the `tessera` binary. Each Add*Command registers one CLI11 subcommand on
// `app`; when the user selects it, CLI11 stores in `*run` the function main() then calls. The
// function returns the process exit code: 0 success, 1 failure at run time (an invariant
// violation, a server that could not start), 2 bad input (flags, files, values).
//
// CLI11 is confined to cmd/tessera; the libraries take plain option structs.
#pragma once

#include <functional>

namespace CLI {
class App;
}  // namespace CLI

namespace tessera::cmd {

using Runner = std::function<int()>;

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

void AddVersionCommand(CLI::App& app, Runner* run);
void AddExplainCommand(CLI::App& app, Runner* run);
void AddDecodeCommand(CLI::App& app, Runner* run);
void AddApisimCommand(CLI::App& app, Runner* run);
void AddServeCommand(CLI::App& app, Runner* run);
void AddBenchCommand(CLI::App& app, Runner* run);
void AddRbacCommand(CLI::App& app, Runner* run);
void AddSimulateCommand(CLI::App& app, Runner* run);

}  // namespace tessera::cmd

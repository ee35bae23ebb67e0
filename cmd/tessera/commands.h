// File: cmd/tessera/commands.h
//
// The subcommands of the two binaries built here. Each Add*Command registers one CLI11 subcommand
// on `app`; when the user selects it, CLI11 stores in `*run` the function main() then calls. The
// function returns the process exit code: 0 success, 1 failure at run time (an invariant
// violation, a server that could not start), 2 bad input (flags, files, values).
//
//   tessera            (main.cc)            every subcommand, for users and tests;
//   tessera-scheduler  (scheduler_main.cc)  the production subcommands only (serve, explain, why,
//   top,
//                                           decode, rbac, version): no apisim, simulator,
//                                           benchmark or test code (the image ships it).
//
// CLI11 is confined to cmd/tessera; the libraries take plain option structs.
#pragma once

#include <functional>
#include <initializer_list>

namespace CLI {
class App;
}  // namespace CLI

namespace tessera::cmd {

using Runner = std::function<int()>;

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

using AddCommandFn = void (*)(CLI::App& app, Runner* run);

// Parses `argv` against the subcommands `commands` adds (plus the global -v flag) and runs the
// selected one; returns its exit code (kExitUsage with the help text when none was selected).
int RunCli(int argc, char** argv, std::initializer_list<AddCommandFn> commands);

// The production subcommands (cli.cc, serve_command.cc, explain_command.cc, why_command.cc,
// top_command.cc, decode_command.cc, rbac_command.cc: library tessera_cmd_production).
void AddVersionCommand(CLI::App& app, Runner* run);
void AddExplainCommand(CLI::App& app, Runner* run);
void AddWhyCommand(CLI::App& app, Runner* run);
void AddDecodeCommand(CLI::App& app, Runner* run);
void AddServeCommand(CLI::App& app, Runner* run);
void AddRbacCommand(CLI::App& app, Runner* run);
void AddTopCommand(CLI::App& app, Runner* run);

// The development subcommands, only in `tessera`: the API server simulator, the simulator, the
// end-to-end benchmark and the emulated nodes of a cluster file (emulate_command.cc).
void AddApisimCommand(CLI::App& app, Runner* run);
void AddBenchCommand(CLI::App& app, Runner* run);
void AddSimulateCommand(CLI::App& app, Runner* run);
void AddEmulateCommand(CLI::App& app, Runner* run);

}  // namespace tessera::cmd

// RunCli and the version subcommand, shared by `tessera` and `tessera-scheduler`.
#include <cstdio>
#include <string>
#include <vector>

#include "cmd/tessera/commands.h"
#include "cmd/tessera/hami_compat.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/base/allocator.h"
#include "tessera/base/logging.h"

namespace tessera::cmd {

void AddVersionCommand(CLI::App& app, Runner* run) {
  CLI::App* sub = app.add_subcommand("version", "Print the version of this binary and exit");
  sub->callback([run] {
    *run = [] {
      fmt::print("tessera {}\n", TESSERA_VERSION);
      return kExitOk;
    };
  });
}

int RunCli(int argc, char** argv, std::initializer_list<AddCommandFn> commands) {
  // First: it may execute the binary again with the allocator's settings (base/allocator.h).
  TuneAllocator(argv);
  CLI::App app{
      "Tessera: a GPU-sharing scheduler extender for Kubernetes, wire-compatible with HAMi.\n"
      "Its device accounting is a projection of the API server's state, audited and repaired "
      "continuously.",
      "tessera"};
  app.require_subcommand(0, 1);
  // pflag's conventions, which HAMi's chart relies on: a repeated flag takes the last value, and
  // the global flags (-v, klog's) may follow the command. Subcommands inherit both settings.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.fallthrough();
  IgnoredFlags klog;
  klog.AddKlogFlags(app);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");
  int verbosity = 0;
  app.add_option("-v,--v", verbosity, "Log verbosity (klog style): 0 quiet … 4 chatty")
      ->check(CLI::Range(0, 10));

  Runner run;
  for (AddCommandFn add : commands) {
    add(app, &run);
  }

  try {
    const std::vector<std::string> args = SchedulerArgv(argc, argv);
    std::vector<const char*> arg_ptrs;
    arg_ptrs.reserve(args.size());
    for (const std::string& arg : args) {
      arg_ptrs.push_back(arg.c_str());
    }
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  SetLogVerbosity(verbosity);
  klog.LogGiven();
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return kExitUsage;
  }
  return run();
}

}  // namespace tessera::cmd

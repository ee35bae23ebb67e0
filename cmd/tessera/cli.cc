// RunCli and the version subcommand, shared by `tessera` and `tessera-scheduler`.
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cmd/tessera/commands.h"
#include "cmd/tessera/hami_compat.h"
#include "cmd/tessera/start_log.h"
#include "cmd/tessera/suggest.h"
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
  // klog's --logging-format, also after the command (`tessera serve --logging-format=json`).
  std::string logging_format = "text";
  app.add_option("--logging-format", logging_format, "Log format, as kube components: text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  // As a kubectl plugin (`kubectl tessera explain …` runs kubectl-tessera): the same commands.
  if (std::string_view self = argc > 0 ? argv[0] : "";
      self.substr(self.rfind('/') + 1) == "kubectl-tessera") {
    app.name("kubectl tessera");
  }

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
    if (std::optional<std::string> unknown = UnknownCommandMessage(app)) {
      std::fputs(unknown->c_str(), stderr);
      return kExitUsage;
    }
    app.exit(e);
    return kExitUsage;
  }
  SetLogVerbosity(verbosity);
  SetLogFormat(*ParseLogFormat(logging_format));  // checked by IsMember
  klog.LogGiven();
  LogStart(app);
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return kExitUsage;
  }
  return run();
}

}  // namespace tessera::cmd

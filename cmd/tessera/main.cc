// The `tessera` binary: serve | apisim | simulate | explain | decode | bench | rbac | version.
#include <cstdio>
#include <string>

#include "cmd/tessera/commands.h"
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

}  // namespace tessera::cmd

int main(int argc, char** argv) {
  // First: it may execute the binary again with the allocator's settings (base/allocator.h).
  tessera::TuneAllocator(argv);
  using tessera::cmd::Runner;
  CLI::App app{
      "Tessera: a GPU-sharing scheduler extender for Kubernetes, wire-compatible with HAMi.\n"
      "Its device accounting is a projection of the API server's state, audited and repaired "
      "continuously.",
      "tessera"};
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");
  int verbosity = 0;
  app.add_option("-v,--v", verbosity, "Log verbosity (klog style): 0 quiet … 4 chatty")
      ->check(CLI::Range(0, 10));

  Runner run;
  tessera::cmd::AddServeCommand(app, &run);
  tessera::cmd::AddExplainCommand(app, &run);
  tessera::cmd::AddDecodeCommand(app, &run);
  tessera::cmd::AddApisimCommand(app, &run);
  tessera::cmd::AddBenchCommand(app, &run);
  tessera::cmd::AddRbacCommand(app, &run);
  tessera::cmd::AddSimulateCommand(app, &run);
  tessera::cmd::AddVersionCommand(app, &run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return tessera::cmd::kExitUsage;
  }
  tessera::SetLogVerbosity(verbosity);
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return tessera::cmd::kExitUsage;
  }
  return run();
}

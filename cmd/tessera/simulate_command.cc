// `tessera simulate`: a whole GPU cluster on one machine around the real Tessera
// (docs/simulate.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/time/time.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/sim/scenario.h"
#include "tessera/sim/simulation.h"

namespace tessera::cmd {
namespace {

struct SimulateFlags {
  std::string scenario = "quick";
  int64_t seed = -1;
  std::string duration;
  std::string report;
  std::string scheduler_args;
  std::string work_dir;
  bool list = false;
};

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

int RunSimulate(const SimulateFlags& f) {
  if (f.list) {
    for (const auto& [name, text] : sim::EmbeddedScenarios()) {
      absl::StatusOr<sim::Scenario> s = sim::ParseScenario(text);
      fmt::print("{:<10} {}\n", name, s.ok() ? s->description : s.status().ToString());
    }
    return kExitOk;
  }
  absl::StatusOr<sim::Scenario> scenario = sim::LoadScenario(f.scenario);
  if (!scenario.ok()) {
    fmt::print(stderr, "tessera simulate: {}\n", std::string(scenario.status().message()));
    return kExitUsage;
  }
  if (f.seed >= 0) {
    scenario->seed = static_cast<uint64_t>(f.seed);
  }
  if (!f.duration.empty()) {
    absl::Duration d;
    if (!absl::ParseDuration(f.duration, &d) || d <= absl::ZeroDuration()) {
      fmt::print(stderr, "tessera simulate: --duration: want a positive duration such as 30s\n");
      return kExitUsage;
    }
    scenario->duration = d;
  }
  if (!f.report.empty()) {
    mkdir(f.report.c_str(), 0755);
    struct stat st;
    if (stat(f.report.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      fmt::print(stderr, "tessera simulate: --report: cannot create directory {}\n", f.report);
      return kExitUsage;
    }
  }
  sim::SimulationOptions o;
  o.scenario = *scenario;
  o.binary = "/proc/self/exe";
  o.scheduler_args = f.scheduler_args.empty() ? scenario->scheduler_args : f.scheduler_args;
  o.work_dir = f.work_dir;
  o.progress = stderr;
  o.progress_bar = isatty(STDERR_FILENO) != 0;
  fmt::print(stderr, "tessera simulate: scenario {} ({}), seed {}\n", scenario->name,
             scenario->description, scenario->seed);
  absl::StatusOr<sim::RunResult> r = sim::RunSimulation(o);
  if (!r.ok()) {
    fmt::print(stderr, "tessera simulate: {}\n", std::string(r.status().message()));
    return kExitFailure;
  }
  fmt::print("{}", sim::SummaryTable(*r));
  if (f.work_dir.empty() && r->violations.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(r->work_dir, ignored);  // nothing to investigate
  } else {
    fmt::print("work directory (kubeconfig, child logs, Tessera's ledger at the end): {}\n",
               r->work_dir);
  }
  if (!f.report.empty()) {
    if (!WriteText(f.report + "/summary.json", sim::SummaryJson(*r)) ||
        !WriteText(f.report + "/report.html", sim::ReportHtml(*r))) {
      fmt::print(stderr, "tessera simulate: cannot write the report to {}\n", f.report);
      return kExitFailure;
    }
    fmt::print("report: {}/report.html, {}/summary.json\n", f.report, f.report);
  }
  std::fflush(stdout);
  return r->violations.empty() ? kExitOk : kExitFailure;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate",
      "Run a whole GPU cluster on this machine: tessera apisim and tessera serve as child "
      "processes, emulated kube-scheduler, HAMi device plugins, kubelets and workload, faults on "
      "a schedule, and an oracle that checks every second that no GPU is over-committed and that "
      "Tessera's /metrics match the truth. Exit 1 on any invariant violation.");
  sub->add_option("--scenario", flags->scenario,
                  "A built-in scenario (quick, seed-bug, chaos, scale) or a YAML file")
      ->capture_default_str();
  sub->add_option("--seed", flags->seed, "Seed of the random choices (default: the scenario's)");
  sub->add_option("--duration", flags->duration,
                  "Length of the workload phase, e.g. 15s (default: the scenario's)");
  sub->add_option("--report", flags->report,
                  "Write summary.json and report.html to this directory");
  sub->add_option("--scheduler-args", flags->scheduler_args,
                  "Extra flags for tessera serve, space-separated, e.g. \"--audit-period=0\"");
  sub->add_option("--work-dir", flags->work_dir,
                  "Directory for the kubeconfig, certificates, state and child logs (default: a "
                  "new /tmp/tessera-simulate-*)");
  sub->add_flag("--list", flags->list, "List the built-in scenarios");
  sub->callback([run, flags] { *run = [flags] { return RunSimulate(*flags); }; });
}

}  // namespace tessera::cmd

// `tessera simulate`: a whole GPU cluster on one machine around the real Tessera
// (docs/simulate.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/time/time.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/sim/control_plane.h"
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
  std::string control_plane = "apisim";
  std::string controlplane_script;
  std::string scheduler = "tessera";
  std::string hami_bin;
  bool list = false;
  bool no_compare = false;
};

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

// SIGINT / SIGTERM end the run early and tear it down (a real control plane runs in sessions of
// its own and would outlive this process); a second one kills as usual.
void OnStopSignal(int sig) {
  sim::SimulationInterrupted().store(true);
  signal(sig, SIG_DFL);
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
  if (f.control_plane == "real") {
    o.control_plane = sim::ControlPlaneKind::kReal;
    absl::StatusOr<std::string> script =
        sim::FindControlPlaneScript(f.controlplane_script, sim::DefaultControlPlaneScripts());
    if (!script.ok()) {
      fmt::print(stderr, "tessera simulate: {}\n", std::string(script.status().message()));
      return kExitUsage;
    }
    o.controlplane_script = *script;
  } else if (f.control_plane != "apisim") {
    fmt::print(stderr, "tessera simulate: --control-plane: want apisim or real, not {}\n",
               f.control_plane);
    return kExitUsage;
  }
  const bool hami = f.scheduler == "hami";
  if (f.scheduler != "tessera" && !hami) {
    fmt::print(stderr, "tessera simulate: --scheduler: want tessera or hami, not {}\n",
               f.scheduler);
    return kExitUsage;
  }
  if (hami != !f.hami_bin.empty() || (hami && f.control_plane != "real")) {
    fmt::print(stderr,
               "tessera simulate: --scheduler hami goes with --hami-bin PATH and "
               "--control-plane=real\n");
    return kExitUsage;
  }
  o.hami_bin = f.hami_bin;
  o.scenario = *scenario;
  o.binary = "/proc/self/exe";
  // The scenario's scheduler args are serve's flags, not HAMi's.
  o.scheduler_args =
      f.scheduler_args.empty() && !hami ? scenario->scheduler_args : f.scheduler_args;
  o.work_dir = f.work_dir;
  o.progress = stderr;
  o.progress_bar = isatty(STDERR_FILENO) != 0;
  // The comparison run: the scenario's `compare` section, unless skipped or pointless.
  std::optional<sim::SimulationOptions> compare;
  if (scenario->compare.has_value() && !f.no_compare && hami) {
    fmt::print(stderr, "tessera simulate: no comparison run: its args are serve's\n");
  } else if (scenario->compare.has_value() && !f.no_compare) {
    if (sim::NormalizeSchedulerArgs(o.scheduler_args) ==
        sim::NormalizeSchedulerArgs(scenario->compare->scheduler_args)) {
      fmt::print(stderr,
                 "tessera simulate: no comparison run: --scheduler-args are the comparison's "
                 "({})\n",
                 scenario->compare->scheduler_args);
    } else {
      compare = o;
      compare->scheduler_args = scenario->compare->scheduler_args;
      compare->label = scenario->compare->label;
      // The primary label describes the scenario's own args, not an override.
      o.label = sim::NormalizeSchedulerArgs(o.scheduler_args) ==
                        sim::NormalizeSchedulerArgs(scenario->scheduler_args)
                    ? scenario->compare->primary_label
                    : "primary";
    }
  }
  fmt::print(stderr, "tessera simulate: scenario {} ({}), seed {}, control plane {}{}\n",
             scenario->name, scenario->description, scenario->seed, f.control_plane,
             compare.has_value()
                 ? fmt::format(", run twice: {} then comparison: {}", o.label, compare->label)
                 : "");
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  absl::StatusOr<sim::RunResult> r = sim::RunSimulation(o);
  if (sim::SimulationInterrupted().load()) {
    fmt::print(
        stderr, "tessera simulate: interrupted; {} torn down\n",
        o.control_plane == sim::ControlPlaneKind::kReal ? "the control plane was" : "the run was");
    return 130;
  }
  if (!r.ok()) {
    fmt::print(stderr, "tessera simulate: {}\n", std::string(r.status().message()));
    return kExitFailure;
  }
  absl::StatusOr<sim::RunResult> c = absl::NotFoundError("no comparison run");
  if (compare.has_value()) {
    fmt::print(stderr, "tessera simulate: {}: {}; now the comparison: {} (scheduler args {})\n",
               o.label, r->violations.empty() ? "PASS" : "FAIL", compare->label,
               compare->scheduler_args.empty() ? "(serve's defaults)" : compare->scheduler_args);
    compare->work_dir = r->work_dir + "/comparison";
    c = sim::RunSimulation(*compare);
    if (!c.ok()) {
      fmt::print(stderr, "tessera simulate: the comparison run: {}\n",
                 std::string(c.status().message()));
    }
  }
  const sim::RunResult* comparison = c.ok() ? &*c : nullptr;
  // A comparison that was due but could not run fails the command like a child that cannot start.
  const bool succeeded = sim::Succeeded(*r, comparison) && (!compare.has_value() || c.ok());
  fmt::print("{}", sim::SummaryTable(*r, comparison));
  if (f.work_dir.empty() && succeeded) {
    std::error_code ignored;
    std::filesystem::remove_all(r->work_dir, ignored);  // nothing to investigate
  } else {
    fmt::print("work directory (kubeconfig, child logs, Tessera's ledger at the end{}): {}\n",
               compare.has_value() ? "; the comparison's in comparison/" : "", r->work_dir);
  }
  if (!f.report.empty()) {
    if (!WriteText(f.report + "/summary.json", sim::SummaryJson(*r, comparison)) ||
        !WriteText(f.report + "/report.html", sim::ReportHtml(*r, comparison))) {
      fmt::print(stderr, "tessera simulate: cannot write the report to {}\n", f.report);
      return kExitFailure;
    }
    fmt::print("report: {}/report.html, {}/summary.json\n", f.report, f.report);
  }
  std::fflush(stdout);
  return succeeded ? kExitOk : kExitFailure;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate",
      "Run a whole GPU cluster on this machine: tessera apisim and tessera serve as child "
      "processes, emulated kube-scheduler, HAMi device plugins, kubelets and workload, faults on "
      "a schedule, and an oracle that checks every second that no GPU is over-committed and that "
      "Tessera's /metrics match the truth. A scenario with a `compare` section (seed-bug) runs "
      "twice with the same seed, the second time with other serve flags (seed-bug: self-healing "
      "off), and reports both side by side. Exit 1 on any invariant violation of the primary run "
      "(or an over-commit in the comparison; its divergences are expected), 2 on bad flags or a "
      "bad scenario.");
  sub->add_option(
         "--scenario", flags->scenario,
         "A built-in scenario (quick, seed-bug, chaos, scale, mig, quota, preemption; --list "
         "shows them) or a YAML file")
      ->capture_default_str();
  sub->add_option("--seed", flags->seed, "Seed of the random choices (default: the scenario's)");
  sub->add_option("--duration", flags->duration,
                  "Length of the workload phase, e.g. 15s (default: the scenario's)");
  sub->add_option("--report", flags->report,
                  "Write summary.json and report.html to this directory");
  sub->add_option("--scheduler-args", flags->scheduler_args,
                  "Extra flags for tessera serve in the primary run, space-separated, e.g. "
                  "\"--audit-period=0\" (default: the scenario's scheduler_args)");
  sub->add_option("--work-dir", flags->work_dir,
                  "Directory for the kubeconfig, certificates, state and child logs (default: a "
                  "new /tmp/tessera-simulate-*)");
  sub->add_flag("--no-compare", flags->no_compare,
                "Skip the scenario's comparison run (its `compare` section, e.g. seed-bug's run "
                "with self-healing off)");
  sub->add_option("--control-plane", flags->control_plane,
                  "apisim: tessera apisim and serve as child processes, kube-scheduler emulated; "
                  "real: the stock etcd, kube-apiserver and kube-scheduler of "
                  "tools/controlplane.sh up (in WORK_DIR/controlplane, serve as their extender "
                  "under deploy/base's RBAC), the emulated workload, device plugins and kubelets "
                  "against that API server, faults mapped onto real ones (apisim-only faults "
                  "skipped and reported); needs kubectl, openssl, curl, python3 with PyYAML, "
                  "setsid, ss (docs/simulate.md)")
      ->capture_default_str();
  sub->add_option("--controlplane-script", flags->controlplane_script,
                  "With --control-plane=real: tools/controlplane.sh to run (default: the one of "
                  "the source tree this binary was built from, else ./tools/controlplane.sh)");
  sub->add_option("--scheduler", flags->scheduler,
                  "With --control-plane=real, the extender under test: tessera (serve) or hami "
                  "(HAMi's own scheduler binary, --hami-bin, in serve's place; --scheduler-args "
                  "are then its flags; docs/benchmarks.md \"seed-bug against HAMi\")")
      ->capture_default_str();
  sub->add_option("--hami-bin", flags->hami_bin,
                  "With --scheduler hami: HAMi's cmd/scheduler binary (test/hami/build.sh --own "
                  "VERSION)");
  sub->add_flag("--list", flags->list, "List the built-in scenarios");
  sub->callback([run, flags] { *run = [flags] { return RunSimulate(*flags); }; });
}

}  // namespace tessera::cmd

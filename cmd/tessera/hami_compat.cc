#include "cmd/tessera/hami_compat.h"

#include <CLI/CLI.hpp>

#include "tessera/base/logging.h"

namespace tessera::cmd {
namespace {

constexpr char kGroup[] = "Accepted for HAMi compatibility (no effect; logged when given)";

// Why a vendor's flags mean nothing: /filter refuses pods asking for its resources
// (device/other_vendors.h).
std::string Unsupported(std::string_view vendor) {
  return std::string(vendor) +
         " devices are not supported: pods asking for them are refused at /filter";
}

}  // namespace

std::vector<std::string> SchedulerArgv(int argc, const char* const* argv) {
  std::vector<std::string> out;
  if (argc <= 0 || argv == nullptr || argv[0] == nullptr) {
    return out;
  }
  std::string_view program = argv[0];
  if (size_t slash = program.rfind('/'); slash != std::string_view::npos) {
    program.remove_prefix(slash + 1);
  }
  out.emplace_back(argv[0]);
  if (program == kHamiProgramName) {
    out.emplace_back("serve");
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.size() > 3 && arg[0] == '-' && arg[1] != '-' && arg[2] == '=') {
      out.emplace_back(arg.substr(0, 2));
      out.emplace_back(arg.substr(3));
    } else {
      out.emplace_back(arg);
    }
  }
  return out;
}

void IgnoredFlags::AddBool(CLI::App& app, const std::string& name, std::string why) {
  bools_.push_back(false);
  CLI::Option* opt = app.add_flag(name, bools_.back(), why)->group(kGroup);
  notes_.emplace_back(opt, std::move(why));
}

void IgnoredFlags::AddValue(CLI::App& app, const std::string& name, std::string why) {
  values_.emplace_back();
  CLI::Option* opt = app.add_option(name, values_.back(), why)->group(kGroup);
  notes_.emplace_back(opt, std::move(why));
}

void IgnoredFlags::AddKlogFlags(CLI::App& app) {
  const std::string stderr_only = "klog: Tessera logs to standard error only";
  for (const char* name : {"--logtostderr", "--alsologtostderr", "--one_output"}) {
    AddBool(app, name, stderr_only);
  }
  for (const char* name : {"--log_dir", "--log_file", "--log_file_max_size", "--stderrthreshold"}) {
    AddValue(app, name, stderr_only);
  }
  for (const char* name : {"--skip_headers", "--skip_log_headers", "--add_dir_header"}) {
    AddBool(app, name, "klog: Tessera's log lines keep their header");
  }
  AddValue(app, "--vmodule", "klog: verbosity is global, set with -v");
  AddValue(app, "--log_backtrace_at", "klog: no stack traces on log lines");
}

void IgnoredFlags::AddHamiFlags(CLI::App& app) {
  AddBool(app, "--debug", "HAMi's debug mode: use -v=4 for detailed logs");
  AddBool(app, "--profiling",
          "no pprof in this binary; the metrics listener serves /debug/ledger and /debug/audit");
  AddValue(app, "--kube-timeout",
           "API requests have Tessera's own timeouts (watches, lists and writes differ)");
  for (const char* name : {"--default-mem", "--default-cores", "--default-gpu"}) {
    AddValue(app, name,
             "no effect in HAMi v2.5.2 either: the device config's nvidia.defaultMemory, "
             "defaultCores and defaultGPUNum apply");
  }
  AddBool(app, "--enable-ascend", Unsupported("Huawei Ascend"));
  AddBool(app, "--enable-iluvatar", Unsupported("Iluvatar"));
  for (const char* name :
       {"--cambricon-mlu-name", "--cambricon-mlu-memory", "--cambricon-mlu-cores"}) {
    AddValue(app, name, Unsupported("Cambricon MLU"));
  }
  for (const char* name : {"--dcu-name", "--dcu-memory", "--dcu-cores"}) {
    AddValue(app, name, Unsupported("Hygon DCU"));
  }
  for (const char* name : {"--iluvatar-name", "--iluvatar-memory", "--iluvatar-cores"}) {
    AddValue(app, name, Unsupported("Iluvatar"));
  }
  for (const char* name : {"--mthreads-name", "--mthreads-memory", "--mthreads-cores"}) {
    AddValue(app, name, Unsupported("Moore Threads"));
  }
  for (const char* name : {"--metax-name", "--metax-vcount", "--metax-vcore", "--metax-vmemory"}) {
    AddValue(app, name, Unsupported("MetaX"));
  }
  AddBool(app, "--sgpu-topology-aware", Unsupported("MetaX"));
  for (const char* name : {"--kunlun-name", "--kunlun-vcount", "--kunlun-vmemory"}) {
    AddValue(app, name, Unsupported("Kunlunxin"));
  }
  for (const char* name : {"--enflame-gcu-resource-name", "--enflame-drs-gcu-resource-name",
                           "--enflame-gcu-memory-resource-name", "--enflame-gcu-core-resource-name",
                           "--enflame-vgcu-resource-name", "--enflame-vgcu-legacy-resource-name",
                           "--enflame-vgcu-percentage-resource-name"}) {
    AddValue(app, name, Unsupported("Enflame GCU"));
  }
}

void IgnoredFlags::LogGiven() const {
  for (const auto& [opt, why] : notes_) {
    if (opt->count() == 0) {
      continue;
    }
    const std::vector<std::string>& results = opt->results();
    TESSERA_LOG(kInfo, "flag {}={} accepted for HAMi compatibility, no effect: {}", opt->get_name(),
                results.empty() ? std::string("true") : results.back(), why);
  }
}

}  // namespace tessera::cmd

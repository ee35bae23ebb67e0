#include "cmd/tessera/start_log.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessera/base/logging.h"
#include "tessera/metrics/build_revision.h"

namespace tessera::cmd {
namespace {

// The long name ("--http_bind") of an option, or its first name.
std::string FlagName(const CLI::Option& option) {
  const std::vector<std::string>& longs = option.get_lnames();
  if (!longs.empty()) {
    return "--" + longs.front();
  }
  const std::vector<std::string>& shorts = option.get_snames();
  return shorts.empty() ? option.get_name() : "-" + shorts.front();
}

// The value the command runs with: what was given (the last of a repeated flag, as CLI11 and
// pflag take it), else the default.
std::string EffectiveValue(const CLI::Option& option) {
  if (option.count() > 0) {
    const std::vector<std::string>& given = option.results();
    return given.empty() ? "true" : given.back();
  }
  std::string value = option.get_default_str();
  if (value.empty() && option.get_expected_min() == 0) {
    return "false";  // a flag not given
  }
  return value;
}

bool Secret(std::string_view name) {
  return name.find("token") != std::string_view::npos ||
         name.find("password") != std::string_view::npos;
}

void AddFlags(const CLI::App& app, std::vector<std::pair<std::string, std::string>>* flags) {
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = FlagName(*option);
    if (name == "--help" || name == "--help-all" || option->get_positional() || Secret(name)) {
      continue;
    }
    flags->emplace_back(name, EffectiveValue(*option));
  }
}

}  // namespace

void LogStart(const CLI::App& app) {
  const std::vector<CLI::App*> selected = app.get_subcommands();
  if (selected.empty() || selected.front()->get_name() != "serve") {
    return;
  }
  const CLI::App& command = *selected.front();
  TESSERA_LOGS(kInfo, "starting", "command", command.get_name(), "version", TESSERA_VERSION,
               "revision", metrics::BuildRevision());
  std::vector<std::pair<std::string, std::string>> flags;
  AddFlags(app, &flags);
  AddFlags(command, &flags);
  std::sort(flags.begin(), flags.end());
  std::vector<logging_internal::Field> fields;
  fields.reserve(flags.size());
  for (const auto& [name, value] : flags) {
    fields.push_back({name, value, true});
  }
  logging_internal::Emit(LogSeverity::kInfo, 0, __FILE__, __LINE__, "flags", true, fields);
}

}  // namespace tessera::cmd

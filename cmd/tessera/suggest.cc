#include "cmd/tessera/suggest.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace tessera::cmd {
namespace {

// Optimal string alignment distance (Damerau–Levenshtein without repeated edits of a substring).
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) {
    d[i][0] = i;
  }
  for (size_t j = 0; j <= b.size(); ++j) {
    d[0][j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string> NearestName(std::string_view word,
                                       const std::vector<std::string>& names) {
  if (word.empty()) {
    return std::nullopt;
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (const std::string& name : names) {
    size_t distance = EditDistance(word, name);
    if (distance > limit && name.starts_with(word)) {
      distance = limit;  // a prefix ("ser" for serve) is near whatever its length
    }
    if (distance < best_distance) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

std::optional<std::string> UnknownCommandMessage(const CLI::App& app) {
  if (!app.get_subcommands().empty()) {
    return std::nullopt;
  }
  const std::vector<std::string> extras = app.remaining();
  if (extras.empty() || extras.front().starts_with("-")) {
    return std::nullopt;
  }
  const std::string& word = extras.front();
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  if (std::find(names.begin(), names.end(), word) != names.end()) {
    return std::nullopt;
  }
  std::optional<std::string> near = NearestName(word, names);
  return fmt::format("{}: unknown command \"{}\"{}\nRun '{} --help' for the list of commands.\n",
                     app.get_name(), word, near ? fmt::format("; did you mean {}?", *near) : "",
                     app.get_name());
}

}  // namespace tessera::cmd

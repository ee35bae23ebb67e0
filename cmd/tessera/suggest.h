// File: cmd/tessera/suggest.h
//
// "did you mean serve?": the known name nearest to a mistyped command, as kubectl and git
// suggest one. Near means an edit distance (insertions, deletions, substitutions, and swaps of
// two neighbouring letters) of at most 2, or at most a third of the word's length for longer
// words, or the word being a prefix of the name; the smallest distance wins, ties by the order
// of `names`.
//
// Thread safety: a pure function.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::cmd {

std::optional<std::string> NearestName(std::string_view word,
                                       const std::vector<std::string>& names);

}  // namespace tessera::cmd

namespace CLI {
class App;
}  // namespace CLI

namespace tessera::cmd {

// After `app` failed to parse: when no subcommand was selected and the first argument left over
// is not a command, the message for it —
//   tessera: unknown command "serv"; did you mean serve?
//   Run 'tessera --help' for the list of commands.
// (without the suggestion when no command is near); nullopt for every other parse error.
std::optional<std::string> UnknownCommandMessage(const CLI::App& app);

}  // namespace tessera::cmd

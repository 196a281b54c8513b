// logitctl's own reading of argv: the common and subcommand flags are
// applied, the positional words returned, and after `validate` every word
// kept for the harness.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace logitd::logitctl {

struct CommandLine {
  // Positional words: the subcommand and its arguments.
  std::vector<std::string> words;
  // For `validate` and `verify`: every token after the word, verbatim, so
  // that the harness sees its own options whatever way it reads them.
  std::vector<std::string> validate_args;
  bool help = false;
};

// Sets registered absl flags from `args`, the words after the program's
// name, read in the spellings of client/common/argv.h (as the harness reads
// its own). Unlike absl::ParseCommandLine it reports problems as a status, so
// that a usage error exits 2 (not 1, which logitctl keeps for server errors).
// After the `validate` word it applies only the connection flags and hands
// every word on, verbatim, to the harness.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args);

}  // namespace logitd::logitctl

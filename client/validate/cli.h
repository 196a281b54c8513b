// Entry point of `logitctl validate`: the harness's flags are defined next to
// its implementation; logitctl's main dispatches here with the positional
// arguments that follow the subcommand.
#pragma once

#include <string>
#include <vector>

namespace logitd::validate {

// Returns the process exit code: 0 when every selected check passed, 1 when
// one failed, 2 when the server could not be reached or refused.
int RunValidateCommand(const std::vector<std::string>& args);

}  // namespace logitd::validate

// What `logitd --help` prints: logitd's own flags, grouped by what they
// configure, with their defaults (Abseil's --help would list only the flags
// of the file that defines main(); --helpfull lists Abseil's and gRPC's too).
#pragma once

#include <string>
#include <vector>

namespace logitd {

struct FlagGroup {
  const char* title;
  std::vector<const char*> flags;
};

// The groups, in the order --help lists them.
const std::vector<FlagGroup>& FlagGroups();

// The help text: the usage line, then each group's flags with their default
// and description, wrapped for a terminal. A flag defined in server/flags.cc
// that no group names is listed under "Other", so none can go missing.
std::string FlagsHelp();

}  // namespace logitd

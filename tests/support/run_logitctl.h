// Runs the built logitctl binary (or another program) for a test: its
// arguments passed as they are (no shell), its stdout and stderr captured,
// its exit code returned.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace logitd::testing {

// The logitctl binary of the build (a compile definition).
std::string LogitctlBinary();

struct LogitctlOptions {
  // Changes to the environment logitctl inherits: NAME set to the value, or
  // removed for nullopt.
  std::map<std::string, std::optional<std::string>> env;
  // stderr into `out` too, interleaved as written (the shell's 2>&1); `err`
  // stays empty.
  bool merge_stderr = false;
};

struct LogitctlRun {
  // The exit status; -1 when logitctl could not be started or did not exit
  // normally (a signal).
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `logitctl <args>` with stdin from /dev/null and waits for it.
LogitctlRun RunLogitctl(const std::vector<std::string>& args, const LogitctlOptions& options = {});

// The same for any program (`binary` a path), e.g. `logitd --help`.
LogitctlRun RunProgram(const std::string& binary, const std::vector<std::string>& args,
                       const LogitctlOptions& options = {});

}  // namespace logitd::testing

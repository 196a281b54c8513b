// Entry point of `logitctl validate`: the harness's flags are defined next to
// its implementation; logitctl's main dispatches here with the positional
// arguments that follow the subcommand.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "logitd/client.h"

namespace logitd::validate {

// `logitctl validate` against the server at `server` (HOST:PORT, logitctl's
// --server). Returns the process exit code: 0 when every selected check
// passed, 1 when one failed, 2 when the server could not be reached or
// refused.
int RunValidateCommand(const std::string& server, const std::vector<std::string>& args);

// Entry point of `logitctl verify` (verify_command.cc): the same exit codes,
// 1 meaning a candidate failed its contract.
int RunVerifyCommand(const std::string& server, const std::vector<std::string>& args);

// What validate and verify share of logitctl: whether --name is one of its
// connection flags (and boolean), which it applies before dispatching; and
// the client options those flags say, on one server (--lb is not followed:
// a run judges what one server did).
std::optional<bool> HostConnectionFlag(absl::string_view name);
absl::StatusOr<client::ClientOptions> HarnessConnectionOptions();

struct Report;
// Connects to report->address with those options and reads the server's
// ServerInfo into the report. A bad connection flag is returned with
// report->error left empty (a usage error); a server that cannot be used
// sets report->error, which is also printed to stderr after `program`.
absl::StatusOr<std::unique_ptr<client::Client>> ConnectForReport(Report* report,
                                                                 absl::string_view program);

}  // namespace logitd::validate

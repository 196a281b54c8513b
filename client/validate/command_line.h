// The options of `logitctl validate`, read from the words after the
// subcommand. logitctl hands those over verbatim, its own flags (--server,
// --timeout, TLS, ...) included; those are recognised and left to it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::validate {

struct ValidateArgs {
  // Suite names as given by --suite and positional words, in that order.
  std::vector<std::string> suites;
  std::string json_path;
  std::string junit_path;
  // --report=DIR: index.html and summary.md.
  std::string report_dir;
  std::string baseline_path;
  std::string record_path;
  // --project (with --branch, --ref): the golden cases recorded in the
  // server's history; --compare_branch/_ref/_baseline: compared there with a
  // recorded run of each case; --compare_missing: "fail" or "record".
  std::string project;
  std::string branch;
  std::string ref;
  std::string compare_branch;
  std::string compare_ref;
  std::string compare_baseline;
  std::string compare_missing = "fail";
  // --compare: a second server run against the same suites.
  std::string compare_address;
  std::uint64_t seed = 1234;
  bool quick = false;
  bool allow_other_platform = false;
  bool help = false;
};

// Whether logitctl itself defines --name: nullopt when it does not, else
// whether the flag is boolean (and so never takes the next word as value).
using HostFlagLookup = std::function<std::optional<bool>(absl::string_view name)>;

// Accepts the spellings of client/common/argv.h, as logitctl does: --name=value,
// --name value, -name, --flag, --noflag, --flag=false, "--" (only words
// after it), and suite names as words (comma lists too). InvalidArgument for
// an unknown option or a bad value.
absl::StatusOr<ValidateArgs> ParseValidateArgs(const std::vector<std::string>& args,
                                               const HostFlagLookup& host_flag);

// `logitctl validate --help`.
std::string ValidateUsage();

}  // namespace logitd::validate

#include "client/logitctl/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace logitd::logitctl {
namespace {

bool IsConnectionFlag(absl::string_view name) {
  for (absl::string_view f :
       {"server", "timeout", "chunk_bytes", "token", "token_file", "ca", "cert", "key"}) {
    if (name == f) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine cl;
  bool in_validate = false;
  bool only_words = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (in_validate) cl.validate_args.push_back(arg);
    if (only_words || arg.size() < 2 || arg[0] != '-') {
      if (!in_validate) {
        cl.words.push_back(arg);
        in_validate = cl.words.size() == 1 && arg == "validate";
      }
      continue;
    }
    if (arg == "--") {
      only_words = true;
      continue;
    }
    absl::string_view body(arg);
    body.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view flag_name = body;
    absl::string_view value;
    bool has_value = false;
    if (const std::size_t eq = body.find('='); eq != absl::string_view::npos) {
      flag_name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (!in_validate && (flag_name == "help" || flag_name == "h" || flag_name == "helpfull")) {
      cl.help = true;
      continue;
    }
    // After `validate` only the connection flags are logitctl's: the harness
    // has options of its own (--json=FILE, --seed) that may share a name with
    // another subcommand's flag.
    if (in_validate && !IsConnectionFlag(flag_name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(flag_name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(flag_name, "no")) {
      flag = absl::FindCommandLineFlag(flag_name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag_name));
    }
    std::string text(value);
    if (flag->IsOfType<bool>()) {
      if (negated) {
        if (has_value) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", flag_name, " takes no value, got '", value, "'"));
        }
        text = "false";
      } else if (!has_value) {
        text = "true";
      }
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag_name, " needs a value"));
      }
      text = argv[++i];
      if (in_validate) cl.validate_args.push_back(text);
    }
    std::string error;
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag->Name(), ": ", error));
    }
  }
  return cl;
}

}  // namespace logitd::logitctl

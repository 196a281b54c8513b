#include "client/logitctl/command_line.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/common/argv.h"

namespace logitd::logitctl {
namespace {

bool IsConnectionFlag(absl::string_view name) {
  for (absl::string_view f : {"server", "timeout", "chunk_bytes", "digest_after_bytes", "token",
                              "token_file", "ca", "cert", "key"}) {
    if (name == f) return true;
  }
  return false;
}

// Every registered absl flag: logitctl's, bench's and stress's.
std::optional<argv::FlagType> AbslFlagType(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return std::nullopt;
  return flag->IsOfType<bool>() ? argv::FlagType::kBool : argv::FlagType::kValue;
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine cl;
  bool in_validate = false;
  argv::Reader reader(args);
  while (std::optional<argv::Word> word = reader.Next()) {
    if (!word->is_flag) {
      if (in_validate) continue;
      cl.words.push_back(word->text);
      if (cl.words.size() == 1 && (word->text == "validate" || word->text == "verify")) {
        in_validate = true;
        cl.validate_args.assign(args.begin() + word->index + 1, args.end());
      }
      continue;
    }
    const std::string& name = word->name;
    if (!in_validate && (name == "help" || name == "h" || name == "helpfull")) {
      cl.help = true;
      continue;
    }
    // After `validate` or `verify` only the connection flags are logitctl's:
    // the harness has options of its own (--json=FILE, --seed, --candidate)
    // that may share a name with another subcommand's flag.
    if (in_validate && !IsConnectionFlag(name)) continue;
    std::optional<argv::Flag> flag = argv::Resolve(*word, AbslFlagType);
    if (!flag.has_value()) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    // Refused here, not by Reader::Value, because logitctl's message quotes
    // the value.
    if (flag->negated && flag->value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " takes no value, got '", *flag->value, "'"));
    }
    absl::StatusOr<std::string> text = reader.Value(*flag);
    if (!text.ok()) return text.status();
    absl::CommandLineFlag* absl_flag = absl::FindCommandLineFlag(flag->name);
    std::string error;
    if (!absl_flag->ParseFrom(*text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", absl_flag->Name(), ": ", error));
    }
  }
  return cl;
}

}  // namespace logitd::logitctl

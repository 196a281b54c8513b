#include "client/validate/command_line.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/common/argv.h"

namespace logitd::validate {
namespace {

enum class Kind { kString, kSeed, kBool, kSuites };

struct Spec {
  const char* name;
  Kind kind;
};

constexpr Spec kSpecs[] = {
    {"suite", Kind::kSuites},
    {"json", Kind::kString},
    {"junit", Kind::kString},
    {"report", Kind::kString},
    {"baseline", Kind::kString},
    {"record", Kind::kString},
    {"compare", Kind::kString},
    {"project", Kind::kString},
    {"branch", Kind::kString},
    {"ref", Kind::kString},
    {"compare_branch", Kind::kString},
    {"compare_ref", Kind::kString},
    {"compare_baseline", Kind::kString},
    {"compare_missing", Kind::kString},
    {"seed", Kind::kSeed},
    {"quick", Kind::kBool},
    {"allow_other_platform", Kind::kBool},
    {"allow-other-platform", Kind::kBool},
};

const Spec* FindSpec(absl::string_view name) {
  for (const Spec& s : kSpecs) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::optional<argv::FlagType> OwnFlagType(absl::string_view name) {
  const Spec* spec = FindSpec(name);
  if (spec == nullptr) return std::nullopt;
  return spec->kind == Kind::kBool ? argv::FlagType::kBool : argv::FlagType::kValue;
}

void AddSuites(absl::string_view list, std::vector<std::string>* out) {
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    out->emplace_back(absl::StripAsciiWhitespace(part));
  }
}

absl::Status Apply(const Spec& spec, absl::string_view value, ValidateArgs* a) {
  const std::string name = spec.name;
  switch (spec.kind) {
    case Kind::kSuites:
      AddSuites(value, &a->suites);
      return absl::OkStatus();
    case Kind::kSeed:
      if (!absl::SimpleAtoi(value, &a->seed)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--seed: expected an unsigned integer, got '", value, "'"));
      }
      return absl::OkStatus();
    case Kind::kBool: {
      bool v = false;
      if (!absl::SimpleAtob(value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": expected true or false, got '", value, "'"));
      }
      if (name == "quick") {
        a->quick = v;
      } else {
        a->allow_other_platform = v;
      }
      return absl::OkStatus();
    }
    case Kind::kString:
      if (value.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name,
                         name == "report" ? " needs a directory"
                         : name == "compare" || name.rfind("compare", 0) == 0 ||
                                 name == "project" || name == "branch" || name == "ref"
                             ? " needs a value"
                             : " needs a file name"));
      }
      if (name == "json") a->json_path = std::string(value);
      if (name == "junit") a->junit_path = std::string(value);
      if (name == "report") a->report_dir = std::string(value);
      if (name == "baseline") a->baseline_path = std::string(value);
      if (name == "record") a->record_path = std::string(value);
      if (name == "compare") a->compare_address = std::string(value);
      if (name == "project") a->project = std::string(value);
      if (name == "branch") a->branch = std::string(value);
      if (name == "ref") a->ref = std::string(value);
      if (name == "compare_branch") a->compare_branch = std::string(value);
      if (name == "compare_ref") a->compare_ref = std::string(value);
      if (name == "compare_baseline") a->compare_baseline = std::string(value);
      if (name == "compare_missing") {
        if (value != "fail" && value != "record") {
          return absl::InvalidArgumentError(
              absl::StrCat("--compare_missing: expected fail or record, got '", value, "'"));
        }
        a->compare_missing = std::string(value);
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ValidateArgs> ParseValidateArgs(const std::vector<std::string>& args,
                                               const HostFlagLookup& host_flag) {
  const argv::FlagLookup host =
      [&host_flag](absl::string_view name) -> std::optional<argv::FlagType> {
    const std::optional<bool> is_bool = host_flag ? host_flag(name) : std::nullopt;
    if (!is_bool.has_value()) return std::nullopt;
    return *is_bool ? argv::FlagType::kBool : argv::FlagType::kValue;
  };
  ValidateArgs a;
  argv::Reader reader(args);
  while (std::optional<argv::Word> word = reader.Next()) {
    if (!word->is_flag) {
      if (word->text == "help") {
        a.help = true;
      } else {
        AddSuites(word->text, &a.suites);
      }
      continue;
    }
    if (word->name == "help" || word->name == "h") {
      a.help = true;
      continue;
    }
    if (std::optional<argv::Flag> flag = argv::Resolve(*word, OwnFlagType); flag.has_value()) {
      absl::StatusOr<std::string> value = reader.Value(*flag);
      if (!value.ok()) return value.status();
      absl::Status s = Apply(*FindSpec(flag->name), *value, &a);
      if (!s.ok()) return s;
      continue;
    }
    // logitctl's own flags (--server, --timeout, TLS...) were applied by it.
    if (std::optional<argv::Flag> flag = argv::Resolve(*word, host); flag.has_value()) {
      reader.SkipValue(*flag);
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option --", word->name, " (see logitctl validate --help)"));
  }
  return a;
}

std::string ValidateUsage() {
  return R"(usage: logitctl validate [--server=HOST:PORT] [SUITE ...] [options]

Streams seeded tensors to a logitd server, computes references on the client
and checks the results bitwise and numerically.

suites (default: all; golden is compared only with --baseline, --record or
--project):
  integer_exact      integer operands: fp32 logits, dX and dW equal the exact sums
  rounding_error     normal data vs an fp64 reference: fp32 within the γ_K bound,
                     bf16-out error >= 50x the fp32-out error; prints the table
  backward_contract  server cast == RNE bitwise; fp32 dY == bf16(dY) bitwise;
                     exact integer gradients; dX, dW within their fp32 bounds
  special_values     NaN, ±Inf, subnormals and bf16 max reach the outputs IEEE
                     754 says, and no others
  cross_entropy      fused loss, lse, dX, dW within fp32 bounds of an fp64
                     reference; the bf16 gradient cast bitwise on integer
                     data; ignore_index, z-loss, soft-capping, reductions,
                     int32/int64 targets, invalid targets refused
  logprobs           LogProbs' logprob, lse, entropy, top-k and ranks within
                     fp32 bounds of an fp64 reference; exact ids and ranks
                     on integer data; lse and logprob bitwise CrossEntropy's;
                     a bf16 head's log-probs shown to miss the bound
  golden             fixed inputs compared bit for bit with a baseline file
  determinism        every other suite's first request, and a few more, sent
                     twice give the same bits

options:
  --suite=A,B         suites to run (also as words after `validate`)
  --quick             V=4096 and K in {512, 4096} (default V=32768, K=512...16384);
                      cross_entropy: M=32, K=256, V=4096 (default M=64, K=1024,
                      V=32768); logprobs: M=37, K=1000, V=5003 (default M=61,
                      K=2047, V=32003)
  --seed=N            seed of the generated data (default 1234; golden is fixed)
  --json=FILE         write the report as JSON (server info, every case)
  --junit=FILE        write the report as JUnit XML
  --report=DIR        write DIR/index.html (one self-contained page: verdicts,
                      platform, plots of the errors, every case's figures)
                      and DIR/summary.md (for a CI job summary); DIR is
                      created when missing
  --record=FILE       write the golden outputs to a baseline file
  --baseline=FILE     compare the golden outputs with a baseline file
  --project=P         record each golden case as a run of project P in the
                      server's history (case golden/NAME; --branch=B and
                      --ref=R label it): its outputs' digests and bound
                      figures; a rule of the project it breaks fails the case
  --compare_branch=B | --compare_ref=R | --compare_baseline=N
                      with --project: compare each case with that recorded
                      run (bits identical, or the rows that changed)
  --compare_missing=fail|record
                      no such run: fail (the default) or record the run
                      without a comparison (a branch's first run in CI)
  --compare=HOST:PORT run the same suites against a second server too and
                      compare every output: bitwise-equal fraction and ULP
                      distance; exit 0 when both pass (identical or not), 1
                      when either side is outside its bounds
  --allow_other_platform
                      compare with a baseline from another backend, device or
                      library version instead of refusing it

exit codes: 0 every selected check passed, 1 a check failed,
            2 bad options, or the server could not be reached or refused
              (the same rule as every logitctl command: logitctl help)
)";
}

}  // namespace logitd::validate

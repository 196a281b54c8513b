// `logitctl validate` options: every spelling absl users expect, logitctl's
// own flags left alone, and clear errors for the rest.
#include "client/validate/command_line.h"

#include "gtest/gtest.h"

namespace logitd::validate {
namespace {

// logitctl's flags as the harness sees them: --server (string), --json
// (logitctl's own bool for `info`), --tls (bool).
std::optional<bool> Host(absl::string_view name) {
  if (name == "server" || name == "timeout") return false;
  if (name == "json" || name == "tls") return true;
  return std::nullopt;
}

TEST(CommandLineTest, ParsesEverySpelling) {
  absl::StatusOr<ValidateArgs> a = ParseValidateArgs(
      {"--quick", "--json", "out.json", "--junit=out.xml", "-seed=7", "--suite=golden,determinism",
       "integer_exact", "--record", "b.json", "--allow_other_platform"},
      Host);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->quick);
  EXPECT_EQ(a->json_path, "out.json");
  EXPECT_EQ(a->junit_path, "out.xml");
  EXPECT_EQ(a->seed, 7u);
  EXPECT_EQ(a->suites, (std::vector<std::string>{"golden", "determinism", "integer_exact"}));
  EXPECT_EQ(a->record_path, "b.json");
  EXPECT_TRUE(a->allow_other_platform);
  EXPECT_TRUE(ParseValidateArgs({"--quick", "--noquick"}, Host).value().quick == false);
  EXPECT_TRUE(ParseValidateArgs({"--quick=false"}, Host).value().quick == false);
}

TEST(CommandLineTest, SelectsTheLogProbsSuite) {
  absl::StatusOr<ValidateArgs> a = ParseValidateArgs({"--suite", "logprobs", "--quick"}, Host);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->suites, std::vector<std::string>{"logprobs"});
  a = ParseValidateArgs({"--suite=cross_entropy,logprobs"}, Host);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->suites, (std::vector<std::string>{"cross_entropy", "logprobs"}));
}

TEST(CommandLineTest, ReportTakesADirectory) {
  EXPECT_EQ(ParseValidateArgs({"--report=out/r"}, Host).value().report_dir, "out/r");
  EXPECT_EQ(ParseValidateArgs({"--report", "r", "golden"}, Host).value().report_dir, "r");
  const absl::Status empty = ParseValidateArgs({"--report="}, Host).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("--report needs a directory"), std::string::npos) << empty;
  EXPECT_NE(ValidateUsage().find("--report=DIR"), std::string::npos);
}

TEST(CommandLineTest, SkipsLogitctlsOwnFlags) {
  absl::StatusOr<ValidateArgs> a = ParseValidateArgs(
      {"--server", "127.0.0.1:5", "--timeout=9", "--tls", "rounding_error"}, Host);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->suites, std::vector<std::string>{"rounding_error"});
}

TEST(CommandLineTest, RejectsUnknownAndBadOptions) {
  EXPECT_EQ(ParseValidateArgs({"--bogus"}, Host).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseValidateArgs({"--seed=-1"}, Host).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseValidateArgs({"--json"}, Host).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseValidateArgs({"--noquick=true"}, Host).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommandLineTest, Help) {
  EXPECT_TRUE(ParseValidateArgs({"--help"}, Host).value().help);
  EXPECT_TRUE(ParseValidateArgs({"help"}, Host).value().help);
  EXPECT_NE(ValidateUsage().find("--baseline"), std::string::npos);
}

}  // namespace
}  // namespace logitd::validate

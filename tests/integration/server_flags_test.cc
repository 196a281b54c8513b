// logitd's command line as a user meets it: --help lists every flag logitd
// defines (grouped, with defaults, and nothing of the libraries'), bad values
// stop it with status 2, and the algorithm-choice default is reported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The flag names server/flags.cc defines, read from the source.
std::set<std::string> FlagsDefinedInSource() {
  std::ifstream in(LOGITD_FLAGS_SOURCE);
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  // "ABSL_FLAG(type, name, ...": the word after the first comma.
  std::set<std::string> names;
  for (std::size_t at = source.find("ABSL_FLAG("); at != std::string::npos;
       at = source.find("ABSL_FLAG(", at + 1)) {
    std::size_t begin = source.find(',', at);
    if (begin == std::string::npos) break;
    begin = source.find_first_not_of(" \n", begin + 1);
    const std::size_t end =
        source.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_", begin);
    if (begin != std::string::npos && end != std::string::npos && end > begin) {
      names.insert(source.substr(begin, end - begin));
    }
  }
  return names;
}

TEST(ServerFlagsTest, HelpListsEveryFlagOfLogitdGroupedAndNoOther) {
  const std::set<std::string> defined = FlagsDefinedInSource();
  ASSERT_GE(defined.size(), 25u) << "cannot read the flags from " << LOGITD_FLAGS_SOURCE;
  const LogitctlRun help = RunProgram(ServerBinary(), {"--help"});
  ASSERT_EQ(help.exit_code, 0) << help.err;
  for (const std::string& name : defined) {
    EXPECT_THAT(help.out, HasSubstr("\n  --" + name + "  (default: ")) << name;
  }
  for (const char* group :
       {"\nNetwork:\n", "\nBackend:\n", "\nLimits:\n", "\nSecurity:\n", "\nObservability:\n"}) {
    EXPECT_THAT(help.out, HasSubstr(group));
  }
  EXPECT_THAT(help.out, Not(HasSubstr("\nOther:\n"))) << "a flag belongs to no group";
  EXPECT_THAT(help.out, HasSubstr("--algo_cache  (default: auto)"));
  EXPECT_THAT(help.out, HasSubstr(" none: "));
  EXPECT_THAT(help.out, Not(HasSubstr("No flags matched")));
  // Abseil's and gRPC's own flags stay behind --helpfull.
  EXPECT_THAT(help.out, Not(HasSubstr("--flagfile")));
  const LogitctlRun shorter = RunProgram(ServerBinary(), {"--helpshort"});
  EXPECT_EQ(shorter.exit_code, 0);
  EXPECT_EQ(shorter.out, help.out);
}

TEST(ServerFlagsTest, AnEmptyAlgoCacheIsRefusedWithStatusTwo) {
  const LogitctlRun run = RunProgram(ServerBinary(), {"--backend=cpu", "--algo_cache="});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--algo_cache: expected auto"));
}

TEST(ServerFlagsTest, CpuAlgorithmsAreTheSameInEveryProcess) {
  absl::StatusOr<std::unique_ptr<SharedServer>> s = SharedServer::Start({});
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<client::ServerInfo> info = (*s)->client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->algo_choices, "fixed");
  EXPECT_EQ(info->algo_cache_path, "");
  EXPECT_THAT((*s)->process.Log(), HasSubstr("algo_choices=fixed"));
  const LogitctlRun run = RunLogitctl({"--server=" + (*s)->process.address(), "info"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("algo_choices"));
  EXPECT_THAT(run.out, HasSubstr("fixed"));
}

}  // namespace
}  // namespace logitd::testing

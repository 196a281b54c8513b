// Tests of client/common/argv.h, the command-line reader logitctl and the
// validation harness share: every spelling it accepts, "--", --noflag, and
// the values it takes from the next word or refuses.
#include "client/common/argv.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace logitd::argv {
namespace {

// A boolean "quick", a valued "seed" and a valued flag literally named
// "nothing" (so that --nothing is not read as --no + thing).
std::optional<FlagType> Flags(absl::string_view name) {
  if (name == "quick") return FlagType::kBool;
  if (name == "seed" || name == "nothing") return FlagType::kValue;
  return std::nullopt;
}

std::vector<Word> ReadAll(const std::vector<std::string>& words) {
  Reader reader(words);
  std::vector<Word> out;
  while (std::optional<Word> w = reader.Next()) out.push_back(*w);
  return out;
}

TEST(ArgvTest, SplitsFlagWordsFromPositionalOnes) {
  const std::vector<Word> w = ReadAll({"info", "--seed=7", "-quick", "-", "--x=", "--", "--seed"});
  ASSERT_EQ(w.size(), 6u);
  EXPECT_FALSE(w[0].is_flag);
  EXPECT_EQ(w[0].text, "info");
  EXPECT_TRUE(w[1].is_flag);
  EXPECT_EQ(w[1].name, "seed");
  EXPECT_EQ(w[1].value, "7");
  EXPECT_TRUE(w[2].is_flag);
  EXPECT_EQ(w[2].name, "quick");
  EXPECT_FALSE(w[2].value.has_value());
  EXPECT_FALSE(w[3].is_flag);  // "-" alone
  EXPECT_EQ(w[4].name, "x");
  EXPECT_EQ(w[4].value, "");  // given, and empty
  // After "--" every word is positional; "--" itself is not returned.
  EXPECT_FALSE(w[5].is_flag);
  EXPECT_EQ(w[5].text, "--seed");
  EXPECT_EQ(w[5].index, 6u);
}

TEST(ArgvTest, ResolvesNegationOfBooleansOnly) {
  const std::vector<Word> w = ReadAll({"--noquick", "--noseed", "--nothing", "--bogus", "x"});
  std::optional<Flag> f = Resolve(w[0], Flags);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "quick");
  EXPECT_EQ(f->written, "noquick");
  EXPECT_TRUE(f->negated);
  EXPECT_FALSE(Resolve(w[1], Flags).has_value());  // seed takes a value
  f = Resolve(w[2], Flags);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->name, "nothing");
  EXPECT_FALSE(f->negated);
  EXPECT_FALSE(Resolve(w[3], Flags).has_value());
  EXPECT_FALSE(Resolve(w[4], Flags).has_value());
  EXPECT_FALSE(Resolve(w[0], FlagLookup()).has_value());
}

// The text each spelling sets its flag from, and the words left positional.
TEST(ArgvTest, ValuesOfEverySpelling) {
  Reader reader(
      {"--quick", "--noquick", "--quick=false", "--seed=1", "--seed", "2", "-seed", "3", "word"});
  std::vector<std::string> values;
  std::vector<std::string> positional;
  while (std::optional<Word> w = reader.Next()) {
    if (!w->is_flag) {
      positional.push_back(w->text);
      continue;
    }
    std::optional<Flag> f = Resolve(*w, Flags);
    ASSERT_TRUE(f.has_value()) << w->text;
    absl::StatusOr<std::string> v = reader.Value(*f);
    ASSERT_TRUE(v.ok()) << v.status();
    values.push_back(*v);
  }
  EXPECT_EQ(values, (std::vector<std::string>{"true", "false", "false", "1", "2", "3"}));
  EXPECT_EQ(positional, std::vector<std::string>{"word"});
}

TEST(ArgvTest, RefusesAMissingValueAndAValuedNegation) {
  Reader missing({"--seed"});
  std::optional<Flag> f = Resolve(*missing.Next(), Flags);
  ASSERT_TRUE(f.has_value());
  absl::StatusOr<std::string> v = missing.Value(*f);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "--seed needs a value");

  Reader negated({"--noquick=true"});
  f = Resolve(*negated.Next(), Flags);
  ASSERT_TRUE(f.has_value());
  v = negated.Value(*f);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "--noquick takes no value");
}

// Another program's flags are passed over with their values, leniently.
TEST(ArgvTest, SkipsAnotherProgramsValues) {
  Reader reader({"--seed", "9", "--quick", "word", "--seed"});
  std::vector<std::string> positional;
  while (std::optional<Word> w = reader.Next()) {
    if (!w->is_flag) {
      positional.push_back(w->text);
      continue;
    }
    reader.SkipValue(*Resolve(*w, Flags));
  }
  EXPECT_EQ(positional, std::vector<std::string>{"word"});
}

}  // namespace
}  // namespace logitd::argv

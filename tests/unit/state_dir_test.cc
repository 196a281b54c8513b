#include "server/state_dir.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace logitd {
namespace {

// An environment of the given variables only.
GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(StateDirTest, SystemdsStateDirectoryComesFirst) {
  EXPECT_EQ(DefaultStateDirectory(Env({{"STATE_DIRECTORY", "/var/lib/logitd"},
                                       {"XDG_STATE_HOME", "/x"},
                                       {"HOME", "/home/u"}}))
                .value(),
            "/var/lib/logitd");
  // Several StateDirectory= entries: the first.
  EXPECT_EQ(DefaultStateDirectory(Env({{"STATE_DIRECTORY", "/var/lib/a:/var/lib/b"}})).value(),
            "/var/lib/a");
}

TEST(StateDirTest, ThenXdgStateHomeThenHome) {
  EXPECT_EQ(
      DefaultStateDirectory(Env({{"XDG_STATE_HOME", "/x/state"}, {"HOME", "/home/u"}})).value(),
      "/x/state/logitd");
  EXPECT_EQ(DefaultStateDirectory(Env({{"HOME", "/home/u"}})).value(),
            "/home/u/.local/state/logitd");
}

TEST(StateDirTest, RelativeValuesAreIgnored) {
  EXPECT_EQ(DefaultStateDirectory(Env({{"STATE_DIRECTORY", "relative"},
                                       {"XDG_STATE_HOME", "also/relative"},
                                       {"HOME", "/home/u"}}))
                .value(),
            "/home/u/.local/state/logitd");
}

TEST(StateDirTest, WithoutHomeThePasswordDatabaseDecides) {
  // This process's user has a home directory in every environment the
  // tests run in; its absence is NOT_FOUND, never a relative path.
  absl::StatusOr<std::string> dir = DefaultStateDirectory(Env({}));
  if (dir.ok()) {
    EXPECT_EQ(dir->front(), '/') << *dir;
    EXPECT_NE(dir->find("/.local/state/logitd"), std::string::npos) << *dir;
  } else {
    EXPECT_EQ(dir.status().code(), absl::StatusCode::kNotFound);
  }
}

TEST(StateDirTest, AlgoCacheFlagValues) {
  const GetEnv env = Env({{"HOME", "/home/u"}});
  EXPECT_EQ(AlgoCachePathFromFlag("auto", env).value(),
            "/home/u/.local/state/logitd/algo_cache.json");
  EXPECT_EQ(AlgoCachePathFromFlag("none", env).value(), "");
  EXPECT_EQ(AlgoCachePathFromFlag("/srv/cache.json", env).value(), "/srv/cache.json");
  absl::StatusOr<std::string> empty = AlgoCachePathFromFlag("", env);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("expected auto"), std::string::npos);
}

}  // namespace
}  // namespace logitd

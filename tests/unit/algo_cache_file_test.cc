#include "server/kernels/algo_cache_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace logitd::kernels {
namespace {

std::string KeyOf(const nlohmann::json& e) { return e.value("key", std::string()); }

nlohmann::json Entry(const std::string& key, const std::string& config) {
  return {{"key", key}, {"config", config}};
}

class AlgoCacheFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(::testing::TempDir(), "/logitd_algo_cache_", info->name(), "_", getpid());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // In a directory that does not exist yet, two levels down.
  std::string Path() const { return dir_ + "/state/logitd/algo_cache.json"; }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  }

  std::string dir_;
};

TEST_F(AlgoCacheFileTest, OpenCreatesAPrivateDirectoryAndNothingElse) {
  absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(f.ok()) << f.status();
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/state/logitd").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_FALSE(std::filesystem::exists(Path()));
  const AlgoCacheFile::Loaded loaded = f->Load();
  EXPECT_TRUE(loaded.entries.empty());
  EXPECT_EQ(loaded.ignored, "");
}

TEST_F(AlgoCacheFileTest, OpenFailsWhereNoDirectoryCanBeMade) {
  Write(dir_ + "/plain", "a file, not a directory");
  absl::StatusOr<AlgoCacheFile> f =
      AlgoCacheFile::Open(dir_ + "/plain/logitd/algo_cache.json", "gpu A", KeyOf);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(f.status().message().find("cannot create directory"), std::string::npos) << f.status();
}

TEST_F(AlgoCacheFileTest, AClaimIsReadByTheNextProcessOfThePlatformOnly) {
  {
    absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<nlohmann::json> standing = f->Claim(Entry("logits 16x32", "tile=1"));
    ASSERT_TRUE(standing.ok()) << standing.status();
    EXPECT_EQ(*standing, Entry("logits 16x32", "tile=1"));
  }
  absl::StatusOr<AlgoCacheFile> again = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(again.ok());
  const AlgoCacheFile::Loaded loaded = again->Load();
  ASSERT_EQ(loaded.entries.size(), 1u);
  EXPECT_EQ(loaded.entries[0], Entry("logits 16x32", "tile=1"));
  EXPECT_EQ(loaded.other_platform_entries, 0);

  absl::StatusOr<AlgoCacheFile> other = AlgoCacheFile::Open(Path(), "gpu B", KeyOf);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->Load().entries.empty());
  EXPECT_EQ(other->Load().other_platform_entries, 1);
  // Its own claims keep the first platform's entries.
  ASSERT_TRUE(other->Claim(Entry("logits 16x32", "tile=7")).ok());
  EXPECT_EQ(again->Load().entries.size(), 1u);
  EXPECT_EQ(again->Load().entries[0], Entry("logits 16x32", "tile=1"));
  EXPECT_EQ(other->Load().entries[0], Entry("logits 16x32", "tile=7"));
}

TEST_F(AlgoCacheFileTest, TheFirstClaimOfAKeyStands) {
  absl::StatusOr<AlgoCacheFile> a = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  absl::StatusOr<AlgoCacheFile> b = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Claim(Entry("dx", "tile=1")).ok());
  absl::StatusOr<nlohmann::json> standing = b->Claim(Entry("dx", "tile=2"));
  ASSERT_TRUE(standing.ok());
  EXPECT_EQ(*standing, Entry("dx", "tile=1"));
  EXPECT_EQ(a->Load().entries.size(), 1u);
}

TEST_F(AlgoCacheFileTest, AFormatOneFileIsReadAndKeptWhenRewritten) {
  Write(Path(), R"({"format": "logitd-algo-cache", "format_version": 1, "platform": "gpu A",
                    "entries": [{"key": "dw", "config": "tile=3"}]})");
  absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->Load().entries.size(), 1u);
  ASSERT_TRUE(f->Claim(Entry("dx", "tile=4")).ok());
  const nlohmann::json j = nlohmann::json::parse(Read(Path()));
  EXPECT_EQ(j["format_version"], 2);
  const AlgoCacheFile::Loaded loaded = f->Load();
  ASSERT_EQ(loaded.entries.size(), 2u);
  EXPECT_EQ(loaded.entries[0], Entry("dw", "tile=3"));
  EXPECT_EQ(loaded.entries[1], Entry("dx", "tile=4"));
}

TEST_F(AlgoCacheFileTest, AFileThatIsNotACacheIsReportedThenReplaced) {
  Write(Path(), "not json");
  absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->Load().ignored, "is not a logitd algorithm cache");
  ASSERT_TRUE(f->Claim(Entry("dx", "tile=4")).ok());
  EXPECT_EQ(f->Load().ignored, "");
  EXPECT_EQ(f->Load().entries.size(), 1u);
}

// Processes that claim at once lose none of each other's entries and agree
// on every key they share.
TEST_F(AlgoCacheFileTest, ConcurrentProcessesKeepEveryEntryAndAgree) {
  constexpr int kProcesses = 6;
  constexpr int kKeysEach = 15;
  ASSERT_TRUE(AlgoCacheFile::Open(Path(), "gpu A", KeyOf).ok());
  std::vector<pid_t> children;
  std::vector<int> reads;
  for (int p = 0; p < kProcesses; ++p) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
      std::string said;
      for (int i = 0; f.ok() && i < kKeysEach; ++i) {
        // Every process claims "shared" with its own value, between its own keys.
        if (i == kKeysEach / 2) {
          absl::StatusOr<nlohmann::json> s = f->Claim(Entry("shared", absl::StrCat("from ", p)));
          said = s.ok() ? s->value("config", std::string()) : "error";
        }
        if (!f->Claim(Entry(absl::StrCat("own ", p, " ", i), "x")).ok()) said = "error";
      }
      const ssize_t n = write(fds[1], said.data(), said.size());
      _exit(f.ok() && n == static_cast<ssize_t>(said.size()) ? 0 : 1);
    }
    close(fds[1]);
    children.push_back(pid);
    reads.push_back(fds[0]);
  }
  std::set<std::string> standing;
  for (int p = 0; p < kProcesses; ++p) {
    int status = 0;
    ASSERT_EQ(waitpid(children[static_cast<std::size_t>(p)], &status, 0),
              children[static_cast<std::size_t>(p)]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "process " << p;
    char buf[64];
    const ssize_t n = read(reads[static_cast<std::size_t>(p)], buf, sizeof buf);
    close(reads[static_cast<std::size_t>(p)]);
    standing.insert(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0));
  }
  EXPECT_EQ(standing.size(), 1u) << "processes disagree on the shared key";
  EXPECT_EQ(standing.count("error"), 0u);
  absl::StatusOr<AlgoCacheFile> f = AlgoCacheFile::Open(Path(), "gpu A", KeyOf);
  ASSERT_TRUE(f.ok());
  const AlgoCacheFile::Loaded loaded = f->Load();
  EXPECT_EQ(loaded.entries.size(), static_cast<std::size_t>(kProcesses * kKeysEach + 1));
  std::set<std::string> keys;
  for (const nlohmann::json& e : loaded.entries) keys.insert(KeyOf(e));
  EXPECT_EQ(keys.size(), loaded.entries.size()) << "a key was recorded twice";
}

}  // namespace
}  // namespace logitd::kernels

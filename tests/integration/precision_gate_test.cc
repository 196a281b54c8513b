// deploy/ci/precision-gate.sh, the CI examples' shell, against real cpu
// servers: record a baseline, gate against it (reports written, the job
// summary appended), compare with a second server, and the exit codes of a
// missing server address, a missing baseline and a failing comparison.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "integration_util.h"

namespace logitd::testing {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PrecisionGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/logitd-gate-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/baselines");
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Runs the script with `env` (NAME=value words) and OUT = DIR/out; returns
  // its exit code, its output in *log.
  int Gate(const std::string& env, std::string* log) {
    const std::string cmd = "cd '" + dir_ +
                            "' && env LOGITCTL='" LOGITCTL_PATH "' GATE_ARGS=--quick " + env +
                            " bash '" GATE_SCRIPT "' out 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return -1;
    char buf[4096];
    log->clear();
    while (size_t n = fread(buf, 1, sizeof buf, p)) log->append(buf, n);
    const int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string dir_;
};

TEST_F(PrecisionGateTest, RecordGateAndCompare) {
  absl::StatusOr<ServerProcess> a = StartServerOnPort(0, {"--backend=cpu"});
  ASSERT_TRUE(a.ok()) << a.status();
  std::string log;
  const std::string addr = "LOGITD_ADDR=" + a->address();

  ASSERT_EQ(Gate(addr + " GATE_RECORD=1", &log), 0) << log;
  ASSERT_TRUE(std::filesystem::exists(dir_ + "/out/baseline.json")) << log;
  std::filesystem::copy_file(dir_ + "/out/baseline.json", dir_ + "/baselines/cpu-test.json");

  const std::string summary = dir_ + "/step-summary.md";
  ASSERT_EQ(Gate(addr + " LOGITD_PLATFORM=cpu-test GITHUB_STEP_SUMMARY=" + summary, &log), 0)
      << log;
  EXPECT_NE(Read(summary).find("logitctl validate: PASSED"), std::string::npos) << Read(summary);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/out/report/index.html"));
  EXPECT_NE(Read(dir_ + "/out/report.json").find("\"golden\""), std::string::npos);

  // A second clean server: both within bounds, exit 0, the comparison in the summary.
  absl::StatusOr<ServerProcess> b = StartServerOnPort(0, {"--backend=cpu", "--cpu_threads=1"});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(Gate(addr + " LOGITD_PLATFORM=cpu-test LOGITD_COMPARE_ADDR=" + b->address() +
                     " GITHUB_STEP_SUMMARY=" + summary,
                 &log),
            0)
      << log;
  EXPECT_NE(Read(dir_ + "/out/compare.json").find("\"verdict\""), std::string::npos);
  EXPECT_NE(Read(summary).find("#### Compare: "), std::string::npos) << Read(summary);
}

TEST_F(PrecisionGateTest, ExitCodes) {
  std::string log;
  EXPECT_EQ(Gate("", &log), 2) << log;
  EXPECT_NE(log.find("set LOGITD_ADDR"), std::string::npos) << log;
  absl::StatusOr<ServerProcess> a = StartServerOnPort(0, {"--backend=cpu"});
  ASSERT_TRUE(a.ok()) << a.status();
  // No baseline for the platform named: a usage error, before any work.
  EXPECT_EQ(Gate("LOGITD_ADDR=" + a->address() + " LOGITD_PLATFORM=nowhere", &log), 2) << log;
  // No logitctl named and none where the README's commands build it: a
  // usage error that says what to build.
  const std::string unset = "LOGITCTL= PATH=/usr/bin:/bin LOGITD_ADDR=" + a->address();
  EXPECT_EQ(Gate(unset + " GATE_RECORD=1", &log), 2) << log;
  EXPECT_NE(log.find("no logitctl"), std::string::npos) << log;
  EXPECT_NE(log.find("cmake --preset default"), std::string::npos) << log;
  // Built by `cmake --preset default`: found there.
  std::filesystem::create_directories(dir_ + "/build/default/client/logitctl");
  std::filesystem::create_symlink(LOGITCTL_PATH, dir_ + "/build/default/client/logitctl/logitctl");
  EXPECT_EQ(Gate(unset + " GATE_RECORD=1", &log), 0) << log;
  std::filesystem::remove_all(dir_ + "/build");
  std::filesystem::remove_all(dir_ + "/out");
#ifdef LOGITD_TEST_FAULTS_ENABLED
  // A candidate one ulp off on exact results fails the comparison.
  ASSERT_EQ(Gate("LOGITD_ADDR=" + a->address() + " GATE_RECORD=1", &log), 0) << log;
  std::filesystem::copy_file(dir_ + "/out/baseline.json", dir_ + "/baselines/cpu-test.json");
  absl::StatusOr<ServerProcess> bad =
      StartServerOnPort(0, {"--backend=cpu", "--test_fault=logits_bit"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(Gate("LOGITD_ADDR=" + a->address() +
                     " LOGITD_PLATFORM=cpu-test LOGITD_COMPARE_ADDR=" + bad->address(),
                 &log),
            1)
      << log;
  EXPECT_NE(log.find("compare verdict: outside its bounds"), std::string::npos) << log;
#endif
}

}  // namespace
}  // namespace logitd::testing

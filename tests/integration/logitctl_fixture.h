// A fixture for tests that drive logitctl against the suite's shared cpu
// server: a scratch directory per test for the safetensors files, and
// helpers to run logitctl, write and read tensors, and read its output.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "logitd/safetensors.h"
#include "logitd/tensor.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {

class LogitctlFixture : public SharedServerTest {
 protected:
  void SetUp() override {
    SharedServerTest::SetUp();
    if (HasFatalFailure()) return;
    dir_ = std::make_unique<TempDir>();
    ASSERT_FALSE(dir_->path().empty());
  }
  void TearDown() override {
    dir_.reset();
    SharedServerTest::TearDown();
  }

  // A file of this test's scratch directory.
  std::string Path(const std::string& name) const { return *dir_ / name; }

  // Runs logitctl against the suite's server (unless args name --server).
  LogitctlRun Run(const std::vector<std::string>& args, bool with_server = true) const {
    std::vector<std::string> all;
    if (with_server) all.push_back("--server=" + server_->process.address());
    all.insert(all.end(), args.begin(), args.end());
    return RunLogitctl(all);
  }

  void Write(const std::string& name, const std::vector<std::pair<std::string, const Tensor*>>& t) {
    absl::Status s = WriteSafetensors(Path(name), t);
    ASSERT_TRUE(s.ok()) << s;
  }

  static Tensor Read(const std::string& path, const std::string& tensor) {
    absl::StatusOr<Tensor> t = ReadSafetensorsTensor(path, tensor);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : Tensor();
  }

  // The value printed after `key` on one of logitctl's "key  value" rows.
  static std::string Field(const std::string& out, const std::string& key) {
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && parts[0] == key) return parts[1];
    }
    return "";
  }

 private:
  std::unique_ptr<TempDir> dir_;
};

}  // namespace logitd::testing

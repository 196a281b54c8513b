// The runner: verdicts from checks, RPC failures as failed cases, and an
// unreachable server stopping the run with the remaining cases not run.
#include "client/validate/harness.h"

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace logitd::validate {
namespace {

class FakeSuite final : public Suite {
 public:
  FakeSuite(std::string name, std::vector<Case> cases)
      : name_(std::move(name)), cases_(std::move(cases)) {}
  std::string name() const override { return name_; }
  std::vector<Case> Cases(const Options&) override { return cases_; }
  void Finish(RunContext&, std::vector<CaseResult>& results) override {
    finished_with = static_cast<int>(results.size());
  }
  int finished_with = -1;

 private:
  std::string name_;
  std::vector<Case> cases_;
};

absl::Status Pass(RunContext&, CaseResult& r) {
  r.summary = "fine";
  return absl::OkStatus();
}
absl::Status FailCheck(RunContext&, CaseResult& r) {
  r.Check(false, "1 of 2 elements differ");
  return absl::OkStatus();
}
absl::Status Skip(RunContext&, CaseResult& r) {
  r.Skip("nothing to compare with");
  return absl::OkStatus();
}
absl::Status DataLoss(RunContext&, CaseResult&) { return absl::DataLossError("bad digest"); }
absl::Status Throw(RunContext&, CaseResult&) { throw std::runtime_error("boom"); }
absl::Status Unavailable(RunContext&, CaseResult&) {
  return absl::UnavailableError("connection refused");
}

std::map<std::string, Verdict> ByName(const RunOutcome& o) {
  std::map<std::string, Verdict> m;
  for (const CaseResult& r : o.results) m[r.FullName()] = r.verdict;
  return m;
}

TEST(RunSuitesTest, VerdictsFromChecksAndStatuses) {
  RunContext ctx(nullptr, client::ServerInfo(), Options());
  std::vector<std::unique_ptr<Suite>> suites;
  suites.push_back(std::make_unique<FakeSuite>("a", std::vector<Case>{{"pass", Pass},
                                                                      {"check", FailCheck},
                                                                      {"skip", Skip},
                                                                      {"data_loss", DataLoss},
                                                                      {"throw", Throw}}));
  auto progress = MakeSilentProgress();
  const RunOutcome o = RunSuites(ctx, suites, *progress);
  EXPECT_TRUE(o.fatal.ok());
  const auto v = ByName(o);
  EXPECT_EQ(v.at("a/pass"), Verdict::kPassed);
  EXPECT_EQ(v.at("a/check"), Verdict::kFailed);
  EXPECT_EQ(v.at("a/skip"), Verdict::kNotRun);
  EXPECT_EQ(v.at("a/data_loss"), Verdict::kFailed);  // a corrupted result is never a pass
  EXPECT_EQ(v.at("a/throw"), Verdict::kFailed);
  EXPECT_EQ(o.results[3].failures.at(0), "DATA_LOSS: bad digest");
  EXPECT_EQ(static_cast<FakeSuite*>(suites[0].get())->finished_with, 5);
}

TEST(RunSuitesTest, UnreachableServerStopsTheRun) {
  RunContext ctx(nullptr, client::ServerInfo(), Options());
  std::vector<std::unique_ptr<Suite>> suites;
  suites.push_back(std::make_unique<FakeSuite>(
      "a", std::vector<Case>{{"pass", Pass}, {"gone", Unavailable}, {"later", Pass}}));
  suites.push_back(std::make_unique<FakeSuite>("b", std::vector<Case>{{"never", Pass}}));
  auto progress = MakeSilentProgress();
  const RunOutcome o = RunSuites(ctx, suites, *progress);
  EXPECT_EQ(o.fatal.code(), absl::StatusCode::kUnavailable);
  const auto v = ByName(o);
  EXPECT_EQ(v.at("a/pass"), Verdict::kPassed);
  EXPECT_EQ(v.at("a/gone"), Verdict::kFailed);
  EXPECT_EQ(v.at("a/later"), Verdict::kNotRun);
  EXPECT_EQ(v.at("b/never"), Verdict::kNotRun);
  EXPECT_EQ(static_cast<FakeSuite*>(suites[1].get())->finished_with, -1);
}

TEST(RunContextTest, KeepsTheFirstReplayOfEachSuite) {
  RunContext ctx(nullptr, client::ServerInfo(), Options());
  EXPECT_TRUE(ctx.WantsReplay("a"));
  ctx.OfferReplay(Replay{"a", "first", nullptr, {}});
  ctx.OfferReplay(Replay{"a", "second", nullptr, {}});
  EXPECT_FALSE(ctx.WantsReplay("a"));
  EXPECT_EQ(ctx.FindReplay("a")->description, "first");
  EXPECT_EQ(ctx.FindReplay("b"), nullptr);
}

TEST(ShapesTest, QuickShrinksVAndK) {
  Options o;
  EXPECT_EQ(ShapesFor(o).v, 32768);
  EXPECT_EQ(ShapesFor(o).ks.back(), 16384);
  o.quick = true;
  EXPECT_EQ(ShapesFor(o).v, 4096);
  EXPECT_LT(ShapesFor(o).ks.size(), 6u);
}

}  // namespace
}  // namespace logitd::validate

// A project's rules and the alerts a run raises under them: each check
// against its figures and its baseline, where a rule applies (case, branch,
// candidate), the checks that need a baseline skipped without one, and the
// rules and alerts kept in the store across a reopen.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/history/history_store.h"
#include "server/history/rules.h"

namespace logitd::history {
namespace {

using ::testing::HasSubstr;

RunRecord BackwardRun(const std::string& case_name, const std::string& branch) {
  RunRecord r;
  r.tenant = "t";
  r.labels = RunLabels{"p", case_name, branch, "r2"};
  r.operation = "VERIFY_BACKWARD";
  r.verdict = "within_bounds";
  for (const char* name : {"dx", "dw"}) {
    CandidateFigures c;
    c.name = name;
    c.verdict = "within_bounds";
    c.worst_bound_fraction = 0.3;
    c.p99_ulp = 6;
    r.candidates.push_back(c);
  }
  return r;
}

Rule MakeRule(Rule::Check check, double limit, const std::string& candidate = "",
              const std::string& branch = "", const std::string& case_name = "") {
  Rule r;
  r.check = check;
  r.limit = limit;
  r.candidate = candidate;
  r.branch = branch;
  r.case_name = case_name;
  return r;
}

RunBaseline Baseline(const std::string& dx_bits, double dx_worst) {
  RunBaseline b;
  b.run_id = 7;
  b.ref = "r1";
  b.candidates["dx"] = {dx_bits, dx_worst};
  b.candidates["dw"] = {"identical", 0.3};
  return b;
}

TEST(HistoryRulesTest, BitsUnchangedAlertsOnTheCandidatesWhoseBitsChanged) {
  const RunRecord run = BackwardRun("c", "main");
  const RunBaseline base = Baseline("different_within_bounds", 0.3);
  const std::vector<Alert> alerts =
      Evaluate({MakeRule(Rule::Check::kBitsUnchanged, 0)}, run, &base);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].candidate, "dx");
  EXPECT_EQ(alerts[0].rule, "bits_unchanged");
  EXPECT_EQ(alerts[0].message, "dx's bits changed against run 7 (ref r1): different_within_bounds");
  // Without a baseline the check has nothing to compare with.
  EXPECT_TRUE(Evaluate({MakeRule(Rule::Check::kBitsUnchanged, 0)}, run, nullptr).empty());
  const RunBaseline same = Baseline("identical", 0.3);
  EXPECT_TRUE(Evaluate({MakeRule(Rule::Check::kBitsUnchanged, 0)}, run, &same).empty());
}

TEST(HistoryRulesTest, WorstFractionGrowthIsAgainstTheBaselinesFigure) {
  const RunRecord run = BackwardRun("c", "main");  // 0.3 for both
  const std::vector<Rule> twice = {MakeRule(Rule::Check::kMaxWorstFractionGrowth, 2)};
  const RunBaseline grew = Baseline("different_within_bounds", 0.1);  // 3x
  std::vector<Alert> alerts = Evaluate(twice, run, &grew);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].candidate, "dx");
  EXPECT_EQ(alerts[0].rule, "max_worst_fraction_growth=2");
  EXPECT_THAT(alerts[0].message, HasSubstr("0.3 is over 2 times run 7 (ref r1)'s 0.1"));
  const RunBaseline within = Baseline("different_within_bounds", 0.15);  // exactly 2x
  EXPECT_TRUE(Evaluate(twice, run, &within).empty());
  EXPECT_TRUE(Evaluate(twice, run, nullptr).empty());
  // A baseline of 0 allows no growth at all.
  const RunBaseline zero = Baseline("different_within_bounds", 0);
  EXPECT_EQ(Evaluate(twice, run, &zero).size(), 1u);
}

TEST(HistoryRulesTest, P99UlpNeedsNoBaselineAndRulesApplyWhereTheirLabelsMatch) {
  const RunRecord run = BackwardRun("c", "main");  // p99 6 for both
  EXPECT_EQ(Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 5)}, run, nullptr).size(), 2u);
  EXPECT_TRUE(Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 6)}, run, nullptr).empty());
  const std::vector<Alert> dw_only =
      Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 5, "dw")}, run, nullptr);
  ASSERT_EQ(dw_only.size(), 1u);
  EXPECT_EQ(dw_only[0].candidate, "dw");
  EXPECT_EQ(dw_only[0].rule, "max_p99_ulp=5 candidate=dw");
  EXPECT_EQ(dw_only[0].message, "dw's p99 ULP distance from logitd's outputs is 6, over 5");
  EXPECT_TRUE(
      Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 5, "", "release")}, run, nullptr).empty());
  EXPECT_TRUE(
      Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 5, "", "", "other")}, run, nullptr).empty());
  EXPECT_EQ(
      Evaluate({MakeRule(Rule::Check::kMaxP99Ulp, 5, "dx", "main", "c")}, run, nullptr).size(), 1u);
}

TEST(HistoryRulesTest, RulesAndAlertsAreKeptAcrossAReopen) {
  char dir[] = "/tmp/logitd-rules-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/h.sqlite3";
  const std::vector<Rule> rules = {MakeRule(Rule::Check::kBitsUnchanged, 0, "dx", "main"),
                                   MakeRule(Rule::Check::kMaxWorstFractionGrowth, 1.5),
                                   MakeRule(Rule::Check::kMaxP99Ulp, 4, "", "", "c")};
  {
    auto store = HistoryStore::OpenSqlite(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SetRules("t", "p", {MakeRule(Rule::Check::kMaxP99Ulp, 9)}).ok());
    ASSERT_TRUE((*store)->SetRules("t", "p", rules).ok());  // replaces
    ASSERT_TRUE((*store)->SetRules("u", "p", {}).ok());
    RunRecord run = BackwardRun("c", "main");
    run.alerts = {Alert{"max_p99_ulp=4 case=c", "dx", "over"},
                  Alert{"max_p99_ulp=4 case=c", "dw", "over too"}};
    ASSERT_TRUE((*store)->Record(&run).ok());
  }
  auto store = HistoryStore::OpenSqlite(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<Rule>> got = (*store)->Rules("t", "p");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), rules.size());
  for (std::size_t i = 0; i < rules.size(); ++i) {
    EXPECT_EQ(RuleText((*got)[i]), RuleText(rules[i])) << i;
  }
  EXPECT_EQ(RuleText((*got)[0]), "bits_unchanged branch=main candidate=dx");
  EXPECT_TRUE((*store)->Rules("u", "p")->empty());
  EXPECT_TRUE((*store)->Rules("t", "q")->empty());
  RunFilter f;
  f.tenant = "t";
  absl::StatusOr<std::vector<RunRecord>> runs = (*store)->List(f);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  ASSERT_EQ((*runs)[0].alerts.size(), 2u);
  EXPECT_EQ((*runs)[0].alerts[1].candidate, "dw");
  EXPECT_EQ((*runs)[0].alerts[1].message, "over too");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace logitd::history

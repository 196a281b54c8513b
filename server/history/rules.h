// A project's rules on its recorded runs, and the alerts a run raises under
// them: "bits of candidate y must not change on branch main", "the worst
// bound fraction must not grow past 2x the baseline's", "p99 ULP against
// logitd at most 4". Checked when a run is recorded (history_handlers.cc),
// stored with it, and said in Verify's response.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/history/history_store.h"

namespace logitd::history {

// The most rules a project holds.
inline constexpr int kMaxRules = 100;

// The check's name as the proto's field spells it ("bits_unchanged").
const char* CheckName(Rule::Check check);
// The rule as text: its check (with its limit) and the labels it names,
// "max_worst_fraction_growth=2 branch=main candidate=y".
std::string RuleText(const Rule& rule);

// What the baseline run gave each candidate, for the checks that compare.
struct BaselineCandidate {
  // CandidateComparison.bits: "identical", "different_within_bounds", ...
  std::string bits;
  double worst_bound_fraction = 0;
};
struct RunBaseline {
  std::int64_t run_id = 0;
  std::string ref;
  std::map<std::string, BaselineCandidate> candidates;
};

// The alerts `run` raises under `rules`: a rule applies where its case and
// branch match the run's labels (empty: any), to each candidate it names
// (empty: every one). The checks against a baseline apply only with one
// (null: the run was not compared) and to candidates the baseline had.
std::vector<Alert> Evaluate(const std::vector<Rule>& rules, const RunRecord& run,
                            const RunBaseline* baseline);

}  // namespace logitd::history

#include "server/history/rules.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace logitd::history {
namespace {

std::string BaselineName(const RunBaseline& baseline) {
  return baseline.ref.empty() ? absl::StrCat("run ", baseline.run_id)
                              : absl::StrCat("run ", baseline.run_id, " (ref ", baseline.ref, ")");
}

// The alert's message when `c` breaks `rule`; empty when it keeps it.
std::string Breach(const Rule& rule, const CandidateFigures& c, const RunBaseline* baseline) {
  switch (rule.check) {
    case Rule::Check::kBitsUnchanged: {
      if (baseline == nullptr) return {};
      auto it = baseline->candidates.find(c.name);
      if (it == baseline->candidates.end() || it->second.bits == "identical") return {};
      return absl::StrCat(c.name, "'s bits changed against ", BaselineName(*baseline), ": ",
                          it->second.bits);
    }
    case Rule::Check::kMaxWorstFractionGrowth: {
      if (baseline == nullptr) return {};
      auto it = baseline->candidates.find(c.name);
      if (it == baseline->candidates.end()) return {};
      const double allowed = rule.limit * it->second.worst_bound_fraction;
      if (!(c.worst_bound_fraction > allowed)) return {};
      return absl::StrFormat("%s's worst bound fraction %.6g is over %g times %s's %.6g", c.name,
                             c.worst_bound_fraction, rule.limit, BaselineName(*baseline),
                             it->second.worst_bound_fraction);
    }
    case Rule::Check::kMaxP99Ulp:
      if (!(static_cast<double>(c.p99_ulp) > rule.limit)) return {};
      return absl::StrFormat("%s's p99 ULP distance from logitd's outputs is %d, over %g", c.name,
                             c.p99_ulp, rule.limit);
  }
  return {};
}

}  // namespace

const char* CheckName(Rule::Check check) {
  switch (check) {
    case Rule::Check::kBitsUnchanged:
      return "bits_unchanged";
    case Rule::Check::kMaxWorstFractionGrowth:
      return "max_worst_fraction_growth";
    case Rule::Check::kMaxP99Ulp:
      return "max_p99_ulp";
  }
  return "?";
}

std::string RuleText(const Rule& rule) {
  std::string text = CheckName(rule.check);
  if (rule.check != Rule::Check::kBitsUnchanged) absl::StrAppend(&text, "=", rule.limit);
  if (!rule.case_name.empty()) absl::StrAppend(&text, " case=", rule.case_name);
  if (!rule.branch.empty()) absl::StrAppend(&text, " branch=", rule.branch);
  if (!rule.candidate.empty()) absl::StrAppend(&text, " candidate=", rule.candidate);
  return text;
}

std::vector<Alert> Evaluate(const std::vector<Rule>& rules, const RunRecord& run,
                            const RunBaseline* baseline) {
  std::vector<Alert> alerts;
  for (const Rule& rule : rules) {
    if (!rule.case_name.empty() && rule.case_name != run.labels.case_name) continue;
    if (!rule.branch.empty() && rule.branch != run.labels.branch) continue;
    for (const CandidateFigures& c : run.candidates) {
      if (!rule.candidate.empty() && rule.candidate != c.name) continue;
      std::string message = Breach(rule, c, baseline);
      if (!message.empty()) alerts.push_back(Alert{RuleText(rule), c.name, std::move(message)});
    }
  }
  return alerts;
}

}  // namespace logitd::history

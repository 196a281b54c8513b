#include "client/validate/golden_history.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace logitd::validate {
namespace {

// The name a golden case's run has in the history.
std::string RunCaseName(const std::string& name) { return absl::StrCat("golden/", name); }

// "identical to run 12 (main at abc)", or the bits that moved and where.
std::string ComparisonSummary(const client::RunComparison& c) {
  const std::string base =
      absl::StrCat("run ", c.baseline_run_id, " (",
                   c.baseline_labels.branch.empty() ? "no branch" : c.baseline_labels.branch,
                   c.baseline_labels.ref.empty() ? "" : " at ", c.baseline_labels.ref, ")");
  std::vector<std::string> moved;
  for (const client::CandidateComparison& cc : c.candidates) {
    if (cc.bits == "identical") continue;
    std::string rows;
    for (std::int64_t b : cc.changed_blocks) {
      const std::int64_t first = b * cc.block_rows;
      std::int64_t last = first + cc.block_rows - 1;
      if (cc.rows > 0) last = std::min(last, cc.rows - 1);
      absl::StrAppend(&rows, rows.empty() ? "" : ", ", first,
                      last > first ? absl::StrCat("-", last) : "");
    }
    moved.push_back(absl::StrCat(cc.name, " ", cc.bits, rows.empty() ? "" : " (rows ", rows,
                                 rows.empty() ? "" : ")"));
  }
  std::string out = moved.empty()
                        ? absl::StrCat("identical to ", base)
                        : absl::StrCat("against ", base, ": ", absl::StrJoin(moved, "; "));
  if (!c.platform_difference.empty())
    absl::StrAppend(&out, " (other platform: ", c.platform_difference, ")");
  if (!c.same_inputs) absl::StrAppend(&out, " (OTHER INPUTS)");
  return out;
}

}  // namespace

client::ValidatedCase ValidatedCaseOf(
    const std::string& case_name, std::uint64_t inputs_xxh3,
    const std::vector<std::pair<std::string, Tensor>>& outputs,
    const std::vector<std::pair<std::string, BoundStats>>& bounds) {
  client::ValidatedCase c;
  c.case_name = RunCaseName(case_name);
  c.inputs_xxh3 = inputs_xxh3;
  for (const auto& [name, t] : outputs) {
    client::ValidatedOutput o;
    o.name = name;
    o.xxh3 = t.Digest();
    o.elements = t.numel();
    o.shape = t.shape();
    for (const auto& [bound_name, stats] : bounds) {
      if (bound_name != name) continue;
      o.within_bounds = stats.within();
      o.worst_bound_fraction = stats.worst_fraction;
    }
    c.within_bounds = c.within_bounds && o.within_bounds;
    // Rows of the first dimension (a scalar: one), at most 64 blocks of them.
    const std::int64_t rows = t.rank() == 0 || t.dim(0) <= 0 ? 1 : t.dim(0);
    const std::size_t row_bytes = t.nbytes() / static_cast<std::size_t>(rows);
    o.block_rows = (rows + 63) / 64;
    for (std::int64_t first = 0; first < rows; first += o.block_rows) {
      const std::int64_t n = std::min(o.block_rows, rows - first);
      o.block_xxh3.push_back(Xxh3(t.bytes() + static_cast<std::size_t>(first) * row_bytes,
                                  static_cast<std::size_t>(n) * row_bytes));
    }
    c.outputs.push_back(std::move(o));
  }
  return c;
}

void RecordGoldenCases(RunContext& ctx, std::vector<client::ValidatedCase> cases,
                       std::vector<CaseResult>& results) {
  if (cases.empty()) return;
  client::RecordValidationArgs args;
  args.labels = *ctx.options().history;
  args.compare = ctx.options().history_compare;
  args.cases = std::move(cases);
  absl::StatusOr<std::vector<client::RecordedCase>> recorded = ctx.client().RecordValidation(args);
  for (CaseResult& r : results) {
    if (!recorded.ok()) {
      r.failures.push_back(
          absl::StrCat("not recorded in the server's history: ", recorded.status().ToString()));
      continue;
    }
    for (const client::RecordedCase& c : *recorded) {
      if (c.case_name != RunCaseName(r.name)) continue;
      if (!c.record_error.empty()) {
        r.failures.push_back(absl::StrCat("NOT RECORDED: ", c.record_error));
        continue;
      }
      r.figures["run_id"] = c.run_id;
      std::string summary =
          absl::StrCat("recorded as run ", c.run_id, " of project ", args.labels.project);
      if (c.comparison.has_value()) {
        absl::StrAppend(&summary, ", ", ComparisonSummary(*c.comparison));
        r.figures["compared_with_run"] = c.comparison->baseline_run_id;
      }
      r.summary = r.summary.empty() || r.summary == "computed, not compared"
                      ? summary
                      : absl::StrCat(r.summary, "; ", summary);
      for (const client::Alert& a : c.alerts) {
        r.failures.push_back(absl::StrCat("ALERT: ", a.rule, ": ", a.message));
      }
    }
  }
}

}  // namespace logitd::validate

// The server's history of Verify runs as the C++ client sees it: the labels
// a recorded run carries (VerifyArgs::record), and ListRuns' arguments and
// runs (see logitd.proto, RunLabels and ListRuns).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace logitd::client {

// Where a recorded run belongs: project and case_name are required; each at
// most 256 bytes.
struct RunLabels {
  std::string project;
  std::string case_name;
  std::string branch;
  std::string ref;
};

// Which recorded run a Verify compares with (VerifyArgs::compare): the
// latest of a branch, of a ref, a run by id, or the run promoted under a
// name (Client::PromoteRun); exactly one set.
struct BaselineSelector {
  std::string branch;
  std::string ref;
  std::int64_t run_id = 0;
  std::string name;
  // No such run: record without a comparison instead of NotFound (a
  // branch's first run in CI).
  bool if_present = false;
};

// A candidate against the baseline run's of the same name: bits
// "identical", "different_within_bounds", "different_outside_bounds" or
// "new"; the deltas are this run's figure less the baseline's.
struct CandidateComparison {
  std::string name;
  std::string bits;
  std::string baseline_verdict;
  double worst_bound_fraction_delta = 0;
  std::int64_t max_ulp_delta = 0;
  double effective_bits_delta = 0;
  // Other bits: the blocks of block_rows rows whose digests differ from the
  // baseline's (block i: rows [i * block_rows, (i + 1) * block_rows)).
  std::int64_t block_rows = 0;
  std::vector<std::int64_t> changed_blocks;
  // The candidate's rows: the last block ends there (0: not said).
  std::int64_t rows = 0;
};

// A Verify's candidates against a recorded run's (VerifyResult::comparison).
// platform_difference: "" when the baseline was judged on this platform,
// else what differs; same_inputs: the same operation, options and tensors.
struct RunComparison {
  std::int64_t baseline_run_id = 0;
  RunLabels baseline_labels;
  std::string baseline_verdict;
  std::string platform_difference;
  bool same_inputs = false;
  std::vector<CandidateComparison> candidates;
};

// A project's rule on its recorded runs (Client::SetRules): where it
// applies (empty: any) and its check: the candidate's bits are the
// baseline's; its worst bound fraction at most `limit` times the
// baseline's (limit >= 1); its p99 ULP from logitd's outputs at most
// `limit`. The first two are checked on runs compared with a baseline.
struct HistoryRule {
  std::string case_name;
  std::string branch;
  std::string candidate;
  enum class Check { kBitsUnchanged, kMaxWorstFractionGrowth, kMaxP99Ulp };
  Check check = Check::kBitsUnchanged;
  double limit = 0;
};

// A rule a recorded run broke: the rule as text ("bits_unchanged
// branch=main candidate=y"), the candidate, and what broke it.
struct Alert {
  std::string rule;
  std::string candidate;
  std::string message;
};

// A candidate's figures as its run's Verify gave them.
struct CandidateSummary {
  std::string name;
  std::string verdict;
  std::uint64_t xxh3 = 0;
  std::int64_t elements = 0;
  std::int64_t outside_bound = 0;
  double worst_bound_fraction = 0;
  double bitwise_equal_fraction = 0;
  std::int64_t max_ulp = 0;
  std::int64_t p99_ulp = 0;
  double rms_ratio = 0;       // 0 where the precision class was not tested
  double effective_bits = 0;  // likewise
};

struct RunSummary {
  std::int64_t run_id = 0;
  RunLabels labels;
  // "logits", "backward", "cross_entropy", "logprobs"; "validation" for a
  // golden case of logitctl validate (Client::RecordValidation)
  std::string operation;
  std::uint64_t inputs_xxh3 = 0;
  std::string verdict;
  std::string backend;
  std::string device;
  std::string logitd_version;
  std::string libraries;  // driver, CUDA, cuBLASLt, SMs; or the BLAS and threads
  std::int64_t recorded_unix_micros = 0;
  std::vector<CandidateSummary> candidates;
  std::vector<Alert> alerts;         // the rules it broke when recorded
  std::int64_t baseline_run_id = 0;  // the run it was compared with; 0: none
};

// Empty labels match any; a page of page_size runs (0: 100; at most 1000)
// older than before_run_id (0: from the newest).
struct ListRunsArgs {
  std::string project;
  std::string case_name;
  std::string branch;
  int page_size = 0;
  std::int64_t before_run_id = 0;
  std::int64_t run_id = 0;  // only this run (0: any)
  // Only runs judged on this platform ("": any), recorded in
  // [recorded_after_unix_micros, recorded_before_unix_micros) (0: unbounded).
  std::string backend;
  std::string device;
  std::int64_t recorded_after_unix_micros = 0;
  std::int64_t recorded_before_unix_micros = 0;
};

// A project of this caller's history (Client::ListProjects), and a case of
// one (Client::ListCases).
struct ProjectSummary {
  std::string project;
  std::int64_t cases = 0;
  std::int64_t runs = 0;
  std::int64_t alerts = 0;
  std::int64_t latest_unix_micros = 0;
};
struct CaseSummary {
  std::string case_name;
  std::int64_t runs = 0;
  std::int64_t alerts = 0;
  std::int64_t latest_run_id = 0;
  std::int64_t latest_unix_micros = 0;
  std::string latest_verdict;
  std::string latest_branch;
  std::string latest_ref;
};

struct ListRunsResult {
  std::vector<RunSummary> runs;         // newest first
  std::int64_t next_before_run_id = 0;  // 0: this page is the last
};

// A golden case the client judged (Client::RecordValidation): each output's
// digest and bound figures, as logitctl validate's golden suite forms them.
struct ValidatedOutput {
  std::string name;
  std::uint64_t xxh3 = 0;
  std::vector<std::int64_t> shape;
  std::int64_t elements = 0;
  bool within_bounds = true;
  double worst_bound_fraction = 0;
  // Its rows' digests in at most 64 blocks of block_rows rows.
  std::int64_t block_rows = 0;
  std::vector<std::uint64_t> block_xxh3;
};
struct ValidatedCase {
  std::string case_name;
  std::uint64_t inputs_xxh3 = 0;
  bool within_bounds = true;
  std::vector<ValidatedOutput> outputs;
};

// labels' project, branch and ref for every case (case_name: each case's).
struct RecordValidationArgs {
  RunLabels labels;
  std::optional<BaselineSelector> compare;
  std::vector<ValidatedCase> cases;
};

// A case as the server recorded it, as a recording Verify's result says.
struct RecordedCase {
  std::string case_name;
  std::int64_t run_id = 0;
  std::optional<RunComparison> comparison;
  std::vector<Alert> alerts;
  std::string record_error;
};

}  // namespace logitd::client

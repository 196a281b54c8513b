// The server's memory of verdicts: each recorded Verify run (its labels,
// operation, inputs' digest, platform and each candidate's figures) kept in
// a SQL database, so that a team's CI can ask what a kernel's numbers were
// on another commit, branch or machine. SQLite (one file, WAL mode) by
// default, or a PostgreSQL server several replicas share; a versioned
// schema migrated forward when the server starts, every write one
// transaction. Runs belong to the tenant whose call made them and are only
// listed to it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/history/schema.h"
#include "server/history/sql.h"

namespace logitd::history {

// Where a run belongs: the caller's project and case, and its branch and
// ref (a commit). project and case_name are required to record.
struct RunLabels {
  std::string project;
  std::string case_name;
  std::string branch;
  std::string ref;
};

// A candidate's figures as Verify gave them.
struct CandidateFigures {
  std::string name;
  std::string verdict;
  std::uint64_t xxh3 = 0;
  std::int64_t elements = 0;
  std::int64_t outside_bound = 0;
  double worst_bound_fraction = 0;
  double bitwise_equal_fraction = 0;
  std::int64_t max_ulp = 0;
  std::int64_t p99_ulp = 0;
  double rms_ratio = 0;
  double effective_bits = 0;
  // Its rows in blocks of block_rows, each block's xxh3-64 (0 and none for
  // a run recorded before blocks were kept).
  std::int64_t block_rows = 0;
  std::vector<std::uint64_t> block_digests;
  // Its rows, where the last block ends (0: not kept, a run recorded before
  // schema version 7).
  std::int64_t rows = 0;
};

// A project's rule on its recorded runs (rules.h checks runs against them).
struct Rule {
  // Where it applies; empty matches any.
  std::string case_name;
  std::string branch;
  std::string candidate;
  enum class Check { kBitsUnchanged, kMaxWorstFractionGrowth, kMaxP99Ulp };
  Check check = Check::kBitsUnchanged;
  // The growth factor or the ULP limit (none for kBitsUnchanged).
  double limit = 0;
};

// A rule a recorded run broke: the rule as text (RuleText), the candidate,
// and what broke it.
struct Alert {
  std::string rule;
  std::string candidate;
  std::string message;
};

struct RunRecord {
  std::int64_t id = 0;  // set by Record
  std::string tenant;
  RunLabels labels;
  std::string operation;  // "logits", "backward", "cross_entropy", "logprobs"
  std::uint64_t inputs_xxh3 = 0;
  std::string verdict;
  // The platform that judged it.
  std::string backend;
  std::string device;
  std::string logitd_version;
  // The rest of the platform that decides the bits: driver, CUDA, cuBLASLt
  // and SMs, or the BLAS and its threads ("" before schema version 8).
  std::string libraries;
  std::int64_t recorded_unix_us = 0;  // set by Record when 0
  // What the run takes in the store, as it counts it (set by Record): its
  // labels, platform, candidates' figures and digests, alerts.
  std::int64_t bytes = 0;
  // The run it was compared with (VerifyHeader.compare); 0: none.
  std::int64_t baseline_run_id = 0;
  std::vector<CandidateFigures> candidates;
  std::vector<Alert> alerts;
};

// A project of a tenant's history, and a case of a project: how many runs
// and alerts, and the latest run (its time; for a case, its verdict and
// labels too).
struct ProjectSummary {
  std::string project;
  std::int64_t cases = 0;
  std::int64_t runs = 0;
  std::int64_t alerts = 0;
  std::int64_t latest_unix_us = 0;
};
struct CaseSummary {
  std::string case_name;
  std::int64_t runs = 0;
  std::int64_t alerts = 0;
  std::int64_t latest_run_id = 0;
  std::int64_t latest_unix_us = 0;
  std::string latest_verdict;
  std::string latest_branch;
  std::string latest_ref;
};

// Which runs to list: the tenant's, narrowed by the labels given (empty:
// any), newest first, at most `limit` (at most kMaxListedRuns + 1), with ids
// below `before_id` (0: from the newest) for paging.
struct RunFilter {
  std::string tenant;
  std::string project;
  std::string case_name;
  std::string branch;
  std::string ref;
  std::int64_t run_id = 0;  // 0: any
  // The run promoted under this name for project and case_name ("": any).
  std::string baseline;
  // The platform that judged it ("": any), and when it was recorded:
  // [after_unix_us, before_unix_us) (0: unbounded).
  std::string backend;
  std::string device;
  std::int64_t after_unix_us = 0;
  std::int64_t before_unix_us = 0;
  std::int64_t before_id = 0;
  int limit = 100;
};

// The most runs one List returns.
inline constexpr int kMaxListedRuns = 1000;  // a page; List takes one more
// The longest label (bytes).
inline constexpr std::size_t kMaxLabelBytes = 256;

// InvalidArgument naming the label that is missing (project, case_name) or
// longer than kMaxLabelBytes.
absl::Status CheckLabels(const RunLabels& labels);

class HistoryStore {
 public:
  // Opens the store `spec` names: a postgresql:// (or postgres://) URI, or
  // else an SQLite file path.
  static absl::StatusOr<std::unique_ptr<HistoryStore>> Open(const std::string& spec);
  // Opens (creating) the SQLite database at `path`, in WAL mode, and
  // migrates its schema to kSchemaVersion. FailedPrecondition when the file
  // holds a schema newer than this server's, Internal for what SQLite
  // refuses (its message included).
  static absl::StatusOr<std::unique_ptr<HistoryStore>> OpenSqlite(const std::string& path);
  // Connects to the PostgreSQL server at `uri` (libpq's URI form) and
  // migrates its schema, once however many replicas start at once.
  // Unavailable when it does not answer within its connect_timeout (5 s
  // unless the URI says), FailedPrecondition for a newer schema.
  static absl::StatusOr<std::unique_ptr<HistoryStore>> OpenPostgres(const std::string& uri);
  ~HistoryStore();
  HistoryStore(const HistoryStore&) = delete;
  HistoryStore& operator=(const HistoryStore&) = delete;

  static constexpr int kSchemaVersion = history::kSchemaVersion;

  // Stores `run` and its candidates in one transaction; sets run->id (and
  // recorded_unix_us when 0) and run->bytes. With max_runs > 0, the
  // tenant's oldest runs past the newest max_runs go in the same
  // transaction; with max_bytes > 0, its oldest runs past max_bytes of runs
  // (never the run recorded, nor a baseline's).
  absl::Status Record(RunRecord* run, std::int64_t max_runs = 0, std::int64_t max_bytes = 0);
  absl::StatusOr<std::vector<RunRecord>> List(const RunFilter& filter);
  // Names the tenant's run `run_id` a baseline of its project and case
  // (the run that name named before is no longer it); NotFound for no such
  // run. Retention never prunes a baseline's run.
  absl::Status Promote(const std::string& tenant, std::int64_t run_id, const std::string& name);
  // The tenant's projects, by name; the cases of one of them, by name.
  absl::StatusOr<std::vector<ProjectSummary>> Projects(const std::string& tenant);
  absl::StatusOr<std::vector<CaseSummary>> Cases(const std::string& tenant,
                                                 const std::string& project);
  // Removes the tenant's project: its runs (with their candidates and
  // alerts), baselines and rules, in one transaction; the runs removed.
  // NotFound when it has none of them.
  absl::StatusOr<std::int64_t> DeleteProject(const std::string& tenant, const std::string& project);
  // Replaces the tenant's rules of `project`, in one transaction.
  absl::Status SetRules(const std::string& tenant, const std::string& project,
                        const std::vector<Rule>& rules);
  // The tenant's rules of `project`, in the order they were set.
  absl::StatusOr<std::vector<Rule>> Rules(const std::string& tenant, const std::string& project);

  // The file, or the PostgreSQL server (without its password).
  const std::string& location() const { return location_; }
  sql::Dialect dialect() const { return dialect_; }
  // The schema version the store holds (kSchemaVersion once opened).
  absl::StatusOr<int> SchemaVersion();
  // SQLite's journal mode for the file ("wal"); "" on PostgreSQL.
  absl::StatusOr<std::string> JournalMode();

 private:
  explicit HistoryStore(std::unique_ptr<sql::Connection> db);
  static absl::StatusOr<std::unique_ptr<HistoryStore>> OpenOn(std::unique_ptr<sql::Connection> db);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  const std::unique_ptr<sql::Connection> db_ ABSL_PT_GUARDED_BY(mu_);
  const std::string location_;
  const sql::Dialect dialect_;
};

}  // namespace logitd::history

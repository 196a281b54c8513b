#include "server/history/history_store.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "logitd/status_macros.h"
#include "server/history/rules.h"
#include "server/history/schema.h"

namespace logitd::history {
namespace {

using sql::Connection;
using sql::Statement;

// A write transaction (Connection::BeginWrite): rolled back when it goes
// uncommitted, so that every early return of a failed step undoes the
// others.
class WriteTransaction {
 public:
  explicit WriteTransaction(Connection* db) : db_(db) {}
  ~WriteTransaction() {
    if (open_) (void)db_->Exec("ROLLBACK;", "roll back");
  }
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;

  absl::Status Begin(absl::string_view what) {
    absl::Status s = db_->BeginWrite(what);
    // A failed BEGIN on PostgreSQL may leave the transaction open (the
    // lock's wait timed out after BEGIN): roll it back either way.
    open_ = true;
    return s;
  }
  absl::Status Commit(absl::string_view what) {
    absl::Status s = db_->Exec("COMMIT;", absl::StrCat("commit ", what));
    if (s.ok()) open_ = false;
    return s;
  }

 private:
  Connection* const db_;
  bool open_ = false;
};

// What a run takes, as the byte limit counts it: its text, each candidate's
// figures (about 100 bytes in SQLite's records) and digests, its alerts.
std::int64_t RunBytes(const RunRecord& run) {
  std::int64_t n = 120 + run.tenant.size() + run.labels.project.size() +
                   run.labels.case_name.size() + run.labels.branch.size() + run.labels.ref.size() +
                   run.operation.size() + run.verdict.size() + run.backend.size() +
                   run.device.size() + run.logitd_version.size() + run.libraries.size();
  for (const CandidateFigures& c : run.candidates) {
    n += 100 +
         static_cast<std::int64_t>(c.name.size() + c.verdict.size() + 8 * c.block_digests.size());
  }
  for (const Alert& a : run.alerts) {
    n += 16 + static_cast<std::int64_t>(a.rule.size() + a.candidate.size() + a.message.size());
  }
  return n;
}

// "(?1, ?2, …), (…), …": `rows` rows of `columns` parameters.
std::string ValueRows(std::size_t rows, int columns) {
  std::string out;
  for (std::size_t r = 0; r < rows; ++r) {
    absl::StrAppend(&out, r == 0 ? "(" : ", (");
    for (int c = 1; c <= columns; ++c) {
      absl::StrAppend(&out, c == 1 ? "?" : ", ?", static_cast<int>(r) * columns + c);
    }
    absl::StrAppend(&out, ")");
  }
  return out;
}

// A run's alerts and candidates, each in one statement (one round trip to
// a PostgreSQL server however many there are).
absl::Status InsertAlerts(Connection* db, const RunRecord& run) {
  if (run.alerts.empty()) return absl::OkStatus();
  constexpr int kColumns = 5;
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db->Prepare(absl::StrCat("INSERT INTO alerts (run_id, position, rule, candidate, message) "
                               "VALUES ",
                               ValueRows(run.alerts.size(), kColumns)),
                  "insert the alerts"));
  for (std::size_t p = 0; p < run.alerts.size(); ++p) {
    const int at = static_cast<int>(p) * kColumns;
    s->Bind(at + 1, run.id);
    s->Bind(at + 2, static_cast<std::int64_t>(p));
    s->Bind(at + 3, run.alerts[p].rule);
    s->Bind(at + 4, run.alerts[p].candidate);
    s->Bind(at + 5, run.alerts[p].message);
  }
  return s->Run();
}

absl::Status InsertCandidates(Connection* db, const RunRecord& run) {
  if (run.candidates.empty()) return absl::OkStatus();
  constexpr int kColumns = 16;
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db->Prepare(absl::StrCat("INSERT INTO candidates (run_id, position, name, verdict, xxh3, "
                               "elements, outside_bound, worst_bound_fraction, "
                               "bitwise_equal_fraction, max_ulp, p99_ulp, rms_ratio, "
                               "effective_bits, block_rows, block_digests, rows) VALUES ",
                               ValueRows(run.candidates.size(), kColumns)),
                  "insert the candidates"));
  for (std::size_t p = 0; p < run.candidates.size(); ++p) {
    const CandidateFigures& c = run.candidates[p];
    const int at = static_cast<int>(p) * kColumns;
    s->Bind(at + 1, run.id);
    s->Bind(at + 2, static_cast<std::int64_t>(p));
    s->Bind(at + 3, c.name);
    s->Bind(at + 4, c.verdict);
    s->Bind(at + 5, c.xxh3);
    s->Bind(at + 6, c.elements);
    s->Bind(at + 7, c.outside_bound);
    s->Bind(at + 8, c.worst_bound_fraction);
    s->Bind(at + 9, c.bitwise_equal_fraction);
    s->Bind(at + 10, c.max_ulp);
    s->Bind(at + 11, c.p99_ulp);
    s->Bind(at + 12, c.rms_ratio);
    s->Bind(at + 13, c.effective_bits);
    s->Bind(at + 14, c.block_rows);
    s->Bind(at + 15, c.block_digests);
    s->Bind(at + 16, c.rows);
  }
  return s->Run();
}

// Which runs a RunFilter lists: the tenant's, and each label it gives (so
// that an index serves it: (tenant, project, case_name, id) for a case's
// newest runs). Its parameters are ?1 to ?9 and ?12 to ?15, as BindFilter
// binds them (?6 the limit); the candidates' and alerts' reads add the
// listed ids' range as ?10 and ?11.
std::string FilterSql(const RunFilter& f) {
  std::string where = "tenant = ?1";
  if (!f.project.empty()) absl::StrAppend(&where, " AND project = ?2");
  if (!f.case_name.empty()) absl::StrAppend(&where, " AND case_name = ?3");
  if (!f.branch.empty()) absl::StrAppend(&where, " AND branch = ?4");
  if (f.before_id != 0) absl::StrAppend(&where, " AND id < ?5");
  if (!f.ref.empty()) absl::StrAppend(&where, " AND ref = ?7");
  if (f.run_id != 0) absl::StrAppend(&where, " AND id = ?8");
  if (!f.backend.empty()) absl::StrAppend(&where, " AND backend = ?12");
  if (!f.device.empty()) absl::StrAppend(&where, " AND device = ?13");
  if (f.after_unix_us != 0) absl::StrAppend(&where, " AND recorded_unix_us >= ?14");
  if (f.before_unix_us != 0) absl::StrAppend(&where, " AND recorded_unix_us < ?15");
  if (!f.baseline.empty()) {
    absl::StrAppend(&where,
                    " AND id = (SELECT run_id FROM baselines b WHERE b.tenant = ?1 AND b.project "
                    "= ?2 AND b.case_name = ?3 AND b.name = ?9)");
  }
  return where;
}

void BindFilter(Statement& s, const RunFilter& filter) {
  s.Bind(1, filter.tenant);
  s.Bind(2, filter.project);
  s.Bind(3, filter.case_name);
  s.Bind(4, filter.branch);
  s.Bind(5, filter.before_id);
  s.Bind(6, static_cast<std::int64_t>(
                filter.limit <= 0 ? kMaxListedRuns : std::min(filter.limit, kMaxListedRuns + 1)));
  s.Bind(7, filter.ref);
  s.Bind(8, filter.run_id);
  s.Bind(9, filter.baseline);
  s.Bind(12, filter.backend);
  s.Bind(13, filter.device);
  s.Bind(14, filter.after_unix_us);
  s.Bind(15, filter.before_unix_us);
}

// The candidates and alerts of the listed runs (newest first), read with
// the filter that listed them over the listed ids' range: one statement
// each however many runs. A run recorded between the two reads is not
// among `runs` and its rows are passed over.
absl::Status ReadCandidatesAndAlerts(Connection* db, const RunFilter& filter,
                                     std::vector<RunRecord>* runs) {
  if (runs->empty()) return absl::OkStatus();
  const std::string where = FilterSql(filter);
  std::unordered_map<std::int64_t, RunRecord*> by_id;
  for (RunRecord& r : *runs) by_id[r.id] = &r;
  const auto range = [&](Statement& s) {
    BindFilter(s, filter);
    s.Bind(10, runs->back().id);
    s.Bind(11, runs->front().id);
  };
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> c,
      db->Prepare(
          absl::StrCat("SELECT c.run_id, c.name, c.verdict, c.xxh3, c.elements, "
                       "c.outside_bound, c.worst_bound_fraction, "
                       "c.bitwise_equal_fraction, c.max_ulp, c.p99_ulp, c.rms_ratio, "
                       "c.effective_bits, c.block_rows, c.block_digests, c.rows FROM candidates "
                       "c WHERE c.run_id IN (SELECT id FROM runs WHERE ",
                       where, " AND id BETWEEN ?10 AND ?11) ORDER BY c.run_id, c.position"),
          "read the candidates"));
  range(*c);
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, c->Next());
    if (!row) break;
    const auto run = by_id.find(c->Int(0));
    if (run == by_id.end()) continue;
    CandidateFigures f;
    f.name = c->Text(1);
    f.verdict = c->Text(2);
    f.xxh3 = c->Uint(3);
    f.elements = c->Int(4);
    f.outside_bound = c->Int(5);
    f.worst_bound_fraction = c->Real(6);
    f.bitwise_equal_fraction = c->Real(7);
    f.max_ulp = c->Int(8);
    f.p99_ulp = c->Int(9);
    f.rms_ratio = c->Real(10);
    f.effective_bits = c->Real(11);
    f.block_rows = c->Int(12);
    f.block_digests = c->Words(13);
    f.rows = c->Int(14);
    run->second->candidates.push_back(std::move(f));
  }
  c.reset();
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> a,
      db->Prepare(absl::StrCat("SELECT a.run_id, a.rule, a.candidate, a.message FROM alerts a "
                               "WHERE a.run_id IN (SELECT id FROM runs WHERE ",
                               where, " AND id BETWEEN ?10 AND ?11) ORDER BY a.run_id, a.position"),
                  "read the alerts"));
  range(*a);
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, a->Next());
    if (!row) return absl::OkStatus();
    const auto run = by_id.find(a->Int(0));
    if (run != by_id.end()) {
      run->second->alerts.push_back(Alert{a->Text(1), a->Text(2), a->Text(3)});
    }
  }
}

// Runs one statement that returns no rows, its parameters bound by `bind`;
// the rows it changed.
template <typename BindFn>
absl::StatusOr<std::int64_t> Change(Connection* db, absl::string_view sql, absl::string_view what,
                                    BindFn bind) {
  LOGITD_ASSIGN_OR_RETURN(std::unique_ptr<Statement> s, db->Prepare(sql, what));
  bind(*s);
  LOGITD_RETURN_IF_ERROR(s->Run());
  return s->Changes();
}

}  // namespace

absl::Status CheckLabels(const RunLabels& labels) {
  for (const auto& [name, value, required] :
       {std::tuple{"project", &labels.project, true},
        std::tuple{"case_name", &labels.case_name, true},
        std::tuple{"branch", &labels.branch, false}, std::tuple{"ref", &labels.ref, false}}) {
    if (required && value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("record.", name, ": required to record a run (it names where the run ",
                       "belongs); leave `record` unset not to record"));
    }
    if (value->size() > kMaxLabelBytes) {
      return absl::InvalidArgumentError(absl::StrCat("record.", name, ": ", value->size(),
                                                     " bytes, more than the ", kMaxLabelBytes,
                                                     " a label may hold"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::Open(const std::string& spec) {
  if (sql::IsPostgresUri(spec)) return OpenPostgres(spec);
  return OpenSqlite(spec);
}

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::OpenSqlite(const std::string& path) {
  LOGITD_ASSIGN_OR_RETURN(std::unique_ptr<Connection> db, sql::OpenSqlite(path));
  return OpenOn(std::move(db));
}

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::OpenPostgres(const std::string& uri) {
  LOGITD_ASSIGN_OR_RETURN(std::unique_ptr<Connection> db, sql::OpenPostgres(uri));
  return OpenOn(std::move(db));
}

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::OpenOn(std::unique_ptr<Connection> db) {
  std::unique_ptr<HistoryStore> store(new HistoryStore(std::move(db)));
  absl::MutexLock lock(&store->mu_);
  LOGITD_RETURN_IF_ERROR(store->Migrate());
  return store;
}

HistoryStore::HistoryStore(std::unique_ptr<Connection> db)
    : db_(std::move(db)), location_(db_->location()), dialect_(db_->dialect()) {}

HistoryStore::~HistoryStore() = default;

absl::Status HistoryStore::Migrate() {
  // Each step in a write transaction that reads the version first: servers
  // that open one store at once migrate it once, one after the other.
  const std::vector<std::string> steps = Migrations(db_->dialect());
  for (;;) {
    WriteTransaction txn(db_.get());
    LOGITD_RETURN_IF_ERROR(txn.Begin("a migration"));
    LOGITD_ASSIGN_OR_RETURN(const int have, db_->SchemaVersion());
    if (have > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "history: ", location_, " holds schema version ", have, ", newer than this logitd's ",
          kSchemaVersion, "; run a newer logitd or give another --history"));
    }
    if (have == kSchemaVersion) return txn.Commit("the migration's end");
    LOGITD_RETURN_IF_ERROR(db_->Exec(steps[have], absl::StrCat("migrate to version ", have + 1)));
    LOGITD_RETURN_IF_ERROR(db_->SetSchemaVersion(have + 1));
    LOGITD_RETURN_IF_ERROR(txn.Commit("a migration"));
  }
}

absl::Status HistoryStore::Record(RunRecord* run, std::int64_t max_runs, std::int64_t max_bytes) {
  if (run->recorded_unix_us == 0) run->recorded_unix_us = absl::ToUnixMicros(absl::Now());
  run->bytes = RunBytes(*run);
  absl::MutexLock lock(&mu_);
  Connection* const db = db_.get();
  WriteTransaction txn(db);
  LOGITD_RETURN_IF_ERROR(txn.Begin("a run's write"));
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> insert,
      db->Prepare("INSERT INTO runs (tenant, project, case_name, branch, ref, operation, "
                  "inputs_xxh3, verdict, backend, device, logitd_version, recorded_unix_us, "
                  "bytes, baseline_run_id, libraries) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                  "?9, ?10, ?11, ?12, ?13, ?14, ?15) RETURNING id",
                  "insert a run"));
  insert->Bind(1, run->tenant);
  insert->Bind(2, run->labels.project);
  insert->Bind(3, run->labels.case_name);
  insert->Bind(4, run->labels.branch);
  insert->Bind(5, run->labels.ref);
  insert->Bind(6, run->operation);
  insert->Bind(7, run->inputs_xxh3);
  insert->Bind(8, run->verdict);
  insert->Bind(9, run->backend);
  insert->Bind(10, run->device);
  insert->Bind(11, run->logitd_version);
  insert->Bind(12, run->recorded_unix_us);
  insert->Bind(13, run->bytes);
  insert->Bind(14, run->baseline_run_id);
  insert->Bind(15, run->libraries);
  LOGITD_ASSIGN_OR_RETURN(const bool inserted, insert->Next());
  if (!inserted) return absl::InternalError("history: insert a run: no id returned");
  run->id = insert->Int(0);
  insert.reset();  // SQLite: the statement done before the next one writes
  LOGITD_RETURN_IF_ERROR(InsertCandidates(db, *run));
  LOGITD_RETURN_IF_ERROR(InsertAlerts(db, *run));
  if (max_runs > 0) {
    // The tenant's runs older than its newest max_runs (their candidates
    // with them: ON DELETE CASCADE).
    LOGITD_RETURN_IF_ERROR(
        Change(db,
               "DELETE FROM runs WHERE tenant = ?1 AND id <= (SELECT id FROM runs WHERE tenant = "
               "?1 ORDER BY id DESC LIMIT 1 OFFSET ?2) AND id NOT IN (SELECT run_id FROM "
               "baselines WHERE tenant = ?1)",
               "prune old runs",
               [&](Statement& s) {
                 s.Bind(1, run->tenant);
                 s.Bind(2, max_runs);
               })
            .status());
  }
  if (max_bytes > 0) {
    // The tenant's runs, newest first, past max_bytes in all (the run just
    // recorded and the baselines' runs count, but are kept).
    LOGITD_RETURN_IF_ERROR(
        Change(db,
               "DELETE FROM runs WHERE id IN (SELECT id FROM (SELECT id, SUM(bytes) OVER (ORDER "
               "BY id DESC) AS upto FROM runs WHERE tenant = ?1) AS running WHERE upto > ?2) AND "
               "id <> ?3 AND id NOT IN (SELECT run_id FROM baselines WHERE tenant = ?1)",
               "prune runs past the byte limit",
               [&](Statement& s) {
                 s.Bind(1, run->tenant);
                 s.Bind(2, max_bytes);
                 s.Bind(3, run->id);
               })
            .status());
  }
  return txn.Commit("a run");
}

absl::StatusOr<std::vector<RunRecord>> HistoryStore::List(const RunFilter& filter) {
  absl::MutexLock lock(&mu_);
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db_->Prepare(absl::StrCat("SELECT id, tenant, project, case_name, branch, ref, operation, "
                                "inputs_xxh3, verdict, backend, device, logitd_version, "
                                "recorded_unix_us, bytes, baseline_run_id, libraries FROM runs "
                                "WHERE ",
                                FilterSql(filter), " ORDER BY id DESC LIMIT ?6"),
                   "read the runs"));
  BindFilter(*s, filter);
  std::vector<RunRecord> runs;
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, s->Next());
    if (!row) break;
    RunRecord r;
    r.id = s->Int(0);
    r.tenant = s->Text(1);
    r.labels = RunLabels{s->Text(2), s->Text(3), s->Text(4), s->Text(5)};
    r.operation = s->Text(6);
    r.inputs_xxh3 = s->Uint(7);
    r.verdict = s->Text(8);
    r.backend = s->Text(9);
    r.device = s->Text(10);
    r.logitd_version = s->Text(11);
    r.recorded_unix_us = s->Int(12);
    r.bytes = s->Int(13);
    r.baseline_run_id = s->Int(14);
    r.libraries = s->Text(15);
    runs.push_back(std::move(r));
  }
  s.reset();
  LOGITD_RETURN_IF_ERROR(ReadCandidatesAndAlerts(db_.get(), filter, &runs));
  return runs;
}

absl::Status HistoryStore::Promote(const std::string& tenant, std::int64_t run_id,
                                   const std::string& name) {
  absl::MutexLock lock(&mu_);
  LOGITD_ASSIGN_OR_RETURN(
      const std::int64_t promoted,
      Change(db_.get(),
             "INSERT INTO baselines (tenant, project, case_name, name, run_id) SELECT tenant, "
             "project, case_name, ?3, id FROM runs WHERE tenant = ?1 AND id = ?2 ON CONFLICT "
             "(tenant, project, case_name, name) DO UPDATE SET run_id = excluded.run_id",
             "promote a run", [&](Statement& s) {
               s.Bind(1, tenant);
               s.Bind(2, run_id);
               s.Bind(3, name);
             }));
  if (promoted == 0) {
    return absl::NotFoundError(
        absl::StrCat("run_id: no recorded run ", run_id, " for this caller"));
  }
  return absl::OkStatus();
}

absl::Status HistoryStore::SetRules(const std::string& tenant, const std::string& project,
                                    const std::vector<Rule>& rules) {
  absl::MutexLock lock(&mu_);
  Connection* const db = db_.get();
  WriteTransaction txn(db);
  LOGITD_RETURN_IF_ERROR(txn.Begin("the rules' write"));
  LOGITD_RETURN_IF_ERROR(Change(db, "DELETE FROM rules WHERE tenant = ?1 AND project = ?2",
                                "remove the rules",
                                [&](Statement& s) {
                                  s.Bind(1, tenant);
                                  s.Bind(2, project);
                                })
                             .status());
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> insert,
      db->Prepare("INSERT INTO rules (tenant, project, position, case_name, branch, candidate, "
                  "check_name, limit_value) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                  "insert a rule"));
  for (std::size_t p = 0; p < rules.size(); ++p) {
    const Rule& r = rules[p];
    insert->Reset();
    insert->Bind(1, tenant);
    insert->Bind(2, project);
    insert->Bind(3, static_cast<std::int64_t>(p));
    insert->Bind(4, r.case_name);
    insert->Bind(5, r.branch);
    insert->Bind(6, r.candidate);
    insert->Bind(7, std::string(CheckName(r.check)));
    insert->Bind(8, r.limit);
    LOGITD_RETURN_IF_ERROR(insert->Run());
  }
  insert.reset();
  return txn.Commit("the rules");
}

absl::StatusOr<std::vector<Rule>> HistoryStore::Rules(const std::string& tenant,
                                                      const std::string& project) {
  absl::MutexLock lock(&mu_);
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db_->Prepare("SELECT case_name, branch, candidate, check_name, limit_value FROM rules "
                   "WHERE tenant = ?1 AND project = ?2 ORDER BY position",
                   "read the rules"));
  s->Bind(1, tenant);
  s->Bind(2, project);
  std::vector<Rule> rules;
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, s->Next());
    if (!row) return rules;
    Rule r;
    r.case_name = s->Text(0);
    r.branch = s->Text(1);
    r.candidate = s->Text(2);
    const std::string check = s->Text(3);
    for (Rule::Check c : {Rule::Check::kBitsUnchanged, Rule::Check::kMaxWorstFractionGrowth,
                          Rule::Check::kMaxP99Ulp}) {
      if (check == CheckName(c)) r.check = c;
    }
    r.limit = s->Real(4);
    rules.push_back(std::move(r));
  }
}

absl::StatusOr<std::vector<ProjectSummary>> HistoryStore::Projects(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db_->Prepare("SELECT r.project, COUNT(DISTINCT r.case_name), COUNT(*), "
                   "MAX(r.recorded_unix_us), (SELECT COUNT(*) FROM alerts a JOIN runs r2 ON "
                   "a.run_id = r2.id WHERE r2.tenant = ?1 AND r2.project = r.project) FROM runs r "
                   "WHERE r.tenant = ?1 GROUP BY r.project ORDER BY r.project",
                   "read the projects"));
  s->Bind(1, tenant);
  std::vector<ProjectSummary> out;
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, s->Next());
    if (!row) return out;
    out.push_back(ProjectSummary{s->Text(0), s->Int(1), s->Int(2), s->Int(4), s->Int(3)});
  }
}

absl::StatusOr<std::vector<CaseSummary>> HistoryStore::Cases(const std::string& tenant,
                                                             const std::string& project) {
  absl::MutexLock lock(&mu_);
  LOGITD_ASSIGN_OR_RETURN(
      std::unique_ptr<Statement> s,
      db_->Prepare("SELECT c.case_name, c.n, r.id, r.recorded_unix_us, r.verdict, r.branch, "
                   "r.ref, (SELECT COUNT(*) FROM alerts a JOIN runs r3 ON a.run_id = r3.id WHERE "
                   "r3.tenant = ?1 AND r3.project = ?2 AND r3.case_name = c.case_name) FROM "
                   "(SELECT case_name, COUNT(*) AS n, MAX(id) AS last FROM runs WHERE tenant = "
                   "?1 AND project = ?2 GROUP BY case_name) c JOIN runs r ON r.id = c.last ORDER "
                   "BY c.case_name",
                   "read the cases"));
  s->Bind(1, tenant);
  s->Bind(2, project);
  std::vector<CaseSummary> out;
  for (;;) {
    LOGITD_ASSIGN_OR_RETURN(const bool row, s->Next());
    if (!row) return out;
    CaseSummary c;
    c.case_name = s->Text(0);
    c.runs = s->Int(1);
    c.latest_run_id = s->Int(2);
    c.latest_unix_us = s->Int(3);
    c.latest_verdict = s->Text(4);
    c.latest_branch = s->Text(5);
    c.latest_ref = s->Text(6);
    c.alerts = s->Int(7);
    out.push_back(std::move(c));
  }
}

absl::StatusOr<std::int64_t> HistoryStore::DeleteProject(const std::string& tenant,
                                                         const std::string& project) {
  absl::MutexLock lock(&mu_);
  WriteTransaction txn(db_.get());
  LOGITD_RETURN_IF_ERROR(txn.Begin("a project's removal"));
  std::int64_t runs = 0, removed = 0;
  for (const char* sql : {"DELETE FROM baselines WHERE tenant = ?1 AND project = ?2",
                          "DELETE FROM rules WHERE tenant = ?1 AND project = ?2",
                          "DELETE FROM runs WHERE tenant = ?1 AND project = ?2"}) {
    LOGITD_ASSIGN_OR_RETURN(runs, Change(db_.get(), sql, "remove a project", [&](Statement& s) {
                              s.Bind(1, tenant);
                              s.Bind(2, project);
                            }));
    removed += runs;
  }
  if (removed == 0) {
    return absl::NotFoundError(absl::StrCat("project: no runs, baselines or rules of project '",
                                            project, "' for this caller"));
  }
  LOGITD_RETURN_IF_ERROR(txn.Commit("a project's removal"));
  return runs;
}

absl::StatusOr<int> HistoryStore::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return db_->SchemaVersion();
}

absl::StatusOr<std::string> HistoryStore::JournalMode() {
  absl::MutexLock lock(&mu_);
  if (dialect_ != sql::Dialect::kSqlite) return std::string();
  LOGITD_ASSIGN_OR_RETURN(std::unique_ptr<Statement> s,
                          db_->Prepare("PRAGMA journal_mode", "read the journal mode"));
  LOGITD_ASSIGN_OR_RETURN(const bool row, s->Next());
  if (!row) return std::string();
  return s->Text(0);
}

}  // namespace logitd::history

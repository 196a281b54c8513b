#include "server/history/history_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/history/rules.h"

namespace logitd::history {
namespace {

// The schema, one step per version: migration i takes a file from version i
// to i + 1 (PRAGMA user_version holds the version). Steps are only ever
// appended.
constexpr const char* kMigrations[] = {
    // 0 -> 1: runs and their candidates.
    R"sql(
      CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        case_name TEXT NOT NULL,
        branch TEXT NOT NULL,
        ref TEXT NOT NULL,
        operation TEXT NOT NULL,
        inputs_xxh3 INTEGER NOT NULL,
        verdict TEXT NOT NULL,
        backend TEXT NOT NULL,
        device TEXT NOT NULL,
        logitd_version TEXT NOT NULL,
        recorded_unix_us INTEGER NOT NULL);
      CREATE INDEX runs_by_case ON runs (tenant, project, case_name, id);
      CREATE TABLE candidates (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        name TEXT NOT NULL,
        verdict TEXT NOT NULL,
        xxh3 INTEGER NOT NULL,
        elements INTEGER NOT NULL,
        outside_bound INTEGER NOT NULL,
        worst_bound_fraction REAL NOT NULL,
        bitwise_equal_fraction REAL NOT NULL,
        max_ulp INTEGER NOT NULL,
        p99_ulp INTEGER NOT NULL,
        rms_ratio REAL NOT NULL,
        effective_bits REAL NOT NULL,
        PRIMARY KEY (run_id, position));
    )sql",
    // 1 -> 2: named baselines, a run each, per project and case.
    R"sql(
      CREATE TABLE baselines (
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        case_name TEXT NOT NULL,
        name TEXT NOT NULL,
        run_id INTEGER NOT NULL REFERENCES runs (id),
        PRIMARY KEY (tenant, project, case_name, name));
    )sql",
    // 2 -> 3: a project's rules, and the alerts a run raised against them.
    R"sql(
      CREATE TABLE rules (
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        position INTEGER NOT NULL,
        case_name TEXT NOT NULL,
        branch TEXT NOT NULL,
        candidate TEXT NOT NULL,
        check_name TEXT NOT NULL,
        limit_value REAL NOT NULL,
        PRIMARY KEY (tenant, project, position));
      CREATE TABLE alerts (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        rule TEXT NOT NULL,
        candidate TEXT NOT NULL,
        message TEXT NOT NULL,
        PRIMARY KEY (run_id, position));
    )sql",
    // 3 -> 4: each candidate's block digests (which rows changed).
    R"sql(
      ALTER TABLE candidates ADD COLUMN block_rows INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE candidates ADD COLUMN block_digests BLOB;
    )sql",
    // 4 -> 5: what each run takes, for the per-tenant byte limit (runs
    // recorded before count 0).
    R"sql(
      ALTER TABLE runs ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
    )sql",
    // 5 -> 6: the run each run was compared with.
    R"sql(
      ALTER TABLE runs ADD COLUMN baseline_run_id INTEGER NOT NULL DEFAULT 0;
    )sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == HistoryStore::kSchemaVersion,
              "one migration per schema version");

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("history: ", what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const char* sql, absl::string_view what) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    absl::Status s =
        absl::InternalError(absl::StrCat("history: ", what, ": ", message ? message : "?"));
    sqlite3_free(message);
    return s;
  }
  return absl::OkStatus();
}

// A prepared statement, finalized when it goes.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    ok_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) == SQLITE_OK;
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status(absl::string_view what) const {
    return ok_ ? absl::OkStatus() : SqliteError(db_, what);
  }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, std::int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, std::uint64_t v) {
    std::int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    sqlite3_bind_int64(stmt_, i, bits);
  }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  // 64-bit words, little-endian, as a blob.
  void Bind(int i, const std::vector<std::uint64_t>& words) {
    std::string bytes(words.size() * 8, '\0');
    for (std::size_t w = 0; w < words.size(); ++w) {
      for (int b = 0; b < 8; ++b) bytes[w * 8 + b] = static_cast<char>(words[w] >> (8 * b));
    }
    sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(stmt_); }
  // Ready to run again with new bindings.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string Text(int i) const {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
  }
  std::int64_t Int(int i) const { return sqlite3_column_int64(stmt_, i); }
  std::uint64_t Uint(int i) const {
    const std::int64_t bits = sqlite3_column_int64(stmt_, i);
    std::uint64_t v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  double Real(int i) const { return sqlite3_column_double(stmt_, i); }
  std::vector<std::uint64_t> Words(int i) const {
    const auto* bytes = static_cast<const unsigned char*>(sqlite3_column_blob(stmt_, i));
    const int n = sqlite3_column_bytes(stmt_, i) / 8;
    std::vector<std::uint64_t> words(static_cast<std::size_t>(n));
    for (int w = 0; w < n; ++w) {
      for (int b = 0; b < 8; ++b) {
        words[w] |= static_cast<std::uint64_t>(bytes[w * 8 + b]) << (8 * b);
      }
    }
    return words;
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  bool ok_ = false;
};

// A write transaction (BEGIN IMMEDIATE): rolled back when it goes
// uncommitted, so that every early return of a failed step undoes the
// others.
class WriteTransaction {
 public:
  explicit WriteTransaction(sqlite3* db) : db_(db) {}
  ~WriteTransaction() {
    if (open_) (void)Exec(db_, "ROLLBACK;", "roll back");
  }
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;

  absl::Status Begin(absl::string_view what) {
    absl::Status s = Exec(db_, "BEGIN IMMEDIATE;", absl::StrCat("begin ", what));
    open_ = s.ok();
    return s;
  }
  absl::Status Commit(absl::string_view what) {
    absl::Status s = Exec(db_, "COMMIT;", absl::StrCat("commit ", what));
    if (s.ok()) open_ = false;
    return s;
  }

 private:
  sqlite3* const db_;
  bool open_ = false;
};

// What a run takes, as the byte limit counts it: its text, each candidate's
// figures (about 100 bytes in SQLite's records) and digests, its alerts.
std::int64_t RunBytes(const RunRecord& run) {
  std::int64_t n = 120 + run.tenant.size() + run.labels.project.size() +
                   run.labels.case_name.size() + run.labels.branch.size() + run.labels.ref.size() +
                   run.operation.size() + run.verdict.size() + run.backend.size() +
                   run.device.size() + run.logitd_version.size();
  for (const CandidateFigures& c : run.candidates) {
    n += 100 +
         static_cast<std::int64_t>(c.name.size() + c.verdict.size() + 8 * c.block_digests.size());
  }
  for (const Alert& a : run.alerts) {
    n += 16 + static_cast<std::int64_t>(a.rule.size() + a.candidate.size() + a.message.size());
  }
  return n;
}

absl::Status InsertAlerts(sqlite3* db, const RunRecord& run) {
  Statement s(db,
              "INSERT INTO alerts (run_id, position, rule, candidate, message) VALUES (?1, ?2, "
              "?3, ?4, ?5)");
  if (absl::Status st = s.status("prepare the alerts' insert"); !st.ok()) return st;
  for (std::size_t p = 0; p < run.alerts.size(); ++p) {
    s.Reset();
    s.Bind(1, run.id);
    s.Bind(2, static_cast<std::int64_t>(p));
    s.Bind(3, run.alerts[p].rule);
    s.Bind(4, run.alerts[p].candidate);
    s.Bind(5, run.alerts[p].message);
    if (s.Step() != SQLITE_DONE) return SqliteError(db, "insert an alert");
  }
  return absl::OkStatus();
}

absl::Status ReadAlerts(sqlite3* db, RunRecord* run) {
  Statement s(db,
              "SELECT rule, candidate, message FROM alerts WHERE run_id = ?1 ORDER BY position");
  if (absl::Status st = s.status("prepare the alerts' query"); !st.ok()) return st;
  s.Bind(1, run->id);
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW)
    run->alerts.push_back(Alert{s.Text(0), s.Text(1), s.Text(2)});
  return rc == SQLITE_DONE ? absl::OkStatus() : SqliteError(db, "read the alerts");
}

absl::Status InsertCandidates(sqlite3* db, const RunRecord& run) {
  Statement s(db,
              "INSERT INTO candidates (run_id, position, name, verdict, xxh3, elements, "
              "outside_bound, worst_bound_fraction, bitwise_equal_fraction, max_ulp, p99_ulp, "
              "rms_ratio, effective_bits, block_rows, block_digests) VALUES (?1, ?2, ?3, ?4, ?5, "
              "?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)");
  if (absl::Status st = s.status("prepare the candidates' insert"); !st.ok()) return st;
  for (std::size_t p = 0; p < run.candidates.size(); ++p) {
    const CandidateFigures& c = run.candidates[p];
    s.Reset();
    s.Bind(1, run.id);
    s.Bind(2, static_cast<std::int64_t>(p));
    s.Bind(3, c.name);
    s.Bind(4, c.verdict);
    s.Bind(5, c.xxh3);
    s.Bind(6, c.elements);
    s.Bind(7, c.outside_bound);
    s.Bind(8, c.worst_bound_fraction);
    s.Bind(9, c.bitwise_equal_fraction);
    s.Bind(10, c.max_ulp);
    s.Bind(11, c.p99_ulp);
    s.Bind(12, c.rms_ratio);
    s.Bind(13, c.effective_bits);
    s.Bind(14, c.block_rows);
    s.Bind(15, c.block_digests);
    if (s.Step() != SQLITE_DONE) return SqliteError(db, "insert a candidate");
  }
  return absl::OkStatus();
}

absl::Status ReadCandidates(sqlite3* db, RunRecord* run) {
  Statement s(db,
              "SELECT name, verdict, xxh3, elements, outside_bound, worst_bound_fraction, "
              "bitwise_equal_fraction, max_ulp, p99_ulp, rms_ratio, effective_bits, block_rows, "
              "block_digests FROM candidates WHERE run_id = ?1 ORDER BY position");
  if (absl::Status st = s.status("prepare the candidates' query"); !st.ok()) return st;
  s.Bind(1, run->id);
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    CandidateFigures c;
    c.name = s.Text(0);
    c.verdict = s.Text(1);
    c.xxh3 = s.Uint(2);
    c.elements = s.Int(3);
    c.outside_bound = s.Int(4);
    c.worst_bound_fraction = s.Real(5);
    c.bitwise_equal_fraction = s.Real(6);
    c.max_ulp = s.Int(7);
    c.p99_ulp = s.Int(8);
    c.rms_ratio = s.Real(9);
    c.effective_bits = s.Real(10);
    c.block_rows = s.Int(11);
    c.block_digests = s.Words(12);
    run->candidates.push_back(std::move(c));
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : SqliteError(db, "read the candidates");
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

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::OpenSqlite(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("history: cannot open ", path, ": ",
                                                      db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<HistoryStore> store(new HistoryStore(db, path));
  absl::MutexLock lock(&store->mu_);
  sqlite3_busy_timeout(db, 5000);
  if (absl::Status s = Exec(db, "PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;", "set WAL mode");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = store->Migrate(); !s.ok()) return s;
  return store;
}

HistoryStore::~HistoryStore() { sqlite3_close(db_); }

absl::Status HistoryStore::Migrate() {
  // Each step in a write transaction that reads the version first: servers
  // that open one file at once migrate it once, one after the other.
  for (;;) {
    WriteTransaction txn(db_);
    if (absl::Status s = txn.Begin("a migration"); !s.ok()) return s;
    int have = 0;
    {
      Statement version(db_, "PRAGMA user_version");
      if (absl::Status s = version.status("read the schema version"); !s.ok()) return s;
      if (version.Step() != SQLITE_ROW) return SqliteError(db_, "read the schema version");
      have = static_cast<int>(version.Int(0));
    }
    if (have > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "history: ", path_, " holds schema version ", have, ", newer than this logitd's ",
          kSchemaVersion, "; run a newer logitd or give another --history"));
    }
    if (have == kSchemaVersion) return txn.Commit("the migration's end");
    const std::string sql =
        absl::StrCat(kMigrations[have], "PRAGMA user_version = ", have + 1, ";");
    if (absl::Status s = Exec(db_, sql.c_str(), absl::StrCat("migrate to version ", have + 1));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = txn.Commit("a migration"); !s.ok()) return s;
  }
}

absl::Status HistoryStore::Record(RunRecord* run, std::int64_t max_runs, std::int64_t max_bytes) {
  if (run->recorded_unix_us == 0) run->recorded_unix_us = absl::ToUnixMicros(absl::Now());
  run->bytes = RunBytes(*run);
  absl::MutexLock lock(&mu_);
  WriteTransaction txn(db_);
  if (absl::Status s = txn.Begin("a run's write"); !s.ok()) return s;
  Statement insert(db_,
                   "INSERT INTO runs (tenant, project, case_name, branch, ref, operation, "
                   "inputs_xxh3, verdict, backend, device, logitd_version, recorded_unix_us, "
                   "bytes, baseline_run_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
                   "?12, ?13, ?14)");
  if (absl::Status s = insert.status("prepare the run's insert"); !s.ok()) return s;
  insert.Bind(1, run->tenant);
  insert.Bind(2, run->labels.project);
  insert.Bind(3, run->labels.case_name);
  insert.Bind(4, run->labels.branch);
  insert.Bind(5, run->labels.ref);
  insert.Bind(6, run->operation);
  insert.Bind(7, run->inputs_xxh3);
  insert.Bind(8, run->verdict);
  insert.Bind(9, run->backend);
  insert.Bind(10, run->device);
  insert.Bind(11, run->logitd_version);
  insert.Bind(12, run->recorded_unix_us);
  insert.Bind(13, run->bytes);
  insert.Bind(14, run->baseline_run_id);
  if (insert.Step() != SQLITE_DONE) return SqliteError(db_, "insert a run");
  run->id = sqlite3_last_insert_rowid(db_);
  if (absl::Status s = InsertCandidates(db_, *run); !s.ok()) return s;
  if (absl::Status s = InsertAlerts(db_, *run); !s.ok()) return s;
  if (max_runs > 0) {
    // The tenant's runs older than its newest max_runs (their candidates
    // with them: ON DELETE CASCADE).
    Statement prune(db_,
                    "DELETE FROM runs WHERE tenant = ?1 AND id <= (SELECT id FROM runs WHERE "
                    "tenant = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2) AND id NOT IN (SELECT "
                    "run_id FROM baselines WHERE tenant = ?1)");
    if (absl::Status s = prune.status("prepare the pruning"); !s.ok()) return s;
    prune.Bind(1, run->tenant);
    prune.Bind(2, max_runs);
    if (prune.Step() != SQLITE_DONE) return SqliteError(db_, "prune old runs");
  }
  if (max_bytes > 0) {
    // The tenant's runs, newest first, past max_bytes in all (the run just
    // recorded and the baselines' runs count, but are kept).
    Statement prune(db_,
                    "DELETE FROM runs WHERE id IN (SELECT id FROM (SELECT id, SUM(bytes) OVER "
                    "(ORDER BY id DESC) AS upto FROM runs WHERE tenant = ?1) WHERE upto > ?2) "
                    "AND id <> ?3 AND id NOT IN (SELECT run_id FROM baselines WHERE tenant = ?1)");
    if (absl::Status s = prune.status("prepare the pruning by bytes"); !s.ok()) return s;
    prune.Bind(1, run->tenant);
    prune.Bind(2, max_bytes);
    prune.Bind(3, run->id);
    if (prune.Step() != SQLITE_DONE) return SqliteError(db_, "prune runs past the byte limit");
  }
  return txn.Commit("a run");
}

absl::StatusOr<std::vector<RunRecord>> HistoryStore::List(const RunFilter& filter) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT id, tenant, project, case_name, branch, ref, operation, inputs_xxh3, "
              "verdict, backend, device, logitd_version, recorded_unix_us, bytes, "
              "baseline_run_id FROM runs WHERE "
              "tenant = ?1 AND (?2 = '' OR project = ?2) AND (?3 = '' OR case_name = ?3) AND "
              "(?4 = '' OR branch = ?4) AND (?5 = 0 OR id < ?5) AND (?7 = '' OR ref = ?7) AND "
              "(?8 = 0 OR id = ?8) AND (?9 = '' OR id = (SELECT run_id FROM baselines b WHERE "
              "b.tenant = ?1 AND b.project = ?2 AND b.case_name = ?3 AND b.name = ?9)) ORDER BY "
              "id DESC LIMIT ?6");
  if (absl::Status st = s.status("prepare the runs' query"); !st.ok()) return st;
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
  std::vector<RunRecord> runs;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    RunRecord r;
    r.id = s.Int(0);
    r.tenant = s.Text(1);
    r.labels = RunLabels{s.Text(2), s.Text(3), s.Text(4), s.Text(5)};
    r.operation = s.Text(6);
    r.inputs_xxh3 = s.Uint(7);
    r.verdict = s.Text(8);
    r.backend = s.Text(9);
    r.device = s.Text(10);
    r.logitd_version = s.Text(11);
    r.recorded_unix_us = s.Int(12);
    r.bytes = s.Int(13);
    r.baseline_run_id = s.Int(14);
    runs.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "read the runs");
  for (RunRecord& r : runs) {
    if (absl::Status st = ReadCandidates(db_, &r); !st.ok()) return st;
    if (absl::Status st = ReadAlerts(db_, &r); !st.ok()) return st;
  }
  return runs;
}

absl::Status HistoryStore::Promote(const std::string& tenant, std::int64_t run_id,
                                   const std::string& name) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "INSERT OR REPLACE INTO baselines (tenant, project, case_name, name, run_id) SELECT "
              "tenant, project, case_name, ?3, id FROM runs WHERE tenant = ?1 AND id = ?2");
  if (absl::Status st = s.status("prepare the promotion"); !st.ok()) return st;
  s.Bind(1, tenant);
  s.Bind(2, run_id);
  s.Bind(3, name);
  if (s.Step() != SQLITE_DONE) return SqliteError(db_, "promote a run");
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(
        absl::StrCat("run_id: no recorded run ", run_id, " for this caller"));
  }
  return absl::OkStatus();
}

absl::Status HistoryStore::SetRules(const std::string& tenant, const std::string& project,
                                    const std::vector<Rule>& rules) {
  absl::MutexLock lock(&mu_);
  WriteTransaction txn(db_);
  if (absl::Status s = txn.Begin("the rules' write"); !s.ok()) return s;
  Statement clear(db_, "DELETE FROM rules WHERE tenant = ?1 AND project = ?2");
  if (absl::Status s = clear.status("prepare the rules' removal"); !s.ok()) return s;
  clear.Bind(1, tenant);
  clear.Bind(2, project);
  if (clear.Step() != SQLITE_DONE) return SqliteError(db_, "remove the rules");
  Statement insert(db_,
                   "INSERT INTO rules (tenant, project, position, case_name, branch, candidate, "
                   "check_name, limit_value) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  if (absl::Status s = insert.status("prepare the rules' insert"); !s.ok()) return s;
  for (std::size_t p = 0; p < rules.size(); ++p) {
    const Rule& r = rules[p];
    insert.Reset();
    insert.Bind(1, tenant);
    insert.Bind(2, project);
    insert.Bind(3, static_cast<std::int64_t>(p));
    insert.Bind(4, r.case_name);
    insert.Bind(5, r.branch);
    insert.Bind(6, r.candidate);
    insert.Bind(7, std::string(CheckName(r.check)));
    insert.Bind(8, r.limit);
    if (insert.Step() != SQLITE_DONE) return SqliteError(db_, "insert a rule");
  }
  return txn.Commit("the rules");
}

absl::StatusOr<std::vector<Rule>> HistoryStore::Rules(const std::string& tenant,
                                                      const std::string& project) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT case_name, branch, candidate, check_name, limit_value FROM rules WHERE "
              "tenant = ?1 AND project = ?2 ORDER BY position");
  if (absl::Status st = s.status("prepare the rules' query"); !st.ok()) return st;
  s.Bind(1, tenant);
  s.Bind(2, project);
  std::vector<Rule> rules;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    Rule r;
    r.case_name = s.Text(0);
    r.branch = s.Text(1);
    r.candidate = s.Text(2);
    const std::string check = s.Text(3);
    for (Rule::Check c : {Rule::Check::kBitsUnchanged, Rule::Check::kMaxWorstFractionGrowth,
                          Rule::Check::kMaxP99Ulp}) {
      if (check == CheckName(c)) r.check = c;
    }
    r.limit = s.Real(4);
    rules.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "read the rules");
  return rules;
}

absl::StatusOr<std::vector<ProjectSummary>> HistoryStore::Projects(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT r.project, COUNT(DISTINCT r.case_name), COUNT(*), MAX(r.recorded_unix_us), "
              "(SELECT COUNT(*) FROM alerts a JOIN runs r2 ON a.run_id = r2.id WHERE r2.tenant = "
              "?1 AND r2.project = r.project) FROM runs r WHERE r.tenant = ?1 GROUP BY r.project "
              "ORDER BY r.project");
  if (absl::Status st = s.status("prepare the projects' query"); !st.ok()) return st;
  s.Bind(1, tenant);
  std::vector<ProjectSummary> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out.push_back(ProjectSummary{s.Text(0), s.Int(1), s.Int(2), s.Int(4), s.Int(3)});
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "read the projects");
  return out;
}

absl::StatusOr<std::vector<CaseSummary>> HistoryStore::Cases(const std::string& tenant,
                                                             const std::string& project) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT c.case_name, c.n, r.id, r.recorded_unix_us, r.verdict, r.branch, r.ref, "
              "(SELECT COUNT(*) FROM alerts a JOIN runs r3 ON a.run_id = r3.id WHERE r3.tenant = "
              "?1 AND r3.project = ?2 AND r3.case_name = c.case_name) FROM (SELECT case_name, "
              "COUNT(*) AS n, MAX(id) AS last FROM runs WHERE tenant = ?1 AND project = ?2 GROUP "
              "BY case_name) c JOIN runs r ON r.id = c.last ORDER BY c.case_name");
  if (absl::Status st = s.status("prepare the cases' query"); !st.ok()) return st;
  s.Bind(1, tenant);
  s.Bind(2, project);
  std::vector<CaseSummary> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    CaseSummary c;
    c.case_name = s.Text(0);
    c.runs = s.Int(1);
    c.latest_run_id = s.Int(2);
    c.latest_unix_us = s.Int(3);
    c.latest_verdict = s.Text(4);
    c.latest_branch = s.Text(5);
    c.latest_ref = s.Text(6);
    c.alerts = s.Int(7);
    out.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "read the cases");
  return out;
}

absl::StatusOr<std::int64_t> HistoryStore::DeleteProject(const std::string& tenant,
                                                         const std::string& project) {
  absl::MutexLock lock(&mu_);
  WriteTransaction txn(db_);
  if (absl::Status s = txn.Begin("a project's removal"); !s.ok()) return s;
  std::int64_t runs = 0, removed = 0;
  for (const char* sql : {"DELETE FROM baselines WHERE tenant = ?1 AND project = ?2",
                          "DELETE FROM rules WHERE tenant = ?1 AND project = ?2",
                          "DELETE FROM runs WHERE tenant = ?1 AND project = ?2"}) {
    Statement s(db_, sql);
    if (absl::Status st = s.status("prepare a project's removal"); !st.ok()) return st;
    s.Bind(1, tenant);
    s.Bind(2, project);
    if (s.Step() != SQLITE_DONE) return SqliteError(db_, "remove a project");
    runs = sqlite3_changes(db_);
    removed += runs;
  }
  if (removed == 0) {
    return absl::NotFoundError(absl::StrCat("project: no runs, baselines or rules of project '",
                                            project, "' for this caller"));
  }
  if (absl::Status s = txn.Commit("a project's removal"); !s.ok()) return s;
  return runs;
}

absl::StatusOr<int> HistoryStore::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  Statement s(db_, "PRAGMA user_version");
  if (s.Step() != SQLITE_ROW) return SqliteError(db_, "read the schema version");
  return static_cast<int>(s.Int(0));
}

absl::StatusOr<std::string> HistoryStore::JournalMode() {
  absl::MutexLock lock(&mu_);
  Statement s(db_, "PRAGMA journal_mode");
  if (s.Step() != SQLITE_ROW) return SqliteError(db_, "read the journal mode");
  return s.Text(0);
}

}  // namespace logitd::history

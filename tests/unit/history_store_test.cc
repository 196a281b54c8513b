// The history store on a real SQLite file and on a real PostgreSQL server
// (Debian's, started by the test), the same suite on each: created and
// migrated, runs and their candidates kept across a reopen, listed per
// tenant newest first with filters and pages, pruned, servers opening one
// new store at once migrate it once, and a store from a newer logitd
// refused. Then what only one of them has: an SQLite file of schema
// version 1 migrated; a PostgreSQL server that does not answer, or goes
// away and comes back.
#include "server/history/history_store.h"

#include <libpq-fe.h>
#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/history/dashboard.h"
#include "tests/support/scratch_postgres.h"

namespace logitd::history {
namespace {

using ::testing::HasSubstr;

// A scratch directory, removed with what it holds.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/logitd-history-XXXXXX";
    if (mkdtemp(name) != nullptr) path_ = name;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

RunRecord MakeRun(const std::string& tenant, const std::string& project, const std::string& c,
                  const std::string& branch, int n) {
  RunRecord r;
  r.tenant = tenant;
  r.labels = RunLabels{project, c, branch, "ref" + std::to_string(n)};
  r.operation = "VERIFY_LOGITS";
  r.inputs_xxh3 = 0xfedcba9876543210ull + static_cast<std::uint64_t>(n);
  r.verdict = n % 2 == 0 ? "within_bounds" : "outside_bounds";
  r.backend = "cpu";
  r.device = "a CPU";
  r.logitd_version = "0.1.0";
  r.recorded_unix_us = 1000 + n;
  CandidateFigures y;
  y.name = "y";
  y.verdict = r.verdict;
  y.xxh3 = 0x8000000000000001ull;  // the top bit survives SQLite's signed integers
  y.elements = 4096;
  y.outside_bound = n % 2;
  y.worst_bound_fraction = 0.25 + n;
  y.bitwise_equal_fraction = 0.5;
  y.max_ulp = 7;
  y.p99_ulp = 3;
  y.rms_ratio = 0.125;
  y.effective_bits = 21.5;
  CandidateFigures lse = y;
  lse.name = "lse";
  r.candidates = {y, lse};
  return r;
}

// The refs of a tenant's runs, newest first.
std::vector<std::string> Refs(HistoryStore& store, const std::string& tenant) {
  RunFilter f;
  f.tenant = tenant;
  absl::StatusOr<std::vector<RunRecord>> runs = store.List(f);
  EXPECT_TRUE(runs.ok()) << runs.status();
  std::vector<std::string> refs;
  if (runs.ok()) {
    for (const RunRecord& r : *runs) refs.push_back(r.labels.ref);
  }
  return refs;
}

// Runs `sql` on the store `spec` names with the database's own library
// (not the store's), for what a test reads or plants behind the store.
std::string RawQuery(const std::string& spec, const std::string& sql) {
  std::string out;
  if (sql::IsPostgresUri(spec)) {
    PGconn* conn = PQconnectdb(spec.c_str());
    PGresult* r = PQexec(conn, sql.c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
    EXPECT_TRUE(PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK)
        << PQerrorMessage(conn);
    PQclear(r);
    PQfinish(conn);
    return out;
  }
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(spec.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  if (sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* t = sqlite3_column_text(stmt, 0);
    if (t != nullptr) out = reinterpret_cast<const char*>(t);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

enum class Store { kSqlite, kPostgres };

// The suite's store: a new SQLite file, or a new database on the test's
// PostgreSQL server (started once per test program, by its first
// PostgreSQL test).
class HistoryStoreTest : public ::testing::TestWithParam<Store> {
 protected:
  static void TearDownTestSuite() {
    delete postgres_;
    postgres_ = nullptr;
  }
  void SetUp() override {
    if (GetParam() == Store::kSqlite) {
      spec_ = dir_ / "history.sqlite3";
      return;
    }
    if (postgres_ == nullptr && postgres_error_ == nullptr) {
      absl::StatusOr<std::unique_ptr<testing::ScratchPostgres>> pg =
          testing::ScratchPostgres::Start();
      if (pg.ok()) {
        postgres_ = std::move(*pg).release();
      } else {
        postgres_error_ = new absl::Status(pg.status());
      }
    }
    ASSERT_NE(postgres_, nullptr) << *postgres_error_;
    static int databases = 0;
    absl::StatusOr<std::string> uri =
        postgres_->NewDatabase("history_" + std::to_string(++databases));
    ASSERT_TRUE(uri.ok()) << uri.status();
    spec_ = *uri;
  }
  absl::StatusOr<std::unique_ptr<HistoryStore>> Open() { return HistoryStore::Open(spec_); }

  static testing::ScratchPostgres* postgres_;
  static absl::Status* postgres_error_;
  TempDir dir_;
  std::string spec_;
};
testing::ScratchPostgres* HistoryStoreTest::postgres_ = nullptr;
absl::Status* HistoryStoreTest::postgres_error_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Stores, HistoryStoreTest,
                         ::testing::Values(Store::kSqlite, Store::kPostgres),
                         [](const ::testing::TestParamInfo<Store>& info) {
                           return info.param == Store::kSqlite ? "SQLite" : "PostgreSQL";
                         });

TEST_P(HistoryStoreTest, ANewStoreIsMigratedAndKeepsRunsAcrossAReopen) {
  std::vector<std::int64_t> ids;
  {
    absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->SchemaVersion(), HistoryStore::kSchemaVersion);
    EXPECT_EQ(*(*store)->JournalMode(), GetParam() == Store::kSqlite ? "wal" : "");
    for (int n = 0; n < 3; ++n) {
      RunRecord r = MakeRun("t1", "p", "c", "main", n);
      ASSERT_TRUE((*store)->Record(&r).ok());
      EXPECT_GT(r.id, 0);
      ids.push_back(r.id);
    }
    EXPECT_LT(ids[0], ids[1]);
  }
  absl::StatusOr<std::unique_ptr<HistoryStore>> again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  RunFilter f;
  f.tenant = "t1";
  absl::StatusOr<std::vector<RunRecord>> runs = (*again)->List(f);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 3u);
  // Newest first, every field as recorded.
  const RunRecord want = MakeRun("t1", "p", "c", "main", 2);
  const RunRecord& got = (*runs)[0];
  EXPECT_EQ(got.id, ids[2]);
  EXPECT_EQ(got.labels.ref, "ref2");
  EXPECT_EQ(got.inputs_xxh3, want.inputs_xxh3);
  EXPECT_EQ(got.verdict, want.verdict);
  EXPECT_EQ(got.recorded_unix_us, want.recorded_unix_us);
  ASSERT_EQ(got.candidates.size(), 2u);
  EXPECT_EQ(got.candidates[0].name, "y");
  EXPECT_EQ(got.candidates[1].name, "lse");
  EXPECT_EQ(got.candidates[0].xxh3, 0x8000000000000001ull);
  EXPECT_EQ(got.candidates[0].worst_bound_fraction, 2.25);
  EXPECT_EQ(got.candidates[0].effective_bits, 21.5);
  EXPECT_EQ(got.candidates[0].max_ulp, 7);
  EXPECT_EQ(got.candidates[0].bitwise_equal_fraction, 0.5);
  EXPECT_EQ(got.candidates[0].rms_ratio, 0.125);
}

TEST_P(HistoryStoreTest, ListsATenantsRunsByLabelsAPageAtATime) {
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  for (int n = 0; n < 10; ++n) {
    RunRecord r = MakeRun(n < 8 ? "t1" : "t2", n % 2 ? "p" : "q", n % 3 ? "c" : "d",
                          n < 5 ? "main" : "dev", n);
    ASSERT_TRUE((*store)->Record(&r).ok());
  }
  const auto list = [&](RunFilter f) {
    absl::StatusOr<std::vector<RunRecord>> runs = (*store)->List(f);
    EXPECT_TRUE(runs.ok()) << runs.status();
    std::vector<std::string> refs;
    for (const RunRecord& r : *runs) refs.push_back(r.labels.ref);
    return refs;
  };
  RunFilter f;
  f.tenant = "t2";
  EXPECT_EQ(list(f), (std::vector<std::string>{"ref9", "ref8"}));
  f.tenant = "nobody";
  EXPECT_TRUE(list(f).empty());
  f.tenant = "t1";
  f.project = "p";
  EXPECT_EQ(list(f), (std::vector<std::string>{"ref7", "ref5", "ref3", "ref1"}));
  f.case_name = "c";
  f.branch = "main";
  EXPECT_EQ(list(f), (std::vector<std::string>{"ref1"}));
  // Pages: 3 newest, then those before the last of them.
  RunFilter page;
  page.tenant = "t1";
  page.limit = 3;
  EXPECT_EQ(list(page), (std::vector<std::string>{"ref7", "ref6", "ref5"}));
  absl::StatusOr<std::vector<RunRecord>> first = (*store)->List(page);
  page.before_id = first->back().id;
  EXPECT_EQ(list(page), (std::vector<std::string>{"ref4", "ref3", "ref2"}));
}

// A tenant's runs past the newest max_runs are pruned with their
// candidates, oldest first; another tenant's are not touched.
TEST_P(HistoryStoreTest, RetentionPrunesATenantsOldestRuns) {
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  RunRecord other = MakeRun("t2", "p", "c", "main", 100);
  ASSERT_TRUE((*store)->Record(&other, 3).ok());
  for (int n = 0; n < 7; ++n) {
    RunRecord r = MakeRun("t1", "p", "c", "main", n);
    ASSERT_TRUE((*store)->Record(&r, 3).ok());
  }
  RunFilter f;
  f.tenant = "t1";
  absl::StatusOr<std::vector<RunRecord>> runs = (*store)->List(f);
  ASSERT_TRUE(runs.ok());
  std::vector<std::string> refs;
  for (const RunRecord& r : *runs) refs.push_back(r.labels.ref);
  EXPECT_EQ(refs, (std::vector<std::string>{"ref6", "ref5", "ref4"}));
  for (const RunRecord& r : *runs) EXPECT_EQ(r.candidates.size(), 2u);
  f.tenant = "t2";
  EXPECT_EQ((*store)->List(f)->size(), 1u);
  // The pruned runs' candidates went with them.
  EXPECT_EQ(RawQuery(spec_, "SELECT COUNT(*) FROM candidates"), "8");
}

// The byte limit: a tenant's runs past it, oldest first, are pruned in the
// writing transaction; the run just recorded and a promoted baseline's are
// kept whatever they take; another tenant's runs do not count.
TEST_P(HistoryStoreTest, RetentionByBytesPrunesATenantsOldestRunsButKeepsBaselinesAndTheNewest) {
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  RunRecord probe = MakeRun("t1", "p", "c", "main", 0);
  ASSERT_TRUE((*store)->Record(&probe).ok());
  ASSERT_GT(probe.bytes, 200);
  ASSERT_TRUE((*store)->Promote("t1", probe.id, "golden").ok());
  const std::int64_t limit = 3 * probe.bytes + probe.bytes / 2;  // three and a half runs
  RunRecord other = MakeRun("t2", "p", "c", "main", 50);
  ASSERT_TRUE((*store)->Record(&other, 0, limit).ok());
  for (int n = 1; n <= 6; ++n) {
    RunRecord r = MakeRun("t1", "p", "c", "main", n);
    ASSERT_TRUE((*store)->Record(&r, 0, limit).ok());
  }
  // ref6, ref5, ref4 fit; ref0 is the baseline (it counts, and is kept).
  EXPECT_EQ(Refs(**store, "t1"), (std::vector<std::string>{"ref6", "ref5", "ref4", "ref0"}));
  EXPECT_EQ(Refs(**store, "t2"), (std::vector<std::string>{"ref50"}));
  // A limit below one run keeps the run just recorded (and the baseline).
  RunRecord big = MakeRun("t1", "p", "c", "main", 7);
  ASSERT_TRUE((*store)->Record(&big, 0, 1).ok());
  EXPECT_EQ(Refs(**store, "t1"), (std::vector<std::string>{"ref7", "ref0"}));
}

// A file of schema version 1 (runs and candidates only, as the first
// logitd with a history wrote it) is migrated to the current version at
// open, its runs kept; a promoted run is found by its name and survives
// retention; promoting another tenant's run is NotFound.
// Every other operation, on both stores: alerts, block digests and
// figures that are not finite kept exactly; a baseline's name moving; rules
// replaced; the projects' and cases' summaries; a project removed.
TEST_P(HistoryStoreTest, EveryOperationKeepsWhatItWasGiven) {
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  RunRecord r = MakeRun("t", "p", "c", "main", 0);
  r.candidates[0].block_rows = 16;
  r.candidates[0].block_digests = {0xffffffffffffffffull, 0, 0x0123456789abcdefull};
  r.candidates[1].worst_bound_fraction = std::numeric_limits<double>::infinity();
  r.candidates[1].rms_ratio = std::numeric_limits<double>::quiet_NaN();
  r.candidates[1].effective_bits = 0.1 + 0.2;  // every bit of a double
  r.alerts = {Alert{"bits_unchanged", "y", "bits 'changed' since run 1"}};
  r.libraries = "driver 580.159.04, CUDA 13.0, cuBLASLt 130100, 132 SMs, split_k fp32";
  const absl::Status recorded = (*store)->Record(&r);
  ASSERT_TRUE(recorded.ok()) << recorded;
  RunRecord second = MakeRun("t", "p", "d", "dev", 1);
  ASSERT_TRUE((*store)->Record(&second).ok());
  RunFilter f;
  f.tenant = "t";
  f.run_id = r.id;
  absl::StatusOr<std::vector<RunRecord>> got = (*store)->List(f);
  ASSERT_TRUE(got.ok() && got->size() == 1u) << got.status();
  const RunRecord& back = (*got)[0];
  EXPECT_EQ(back.candidates[0].block_rows, 16);
  EXPECT_EQ(back.candidates[0].block_digests, r.candidates[0].block_digests);
  EXPECT_TRUE(back.candidates[1].block_digests.empty());
  EXPECT_EQ(back.candidates[1].worst_bound_fraction, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(back.candidates[1].rms_ratio));
  EXPECT_EQ(back.candidates[1].effective_bits, 0.1 + 0.2);
  ASSERT_EQ(back.alerts.size(), 1u);
  EXPECT_EQ(back.alerts[0].message, "bits 'changed' since run 1");
  EXPECT_EQ(back.bytes, r.bytes);
  EXPECT_EQ(back.libraries, r.libraries);

  ASSERT_TRUE((*store)->Promote("t", r.id, "golden").ok());
  ASSERT_TRUE((*store)->Promote("t", r.id, "golden").ok());  // again: the same
  EXPECT_EQ((*store)->Promote("other", r.id, "golden").code(), absl::StatusCode::kNotFound);
  RunFilter golden;
  golden.tenant = "t";
  golden.project = "p";
  golden.case_name = "c";
  golden.baseline = "golden";
  EXPECT_EQ((*store)->List(golden)->at(0).id, r.id);

  const std::vector<Rule> rules = {Rule{"c", "main", "y", Rule::Check::kBitsUnchanged, 0},
                                   Rule{"", "", "", Rule::Check::kMaxWorstFractionGrowth, 2.5}};
  ASSERT_TRUE((*store)->SetRules("t", "p", rules).ok());
  ASSERT_TRUE((*store)->SetRules("t", "p", {rules[1], rules[0]}).ok());
  absl::StatusOr<std::vector<Rule>> kept = (*store)->Rules("t", "p");
  ASSERT_TRUE(kept.ok() && kept->size() == 2u) << kept.status();
  EXPECT_EQ((*kept)[0].check, Rule::Check::kMaxWorstFractionGrowth);
  EXPECT_EQ((*kept)[0].limit, 2.5);
  EXPECT_EQ((*kept)[1].case_name, "c");
  EXPECT_TRUE((*store)->Rules("other", "p")->empty());

  absl::StatusOr<std::vector<ProjectSummary>> projects = (*store)->Projects("t");
  ASSERT_TRUE(projects.ok() && projects->size() == 1u) << projects.status();
  EXPECT_EQ((*projects)[0].cases, 2);
  EXPECT_EQ((*projects)[0].runs, 2);
  EXPECT_EQ((*projects)[0].alerts, 1);
  absl::StatusOr<std::vector<CaseSummary>> cases = (*store)->Cases("t", "p");
  ASSERT_TRUE(cases.ok() && cases->size() == 2u) << cases.status();
  EXPECT_EQ((*cases)[0].case_name, "c");
  EXPECT_EQ((*cases)[0].alerts, 1);
  EXPECT_EQ((*cases)[1].latest_branch, "dev");
  EXPECT_EQ((*cases)[1].latest_run_id, second.id);

  EXPECT_EQ((*store)->DeleteProject("other", "p").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::int64_t> removed = (*store)->DeleteProject("t", "p");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_TRUE((*store)->Projects("t")->empty());
  EXPECT_TRUE((*store)->Rules("t", "p")->empty());
  EXPECT_EQ(RawQuery(spec_, "SELECT COUNT(*) FROM candidates"), "0");
  EXPECT_EQ(RawQuery(spec_, "SELECT COUNT(*) FROM alerts"), "0");
}

// A run compared with another names the rows whose blocks changed on its
// page, the last block ending at the candidate's last row (8 rows in blocks
// of 3: rows 6-7, not 6-8).
TEST_P(HistoryStoreTest, ARunsPageNamesTheChangedRowsUpToTheLastRow) {
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  RunRecord base = MakeRun("t", "p", "c", "main", 0);
  base.candidates.resize(1);
  base.candidates[0].block_rows = 3;
  base.candidates[0].block_digests = {1, 2, 3};
  base.candidates[0].rows = 8;
  ASSERT_TRUE((*store)->Record(&base).ok());
  RunRecord next = base;
  next.labels.ref = "next";
  next.baseline_run_id = base.id;
  next.candidates[0].xxh3 ^= 1;
  next.candidates[0].block_digests = {9, 2, 4};
  ASSERT_TRUE((*store)->Record(&next).ok());
  RunFilter f;
  f.tenant = "t";
  f.run_id = next.id;
  EXPECT_EQ((*store)->List(f)->at(0).candidates[0].rows, 8);
  const DashboardPage page =
      RenderDashboard(**store, "t", "/history/run", {{"run", std::to_string(next.id)}});
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_THAT(page.body, HasSubstr("0-2, 6-7"));
  EXPECT_THAT(page.body, ::testing::Not(HasSubstr("6-8")));
}

TEST(HistoryStoreSqliteTest, AVersion1FileMigratesAndPromotedRunsOutliveRetention) {
  TempDir dir;
  const std::string path = dir / "history.sqlite3";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const char* v1 =
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, project "
        "TEXT NOT NULL, case_name TEXT NOT NULL, branch TEXT NOT NULL, ref TEXT NOT NULL, "
        "operation TEXT NOT NULL, inputs_xxh3 INTEGER NOT NULL, verdict TEXT NOT NULL, backend "
        "TEXT NOT NULL, device TEXT NOT NULL, logitd_version TEXT NOT NULL, recorded_unix_us "
        "INTEGER NOT NULL);"
        "CREATE INDEX runs_by_case ON runs (tenant, project, case_name, id);"
        "CREATE TABLE candidates (run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE "
        "CASCADE, position INTEGER NOT NULL, name TEXT NOT NULL, verdict TEXT NOT NULL, xxh3 "
        "INTEGER NOT NULL, elements INTEGER NOT NULL, outside_bound INTEGER NOT NULL, "
        "worst_bound_fraction REAL NOT NULL, bitwise_equal_fraction REAL NOT NULL, max_ulp "
        "INTEGER NOT NULL, p99_ulp INTEGER NOT NULL, rms_ratio REAL NOT NULL, effective_bits "
        "REAL NOT NULL, PRIMARY KEY (run_id, position));"
        "INSERT INTO runs VALUES (1, 't', 'p', 'c', 'main', 'old', 'VERIFY_LOGITS', 7, "
        "'within_bounds', 'cpu', 'a CPU', '0.1.0', 5);"
        "PRAGMA user_version = 1;";
    ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::OpenSqlite(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->SchemaVersion(), HistoryStore::kSchemaVersion);
  ASSERT_TRUE((*store)->Promote("t", 1, "golden").ok());
  EXPECT_EQ((*store)->Promote("other", 1, "golden").code(), absl::StatusCode::kNotFound);
  for (int n = 0; n < 5; ++n) {
    RunRecord r = MakeRun("t", "p", "c", "main", n);
    ASSERT_TRUE((*store)->Record(&r, 2).ok());
  }
  RunFilter f;
  f.tenant = "t";
  std::vector<std::string> refs;
  absl::StatusOr<std::vector<RunRecord>> kept = (*store)->List(f);
  ASSERT_TRUE(kept.ok()) << kept.status();
  for (const RunRecord& r : *kept) refs.push_back(r.labels.ref);
  EXPECT_EQ(refs, (std::vector<std::string>{"ref4", "ref3", "old"}));
  f.project = "p";
  f.case_name = "c";
  f.baseline = "golden";
  absl::StatusOr<std::vector<RunRecord>> golden = (*store)->List(f);
  ASSERT_TRUE(golden.ok()) << golden.status();
  ASSERT_EQ(golden->size(), 1u);
  EXPECT_EQ((*golden)[0].id, 1);
  // The name moves to another run.
  RunFilter all;
  all.tenant = "t";
  absl::StatusOr<std::vector<RunRecord>> newest = (*store)->List(all);
  ASSERT_TRUE(newest.ok() && !newest->empty());
  ASSERT_TRUE((*store)->Promote("t", (*newest)[0].id, "golden").ok());
  golden = (*store)->List(f);
  ASSERT_TRUE(golden.ok() && golden->size() == 1u);
  EXPECT_EQ((*golden)[0].labels.ref, "ref4");
}

TEST_P(HistoryStoreTest, ServersOpeningOneNewStoreAtOnceMigrateItOnce) {
  std::vector<std::thread> threads;
  std::vector<absl::Status> opened(8);
  for (std::size_t i = 0; i < opened.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<HistoryStore>> s = Open();
      opened[i] = s.status();
      if (!s.ok()) return;
      RunRecord r = MakeRun("t", "p", "c", "b", static_cast<int>(i));
      opened[i] = (*s)->Record(&r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : opened) EXPECT_TRUE(s.ok()) << s;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  ASSERT_TRUE(store.ok());
  RunFilter f;
  f.tenant = "t";
  EXPECT_EQ((*store)->List(f)->size(), opened.size());
}

TEST_P(HistoryStoreTest, AStoreOfANewerSchemaIsRefused) {
  RawQuery(spec_, GetParam() == Store::kSqlite
                      ? "PRAGMA user_version = 99"
                      : "CREATE TABLE logitd_schema_version (version INTEGER NOT NULL); INSERT "
                        "INTO logitd_schema_version VALUES (99)");
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = Open();
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
}

TEST(HistoryStoreSqliteTest, AnUnopenablePathSaysWhy) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store =
      HistoryStore::OpenSqlite(dir / "no/such/dir/history.sqlite3");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(store.status().message(), HasSubstr("no/such/dir"));
}

TEST(HistoryLabelsTest, LabelsNeedAProjectAndACaseAndAreBounded) {
  EXPECT_TRUE(CheckLabels(RunLabels{"p", "c", "", ""}).ok());
  absl::Status s = CheckLabels(RunLabels{"", "c", "", ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("record.project"));
  s = CheckLabels(RunLabels{"p", "", "", ""});
  EXPECT_THAT(s.message(), HasSubstr("record.case_name"));
  s = CheckLabels(RunLabels{"p", "c", std::string(kMaxLabelBytes + 1, 'b'), ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("record.branch: 257 bytes"));
}

}  // namespace
}  // namespace logitd::history

namespace logitd::history {
namespace {

// A server that does not answer: Unavailable at once, the password not
// said.
TEST(HistoryStorePostgresTest, AServerThatDoesNotAnswerIsUnavailableAndItsPasswordIsNotSaid) {
  const int port = [] {
    absl::StatusOr<std::unique_ptr<testing::ScratchPostgres>> pg =
        testing::ScratchPostgres::Start();
    return pg.ok() ? (*pg)->port() : 1;  // its port, once it has stopped
  }();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::Open(
      "postgresql://logitd:s3cret@127.0.0.1:" + std::to_string(port) + "/history");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("logitd:***@127.0.0.1"));
  EXPECT_THAT(store.status().message(), ::testing::Not(HasSubstr("s3cret")));
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::seconds(sql::kWaitMs / 1000 + 2));
}

// The server goes away: a run recorded meanwhile fails within the bounded
// wait, and the next one once it is back is kept, without a reopen.
TEST(HistoryStorePostgresTest, AServerThatGoesAwayFailsARecordAndIsUsedAgainOnceBack) {
  absl::StatusOr<std::unique_ptr<testing::ScratchPostgres>> pg = testing::ScratchPostgres::Start();
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<std::string> uri = (*pg)->NewDatabase("history");
  ASSERT_TRUE(uri.ok()) << uri.status();
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::Open(*uri);
  ASSERT_TRUE(store.ok()) << store.status();
  RunRecord before = MakeRun("t", "p", "c", "main", 0);
  ASSERT_TRUE((*store)->Record(&before).ok());
  ASSERT_TRUE((*pg)->Stop().ok());
  const auto start = std::chrono::steady_clock::now();
  RunRecord during = MakeRun("t", "p", "c", "main", 1);
  const absl::Status lost = (*store)->Record(&during);
  EXPECT_FALSE(lost.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::seconds(2 * sql::kWaitMs / 1000));
  ASSERT_TRUE((*pg)->Restart().ok());
  RunRecord after = MakeRun("t", "p", "c", "main", 2);
  // The first call after the restart finds the old socket gone, connects
  // again and runs its statement once more: no call is lost to it.
  const absl::Status kept = (*store)->Record(&after);
  ASSERT_TRUE(kept.ok()) << kept;
  EXPECT_EQ(Refs(**store, "t"), (std::vector<std::string>{"ref2", "ref0"}));
}

}  // namespace
}  // namespace logitd::history

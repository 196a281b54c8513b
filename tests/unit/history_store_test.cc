// The history store on a real SQLite file: created and migrated in WAL
// mode, runs and their candidates kept across a reopen, listed per tenant
// newest first with filters and pages, servers opening one new file at once
// migrate it once, and a file from a newer logitd refused.
#include "server/history/history_store.h"

#include <sqlite3.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

TEST(HistoryStoreTest, ANewFileIsMigratedInWalModeAndKeepsRunsAcrossAReopen) {
  TempDir dir;
  const std::string path = dir / "history.sqlite3";
  std::vector<std::int64_t> ids;
  {
    absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::OpenSqlite(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->SchemaVersion(), HistoryStore::kSchemaVersion);
    EXPECT_EQ(*(*store)->JournalMode(), "wal");
    for (int n = 0; n < 3; ++n) {
      RunRecord r = MakeRun("t1", "p", "c", "main", n);
      ASSERT_TRUE((*store)->Record(&r).ok());
      EXPECT_GT(r.id, 0);
      ids.push_back(r.id);
    }
    EXPECT_LT(ids[0], ids[1]);
  }
  absl::StatusOr<std::unique_ptr<HistoryStore>> again = HistoryStore::OpenSqlite(path);
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
}

TEST(HistoryStoreTest, ListsATenantsRunsByLabelsAPageAtATime) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store =
      HistoryStore::OpenSqlite(dir / "history.sqlite3");
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
TEST(HistoryStoreTest, RetentionPrunesATenantsOldestRuns) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store =
      HistoryStore::OpenSqlite(dir / "history.sqlite3");
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
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "history.sqlite3").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM candidates", -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(stmt, 0), 4 * 2);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

// The byte limit: a tenant's runs past it, oldest first, are pruned in the
// writing transaction; the run just recorded and a promoted baseline's are
// kept whatever they take; another tenant's runs do not count.
TEST(HistoryStoreTest, RetentionByBytesPrunesATenantsOldestRunsButKeepsBaselinesAndTheNewest) {
  TempDir dir;
  auto store = HistoryStore::OpenSqlite(dir / "history.sqlite3");
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
TEST(HistoryStoreTest, AVersion1FileMigratesAndPromotedRunsOutliveRetention) {
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

TEST(HistoryStoreTest, ServersOpeningOneNewFileAtOnceMigrateItOnce) {
  TempDir dir;
  const std::string path = dir / "history.sqlite3";
  std::vector<std::thread> threads;
  std::vector<absl::Status> opened(8);
  for (std::size_t i = 0; i < opened.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<HistoryStore>> s = HistoryStore::OpenSqlite(path);
      opened[i] = s.status();
      if (!s.ok()) return;
      RunRecord r = MakeRun("t", "p", "c", "b", static_cast<int>(i));
      opened[i] = (*s)->Record(&r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : opened) EXPECT_TRUE(s.ok()) << s;
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::OpenSqlite(path);
  ASSERT_TRUE(store.ok());
  RunFilter f;
  f.tenant = "t";
  EXPECT_EQ((*store)->List(f)->size(), opened.size());
}

TEST(HistoryStoreTest, AFileOfANewerSchemaIsRefusedAndAnUnopenablePathSaysWhy) {
  TempDir dir;
  const std::string path = dir / "history.sqlite3";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99;", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  absl::StatusOr<std::unique_ptr<HistoryStore>> store = HistoryStore::OpenSqlite(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
  store = HistoryStore::OpenSqlite(dir / "no/such/dir/history.sqlite3");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(store.status().message(), HasSubstr("no/such/dir"));
}

TEST(HistoryStoreTest, LabelsNeedAProjectAndACaseAndAreBounded) {
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

#include "server/history/schema.h"

#include "absl/strings/str_replace.h"

namespace logitd::history {
namespace {

// SQLite (PRAGMA user_version holds the version).
constexpr const char* kSqlite[] = {
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
    // 6 -> 7: each candidate's rows (where its last block ends).
    R"sql(
      ALTER TABLE candidates ADD COLUMN rows INTEGER NOT NULL DEFAULT 0;
    )sql",
    // 7 -> 8: the libraries (driver, CUDA, cuBLASLt; the BLAS) that judged it.
    R"sql(
      ALTER TABLE runs ADD COLUMN libraries TEXT NOT NULL DEFAULT '';
    )sql",
};

static_assert(sizeof(kSqlite) / sizeof(kSqlite[0]) == kSchemaVersion, "one step per version");

// PostgreSQL takes SQLite's steps in its own types (logitd_schema_version
// holds the version there): 64-bit integers and identities, doubles, bytea.
std::string PostgresStep(std::string step) {
  step =
      absl::StrReplaceAll(step, {{"INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY"}});
  return absl::StrReplaceAll(
      step, {{" INTEGER", " BIGINT"}, {" REAL", " DOUBLE PRECISION"}, {" BLOB", " BYTEA"}});
}

}  // namespace

std::vector<std::string> Migrations(sql::Dialect dialect) {
  std::vector<std::string> steps;
  for (const char* step : kSqlite) {
    steps.push_back(dialect == sql::Dialect::kSqlite ? std::string(step) : PostgresStep(step));
  }
  return steps;
}

}  // namespace logitd::history

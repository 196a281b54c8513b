#include "server/history/schema.h"

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
};

// PostgreSQL (logitd_schema_version holds it): SQLite's steps in its types.
constexpr const char* kPostgres[] = {
    // 0 -> 1: runs and their candidates.
    R"sql(
      CREATE TABLE runs (
        id BIGSERIAL PRIMARY KEY,
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        case_name TEXT NOT NULL,
        branch TEXT NOT NULL,
        ref TEXT NOT NULL,
        operation TEXT NOT NULL,
        inputs_xxh3 BIGINT NOT NULL,
        verdict TEXT NOT NULL,
        backend TEXT NOT NULL,
        device TEXT NOT NULL,
        logitd_version TEXT NOT NULL,
        recorded_unix_us BIGINT NOT NULL);
      CREATE INDEX runs_by_case ON runs (tenant, project, case_name, id);
      CREATE TABLE candidates (
        run_id BIGINT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        position BIGINT NOT NULL,
        name TEXT NOT NULL,
        verdict TEXT NOT NULL,
        xxh3 BIGINT NOT NULL,
        elements BIGINT NOT NULL,
        outside_bound BIGINT NOT NULL,
        worst_bound_fraction DOUBLE PRECISION NOT NULL,
        bitwise_equal_fraction DOUBLE PRECISION NOT NULL,
        max_ulp BIGINT NOT NULL,
        p99_ulp BIGINT NOT NULL,
        rms_ratio DOUBLE PRECISION NOT NULL,
        effective_bits DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, position));
    )sql",
    // 1 -> 2: named baselines, a run each, per project and case.
    R"sql(
      CREATE TABLE baselines (
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        case_name TEXT NOT NULL,
        name TEXT NOT NULL,
        run_id BIGINT NOT NULL REFERENCES runs (id),
        PRIMARY KEY (tenant, project, case_name, name));
    )sql",
    // 2 -> 3: a project's rules, and the alerts a run raised against them.
    R"sql(
      CREATE TABLE rules (
        tenant TEXT NOT NULL,
        project TEXT NOT NULL,
        position BIGINT NOT NULL,
        case_name TEXT NOT NULL,
        branch TEXT NOT NULL,
        candidate TEXT NOT NULL,
        check_name TEXT NOT NULL,
        limit_value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, project, position));
      CREATE TABLE alerts (
        run_id BIGINT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        position BIGINT NOT NULL,
        rule TEXT NOT NULL,
        candidate TEXT NOT NULL,
        message TEXT NOT NULL,
        PRIMARY KEY (run_id, position));
    )sql",
    // 3 -> 4: each candidate's block digests (which rows changed).
    R"sql(
      ALTER TABLE candidates ADD COLUMN block_rows BIGINT NOT NULL DEFAULT 0;
      ALTER TABLE candidates ADD COLUMN block_digests BYTEA;
    )sql",
    // 4 -> 5: what each run takes, for the per-tenant byte limit (runs
    // recorded before count 0).
    R"sql(
      ALTER TABLE runs ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
    )sql",
    // 5 -> 6: the run each run was compared with.
    R"sql(
      ALTER TABLE runs ADD COLUMN baseline_run_id BIGINT NOT NULL DEFAULT 0;
    )sql",
    R"sql(
      ALTER TABLE candidates ADD COLUMN rows BIGINT NOT NULL DEFAULT 0;
    )sql",
};
static_assert(sizeof(kSqlite) / sizeof(kSqlite[0]) == kSchemaVersion, "one step per version");
static_assert(sizeof(kPostgres) / sizeof(kPostgres[0]) == kSchemaVersion, "one step per version");

}  // namespace

absl::Span<const char* const> Migrations(sql::Dialect dialect) {
  return dialect == sql::Dialect::kSqlite ? absl::MakeConstSpan(kSqlite)
                                          : absl::MakeConstSpan(kPostgres);
}

}  // namespace logitd::history

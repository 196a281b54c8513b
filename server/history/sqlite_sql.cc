// sql.h over SQLite (Debian's libsqlite3): one file in WAL mode.
#include "server/history/sql.h"

#include <sqlite3.h>

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace logitd::history::sql {
namespace {

class SqliteStatement final : public Statement {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt, std::string what)
      : db_(db), stmt_(stmt), what_(std::move(what)) {}
  ~SqliteStatement() override { sqlite3_finalize(stmt_); }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  using Statement::Bind;
  void Bind(int i, const std::string& s) override {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, std::int64_t v) override { sqlite3_bind_int64(stmt_, i, v); }
  // SQLite keeps no NaN (it binds NULL): one is kept as the text "NaN",
  // which Real reads back.
  void Bind(int i, double v) override {
    if (std::isnan(v)) {
      sqlite3_bind_text(stmt_, i, "NaN", 3, SQLITE_STATIC);
    } else {
      sqlite3_bind_double(stmt_, i, v);
    }
  }
  void Bind(int i, const std::vector<std::uint64_t>& words) override {
    std::string bytes(words.size() * 8, '\0');
    for (std::size_t w = 0; w < words.size(); ++w) {
      for (int b = 0; b < 8; ++b) bytes[w * 8 + b] = static_cast<char>(words[w] >> (8 * b));
    }
    sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }

  absl::StatusOr<bool> Next() override {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) {
      changes_ = sqlite3_changes(db_);
      return false;
    }
    return absl::InternalError(absl::StrCat("history: ", what_, ": ", sqlite3_errmsg(db_)));
  }
  std::int64_t Changes() const override { return changes_; }
  void Reset() override {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  std::string Text(int i) const override {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
  }
  std::int64_t Int(int i) const override { return sqlite3_column_int64(stmt_, i); }
  double Real(int i) const override {
    if (sqlite3_column_type(stmt_, i) == SQLITE_TEXT) {
      return std::strtod(reinterpret_cast<const char*>(sqlite3_column_text(stmt_, i)), nullptr);
    }
    return sqlite3_column_double(stmt_, i);
  }
  std::vector<std::uint64_t> Words(int i) const override {
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
  sqlite3* const db_;
  sqlite3_stmt* const stmt_;
  const std::string what_;
  std::int64_t changes_ = 0;
};

class SqliteConnection final : public Connection {
 public:
  SqliteConnection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteConnection() override { sqlite3_close(db_); }
  SqliteConnection(const SqliteConnection&) = delete;
  SqliteConnection& operator=(const SqliteConnection&) = delete;

  Dialect dialect() const override { return Dialect::kSqlite; }
  const std::string& location() const override { return path_; }

  absl::StatusOr<std::unique_ptr<Statement>> Prepare(absl::string_view sql,
                                                     absl::string_view what) override {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) !=
        SQLITE_OK) {
      sqlite3_finalize(stmt);
      return absl::InternalError(
          absl::StrCat("history: prepare ", what, ": ", sqlite3_errmsg(db_)));
    }
    return std::make_unique<SqliteStatement>(db_, stmt, std::string(what));
  }
  absl::Status Exec(absl::string_view sql, absl::string_view what) override {
    char* message = nullptr;
    const std::string text(sql);
    if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      absl::Status s =
          absl::InternalError(absl::StrCat("history: ", what, ": ", message ? message : "?"));
      sqlite3_free(message);
      return s;
    }
    return absl::OkStatus();
  }
  absl::Status BeginWrite(absl::string_view what) override {
    return Exec("BEGIN IMMEDIATE;", absl::StrCat("begin ", what));
  }
  absl::StatusOr<int> SchemaVersion() override {
    absl::StatusOr<std::unique_ptr<Statement>> s =
        Prepare("PRAGMA user_version", "read the schema version");
    if (!s.ok()) return s.status();
    absl::StatusOr<bool> row = (*s)->Next();
    if (!row.ok()) return row.status();
    return static_cast<int>((*s)->Int(0));
  }
  absl::Status SetSchemaVersion(int version) override {
    return Exec(absl::StrCat("PRAGMA user_version = ", version, ";"),
                absl::StrCat("set the schema version to ", version));
  }

 private:
  sqlite3* const db_;
  const std::string path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> OpenSqlite(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("history: cannot open ", path, ": ",
                                                      db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  auto connection = std::make_unique<SqliteConnection>(db, path);
  sqlite3_busy_timeout(db, kWaitMs);
  if (absl::Status s =
          connection->Exec("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;", "set WAL mode");
      !s.ok()) {
    return s;
  }
  return connection;
}

}  // namespace logitd::history::sql

// The history's one view of a SQL database, so that the store's queries are
// written once for SQLite (an embedded file, the default) and PostgreSQL
// (a server several logitd replicas share). Statements use numbered
// parameters (?1, ?2, …; PostgreSQL's $1, $2, … are derived from them) and
// the SQL both dialects accept; what differs (the schema's types, where the
// schema version lives, how a write transaction locks) is the connection's.
// A connection serves one thread at a time (the store holds a lock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::history::sql {

enum class Dialect { kSqlite, kPostgres };

// A statement and, once run, its rows. Errors are Internal, worded
// "history: <what>: <the database's message>", `what` as Prepare was told.
class Statement {
 public:
  virtual ~Statement() = default;

  virtual void Bind(int i, const std::string& s) = 0;
  virtual void Bind(int i, std::int64_t v) = 0;
  // The 64 bits as a signed integer (xxh3 digests).
  void Bind(int i, std::uint64_t v);
  virtual void Bind(int i, double v) = 0;
  // 64-bit words, little-endian, as a blob.
  virtual void Bind(int i, const std::vector<std::uint64_t>& words) = 0;

  // Runs the statement on its first call; true while a row is there to
  // read, false past the last.
  virtual absl::StatusOr<bool> Next() = 0;
  // Runs a statement that returns no rows.
  absl::Status Run();
  // The rows the last run inserted, updated or deleted.
  virtual std::int64_t Changes() const = 0;
  // Ready to run again with new bindings.
  virtual void Reset() = 0;

  // The current row's column i (NULL reads as "", 0 or no words).
  virtual std::string Text(int i) const = 0;
  virtual std::int64_t Int(int i) const = 0;
  std::uint64_t Uint(int i) const;
  virtual double Real(int i) const = 0;
  virtual std::vector<std::uint64_t> Words(int i) const = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual Dialect dialect() const = 0;
  // Where it is, for messages: the file, or the server without a password.
  virtual const std::string& location() const = 0;

  virtual absl::StatusOr<std::unique_ptr<Statement>> Prepare(absl::string_view sql,
                                                             absl::string_view what) = 0;
  // Runs statements without parameters.
  virtual absl::Status Exec(absl::string_view sql, absl::string_view what) = 0;
  // Begins a write transaction that holds the store's write lock (at most
  // a bounded wait for it, else an error): SQLite's BEGIN IMMEDIATE,
  // PostgreSQL's BEGIN with a transaction-scoped advisory lock, so that
  // writers on every replica take turns as one file's do.
  virtual absl::Status BeginWrite(absl::string_view what) = 0;

  // The schema version the database holds (0: none yet), and setting it
  // inside a write transaction.
  virtual absl::StatusOr<int> SchemaVersion() = 0;
  virtual absl::Status SetSchemaVersion(int version) = 0;
};

// How long a statement or a lock may wait before it fails (a locked SQLite
// file, a PostgreSQL lock or server that does not answer).
inline constexpr int kWaitMs = 5000;

// Opens (creating) an SQLite file in WAL mode with foreign keys on.
absl::StatusOr<std::unique_ptr<Connection>> OpenSqlite(const std::string& path);

// Whether `spec` names a PostgreSQL server (postgresql:// or postgres://).
bool IsPostgresUri(absl::string_view spec);
// Connects to a PostgreSQL server (a libpq URI); Unimplemented where this
// logitd was built without libpq.
absl::StatusOr<std::unique_ptr<Connection>> OpenPostgres(const std::string& uri);
// The URI without its password, for logs and messages.
std::string RedactUri(absl::string_view uri);

}  // namespace logitd::history::sql

// sql.h over PostgreSQL (Debian's libpq): a server that several logitd
// replicas share. Parameters and rows travel as text, each parameter typed
// (text, int8, float8, bytea), so that the queries sqlite_sql.cc runs run
// here unchanged but for ?N becoming $N.
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/history/sql.h"

#if LOGITD_HAVE_LIBPQ
#include <libpq-fe.h>
#endif

namespace logitd::history::sql {

#if LOGITD_HAVE_LIBPQ
namespace {

// PostgreSQL's type oids (pg_type.dat) of the parameters the store binds.
constexpr Oid kText = 25, kInt8 = 20, kFloat8 = 701, kBytea = 17;
// The advisory lock every write transaction takes (any one number the
// schema owns: "logitd" in ASCII).
constexpr const char* kWriteLock = "SELECT pg_advisory_xact_lock(108105116105116100)";

std::string Message(const PGconn* conn) {
  std::string m = PQerrorMessage(conn);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

// ?N → $N (the store's SQL has no '?' elsewhere).
std::string Numbered(absl::string_view sql) {
  std::string out(sql);
  for (std::size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '?' && out[i + 1] >= '0' && out[i + 1] <= '9') out[i] = '$';
  }
  return out;
}

// A connection's session: its named prepared statements (one per statement
// text and parameter types, each parsed and planned once a session, then
// only run), its settings, and the one retry of a statement the server
// dropped the connection under while no transaction was open (a restart,
// a failover: the socket's loss is only seen when it is used).
class Session {
 public:
  Session(PGconn* conn, std::string location) : conn_(conn), location_(std::move(location)) {}

  PGconn* conn() const { return conn_; }
  const std::string& location() const { return location_; }

  // Bounded waits, no notices on stderr.
  absl::Status Configure() {
    PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);
    PGresult* r =
        PQexec(conn_, absl::StrCat("SET lock_timeout = ", kWaitMs,
                                   "; SET statement_timeout = ", 2 * kWaitMs,
                                   "; SET idle_in_transaction_session_timeout = ", 6 * kWaitMs, ";")
                          .c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok)
      return absl::InternalError(absl::StrCat("history: configure the session: ", Message(conn_)));
    return absl::OkStatus();
  }
  // The connection made again, within connect_timeout, when it is gone.
  absl::Status Reconnect() {
    if (PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
    PQreset(conn_);
    names_.clear();  // the new session has none of them
    if (PQstatus(conn_) != CONNECTION_OK) {
      return absl::UnavailableError(
          absl::StrCat("history: PostgreSQL at ", location_, ": ", Message(conn_)));
    }
    return Configure();
  }

  // Runs `exec` (a PQexec…); when it fails because the connection went
  // while no transaction was open, connects again and runs it once more.
  template <typename Exec>
  PGresult* Run(Exec exec) {
    const bool idle = PQtransactionStatus(conn_) == PQTRANS_IDLE;
    PGresult* r = exec();
    if (Succeeded(r) || !idle || PQstatus(conn_) != CONNECTION_BAD || !Reconnect().ok()) return r;
    PQclear(r);
    return exec();
  }
  static bool Succeeded(const PGresult* r) {
    const ExecStatusType status = PQresultStatus(r);
    return status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK;
  }

  // The name of `sql` prepared with `types`, preparing it on first use;
  // an empty name when the server refused (Message says why).
  std::string Name(const std::string& sql, const std::vector<Oid>& types) {
    std::string key = sql;
    for (Oid t : types) absl::StrAppend(&key, "\n", t);
    if (const auto it = names_.find(key); it != names_.end()) return it->second;
    if (names_.size() >= kMostKept) {
      PQclear(PQexec(conn_, "DEALLOCATE ALL"));
      names_.clear();
    }
    std::string name = absl::StrCat("logitd_", next_++);
    PGresult* r =
        PQprepare(conn_, name.c_str(), sql.c_str(), static_cast<int>(types.size()), types.data());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) return "";
    names_.emplace(std::move(key), name);
    return name;
  }

 private:
  static constexpr std::size_t kMostKept = 256;
  PGconn* const conn_;
  const std::string location_;
  std::unordered_map<std::string, std::string> names_;
  std::uint64_t next_ = 0;
};

class PostgresStatement final : public Statement {
 public:
  PostgresStatement(Session* session, std::string sql, std::string what)
      : session_(session), sql_(std::move(sql)), what_(std::move(what)) {}
  ~PostgresStatement() override { PQclear(result_); }
  PostgresStatement(const PostgresStatement&) = delete;
  PostgresStatement& operator=(const PostgresStatement&) = delete;

  using Statement::Bind;
  void Bind(int i, const std::string& s) override { Set(i, s, kText); }
  void Bind(int i, std::int64_t v) override { Set(i, absl::StrCat(v), kInt8); }
  void Bind(int i, double v) override {
    Set(i,
        std::isnan(v)   ? std::string("NaN")
        : std::isinf(v) ? std::string(v > 0 ? "Infinity" : "-Infinity")
                        : absl::StrFormat("%.17g", v),
        kFloat8);
  }
  void Bind(int i, const std::vector<std::uint64_t>& words) override {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex = "\\x";
    hex.reserve(2 + words.size() * 16);
    for (std::uint64_t w : words) {
      for (int b = 0; b < 8; ++b) {
        const unsigned byte = static_cast<unsigned>(w >> (8 * b)) & 0xff;
        hex += kHex[byte >> 4];
        hex += kHex[byte & 15];
      }
    }
    Set(i, hex, kBytea);
  }

  absl::StatusOr<bool> Next() override {
    if (result_ == nullptr) {
      std::vector<const char*> values(values_.size());
      for (std::size_t i = 0; i < values_.size(); ++i) values[i] = values_[i].c_str();
      std::string failed;
      result_ = session_->Run([&]() -> PGresult* {
        const std::string name = session_->Name(sql_, types_);
        if (name.empty()) {
          failed = Message(session_->conn());
          return nullptr;
        }
        return PQexecPrepared(session_->conn(), name.c_str(), static_cast<int>(values.size()),
                              values.data(), nullptr, nullptr, 0);
      });
      if (!Session::Succeeded(result_)) {
        return absl::InternalError(absl::StrCat(
            "history: ", what_, ": ", failed.empty() ? Message(session_->conn()) : failed));
      }
      (void)absl::SimpleAtoi(PQcmdTuples(result_), &changes_);
      row_ = -1;
    }
    return ++row_ < PQntuples(result_);
  }
  std::int64_t Changes() const override { return changes_; }
  void Reset() override {
    PQclear(result_);
    result_ = nullptr;
    values_.clear();
    types_.clear();
    changes_ = 0;
  }

  std::string Text(int i) const override { return PQgetvalue(result_, row_, i); }
  std::int64_t Int(int i) const override {
    std::int64_t v = 0;
    (void)absl::SimpleAtoi(PQgetvalue(result_, row_, i), &v);
    return v;
  }
  double Real(int i) const override {
    return PQgetisnull(result_, row_, i) ? 0 : std::strtod(PQgetvalue(result_, row_, i), nullptr);
  }
  std::vector<std::uint64_t> Words(int i) const override {
    // bytea's hex output: \x then two digits a byte.
    const absl::string_view hex = PQgetvalue(result_, row_, i);
    std::vector<std::uint64_t> words;
    if (hex.size() < 2 || hex[0] != '\\' || hex[1] != 'x') return words;
    const auto digit = [](char c) -> std::uint64_t {
      return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    };
    const std::size_t bytes = (hex.size() - 2) / 2;
    words.assign(bytes / 8, 0);
    for (std::size_t b = 0; b < words.size() * 8; ++b) {
      const std::uint64_t byte = digit(hex[2 + 2 * b]) << 4 | digit(hex[3 + 2 * b]);
      words[b / 8] |= byte << (8 * (b % 8));
    }
    return words;
  }

 private:
  void Set(int i, std::string value, Oid type) {
    if (values_.size() < static_cast<std::size_t>(i)) {
      values_.resize(i);
      types_.resize(i, kText);
    }
    values_[i - 1] = std::move(value);
    types_[i - 1] = type;
  }

  Session* const session_;
  const std::string sql_;
  const std::string what_;
  std::vector<std::string> values_;
  std::vector<Oid> types_;
  PGresult* result_ = nullptr;
  int row_ = -1;
  std::int64_t changes_ = 0;
};

class PostgresConnection final : public Connection {
 public:
  PostgresConnection(PGconn* conn, std::string location) : session_(conn, std::move(location)) {}
  ~PostgresConnection() override { PQfinish(session_.conn()); }
  PostgresConnection(const PostgresConnection&) = delete;
  PostgresConnection& operator=(const PostgresConnection&) = delete;

  Dialect dialect() const override { return Dialect::kPostgres; }
  const std::string& location() const override { return session_.location(); }
  absl::Status Configure() { return session_.Configure(); }

  absl::StatusOr<std::unique_ptr<Statement>> Prepare(absl::string_view sql,
                                                     absl::string_view what) override {
    if (absl::Status s = session_.Reconnect(); !s.ok()) return s;
    return std::make_unique<PostgresStatement>(&session_, Numbered(sql), std::string(what));
  }
  absl::Status Exec(absl::string_view sql, absl::string_view what) override {
    if (absl::Status s = session_.Reconnect(); !s.ok()) return s;
    const std::string text(sql);
    PGresult* r = session_.Run([&] { return PQexec(session_.conn(), text.c_str()); });
    const bool ok = Session::Succeeded(r);
    PQclear(r);
    if (!ok) {
      return absl::InternalError(absl::StrCat("history: ", what, ": ", Message(session_.conn())));
    }
    return absl::OkStatus();
  }
  absl::Status BeginWrite(absl::string_view what) override {
    return Exec(absl::StrCat("BEGIN; ", kWriteLock, ";"), absl::StrCat("begin ", what));
  }
  absl::StatusOr<int> SchemaVersion() override {
    // A database without the version's table yet holds version 0.
    absl::StatusOr<std::unique_ptr<Statement>> exists = Prepare(
        "SELECT to_regclass('logitd_schema_version') IS NOT NULL", "read the schema version");
    if (!exists.ok()) return exists.status();
    absl::StatusOr<bool> row = (*exists)->Next();
    if (!row.ok()) return row.status();
    if ((*exists)->Text(0) != "t") return 0;
    absl::StatusOr<std::unique_ptr<Statement>> version = Prepare(
        "SELECT COALESCE(MAX(version), 0) FROM logitd_schema_version", "read the schema version");
    if (!version.ok()) return version.status();
    row = (*version)->Next();
    if (!row.ok()) return row.status();
    return static_cast<int>((*version)->Int(0));
  }
  absl::Status SetSchemaVersion(int version) override {
    return Exec(absl::StrCat("CREATE TABLE IF NOT EXISTS logitd_schema_version (version INTEGER "
                             "NOT NULL); DELETE FROM logitd_schema_version; INSERT INTO "
                             "logitd_schema_version VALUES (",
                             version, ");"),
                absl::StrCat("set the schema version to ", version));
  }

 private:
  Session session_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> OpenPostgres(const std::string& uri) {
  // Bounded waits unless the URI says otherwise (its keywords come later
  // and override these).
  const char* keys[] = {"connect_timeout", "tcp_user_timeout", "application_name", "dbname",
                        nullptr};
  const std::string connect_s = absl::StrCat(kWaitMs / 1000);
  const std::string tcp_ms = absl::StrCat(2 * kWaitMs);
  const char* values[] = {connect_s.c_str(), tcp_ms.c_str(), "logitd", uri.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn == nullptr) return absl::ResourceExhaustedError("history: libpq: out of memory");
  auto connection = std::make_unique<PostgresConnection>(conn, RedactUri(uri));
  if (PQstatus(conn) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat("history: cannot connect to ", RedactUri(uri), ": ", Message(conn)));
  }
  if (absl::Status s = connection->Configure(); !s.ok()) return s;
  return connection;
}

#else  // !LOGITD_HAVE_LIBPQ

absl::StatusOr<std::unique_ptr<Connection>> OpenPostgres(const std::string& uri) {
  return absl::UnimplementedError(absl::StrCat(
      "history: ", RedactUri(uri),
      ": this logitd was built without PostgreSQL (libpq-dev was not found when it was built)"));
}

#endif

}  // namespace logitd::history::sql

// A PostgreSQL server of Debian's packages (postgresql-15), started by a
// test in a scratch directory on a free loopback port and stopped with it:
// the real server the history's PostgreSQL store is tested against. As root
// the server runs as the `postgres` user (initdb refuses root), else as the
// caller.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace logitd::testing {

class ScratchPostgres {
 public:
  // initdb (trust authentication for the user "logitd", fsync off) and
  // pg_ctl start; FailedPrecondition naming what to install when Debian's
  // server binaries are missing.
  static absl::StatusOr<std::unique_ptr<ScratchPostgres>> Start();
  ~ScratchPostgres();
  ScratchPostgres(const ScratchPostgres&) = delete;
  ScratchPostgres& operator=(const ScratchPostgres&) = delete;

  // Creates an empty database; its URI.
  absl::StatusOr<std::string> NewDatabase(const std::string& name);
  std::string Uri(const std::string& database) const;
  int port() const { return port_; }

  // Stops the server (fast shutdown: connections dropped), and starts it
  // again on the same port.
  absl::Status Stop();
  absl::Status Restart();

 private:
  ScratchPostgres() = default;
  // Runs a server binary (initdb, pg_ctl, createdb) with arguments already
  // quoted for the shell, as the server's user.
  absl::Status Run(const std::string& binary, const std::string& args) const;

  std::string bin_;   // Debian's /usr/lib/postgresql/<version>/bin
  std::string dir_;   // the scratch directory (data/, the socket, log)
  std::string user_;  // the user the server runs as ("" for the caller)
  int port_ = 0;
  bool running_ = false;
};

}  // namespace logitd::testing

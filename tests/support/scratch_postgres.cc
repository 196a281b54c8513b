#include "tests/support/scratch_postgres.h"

#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace logitd::testing {
namespace {

// The newest of Debian's server versions installed.
std::string ServerBinDir() {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    if (std::filesystem::exists(entry.path() / "bin" / "initdb")) {
      found.push_back((entry.path() / "bin").string());
    }
  }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return found.back();
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ScratchPostgres>> ScratchPostgres::Start() {
  std::unique_ptr<ScratchPostgres> pg(new ScratchPostgres());
  pg->bin_ = ServerBinDir();
  if (pg->bin_.empty()) {
    return absl::FailedPreconditionError(
        "no PostgreSQL server under /usr/lib/postgresql/*/bin: install Debian's postgresql "
        "(scripts/bootstrap.sh does)");
  }
  char name[] = "/tmp/logitd-postgres-XXXXXX";
  if (mkdtemp(name) == nullptr) return absl::InternalError("mkdtemp failed");
  pg->dir_ = name;
  if (geteuid() == 0) {
    pg->user_ = getpwnam("postgres") != nullptr ? "postgres" : "nobody";
    if (std::system(absl::StrCat("chown ", pg->user_, " ", pg->dir_).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("chown ", pg->user_, " ", pg->dir_, " failed"));
    }
  }
  if (absl::Status s = pg->Run("initdb", absl::StrCat("-D ", pg->dir_,
                                                      "/data -A trust -U logitd -E UTF8 "
                                                      "--locale=C --no-sync >",
                                                      pg->dir_, "/initdb.log 2>&1"));
      !s.ok()) {
    return s;
  }
  pg->port_ = FreeLoopbackPort();
  if (absl::Status s = pg->Restart(); !s.ok()) return s;
  return pg;
}

ScratchPostgres::~ScratchPostgres() {
  if (running_) {
    (void)Run("pg_ctl", absl::StrCat("-D ", dir_, "/data -m immediate -w stop >/dev/null 2>&1"));
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

absl::Status ScratchPostgres::Run(const std::string& binary, const std::string& args) const {
  const std::string command =
      user_.empty() ? absl::StrCat(bin_, "/", binary, " ", args)
                    : absl::StrCat("runuser -u ", user_, " -- ", bin_, "/", binary, " ", args);
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat(binary, " exited with ", rc, " (", command, "); its log is in ", dir_));
  }
  return absl::OkStatus();
}

absl::Status ScratchPostgres::Stop() {
  if (!running_) return absl::OkStatus();
  running_ = false;
  return Run("pg_ctl", absl::StrCat("-D ", dir_, "/data -m fast -w stop >/dev/null 2>&1"));
}

absl::Status ScratchPostgres::Restart() {
  if (absl::Status s = Stop(); !s.ok()) return s;
  absl::Status s =
      Run("pg_ctl", absl::StrCat("-D ", dir_, "/data -l ", dir_, "/server.log -w -t 60 -o \"-p ",
                                 port_, " -k ", dir_,
                                 " -c listen_addresses=127.0.0.1 -c fsync=off -c "
                                 "full_page_writes=off -c max_connections=100\" start >/dev/null"));
  running_ = s.ok();
  return s;
}

absl::StatusOr<std::string> ScratchPostgres::NewDatabase(const std::string& name) {
  if (absl::Status s =
          Run("createdb", absl::StrCat("-h 127.0.0.1 -p ", port_, " -U logitd ", name));
      !s.ok()) {
    return s;
  }
  return Uri(name);
}

std::string ScratchPostgres::Uri(const std::string& database) const {
  return absl::StrCat("postgresql://logitd@127.0.0.1:", port_, "/", database);
}

}  // namespace logitd::testing

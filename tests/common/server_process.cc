#include "tests/common/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace logitd::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ServerProcess> ServerProcess::Start(const std::string& binary,
                                                   const std::vector<std::string>& extra_args,
                                                   absl::Duration timeout) {
  char tmpl[] = "/tmp/logitd-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  ServerProcess p;
  p.dir_ = tmpl;
  const std::string port_file = p.dir_ + "/port";
  const std::string log_file = p.dir_ + "/server.log";

  std::vector<std::string> args = {binary, "--address=127.0.0.1:0",
                                   absl::StrCat("--port_file=", port_file)};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // A test that names no history keeps one in its own folder, not in the
  // machine's state directory (--history=auto).
  if (std::none_of(extra_args.begin(), extra_args.end(),
                   [](const std::string& a) { return absl::StartsWith(a, "--history="); })) {
    args.push_back(absl::StrCat("--history=", p.dir_, "/history.sqlite3"));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  p.pid_ = pid;

  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const std::string port = ReadFile(port_file);
    if (!port.empty() && port.back() == '\n') {
      p.address_ = absl::StrCat("127.0.0.1:", port.substr(0, port.size() - 1));
      return p;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p.pid_ = -1;
      return absl::FailedPreconditionError(absl::StrCat("logitd exited before listening (status ",
                                                        status, "): ", ReadFile(log_file)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("logitd did not report a port within ",
                                                  absl::FormatDuration(timeout), ": ",
                                                  ReadFile(log_file)));
}

ServerProcess::ServerProcess(ServerProcess&& o) noexcept { *this = std::move(o); }

ServerProcess& ServerProcess::operator=(ServerProcess&& o) noexcept {
  if (this != &o) {
    Stop();
    pid_ = o.pid_;
    exit_status_ = o.exit_status_;
    address_ = std::move(o.address_);
    dir_ = std::move(o.dir_);
    o.pid_ = -1;
    o.dir_.clear();
  }
  return *this;
}

ServerProcess::~ServerProcess() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

bool ServerProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    exit_status_ = status;
    return false;
  }
  return true;
}

std::optional<int> ServerProcess::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return exit_status_;
}

int ServerProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

std::string ServerProcess::Log() const {
  return dir_.empty() ? "" : ReadFile(dir_ + "/server.log");
}

}  // namespace logitd::testing

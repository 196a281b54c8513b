#include "tests/support/run_logitctl.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace logitd::testing {
namespace {

// Reads `fds` (closing each at its end of file) into `outs` until all end.
void Drain(int fds[2], std::string* outs[2]) {
  for (;;) {
    pollfd p[2];
    int n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0) continue;
      p[n] = {fds[i], POLLIN, 0};
      which[n++] = i;
    }
    if (n == 0) return;
    if (poll(p, n, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int j = 0; j < n; ++j) {
      if (p[j].revents == 0) continue;
      const int i = which[j];
      char buf[4096];
      const ssize_t got = read(fds[i], buf, sizeof buf);
      if (got > 0) {
        outs[i]->append(buf, static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
  }
}

// The environment of this process with `changes` applied, as NAME=VALUE.
std::vector<std::string> Environment(
    const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (changes.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) env.push_back(name + "=" + *value);
  }
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (std::string& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

std::string LogitctlBinary() { return LOGITCTL_PATH; }

LogitctlRun RunLogitctl(const std::vector<std::string>& args, const LogitctlOptions& options) {
  return RunProgram(LogitctlBinary(), args, options);
}

LogitctlRun RunProgram(const std::string& binary, const std::vector<std::string>& args,
                       const LogitctlOptions& options) {
  LogitctlRun r;
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return r;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return r;
  }
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = Environment(options.env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, options.merge_stderr ? out[1] : err[1], STDERR_FILENO);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, Pointers(argv).data(),
                                  Pointers(env).data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  if (spawned != 0) {
    close(out[0]);
    close(err[0]);
    r.err = std::string("cannot run ") + argv[0] + ": " + std::strerror(spawned);
    return r;
  }

  int fds[2] = {out[0], err[0]};
  std::string* outs[2] = {&r.out, &r.err};
  Drain(fds, outs);
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  r.exit_code = waited == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace logitd::testing

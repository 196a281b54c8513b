// Starts the real logitd binary on a free loopback port for integration
// tests, and stops it (SIGTERM, then SIGKILL) when the object goes away.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace logitd::testing {

class ServerProcess {
 public:
  // Runs `binary --address=127.0.0.1:0 --port_file=... <extra_args>` and waits
  // until the server has written the port it bound (or `timeout` passes).
  static absl::StatusOr<ServerProcess> Start(const std::string& binary,
                                             const std::vector<std::string>& extra_args,
                                             absl::Duration timeout = absl::Seconds(30));
  ServerProcess(ServerProcess&& o) noexcept;
  ServerProcess& operator=(ServerProcess&& o) noexcept;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // The folder of its port file, its log and, when the test names no
  // --history, its history (history.sqlite3).
  const std::string& dir() const { return dir_; }
  bool Running();
  // Sends SIGTERM and waits; returns the exit status (as from waitpid), or -1.
  int Stop(absl::Duration grace = absl::Seconds(20));
  // Waits up to `timeout` for the process to exit by itself; its exit status
  // (as from waitpid), or nullopt while it still runs.
  std::optional<int> WaitExit(absl::Duration timeout);
  // Everything the server wrote to stderr/stdout so far.
  std::string Log() const;

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;  // once reaped
  std::string address_;
  std::string dir_;
};

}  // namespace logitd::testing

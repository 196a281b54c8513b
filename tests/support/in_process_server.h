// A logitd service served by a grpc::Server inside the test process: the
// real handlers over a backend the test chooses (FakeBackend, or the cpu
// backend), reached on a loopback port by the C++ client and through the
// server's in-process channel by the generated stub. Built as server/main.cc
// builds the real server, less what tests do not need (flags, TLS, health
// and reflection services, metrics, signals).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "server/kernels/backend.h"
#include "server/service/shared/shared_state.h"
#include "server/service/state/options.h"
#include "server/service/v1/service.h"

namespace logitd::testing {

// The cpu backend, for tests whose results must be right.
std::unique_ptr<kernels::Backend> CpuBackend();

class InProcessServer {
 public:
  // Serves a LogitdService over `backend` with `options` on 127.0.0.1 (a
  // port the system picks). Without options.auth every caller is served
  // as the default tenant (no tokens, and no loopback-only rule: the
  // in-process channel's peer is not an address).
  static absl::StatusOr<std::unique_ptr<InProcessServer>> Start(
      std::unique_ptr<kernels::Backend> backend, service::ServiceOptions options = {});
  // Shuts the server down (calls still running are cancelled after a short
  // grace), then the service goes. Calls blocked in a FakeBackend must have
  // been released: the service waits for its calls' threads.
  ~InProcessServer();
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  // "127.0.0.1:PORT", for the C++ client and logitctl.
  const std::string& address() const { return address_; }
  // A client of the server on its loopback port.
  absl::StatusOr<std::unique_ptr<client::Client>> NewClient(
      client::ClientOptions options = {}) const;
  // The server's in-process channel (no socket), and a generated stub on it.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  std::unique_ptr<v1::Logitd::Stub> NewStub() const;

  // What the service serves over: its registry, admission and shared memory.
  service::SharedState& state() { return *state_; }

 private:
  InProcessServer() = default;

  // Declared before the server, so that the server is shut down first,
  // then the service, then the state it serves over.
  std::unique_ptr<service::SharedState> state_;
  std::unique_ptr<service::LogitdService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string address_;
};

}  // namespace logitd::testing

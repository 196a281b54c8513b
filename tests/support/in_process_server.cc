#include "tests/support/in_process_server.h"

#include <grpc/grpc.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace logitd::testing {
namespace {

// How long calls in flight get to finish when the server goes.
constexpr auto kShutdownGrace = std::chrono::seconds(5);

}  // namespace

std::unique_ptr<kernels::Backend> CpuBackend() {
  kernels::BackendOptions options;
  options.kind = kernels::BackendKind::kCpu;
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::CreateBackend(options);
  return backend.ok() ? *std::move(backend) : nullptr;
}

absl::StatusOr<std::unique_ptr<InProcessServer>> InProcessServer::Start(
    std::unique_ptr<kernels::Backend> backend, service::ServiceOptions options) {
  if (backend == nullptr) return absl::InvalidArgumentError("InProcessServer: no backend");
  if (options.auth == nullptr) {
    // The port is on loopback anyway; and this gRPC names the in-process
    // channel's peer "unknown", which the loopback-only rule refuses.
    service::AuthOptions auth;
    auth.allow_remote = true;
    absl::StatusOr<std::unique_ptr<service::Authenticator>> created =
        service::Authenticator::Create(auth);
    if (!created.ok()) return created.status();
    options.auth = *std::move(created);
  }
  std::unique_ptr<InProcessServer> s(new InProcessServer());
  s->state_ = std::make_unique<service::SharedState>(std::move(backend), options);
  s->service_ = std::make_unique<service::LogitdService>(s->state_.get());

  // As server/main.cc: no shared ports, and gRPC's receive limit twice the
  // service's, so that the service names its own limit.
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  s->service_->RegisterWith(&builder);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(2 * options.max_receive_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_send_message_bytes));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError("InProcessServer: cannot listen on 127.0.0.1");
  }
  s->address_ = absl::StrCat("127.0.0.1:", port);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  s->channel_ = s->server_->InProcessChannel(args);
  return s;
}

InProcessServer::~InProcessServer() {
  channel_.reset();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    server_->Wait();
  }
}

absl::StatusOr<std::unique_ptr<client::Client>> InProcessServer::NewClient(
    client::ClientOptions options) const {
  return client::Client::Create(address_, std::move(options));
}

std::unique_ptr<v1::Logitd::Stub> InProcessServer::NewStub() const {
  return v1::Logitd::NewStub(channel_);
}

}  // namespace logitd::testing

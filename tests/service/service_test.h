// The fixture of the in-process service tests: a fresh LogitdService over a
// FakeBackend for every test, a C++ client on its loopback port and a
// generated stub on its in-process channel. After every test, whatever it
// did, the server still answers GetServerInfo and holds no request memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "server/service/state/options.h"
#include "tests/support/fake_backend.h"
#include "tests/support/in_process_server.h"

namespace logitd::testing {

// The weight most tests register: V = 64, K = 128.
inline constexpr std::int64_t kV = 64;
inline constexpr std::int64_t kK = 128;

// A tensor whose element i is i mod 97 (exact in bf16), so that tensors of
// different shapes have different bytes.
inline Tensor Ramp(DType dtype, std::vector<std::int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>(i % 97);
    switch (dtype) {
      case DType::kBf16:
        t.data<Bf16Bits>()[i] = FloatToBf16(v);
        break;
      case DType::kFp32:
        t.data<float>()[i] = v;
        break;
      case DType::kInt32:
        t.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 97);
        break;
      case DType::kInt64:
        t.data<std::int64_t>()[i] = i % 97;
        break;
    }
  }
  return t;
}

// Targets for a cross-entropy call: M int64 values, each in [0, kV).
inline Tensor Targets(std::int64_t m) {
  Tensor t(DType::kInt64, {m});
  for (std::int64_t i = 0; i < m; ++i) t.data<std::int64_t>()[i] = i % kV;
  return t;
}

// The request memory the service holds drops to nothing within a few
// seconds (a call's ticket goes as its handler returns).
inline ::testing::AssertionResult NoRequestMemoryHeld(const service::SharedState& state) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    const service::AdmissionStats s = state.admission().Stats();
    if (s.bytes_in_flight == 0 && s.requests_in_flight == 0) {
      return ::testing::AssertionSuccess();
    }
    if (absl::Now() >= deadline) {
      return ::testing::AssertionFailure()
             << s.bytes_in_flight << " bytes of request memory still held by "
             << s.requests_in_flight << " calls";
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// A deadline for a call made through the stub.
inline std::unique_ptr<grpc::ClientContext> StubContext(
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  return context;
}

class ServiceTest : public ::testing::Test {
 protected:
  // The service's options for this suite; a suite that needs others
  // overrides it.
  virtual service::ServiceOptions Options() { return {}; }

  void SetUp() override { StartServer(Options()); }

  void TearDown() override {
    if (server_ == nullptr || client_ == nullptr) return;
    fake_->ReleaseAll();
    absl::StatusOr<client::ServerInfo> info = client().Info();
    EXPECT_TRUE(info.ok()) << "the server stopped answering: " << info.status();
    EXPECT_TRUE(NoRequestMemoryHeld(server_->state()));
    client_.reset();
    stub_.reset();
    server_.reset();
  }

  // (Re)starts the server over a fresh fake backend, and connects client()
  // to it with `client_options` (a 30 s deadline unless they say otherwise).
  void StartServer(service::ServiceOptions options, client::ClientOptions client_options = {}) {
    client_.reset();
    stub_.reset();
    server_.reset();
    auto fake = std::make_unique<FakeBackend>();
    fake_ = fake.get();
    absl::StatusOr<std::unique_ptr<InProcessServer>> started =
        InProcessServer::Start(std::move(fake), std::move(options));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    if (client_options.timeout == client::ClientOptions().timeout) {
      client_options.timeout = absl::Seconds(30);
    }
    absl::StatusOr<std::unique_ptr<client::Client>> c = server_->NewClient(client_options);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    stub_ = server_->NewStub();
  }

  // Registers a weight [v, k] and returns its handle.
  std::string Register(std::int64_t v = kV, std::int64_t k = kK) {
    absl::StatusOr<client::WeightInfo> info =
        client().RegisterWeight(Ramp(DType::kBf16, {v, k}), "w");
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->handle : "";
  }

  FakeBackend& fake() { return *fake_; }
  client::Client& client() { return *client_; }
  v1::Logitd::Stub& stub() { return *stub_; }
  InProcessServer& server() { return *server_; }
  service::SharedState& state() { return server_->state(); }

 private:
  FakeBackend* fake_ = nullptr;  // owned by the service
  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<v1::Logitd::Stub> stub_;
};

}  // namespace logitd::testing

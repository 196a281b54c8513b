// Shared pieces of the integration tests: the paths of the built binaries, a
// server shared by a test suite, seeded tensors, and exact integer references
// that the service's fp32 results must equal bitwise.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "tests/common/seeded_tensors.h"
#include "tests/common/server_process.h"
#include "tests/support/run_logitctl.h"

namespace logitd::testing {

// A scratch directory under /tmp, removed with everything in it when the
// object goes; path() is empty when it could not be made.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path()/name.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The server binary under test, from the build (a compile definition);
// LogitctlBinary() and RunLogitctl() are in tests/support/run_logitctl.h.
// Clients that record runs until stopped, each on a connection of its
// own, for the tests that kill a server mid-write: `record(t, i, client)`
// records client t's i-th run and returns its id, or an error once the
// server is gone, after which that client stops.
class RecordingClients {
 public:
  using Connector = std::function<std::unique_ptr<client::Client>(int t)>;
  using Recorder =
      std::function<absl::StatusOr<std::int64_t>(int t, std::uint32_t i, client::Client& c)>;
  RecordingClients(int count, Connector connect, Recorder record);
  RecordingClients(const RecordingClients&) = delete;
  RecordingClients& operator=(const RecordingClients&) = delete;
  ~RecordingClients() { Stop(); }
  // Stops and joins the clients: the run ids the servers acknowledged.
  std::vector<std::int64_t> Stop();

 private:
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<std::int64_t> acknowledged_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> clients_;
};

std::string ServerBinary();

// A test binary run as more than one variant (tests/CMakeLists.txt,
// logitd_add_test_variant) learns which from its environment: the value of
// `name`, empty when unset. TestBackend() is LOGITD_TEST_BACKEND's, "cpu"
// when unset.
std::string TestVariant(const char* name);
std::string TestBackend();

// A loopback port with nothing listening on it (bound, then released).
int UnusedPort();

// Starts logitd on 127.0.0.1:`port` with `args`. The port was free a moment
// ago and a killed server's socket may linger for a moment, so binding is
// tried a few times.
absl::StatusOr<ServerProcess> StartServerOnPort(int port, const std::vector<std::string>& args);

// grpc.health.v1.Health/Check for `service` ("" for the server), without any
// credentials beyond the channel's; returns the status code and the serving
// status in *serving (1 = SERVING, 2 = NOT_SERVING).
grpc::StatusCode HealthCheck(const std::string& address, const std::string& service, int* serving);

// One logitd process and a client for it, shared by the tests of a suite.
struct SharedServer {
  ServerProcess process;
  std::unique_ptr<client::Client> client;

  // Starts `logitd --backend=cpu <args>` and connects a client to it.
  static absl::StatusOr<std::unique_ptr<SharedServer>> Start(const std::vector<std::string>& args,
                                                             client::ClientOptions options = {});
  // A further client for the same server (e.g. one per thread).
  absl::StatusOr<std::unique_ptr<client::Client>> NewClient(
      client::ClientOptions options = {}) const;
};

// The server still answers (GetServerInfo) after whatever the test did to it.
::testing::AssertionResult ServerAnswers(client::Client& client);

// A test suite that shares one cpu-backend server among its tests and checks
// after each test that the server still answers. A suite that needs server
// flags or client options derives from it and defines its own
// SetUpTestSuite() calling StartSharedServer(flags, options).
// A stub generated from the proto with default options (the stub keeps its
// channel), for the calls the client library would not make.
template <typename Service>
typename Service::Stub* NewGeneratedStub(const std::string& address) {
  return Service::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))
      .release();
}

class SharedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartSharedServer({}); }
  static void StartSharedServer(const std::vector<std::string>& args,
                                client::ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<SharedServer>> s = SharedServer::Start(args, std::move(options));
    if (s.ok()) {
      server_ = std::move(*s).release();
    } else {
      start_error_ = new absl::Status(s.status());
    }
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "logitd did not start: " << *start_error_;
  }
  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(ServerAnswers(client())) << server_->process.Log();
    }
  }
  static client::Client& client() { return *server_->client; }

  // Registers `w` and returns its handle (fails the test otherwise).
  static std::string Register(const Tensor& w, const std::string& name) {
    absl::StatusOr<client::WeightInfo> info = client().RegisterWeight(w, name);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->handle : "";
  }

  static inline SharedServer* server_ = nullptr;
  static inline absl::Status* start_error_ = nullptr;
};

// Integer values of an integer-valued bf16 or fp32 tensor.
std::vector<std::int32_t> ToInts(const Tensor& t);

// Exact integer products, row-major results:
//   ExactNT: C[i, j] = sum_k A[i, k] * B[j, k]   (A [I, K], B [J, K]): Y = X.W^T
//   ExactNN: C[i, j] = sum_k A[i, k] * B[k, j]   (A [I, K], B [K, J]): dX = G.W
//   ExactTN: C[i, j] = sum_k A[k, i] * B[k, j]   (A [K, I], B [K, J]): dW = G^T.X
std::vector<std::int64_t> ExactNT(const Tensor& a, const Tensor& b);
std::vector<std::int64_t> ExactNN(const Tensor& a, const Tensor& b);
std::vector<std::int64_t> ExactTN(const Tensor& a, const Tensor& b);

// `got` (fp32) equals the exact sums converted to fp32, bit for bit.
::testing::AssertionResult Fp32EqualsExact(const Tensor& got, const std::vector<std::int64_t>& want,
                                           const std::vector<std::int64_t>& shape);
// `got` (bf16) equals FloatToBf16 of the exact sums, bit for bit.
::testing::AssertionResult Bf16EqualsRoundedExact(const Tensor& got,
                                                  const std::vector<std::int64_t>& want,
                                                  const std::vector<std::int64_t>& shape);
// Same dtype, shape and bytes.
::testing::AssertionResult BitwiseEqual(const Tensor& got, const Tensor& want);

}  // namespace logitd::testing

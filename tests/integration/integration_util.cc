#include "tests/integration/integration_util.h"

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "logitd/bf16.h"

namespace logitd::testing {

TempDir::TempDir() {
  char tmpl[] = "/tmp/logitd-test-XXXXXX";
  if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string ServerBinary() { return LOGITD_SERVER_PATH; }

std::string TestVariant(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::string TestBackend() {
  const std::string backend = TestVariant("LOGITD_TEST_BACKEND");
  return backend.empty() ? "cpu" : backend;
}

int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

absl::StatusOr<std::unique_ptr<SharedServer>> SharedServer::Start(
    const std::vector<std::string>& args, client::ClientOptions options) {
  std::vector<std::string> all = {"--backend=cpu"};
  all.insert(all.end(), args.begin(), args.end());
  absl::StatusOr<ServerProcess> process = ServerProcess::Start(ServerBinary(), all);
  if (!process.ok()) return process.status();
  auto shared = std::make_unique<SharedServer>(SharedServer{*std::move(process), nullptr});
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create(shared->process.address(), std::move(options));
  if (!c.ok()) return c.status();
  shared->client = *std::move(c);
  return shared;
}

absl::StatusOr<std::unique_ptr<client::Client>> SharedServer::NewClient(
    client::ClientOptions options) const {
  return client::Client::Create(process.address(), std::move(options));
}

std::vector<std::int32_t> ToInts(const Tensor& t) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(t.At(i));
  }
  return out;
}

namespace {

// int32 accumulation is exact here: the tests keep |values| <= 8 and the
// reduction widths far below 2^31 / 64.
std::vector<std::int64_t> Gemm(const std::vector<std::int32_t>& a,
                               const std::vector<std::int32_t>& b, std::int64_t rows,
                               std::int64_t cols, std::int64_t depth, bool a_transposed,
                               bool b_transposed) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(rows * cols));
  // Bring both operands to "depth innermost" so the dot product is contiguous.
  std::vector<std::int32_t> at, bt;
  const std::int32_t* ap = a.data();
  const std::int32_t* bp = b.data();
  if (a_transposed) {  // a is [depth, rows]
    at.resize(a.size());
    for (std::int64_t k = 0; k < depth; ++k)
      for (std::int64_t i = 0; i < rows; ++i) at[i * depth + k] = a[k * rows + i];
    ap = at.data();
  }
  if (!b_transposed) {  // b is [depth, cols]
    bt.resize(b.size());
    for (std::int64_t k = 0; k < depth; ++k)
      for (std::int64_t j = 0; j < cols; ++j) bt[j * depth + k] = b[k * cols + j];
    bp = bt.data();
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int32_t* ar = ap + i * depth;
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int32_t* br = bp + j * depth;
      std::int32_t s = 0;
      for (std::int64_t k = 0; k < depth; ++k) s += ar[k] * br[k];
      c[i * cols + j] = s;
    }
  }
  return c;
}

}  // namespace

std::vector<std::int64_t> ExactNT(const Tensor& a, const Tensor& b) {
  return Gemm(ToInts(a), ToInts(b), a.dim(0), b.dim(0), a.dim(1), false, true);
}

std::vector<std::int64_t> ExactNN(const Tensor& a, const Tensor& b) {
  return Gemm(ToInts(a), ToInts(b), a.dim(0), b.dim(1), a.dim(1), false, false);
}

std::vector<std::int64_t> ExactTN(const Tensor& a, const Tensor& b) {
  return Gemm(ToInts(a), ToInts(b), a.dim(1), b.dim(1), a.dim(0), true, false);
}

namespace {

::testing::AssertionResult CheckHeader(const Tensor& got, DType dtype,
                                       const std::vector<std::int64_t>& shape,
                                       std::size_t want_elements) {
  if (got.dtype() != dtype || got.shape() != shape) {
    return ::testing::AssertionFailure()
           << "expected " << DTypeName(dtype) << " " << ShapeString(shape) << ", got "
           << DTypeName(got.dtype()) << " " << ShapeString(got.shape());
  }
  if (static_cast<std::size_t>(got.numel()) != want_elements) {
    return ::testing::AssertionFailure()
           << "reference has " << want_elements << " elements, tensor " << got.numel();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult Fp32EqualsExact(const Tensor& got, const std::vector<std::int64_t>& want,
                                           const std::vector<std::int64_t>& shape) {
  if (auto r = CheckHeader(got, DType::kFp32, shape, want.size()); !r) return r;
  const float* g = got.data<float>();
  std::int64_t mismatches = 0;
  std::int64_t first = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (FloatBits(g[i]) != FloatBits(static_cast<float>(want[i]))) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << want.size() << " elements differ; first at flat index " << first
         << ": got " << g[first] << ", exact " << want[first];
}

::testing::AssertionResult Bf16EqualsRoundedExact(const Tensor& got,
                                                  const std::vector<std::int64_t>& want,
                                                  const std::vector<std::int64_t>& shape) {
  if (auto r = CheckHeader(got, DType::kBf16, shape, want.size()); !r) return r;
  const Bf16Bits* g = got.data<Bf16Bits>();
  std::int64_t mismatches = 0;
  std::int64_t first = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (g[i] != FloatToBf16(static_cast<float>(want[i]))) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << want.size() << " elements differ; first at flat index " << first
         << ": got " << Bf16ToFloat(g[first]) << ", expected bf16(" << want[first]
         << ") = " << RoundToBf16(static_cast<float>(want[first]));
}

::testing::AssertionResult BitwiseEqual(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure()
           << "expected " << DTypeName(want.dtype()) << " " << ShapeString(want.shape()) << ", got "
           << DTypeName(got.dtype()) << " " << ShapeString(got.shape());
  }
  if (got.nbytes() != want.nbytes() ||
      (got.nbytes() != 0 && std::memcmp(got.bytes(), want.bytes(), got.nbytes()) != 0)) {
    const std::size_t es = ElementSize(got.dtype());
    for (std::size_t i = 0; i < got.nbytes(); ++i) {
      if (got.bytes()[i] != want.bytes()[i]) {
        const auto e = static_cast<std::int64_t>(i / es);
        return ::testing::AssertionFailure() << "bytes differ; first at element " << e << ": got "
                                             << got.At(e) << ", want " << want.At(e);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ServerAnswers(client::Client& client) {
  absl::StatusOr<client::ServerInfo> info = client.Info();
  if (!info.ok()) return ::testing::AssertionFailure() << "Info() failed: " << info.status();
  return ::testing::AssertionSuccess();
}

absl::StatusOr<ServerProcess> StartServerOnPort(int port, const std::vector<std::string>& args) {
  std::vector<std::string> all = {absl::StrCat("--address=127.0.0.1:", port)};
  all.insert(all.end(), args.begin(), args.end());
  absl::Status last;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<ServerProcess> p = ServerProcess::Start(ServerBinary(), all);
    if (p.ok()) return p;
    last = p.status();
    std::printf("start failed: %s\n", last.ToString().c_str());
    absl::SleepFor(absl::Milliseconds(200));
  }
  return last;
}

// grpc.health.v1.Health/Check for `service`, without any credentials beyond
// the channel's; returns the status code and the serving status (1 = SERVING).
grpc::StatusCode HealthCheck(const std::string& address, const std::string& service, int* serving) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  // HealthCheckRequest { string service = 1; } encoded by hand.
  std::string request = "\x0a";
  request.push_back(static_cast<char>(service.size()));
  request += service;
  grpc::Slice slice(request);
  grpc::ByteBuffer send(&slice, 1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", send, &cq);
  call->StartCall();
  grpc::ByteBuffer received;
  grpc::Status status;
  call->Finish(&received, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  *serving = -1;
  std::vector<grpc::Slice> slices;
  if (status.ok() && received.Dump(&slices).ok()) {
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    // HealthCheckResponse { ServingStatus status = 1; }: 0x08 then the value.
    *serving = bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  }
  return status.error_code();
}

RecordingClients::RecordingClients(int count, Connector connect, Recorder record) {
  for (int t = 0; t < count; ++t) {
    clients_.emplace_back([this, t, connect, record] {
      std::unique_ptr<client::Client> c = connect(t);
      for (std::uint32_t i = 0; !stop_ && c != nullptr; ++i) {
        absl::StatusOr<std::int64_t> id = record(t, i, *c);
        if (!id.ok()) return;  // the server is gone
        absl::MutexLock lock(&mu_);
        acknowledged_.push_back(*id);
      }
    });
  }
}

std::vector<std::int64_t> RecordingClients::Stop() {
  stop_ = true;
  for (std::thread& t : clients_) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock lock(&mu_);
  return acknowledged_;
}

}  // namespace logitd::testing

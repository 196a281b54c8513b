// GetServerInfo and the weight calls (RegisterWeight, LoadWeight,
// ReleaseWeight) in-process: every refusal with its status code and the
// message that says why, and what the refusal leaves (no budget held, no
// backend call made).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "logitd/wire/wire.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// --- GetServerInfo ---------------------------------------------------------------

class ServiceInfoTest : public ServiceTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.weight_budget_bytes = 1 << 20;
    o.max_request_bytes = 1 << 22;
    o.admission.max_concurrent_requests = 3;
    return o;
  }
};

TEST_F(ServiceInfoTest, ReportsTheBackendAndTheOptions) {
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend, "fake");
  EXPECT_EQ(info->device_name, "fake device");
  EXPECT_EQ(info->weight_budget_bytes, 1u << 20);
  EXPECT_EQ(info->max_request_bytes, 1u << 22);
  EXPECT_EQ(info->max_concurrent_requests, 3u);
  EXPECT_EQ(info->request_bytes_in_flight, 0u);
}

TEST_F(ServiceInfoTest, CallWithoutAKnownTokenIsUnauthenticatedWhenTokensAreRequired) {
  char dir[] = "/tmp/logitd-service-auth-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string tokens = std::string(dir) + "/tokens";
  std::ofstream(tokens) << "tok-a tenant-a\n";
  service::AuthOptions auth_options;
  auth_options.tokens_path = tokens;
  absl::StatusOr<std::unique_ptr<service::Authenticator>> auth =
      service::Authenticator::Create(auth_options);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(auth.ok()) << auth.status();
  service::ServiceOptions options = Options();
  options.auth = std::move(*auth);
  client::ClientOptions with_token;
  with_token.auth_token = "tok-a";
  StartServer(std::move(options), with_token);
  EXPECT_TRUE(client().Info().ok());

  absl::StatusOr<std::unique_ptr<client::Client>> anonymous = server().NewClient();
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  absl::StatusOr<client::ServerInfo> info = (*anonymous)->Info();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("requires a bearer token"));

  with_token.auth_token = "tok-b";
  absl::StatusOr<std::unique_ptr<client::Client>> unknown = server().NewClient(with_token);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  info = (*unknown)->Info();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("not known to this server"));
}

// --- RegisterWeight ---------------------------------------------------------------

class ServiceWeightTest : public ServiceTest {
 protected:
  // Every message of a RegisterWeight call through the stub; the call's status.
  grpc::Status RunRegister(const std::vector<v1::RegisterWeightRequest>& messages) {
    std::unique_ptr<grpc::ClientContext> context = StubContext();
    v1::WeightInfo info;
    auto writer = stub().RegisterWeight(context.get(), &info);
    for (const v1::RegisterWeightRequest& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // A header for `w`, then its bytes in one chunk.
  static std::vector<v1::RegisterWeightRequest> GoodRegister(const Tensor& w) {
    v1::RegisterWeightRequest header;
    header.mutable_header()->set_name("raw");
    *header.mutable_header()->mutable_weight() = wire::MakeSpec("weight", w);
    v1::RegisterWeightRequest chunk;
    chunk.mutable_chunk()->set_name("weight");
    chunk.mutable_chunk()->set_data(reinterpret_cast<const char*>(w.bytes()), w.nbytes());
    return {header, chunk};
  }
};

TEST_F(ServiceWeightTest, WellFormedRawRegistrationSucceeds) {
  // The baseline the malformed requests below deviate from.
  EXPECT_TRUE(RunRegister(GoodRegister(Ramp(DType::kBf16, {kV, kK}))).ok());
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 1);
}

TEST_F(ServiceWeightTest, HeaderWithoutAWeightSpecIsInvalidArgument) {
  std::vector<v1::RegisterWeightRequest> m = GoodRegister(Ramp(DType::kBf16, {kV, kK}));
  m[0].mutable_header()->clear_weight();
  const grpc::Status status = RunRegister(m);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("weight: the header has no TensorSpec"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
}

TEST_F(ServiceWeightTest, HeaderWithoutADigestIsInvalidArgument) {
  std::vector<v1::RegisterWeightRequest> m = GoodRegister(Ramp(DType::kBf16, {kV, kK}));
  m[0].mutable_header()->mutable_weight()->set_xxh3(0);
  const grpc::Status status = RunRegister(m);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("weight: TensorSpec.xxh3 is 0"));
}

TEST_F(ServiceWeightTest, ChunkBeforeTheHeaderIsInvalidArgument) {
  std::vector<v1::RegisterWeightRequest> m = GoodRegister(Ramp(DType::kBf16, {kV, kK}));
  m.erase(m.begin());
  grpc::Status status = RunRegister(m);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("expected a header first, got a chunk"));

  status = RunRegister({});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("got an empty request stream"));
}

TEST_F(ServiceWeightTest, DamagedBytesAreDataLossAndRegisterNothing) {
  const Tensor w = Ramp(DType::kBf16, {kV, kK});
  std::vector<v1::RegisterWeightRequest> m = GoodRegister(w);
  m[0].mutable_header()->mutable_weight()->set_xxh3(w.Digest() ^ 1);
  const grpc::Status status = RunRegister(m);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("xxh3"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
  EXPECT_EQ(state().registry().bytes_in_use(), 0u);
}

TEST_F(ServiceWeightTest, WeightThatIsNotBf16OrNotRank2IsInvalidArgument) {
  absl::StatusOr<client::WeightInfo> info =
      client().RegisterWeight(Ramp(DType::kFp32, {kV, kK}), "fp32");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("weight: expected dtype BF16, got FP32"));

  info = client().RegisterWeight(Ramp(DType::kBf16, {kV * kK}), "rank1");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("weight: expected rank 2 [V, K]"));

  info = client().RegisterWeight(Tensor(DType::kBf16, {0, kK}), "empty");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
}

TEST_F(ServiceWeightTest, BackendFailureIsPassedThroughAndGivesTheBudgetBack) {
  fake().FailWith(FakeMethod::kLoadWeight,
                  absl::ResourceExhaustedError("fake: no device memory for the weight"));
  absl::StatusOr<client::WeightInfo> info =
      client().RegisterWeight(Ramp(DType::kBf16, {kV, kK}), "w");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("fake: no device memory for the weight"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 1);
  EXPECT_EQ(state().registry().bytes_in_use(), 0u);
  EXPECT_EQ(state().registry().weight_count(), 0u);

  fake().FailWith(FakeMethod::kLoadWeight, absl::OkStatus());
  EXPECT_TRUE(client().RegisterWeight(Ramp(DType::kBf16, {kV, kK}), "w").ok());
}

class ServiceWeightBudgetTest : public ServiceWeightTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.weight_budget_bytes = kV * kK * 2 - 1;  // one byte short of the weight
    return o;
  }
};

TEST_F(ServiceWeightBudgetTest, WeightOverTheBudgetIsResourceExhaustedBeforeItsBytes) {
  absl::StatusOr<client::WeightInfo> info =
      client().RegisterWeight(Ramp(DType::kBf16, {kV, kK}), "big");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("--weight_budget_bytes"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("'big'"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
  EXPECT_EQ(state().registry().bytes_in_use(), 0u);
  // A smaller weight still fits.
  EXPECT_TRUE(client().RegisterWeight(Ramp(DType::kBf16, {kV / 2, kK}), "half").ok());
}

// --- LoadWeight -------------------------------------------------------------------

TEST_F(ServiceWeightTest, LoadWeightWithoutAWeightsDirIsFailedPrecondition) {
  absl::StatusOr<client::WeightInfo> info = client().LoadWeight("w.safetensors", "w", "");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("without --weights_dir"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
}

class ServiceLoadWeightTest : public ServiceWeightTest {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/logitd-service-weights-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    ServiceWeightTest::SetUp();
  }
  void TearDown() override {
    ServiceWeightTest::TearDown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.weights_dir = dir_;
    return o;
  }

  std::string dir_;
};

TEST_F(ServiceLoadWeightTest, PathsTheWeightsDirDoesNotHoldAreRefused) {
  absl::StatusOr<client::WeightInfo> info = client().LoadWeight("missing.safetensors", "w", "");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("no such file in the server's --weights_dir"));

  info = client().LoadWeight("../outside.safetensors", "w", "");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("got one with a '..' component"));

  std::ofstream(dir_ + "/junk.safetensors") << "not a safetensors file";
  info = client().LoadWeight("junk.safetensors", "w", "");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("junk.safetensors"));

  info = client().LoadWeight("junk.safetensors", "", "");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("expected the name of a tensor"));
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 0);
}

// --- ReleaseWeight ----------------------------------------------------------------

TEST_F(ServiceWeightTest, ReleasingAnUnknownHandleIsNotFound) {
  absl::StatusOr<std::uint64_t> freed = client().ReleaseWeight("no-such-handle");
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(freed.status().message(),
              HasSubstr("weight handle 'no-such-handle' is not registered on this server"));

  // Released once, the handle is unknown.
  const std::string handle = Register();
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
  freed = client().ReleaseWeight(handle);
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(freed.status().message()), HasSubstr(handle));
}

TEST_F(ServiceWeightTest, ReleasingAnEmptyHandleIsInvalidArgument) {
  absl::StatusOr<std::uint64_t> freed = client().ReleaseWeight("");
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(freed.status().message()), HasSubstr("weight_handle: expected a handle"));
}

}  // namespace
}  // namespace logitd::testing

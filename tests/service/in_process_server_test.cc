// The test seam itself: an InProcessServer answers the C++ client on its
// loopback port and the generated stub on its in-process channel, over the
// fake backend (predictable results, counted calls) or the cpu backend
// (right results).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "logitd/bf16.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using InProcessServerTest = ServiceTest;

TEST_F(InProcessServerTest, ClientAndStubReachTheSameService) {
  const std::string handle = Register();
  std::unique_ptr<grpc::ClientContext> context = StubContext();
  v1::ListWeightsResponse listed;
  const grpc::Status status = stub().ListWeights(context.get(), {}, &listed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(listed.weights_size(), 1);
  EXPECT_EQ(listed.weights(0).handle(), handle);
  EXPECT_EQ(state().registry().weight_count(), 1u);
}

TEST_F(InProcessServerTest, FakeBackendResultsReachTheClient) {
  const std::string handle = Register();
  client::LogitsOptions options;
  options.alpha = 0.5f;
  absl::StatusOr<Tensor> y = client().Logits(Ramp(DType::kBf16, {3, kK}), handle, options);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_EQ(y->shape(), (std::vector<std::int64_t>{3, kV}));
  for (std::int64_t i = 0; i < y->numel(); ++i) {
    ASSERT_EQ(y->data<float>()[i], 0.5f * static_cast<float>(i)) << i;
  }

  const Tensor in = Ramp(DType::kFp32, {5, 7});
  absl::StatusOr<Tensor> cast = client().CastToBf16(in);
  ASSERT_TRUE(cast.ok()) << cast.status();
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    ASSERT_EQ(cast->data<Bf16Bits>()[i], FloatToBf16(in.data<float>()[i])) << i;
  }

  client::BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        client()
            .Backward(Ramp(DType::kFp32, {2, kV}), Ramp(DType::kBf16, {2, kK}), handle, accumulate)
            .ok());
  }
  absl::StatusOr<client::GradientResult> grad = client().FetchGradient(handle, true);
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_EQ(grad->accumulated_calls, 2u);

  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 1);
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 1);
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 1);
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 2);
  EXPECT_EQ(fake().calls(FakeMethod::kFetchGradient), 1);
}

TEST_F(InProcessServerTest, FailureStaysUntilClearedAndCountsEveryCall) {
  const std::string handle = Register();
  fake().FailWith(FakeMethod::kCast, absl::DataLossError("fake: bits flipped"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(client().CastToBf16(Ramp(DType::kFp32, {4})).status().code(),
              absl::StatusCode::kDataLoss);
  }
  fake().FailWith(FakeMethod::kCast, absl::OkStatus());
  EXPECT_TRUE(client().CastToBf16(Ramp(DType::kFp32, {4})).ok());
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 4);
}

TEST(InProcessCpuServerTest, CpuBackendComputesExactLogits) {
  std::unique_ptr<kernels::Backend> cpu = CpuBackend();
  ASSERT_NE(cpu, nullptr);
  absl::StatusOr<std::unique_ptr<InProcessServer>> server = InProcessServer::Start(std::move(cpu));
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<client::Client>> c = (*server)->NewClient();
  ASSERT_TRUE(c.ok()) << c.status();

  // Small integers: every product and sum is exact in fp32.
  const Tensor w = Ramp(DType::kBf16, {16, 32});
  const Tensor x = Ramp(DType::kBf16, {3, 32});
  absl::StatusOr<client::WeightInfo> info = (*c)->RegisterWeight(w, "w");
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = (*c)->Logits(x, info->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 16; ++j) {
      double want = 0;
      for (std::int64_t k = 0; k < 32; ++k) want += x.At(i * 32 + k) * w.At(j * 32 + k);
      ASSERT_EQ(y->data<float>()[i * 16 + j], static_cast<float>(want)) << i << ", " << j;
    }
  }
  absl::StatusOr<client::ServerInfo> server_info = (*c)->Info();
  ASSERT_TRUE(server_info.ok()) << server_info.status();
  EXPECT_EQ(server_info->backend, "cpu");
}

}  // namespace
}  // namespace logitd::testing

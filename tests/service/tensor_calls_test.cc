// The tensor calls (Logits, Backward, FetchGradient, ZeroGradient, Cast,
// CrossEntropy, LogProbs) in-process: a missing or unknown weight, shapes and dtypes
// the call cannot take, and a failing backend, each with its status code and
// the message that says why. A refused request never reaches the backend.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "logitd/wire/wire.h"
#include "tests/common/stub_stream.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// What the fake backend is told to fail with, and the message a caller must see.
absl::Status DeviceFull() { return absl::ResourceExhaustedError("fake: out of device memory"); }

MATCHER_P2(IsStatus, code, says, "") {
  const absl::Status& s = arg;
  *result_listener << "status " << s;
  return s.code() == code && s.message().find(says) != absl::string_view::npos;
}

class ServiceTensorTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    handle_ = Register();
  }
  const std::string& handle() const { return handle_; }

  // Writes `messages` on a bidirectional stream of the stub, half-closes,
  // drains the responses and returns the call's status.
  template <typename Response, typename Request, typename Open>
  grpc::Status RunBidi(Open open, const std::vector<Request>& messages) {
    std::unique_ptr<grpc::ClientContext> context = StubContext();
    auto stream = (stub().*open)(context.get());
    return FinishAfterWriting<Response>(*stream, messages);
  }

 private:
  std::string handle_;
};

// --- Logits -----------------------------------------------------------------------

TEST_F(ServiceTensorTest, LogitsOfAnUnknownOrEmptyHandleIsRefused) {
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  EXPECT_THAT(client().Logits(x, "no-such-handle").status(),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  EXPECT_THAT(client().Logits(x, "").status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "weight_handle: expected a handle"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
}

TEST_F(ServiceTensorTest, LogitsOfBadShapesOrDtypesIsInvalidArgument) {
  EXPECT_THAT(client().Logits(Ramp(DType::kBf16, {4, kK - 1}), handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("x: expected K=", kK, " to match weight")));
  EXPECT_THAT(client().Logits(Ramp(DType::kFp32, {4, kK}), handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "x: expected dtype BF16, got FP32"));
  EXPECT_THAT(client().Logits(Ramp(DType::kBf16, {2, 2, kK}), handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "x: expected rank 2 [M, K]"));
  EXPECT_THAT(client().Logits(Tensor(DType::kBf16, {0, kK}), handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "x: "));
  client::LogitsOptions int_out;
  int_out.out_dtype = DType::kInt32;
  EXPECT_THAT(client().Logits(Ramp(DType::kBf16, {2, kK}), handle(), int_out).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "out_dtype: expected FP32 or BF16"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
}

TEST_F(ServiceTensorTest, LogitsHeaderWithoutXOrWithAnInfiniteAlphaIsInvalidArgument) {
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  v1::LogitsRequest header;
  header.mutable_header()->set_weight_handle(handle());
  grpc::Status status = RunBidi<v1::LogitsResponse>(&v1::Logitd::Stub::Logits,
                                                    std::vector<v1::LogitsRequest>{header});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("x: the header has no TensorSpec"));

  *header.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
  header.mutable_header()->set_alpha(std::numeric_limits<float>::infinity());
  status = RunBidi<v1::LogitsResponse>(&v1::Logitd::Stub::Logits,
                                       std::vector<v1::LogitsRequest>{header});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("alpha: expected a finite scale"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
}

TEST_F(ServiceTensorTest, LogitsBackendFailureIsPassedThrough) {
  fake().FailWith(FakeMethod::kLogits, DeviceFull());
  EXPECT_THAT(client().Logits(Ramp(DType::kBf16, {2, kK}), handle()).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 1);
  fake().FailWith(FakeMethod::kLogits, absl::OkStatus());
  EXPECT_TRUE(client().Logits(Ramp(DType::kBf16, {2, kK}), handle()).ok());
}

class ServiceSmallCallsTest : public ServiceTensorTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.max_request_bytes = 4096;
    return o;
  }
};

TEST_F(ServiceSmallCallsTest, CallOverMaxRequestBytesIsResourceExhaustedNamingTheFlag) {
  // x 512 bytes + y [2, 64] fp32 512 bytes fit; x [16, K] + y do not.
  EXPECT_TRUE(client().Logits(Ramp(DType::kBf16, {2, kK}), handle()).ok());
  EXPECT_THAT(client().Logits(Ramp(DType::kBf16, {16, kK}), handle()).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "--max_request_bytes"));
  EXPECT_THAT(client().CastToBf16(Ramp(DType::kFp32, {1024})).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "--max_request_bytes"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 1);
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 0);
}

// --- Backward ---------------------------------------------------------------------

TEST_F(ServiceTensorTest, BackwardOfAnUnknownOrEmptyHandleIsRefused) {
  const Tensor dy = Ramp(DType::kFp32, {2, kV});
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  EXPECT_THAT(client().Backward(dy, x, "no-such-handle").status(),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  EXPECT_THAT(client().Backward(dy, x, "").status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "weight_handle: expected a handle"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 0);
}

TEST_F(ServiceTensorTest, BackwardOfBadShapesOrDtypesIsInvalidArgument) {
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  EXPECT_THAT(client().Backward(Ramp(DType::kFp32, {4, kV + 1}), x, handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("dy: expected V=", kV, " to match weight")));
  EXPECT_THAT(client().Backward(Ramp(DType::kFp32, {5, kV}), x, handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "dy: expected M=4 to match x"));
  EXPECT_THAT(client()
                  .Backward(Ramp(DType::kFp32, {4, kV}), Ramp(DType::kBf16, {4, kK + 1}), handle())
                  .status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "x: expected K="));
  EXPECT_THAT(client().Backward(Ramp(DType::kInt32, {4, kV}), x, handle()).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "dy: expected dtype FP32 or BF16"));
  client::BackwardOptions int_dx;
  int_dx.dx_dtype = DType::kInt32;
  EXPECT_THAT(client().Backward(Ramp(DType::kFp32, {4, kV}), x, handle(), int_dx).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "dx_dtype: expected BF16 or FP32"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 0);
}

TEST_F(ServiceTensorTest, BackwardAskingForNoGradientOrAccumulatingBf16IsInvalidArgument) {
  const Tensor dy = Ramp(DType::kFp32, {4, kV});
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  client::BackwardOptions neither;
  neither.want_dx = false;
  neither.want_dw = false;
  EXPECT_THAT(client().Backward(dy, x, handle(), neither).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "want_dx, want_dw"));
  client::BackwardOptions bf16_accumulate;
  bf16_accumulate.accumulate_dw = true;
  bf16_accumulate.dw_dtype = DType::kBf16;
  EXPECT_THAT(client().Backward(dy, x, handle(), bf16_accumulate).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "dw_dtype: accumulate_dw"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 0);
}

TEST_F(ServiceTensorTest, BackwardBackendFailureIsPassedThrough) {
  fake().FailWith(FakeMethod::kBackward, DeviceFull());
  EXPECT_THAT(client()
                  .Backward(Ramp(DType::kFp32, {2, kV}), Ramp(DType::kBf16, {2, kK}), handle())
                  .status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 1);
}

class ServiceGradientBudgetTest : public ServiceTensorTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.weight_budget_bytes = kV * kK * 2;  // the weight, and no room for its gradient
    return o;
  }
};

TEST_F(ServiceGradientBudgetTest, AccumulatingWithoutBudgetForTheGradientIsResourceExhausted) {
  client::BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  EXPECT_THAT(
      client()
          .Backward(Ramp(DType::kFp32, {2, kV}), Ramp(DType::kBf16, {2, kK}), handle(), accumulate)
          .status(),
      IsStatus(absl::StatusCode::kResourceExhausted, "--weight_budget_bytes"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 0);
}

// --- FetchGradient and ZeroGradient -------------------------------------------------

TEST_F(ServiceTensorTest, GradientCallsOfAnUnknownOrEmptyHandleAreRefused) {
  EXPECT_THAT(client().FetchGradient("no-such-handle", false).status(),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  EXPECT_THAT(client().FetchGradient("", false).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "weight_handle: expected a handle"));
  EXPECT_THAT(client().ZeroGradient("no-such-handle"),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  EXPECT_THAT(client().ZeroGradient(""),
              IsStatus(absl::StatusCode::kInvalidArgument, "weight_handle: expected a handle"));
  EXPECT_EQ(fake().calls(FakeMethod::kFetchGradient), 0);
  EXPECT_EQ(fake().calls(FakeMethod::kZeroGradient), 0);
}

TEST_F(ServiceTensorTest, FetchGradientWithoutARequestIsInvalidArgument) {
  std::unique_ptr<grpc::ClientContext> context = StubContext();
  v1::FetchGradientRequest request;  // no handle
  auto stream = stub().FetchGradient(context.get(), request);
  v1::FetchGradientResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("weight_handle: expected a handle"));
}

TEST_F(ServiceTensorTest, GradientBackendFailuresArePassedThrough) {
  fake().FailWith(FakeMethod::kFetchGradient, DeviceFull());
  fake().FailWith(FakeMethod::kZeroGradient, absl::InternalError("fake: zeroing failed"));
  EXPECT_THAT(client().FetchGradient(handle(), true).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_THAT(client().ZeroGradient(handle()),
              IsStatus(absl::StatusCode::kInternal, "fake: zeroing failed"));
  EXPECT_EQ(fake().calls(FakeMethod::kFetchGradient), 1);
  EXPECT_EQ(fake().calls(FakeMethod::kZeroGradient), 1);
}

// --- Cast -------------------------------------------------------------------------

TEST_F(ServiceTensorTest, CastOfBadDtypesOrShapesIsInvalidArgument) {
  EXPECT_THAT(client().CastToBf16(Ramp(DType::kBf16, {4, 4})).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "input: expected dtype FP32, got BF16"));
  EXPECT_THAT(client().CastToBf16(Tensor(DType::kFp32, {3, 0})).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "input: "));
  v1::CastRequest header;
  header.mutable_header();  // no input spec
  const grpc::Status status =
      RunBidi<v1::CastResponse>(&v1::Logitd::Stub::Cast, std::vector<v1::CastRequest>{header});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("input: the header has no TensorSpec"));
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 0);
}

TEST_F(ServiceTensorTest, CastBackendFailureIsPassedThrough) {
  fake().FailWith(FakeMethod::kCast, DeviceFull());
  EXPECT_THAT(client().CastToBf16(Ramp(DType::kFp32, {16})).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 1);
}

// --- CrossEntropy -----------------------------------------------------------------

TEST_F(ServiceTensorTest, CrossEntropyOfAnUnknownOrEmptyHandleIsRefused) {
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  EXPECT_THAT(client().CrossEntropy(x, Targets(4), "no-such-handle", {}).status(),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  EXPECT_THAT(client().CrossEntropy(x, Targets(4), "", {}).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "weight_handle: expected a handle"));
  EXPECT_EQ(fake().calls(FakeMethod::kCrossEntropy), 0);
}

TEST_F(ServiceTensorTest, CrossEntropyOfBadShapesDtypesOrTargetsIsInvalidArgument) {
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  EXPECT_THAT(
      client().CrossEntropy(Ramp(DType::kBf16, {4, kK + 1}), Targets(4), handle(), {}).status(),
      IsStatus(absl::StatusCode::kInvalidArgument, "x: expected K="));
  EXPECT_THAT(
      client().CrossEntropy(x, Targets(5), handle(), {}).status(),
      IsStatus(absl::StatusCode::kInvalidArgument, "targets: expected rank 1 [M] with M=4"));
  EXPECT_THAT(
      client().CrossEntropy(x, Ramp(DType::kFp32, {4}), handle(), {}).status(),
      IsStatus(absl::StatusCode::kInvalidArgument, "targets: expected dtype INT32 or INT64"));
  Tensor out_of_range = Targets(4);
  out_of_range.data<std::int64_t>()[2] = kV;
  EXPECT_THAT(client().CrossEntropy(x, out_of_range, handle(), {}).status(),
              IsStatus(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("targets[2] = ", kV, ": expected a token id in [0, ", kV)));
  client::CrossEntropyOptions negative_z_loss;
  negative_z_loss.z_loss = -1.0f;
  EXPECT_THAT(client().CrossEntropy(x, Targets(4), handle(), negative_z_loss).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "z_loss: expected a finite"));
  EXPECT_EQ(fake().calls(FakeMethod::kCrossEntropy), 0);
}

TEST_F(ServiceTensorTest, CrossEntropyBackendFailureIsPassedThrough) {
  fake().FailWith(FakeMethod::kCrossEntropy, DeviceFull());
  client::CrossEntropyOptions everything;
  everything.want_lse = everything.want_dx = everything.want_dw = true;
  EXPECT_THAT(
      client().CrossEntropy(Ramp(DType::kBf16, {4, kK}), Targets(4), handle(), everything).status(),
      IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_EQ(fake().calls(FakeMethod::kCrossEntropy), 1);
}

// --- LogProbs ---------------------------------------------------------------------

TEST_F(ServiceTensorTest, LogProbsRefusalsNameTheFieldAndNeverReachTheBackend) {
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  const Tensor targets = Targets(4);
  client::LogProbsOptions top2;
  top2.top_k = 2;
  EXPECT_THAT(client().LogProbs(x, &targets, "no-such-handle", top2).status(),
              IsStatus(absl::StatusCode::kNotFound, "'no-such-handle' is not registered"));
  client::LogProbsOptions too_many;
  too_many.top_k = 65;
  EXPECT_THAT(client().LogProbs(x, &targets, handle(), too_many).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "top_k: expected 0 to"));
  client::LogProbsOptions rank;
  rank.want_rank = true;
  EXPECT_THAT(client().LogProbs(x, nullptr, handle(), rank).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "want_rank"));
  EXPECT_THAT(client().LogProbs(x, nullptr, handle(), {}).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "at least one output"));
  client::LogProbsOptions masked;
  masked.vocab_size = 2;
  Tensor past = Targets(4);
  past.data<std::int64_t>()[1] = 2;
  EXPECT_THAT(client().LogProbs(x, &past, handle(), masked).status(),
              IsStatus(absl::StatusCode::kInvalidArgument, "targets[1] = 2"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogProbs), 0);
}

TEST_F(ServiceTensorTest, LogProbsOutputsAndBackendFailure) {
  const Tensor x = Ramp(DType::kBf16, {4, kK});
  const Tensor targets = Targets(4);
  client::LogProbsOptions options;
  options.top_k = 3;
  options.want_entropy = options.want_rank = true;
  absl::StatusOr<client::LogProbsResult> r = client().LogProbs(x, &targets, handle(), options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->logprob && r->entropy && r->topk_ids && r->topk_logprobs && r->rank);
  EXPECT_FALSE(r->lse.has_value());
  EXPECT_EQ(r->topk_ids->shape(), (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ(r->topk_ids->data<std::int32_t>()[5], 2);
  EXPECT_EQ(r->logprob->data<float>()[3], -1.0f);
  fake().FailWith(FakeMethod::kLogProbs, DeviceFull());
  EXPECT_THAT(client().LogProbs(x, &targets, handle(), options).status(),
              IsStatus(absl::StatusCode::kResourceExhausted, "fake: out of device memory"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogProbs), 2);
}

}  // namespace
}  // namespace logitd::testing

// Request validation: every bad-input class with its exact status code, the
// defaults for unspecified fields, and the per-call byte limit.
#include "server/service/validation.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;

constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

v1::TensorSpec Spec(const std::string& name, v1::DType dtype, std::vector<std::int64_t> shape) {
  v1::TensorSpec s;
  s.set_name(name);
  s.set_dtype(dtype);
  for (std::int64_t d : shape) s.add_shape(d);
  return s;
}

WeightDims Weight() { return WeightDims{32768, 4096, "'lm_head' [32768, 4096]"}; }

v1::LogitsHeader Logits(std::vector<std::int64_t> x_shape, v1::DType x_dtype = v1::DTYPE_BF16) {
  v1::LogitsHeader h;
  h.set_weight_handle("w");
  *h.mutable_x() = Spec("x", x_dtype, std::move(x_shape));
  return h;
}

v1::BackwardHeader Backward(std::vector<std::int64_t> dy_shape, std::vector<std::int64_t> x_shape,
                            v1::DType dy_dtype = v1::DTYPE_FP32) {
  v1::BackwardHeader h;
  h.set_weight_handle("w");
  *h.mutable_dy() = Spec("dy", dy_dtype, std::move(dy_shape));
  *h.mutable_x() = Spec("x", v1::DTYPE_BF16, std::move(x_shape));
  h.set_want_dx(true);
  h.set_want_dw(true);
  return h;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// --- RegisterWeight ---------------------------------------------------------

TEST(ValidateRegisterWeight, AcceptsBf16Rank2) {
  v1::RegisterWeightHeader h;
  *h.mutable_weight() = Spec("weight", v1::DTYPE_BF16, {32768, 4096});
  absl::StatusOr<WeightPlan> p = ValidateRegisterWeight(h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->v, 32768);
  EXPECT_EQ(p->k, 4096);
  EXPECT_EQ(p->bytes, 32768u * 4096 * 2);
}

TEST(ValidateRegisterWeight, RejectsBadWeights) {
  v1::RegisterWeightHeader h;
  EXPECT_EQ(ValidateRegisterWeight(h).status().code(), absl::StatusCode::kInvalidArgument);

  *h.mutable_weight() = Spec("weight", v1::DTYPE_FP32, {4, 4});
  absl::Status s = ValidateRegisterWeight(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("weight: expected dtype BF16, got FP32"));

  *h.mutable_weight() = Spec("weight", v1::DTYPE_BF16, {4, 4, 4});
  s = ValidateRegisterWeight(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("expected rank 2 [V, K], got [4, 4, 4]"));

  *h.mutable_weight() = Spec("weight", v1::DTYPE_BF16, {4, 0});
  EXPECT_EQ(ValidateRegisterWeight(h).status().code(), absl::StatusCode::kInvalidArgument);

  *h.mutable_weight() = Spec("weight", v1::DTYPE_BF16, {-1, 4});
  EXPECT_EQ(ValidateRegisterWeight(h).status().code(), absl::StatusCode::kInvalidArgument);

  *h.mutable_weight() =
      Spec("weight", v1::DTYPE_BF16, {std::int64_t{1} << 40, std::int64_t{1} << 22});
  s = ValidateRegisterWeight(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("overflows"));

  *h.mutable_weight() = Spec("", v1::DTYPE_BF16, {4, 4});
  s = ValidateRegisterWeight(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("name is empty"));

  *h.mutable_weight() = Spec("weight", v1::DTYPE_BF16, {4, 4});
  h.set_name(std::string(5000, 'n'));
  EXPECT_EQ(ValidateRegisterWeight(h).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- Logits -------------------------------------------------------------------

TEST(ValidateLogits, AcceptsAndAppliesDefaults) {
  absl::StatusOr<LogitsPlan> p = ValidateLogits(Logits({16, 4096}), Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->m, 16);
  EXPECT_EQ(p->out_dtype, DType::kFp32);  // unspecified means fp32
  EXPECT_EQ(p->alpha, 1.0f);              // 0 means 1
  EXPECT_EQ(p->x_bytes, 16u * 4096 * 2);
  EXPECT_EQ(p->y_bytes, 16u * 32768 * 4);

  v1::LogitsHeader h = Logits({16, 4096});
  h.set_out_dtype(v1::DTYPE_BF16);
  h.set_alpha(0.5f);
  p = ValidateLogits(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->out_dtype, DType::kBf16);
  EXPECT_EQ(p->alpha, 0.5f);
  EXPECT_EQ(p->y_bytes, 16u * 32768 * 2);
}

TEST(ValidateLogits, KMismatchNamesWeightAndShapes) {
  absl::Status s = ValidateLogits(Logits({16, 4095}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "x: expected K=4096 to match weight 'lm_head' [32768, 4096], got [16, 4095]");
}

TEST(ValidateLogits, RejectsBadX) {
  EXPECT_EQ(
      ValidateLogits(Logits({16, 4096}, v1::DTYPE_FP32), Weight(), kUnlimited).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogits(Logits({4096}), Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogits(Logits({1, 16, 4096}), Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogits(Logits({0, 4096}), Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogits(Logits({-16, 4096}), Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::LogitsHeader missing;
  missing.set_weight_handle("w");
  absl::Status s = ValidateLogits(missing, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("x: the header has no TensorSpec"));
  v1::LogitsHeader unnamed = Logits({16, 4096});
  unnamed.mutable_x()->clear_name();
  EXPECT_EQ(ValidateLogits(unnamed, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateLogits, RejectsBadOutDtype) {
  for (v1::DType d : {v1::DTYPE_INT32, v1::DTYPE_INT64, static_cast<v1::DType>(17)}) {
    v1::LogitsHeader h = Logits({16, 4096});
    h.set_out_dtype(d);
    absl::Status s = ValidateLogits(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(Message(s), HasSubstr("out_dtype: expected FP32 or BF16"));
  }
}

TEST(ValidateLogits, RejectsNonFiniteAlpha) {
  for (float a : {std::nanf(""), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity()}) {
    v1::LogitsHeader h = Logits({16, 4096});
    h.set_alpha(a);
    absl::Status s = ValidateLogits(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(s), HasSubstr("alpha"));
  }
}

TEST(ValidateLogits, OutputCountsAgainstRequestLimit) {
  // x 16x4096 bf16 = 131072 bytes, y 16x32768 fp32 = 2097152 bytes.
  const std::uint64_t total = 131072 + 2097152;
  EXPECT_TRUE(ValidateLogits(Logits({16, 4096}), Weight(), total).ok());
  absl::Status s = ValidateLogits(Logits({16, 4096}), Weight(), total - 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr(std::to_string(total - 1)));
  EXPECT_THAT(Message(s), HasSubstr("--max_request_bytes"));
  EXPECT_THAT(Message(s), HasSubstr("y fp32 [16, 32768]"));
}

TEST(ValidateLogits, OutputShapeOverflowIsInvalid) {
  WeightDims huge{std::int64_t{1} << 40, 4, "'huge' [2^40, 4]"};
  absl::Status s = ValidateLogits(Logits({std::int64_t{1} << 30, 4}), huge, kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("y: "));
}

// --- Backward -----------------------------------------------------------------

TEST(ValidateBackward, AcceptsAndAppliesDefaults) {
  absl::StatusOr<BackwardPlan> p =
      ValidateBackward(Backward({16, 32768}, {16, 4096}), Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->m, 16);
  EXPECT_EQ(p->dy_dtype, DType::kFp32);
  EXPECT_EQ(p->dx_dtype, DType::kBf16);
  EXPECT_EQ(p->dw_dtype, DType::kFp32);
  EXPECT_EQ(p->dx_bytes, 16u * 4096 * 2);
  EXPECT_EQ(p->dw_bytes, 32768u * 4096 * 4);
  EXPECT_TRUE(p->returns_dw());

  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096}, v1::DTYPE_BF16);
  h.set_dx_dtype(v1::DTYPE_FP32);
  h.set_dw_dtype(v1::DTYPE_BF16);
  p = ValidateBackward(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dy_dtype, DType::kBf16);
  EXPECT_EQ(p->dx_dtype, DType::kFp32);
  EXPECT_EQ(p->dw_dtype, DType::kBf16);
}

TEST(ValidateBackward, ShapeMismatches) {
  absl::Status s =
      ValidateBackward(Backward({16, 32767}, {16, 4096}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "dy: expected V=32768 to match weight 'lm_head' [32768, 4096], got [16, 32767]");

  s = ValidateBackward(Backward({8, 32768}, {16, 4096}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "dy: expected M=16 to match x [16, 4096], got [8, 32768]");

  s = ValidateBackward(Backward({16, 32768}, {16, 4000}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("x: expected K=4096"));

  s = ValidateBackward(Backward({16, 32768, 1}, {16, 4096}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("dy: expected rank 2 [M, V]"));
}

TEST(ValidateBackward, DtypeRules) {
  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096}, v1::DTYPE_INT32);
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);

  h = Backward({16, 32768}, {16, 4096});
  h.mutable_x()->set_dtype(v1::DTYPE_FP32);
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);

  h = Backward({16, 32768}, {16, 4096});
  h.set_dx_dtype(v1::DTYPE_INT64);
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);

  h = Backward({16, 32768}, {16, 4096});
  h.set_dw_dtype(v1::DTYPE_INT32);
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateBackward, WantsAtLeastOneGradient) {
  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096});
  h.set_want_dx(false);
  h.set_want_dw(false);
  absl::Status s = ValidateBackward(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("want_dx"));

  h.set_want_dx(true);
  absl::StatusOr<BackwardPlan> p = ValidateBackward(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->dw_bytes, 0u);
  EXPECT_FALSE(p->returns_dw());
}

TEST(ValidateBackward, AccumulateRules) {
  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096});
  h.set_accumulate_dw(true);
  absl::StatusOr<BackwardPlan> p = ValidateBackward(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->returns_dw());
  EXPECT_EQ(p->dw_bytes, 0u);
  EXPECT_EQ(p->dw_dtype, DType::kFp32);

  h.set_dw_dtype(v1::DTYPE_FP32);
  EXPECT_TRUE(ValidateBackward(h, Weight(), kUnlimited).ok());

  h.set_dw_dtype(v1::DTYPE_BF16);
  absl::Status s = ValidateBackward(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("dw_dtype: accumulate_dw"));
  EXPECT_THAT(Message(s), HasSubstr("got BF16"));

  h = Backward({16, 32768}, {16, 4096});
  h.set_accumulate_dw(true);
  h.set_want_dw(false);
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateBackward, SameTensorNamesRejected) {
  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096});
  h.mutable_dy()->set_name("x");
  EXPECT_EQ(ValidateBackward(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateBackward, OutputsCountAgainstRequestLimit) {
  // dy 16x32768 fp32 = 2 MiB, x = 128 KiB, dx bf16 = 128 KiB, dw fp32 = 512 MiB.
  const std::uint64_t without_dw = 2097152 + 131072 + 131072;
  v1::BackwardHeader h = Backward({16, 32768}, {16, 4096});
  absl::Status s = ValidateBackward(h, Weight(), without_dw).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("dw fp32 [32768, 4096]"));
  // Accumulated dW does not travel, so it fits.
  h.set_accumulate_dw(true);
  EXPECT_TRUE(ValidateBackward(h, Weight(), without_dw).ok());
  EXPECT_EQ(ValidateBackward(h, Weight(), without_dw - 1).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// --- Cast ---------------------------------------------------------------------

TEST(ValidateCast, AnyRankFp32) {
  for (std::vector<std::int64_t> shape :
       {std::vector<std::int64_t>{7}, {3, 5}, {2, 3, 4}, {1, 1, 1, 1, 9}}) {
    v1::CastHeader h;
    *h.mutable_input() = Spec("input", v1::DTYPE_FP32, shape);
    absl::StatusOr<CastPlan> p = ValidateCast(h, kUnlimited);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->shape, shape);
    EXPECT_EQ(p->out_bytes * 2, p->in_bytes);
    EXPECT_EQ(static_cast<std::uint64_t>(p->n) * 4, p->in_bytes);
  }
}

TEST(ValidateCast, RejectsBadInput) {
  v1::CastHeader h;
  *h.mutable_input() = Spec("input", v1::DTYPE_BF16, {4});
  absl::Status s = ValidateCast(h, kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("input: expected dtype FP32, got BF16"));

  *h.mutable_input() = Spec("input", v1::DTYPE_FP32, {});
  EXPECT_EQ(ValidateCast(h, kUnlimited).status().code(), absl::StatusCode::kInvalidArgument);

  *h.mutable_input() = Spec("input", v1::DTYPE_FP32, {4, 0});
  EXPECT_EQ(ValidateCast(h, kUnlimited).status().code(), absl::StatusCode::kInvalidArgument);

  *h.mutable_input() = Spec("input", v1::DTYPE_FP32, {1000});
  s = ValidateCast(h, 5999).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ValidateCast(h, 6000).ok());
}

TEST(ValidateHandle, EmptyIsAMissingField) {
  absl::Status s = ValidateHandle("");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("weight_handle"));
  EXPECT_TRUE(ValidateHandle("w-0000000000000001-2x3").ok());
}

}  // namespace
}  // namespace logitd::service

// Request validation: every bad-input class with its exact status code, the
// defaults for unspecified fields, and the per-call byte limit.
#include "server/service/v1/validation.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/targets.h"

namespace logitd::service {
namespace {

using ::logitd::testing::TargetsTensor;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

v1::TensorSpec Spec(const std::string& name, v1::DType dtype, std::vector<std::int64_t> shape) {
  v1::TensorSpec s;
  s.set_name(name);
  s.set_dtype(dtype);
  for (std::int64_t d : shape) s.add_shape(d);
  s.set_xxh3(0x5eed);  // validation reads no bytes; any digest but 0 will do
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

std::uint32_t FloatBitsOf(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

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

// --- CrossEntropy ------------------------------------------------------------

v1::CrossEntropyHeader CrossEntropy(std::vector<std::int64_t> x_shape,
                                    std::vector<std::int64_t> targets_shape,
                                    v1::DType targets_dtype = v1::DTYPE_INT64) {
  v1::CrossEntropyHeader h;
  h.set_weight_handle("w");
  *h.mutable_x() = Spec("x", v1::DTYPE_BF16, std::move(x_shape));
  *h.mutable_targets() = Spec("targets", targets_dtype, std::move(targets_shape));
  return h;
}

TEST(ValidateCrossEntropy, AcceptsAndAppliesDefaults) {
  absl::StatusOr<CrossEntropyPlan> p =
      ValidateCrossEntropy(CrossEntropy({16, 4096}, {16}), Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->m, 16);
  EXPECT_EQ(p->targets_dtype, DType::kInt64);
  EXPECT_EQ(p->ignore_index, -100);  // the field is absent
  EXPECT_EQ(p->reduction, Reduction::kMean);
  EXPECT_EQ(p->z_loss, 0.0f);
  EXPECT_EQ(p->logit_softcap, 0.0f);
  EXPECT_EQ(p->grad_scale, 1.0f);  // 0 means 1
  EXPECT_EQ(p->dx_dtype, DType::kBf16);
  EXPECT_FALSE(p->want_lse || p->want_dx || p->want_dw || p->accumulate_dw);
  EXPECT_EQ(p->loss_shape, std::vector<std::int64_t>{1});
  EXPECT_EQ(p->x_bytes, 16u * 4096 * 2);
  EXPECT_EQ(p->targets_bytes, 16u * 8);
  EXPECT_EQ(p->loss_bytes, 4u);
  EXPECT_EQ(p->lse_bytes, 0u);
  EXPECT_EQ(p->dx_bytes, 0u);
  EXPECT_EQ(p->dw_bytes, 0u);
  EXPECT_FALSE(p->returns_dw());

  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16}, v1::DTYPE_INT32);
  h.set_ignore_index(0);  // present, even when 0
  h.set_reduction(v1::REDUCTION_NONE);
  h.set_z_loss(1e-4f);
  h.set_logit_softcap(30.0f);
  h.set_grad_scale(-0.5f);
  h.set_want_lse(true);
  h.set_want_dx(true);
  h.set_want_dw(true);
  h.set_dx_dtype(v1::DTYPE_FP32);
  p = ValidateCrossEntropy(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->targets_dtype, DType::kInt32);
  EXPECT_EQ(p->targets_bytes, 16u * 4);
  EXPECT_EQ(p->ignore_index, 0);
  EXPECT_EQ(p->reduction, Reduction::kNone);
  EXPECT_EQ(p->loss_shape, std::vector<std::int64_t>{16});
  EXPECT_EQ(p->loss_bytes, 16u * 4);
  EXPECT_EQ(p->z_loss, 1e-4f);
  EXPECT_EQ(p->logit_softcap, 30.0f);
  EXPECT_EQ(p->grad_scale, -0.5f);
  EXPECT_EQ(p->dx_dtype, DType::kFp32);
  EXPECT_EQ(p->lse_bytes, 16u * 4);
  EXPECT_EQ(p->dx_bytes, 16u * 4096 * 4);
  EXPECT_EQ(p->dw_bytes, 32768u * 4096 * 4);
  EXPECT_TRUE(p->returns_dw());

  h.set_reduction(v1::REDUCTION_SUM);
  p = ValidateCrossEntropy(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->reduction, Reduction::kSum);
  EXPECT_EQ(p->loss_shape, std::vector<std::int64_t>{1});
  h.set_reduction(v1::REDUCTION_MEAN);
  EXPECT_EQ(ValidateCrossEntropy(h, Weight(), kUnlimited)->reduction, Reduction::kMean);
}

TEST(ValidateCrossEntropy, RejectsBadX) {
  absl::Status s =
      ValidateCrossEntropy(CrossEntropy({16, 4095}, {16}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "x: expected K=4096 to match weight 'lm_head' [32768, 4096], got [16, 4095]");
  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
  h.mutable_x()->set_dtype(v1::DTYPE_FP32);
  s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("x: expected dtype BF16, got FP32"));
  EXPECT_EQ(ValidateCrossEntropy(CrossEntropy({4096}, {16}), Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ValidateCrossEntropy(CrossEntropy({0, 4096}, {0}), Weight(), kUnlimited).status().code(),
      absl::StatusCode::kInvalidArgument);
  h = CrossEntropy({16, 4096}, {16});
  h.clear_x();
  s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("x: the header has no TensorSpec"));
}

TEST(ValidateCrossEntropy, RejectsBadTargets) {
  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
  h.clear_targets();
  absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("targets: the header has no TensorSpec"));

  h = CrossEntropy({16, 4096}, {16});
  h.mutable_targets()->clear_name();
  EXPECT_EQ(ValidateCrossEntropy(h, Weight(), kUnlimited).status().code(),
            absl::StatusCode::kInvalidArgument);

  h = CrossEntropy({16, 4096}, {16});
  h.mutable_targets()->set_name("x");
  s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("distinct TensorSpec names"));

  for (v1::DType d : {v1::DTYPE_FP32, v1::DTYPE_BF16, v1::DTYPE_UNSPECIFIED}) {
    s = ValidateCrossEntropy(CrossEntropy({16, 4096}, {16}, d), Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(Message(s), HasSubstr("targets: expected dtype INT32 or INT64, got "));
  }

  s = ValidateCrossEntropy(CrossEntropy({16, 4096}, {15}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "targets: expected rank 1 [M] with M=16 to match x [16, 4096], got [15]");
  s = ValidateCrossEntropy(CrossEntropy({16, 4096}, {16, 1}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("got [16, 1]"));
  s = ValidateCrossEntropy(CrossEntropy({16, 4096}, {}), Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateCrossEntropy, RejectsBadOptions) {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  for (float z : {-1e-4f, nan, inf}) {
    v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
    h.set_z_loss(z);
    absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << z;
    EXPECT_THAT(Message(s), HasSubstr("z_loss: expected a finite coefficient >= 0"));
  }
  for (float cap : {-30.0f, nan, inf}) {
    v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
    h.set_logit_softcap(cap);
    absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cap;
    EXPECT_THAT(Message(s), HasSubstr("logit_softcap: expected 0 (off) or a finite cap > 0"));
  }
  for (float g : {nan, inf, -inf}) {
    v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
    h.set_grad_scale(g);
    absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << g;
    EXPECT_THAT(Message(s), HasSubstr("grad_scale: expected a finite incoming gradient"));
  }
  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
  h.set_reduction(static_cast<v1::Reduction>(7));
  absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "reduction: expected NONE, SUM or MEAN (unspecified means MEAN), got 7");

  for (v1::DType d : {v1::DTYPE_INT32, v1::DTYPE_INT64, static_cast<v1::DType>(9)}) {
    h = CrossEntropy({16, 4096}, {16});
    h.set_want_dx(true);
    h.set_dx_dtype(d);
    s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(Message(s), HasSubstr("dx_dtype: expected BF16 or FP32"));
  }
}

TEST(ValidateCrossEntropy, AccumulateRules) {
  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
  h.set_accumulate_dw(true);
  absl::Status s = ValidateCrossEntropy(h, Weight(), kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "accumulate_dw: expected want_dw=true (accumulation computes dW), got want_dw=false");
  h.set_want_dw(true);
  absl::StatusOr<CrossEntropyPlan> p = ValidateCrossEntropy(h, Weight(), kUnlimited);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->accumulate_dw);
  EXPECT_FALSE(p->returns_dw());
  EXPECT_EQ(p->dw_bytes, 0u);
}

TEST(ValidateCrossEntropy, OutputsCountAgainstRequestLimit) {
  // x 16x4096 bf16 = 131072, targets int64 = 128, loss [1] = 4, lse = 64,
  // dx bf16 = 131072, dw fp32 = 512 MiB.
  const std::uint64_t without_dw = 131072 + 128 + 4 + 64 + 131072;
  v1::CrossEntropyHeader h = CrossEntropy({16, 4096}, {16});
  h.set_want_lse(true);
  h.set_want_dx(true);
  h.set_want_dw(true);
  absl::Status s = ValidateCrossEntropy(h, Weight(), without_dw).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("dw fp32 [32768, 4096]"));
  EXPECT_THAT(Message(s), HasSubstr("--max_request_bytes"));
  // Accumulated dW does not travel, so it fits, to the byte.
  h.set_accumulate_dw(true);
  EXPECT_TRUE(ValidateCrossEntropy(h, Weight(), without_dw).ok());
  s = ValidateCrossEntropy(h, Weight(), without_dw - 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("lse fp32 [16]"));
  // Per-token losses count M entries.
  h.set_reduction(v1::REDUCTION_NONE);
  EXPECT_EQ(ValidateCrossEntropy(h, Weight(), without_dw).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ValidateCrossEntropy(h, Weight(), without_dw + 60).ok());
}

TEST(ValidateCrossEntropy, OutputShapeOverflowIsInvalid) {
  WeightDims huge{std::int64_t{1} << 40, 4, "'huge' [2^40, 4]"};
  v1::CrossEntropyHeader h = CrossEntropy({std::int64_t{1} << 30, 4}, {std::int64_t{1} << 30});
  EXPECT_TRUE(ValidateCrossEntropy(h, huge, kUnlimited).ok());  // no [M, V] anywhere
  h.set_want_dw(true);
  absl::Status s = ValidateCrossEntropy(h, huge, kUnlimited).status();
  EXPECT_TRUE(s.ok()) << s;  // [2^40, 4] fp32 = 2^44 bytes still fits in int64
  WeightDims huger{std::int64_t{1} << 61, 4, "'huger' [2^61, 4]"};
  s = ValidateCrossEntropy(h, huger, kUnlimited).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("dw: "));
}

TEST(ConvertTargets, WidensInt32AndCountsTheNonIgnored) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    std::vector<std::int64_t> out;
    absl::StatusOr<std::int64_t> counted =
        ConvertTargets(TargetsTensor(dtype, {0, 32767, -100, 5, -100}), 32768, -100, &out);
    ASSERT_TRUE(counted.ok()) << counted.status();
    EXPECT_EQ(*counted, 3);
    EXPECT_EQ(out, (std::vector<std::int64_t>{0, 32767, -100, 5, -100}));
  }
  // int64 ids past 2^31 and an ignore_index inside the vocabulary.
  std::vector<std::int64_t> out;
  absl::StatusOr<std::int64_t> counted = ConvertTargets(
      TargetsTensor(DType::kInt64, {std::int64_t{1} << 33, 3, 7}), std::int64_t{1} << 34, 7, &out);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(*counted, 2);
  EXPECT_EQ(out[0], std::int64_t{1} << 33);
}

TEST(ConvertTargets, OutOfRangeNamesTheFirstBadIndexAndValue) {
  std::vector<std::int64_t> values(20, 1);
  values[17] = 50000;
  values[19] = -5;
  std::vector<std::int64_t> out;
  absl::Status s = ConvertTargets(TargetsTensor(DType::kInt32, values), 32768, -100, &out).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            "targets[17] = 50000: expected a token id in [0, 32768) or ignore_index -100");
  values[17] = 32768;  // V itself
  s = ConvertTargets(TargetsTensor(DType::kInt64, values), 32768, -100, &out).status();
  EXPECT_THAT(Message(s), HasSubstr("targets[17] = 32768:"));
  values[17] = 0;
  s = ConvertTargets(TargetsTensor(DType::kInt64, values), 32768, -100, &out).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("targets[19] = -5:"));
  values[19] = -100;  // the default ignore_index is no token once another is set
  s = ConvertTargets(TargetsTensor(DType::kInt64, values), 32768, -1, &out).status();
  EXPECT_EQ(Message(s), "targets[19] = -100: expected a token id in [0, 32768) or ignore_index -1");
  // An int64 id that an int32 conversion would wrap into range.
  s = ConvertTargets(TargetsTensor(DType::kInt64, {(std::int64_t{1} << 32) + 5}), 32768, -100, &out)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("targets[0] = 4294967301:"));
  s = ConvertTargets(Tensor(DType::kFp32, {4}), 32768, -100, &out).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(CrossEntropyReduction, GradScaleDividesByCountedForMeanOnly) {
  CrossEntropyPlan plan;
  plan.grad_scale = 3.0f;
  plan.reduction = Reduction::kMean;
  EXPECT_EQ(CrossEntropyGradScale(plan, 4), 0.75f);
  EXPECT_EQ(CrossEntropyGradScale(plan, 3), 1.0f);
  EXPECT_EQ(CrossEntropyGradScale(plan, 7), 3.0f / 7.0f);  // one fp32 division
  EXPECT_EQ(CrossEntropyGradScale(plan, 0), 3.0f);         // nothing counts: rows are zero
  plan.reduction = Reduction::kSum;
  EXPECT_EQ(CrossEntropyGradScale(plan, 4), 3.0f);
  plan.reduction = Reduction::kNone;
  EXPECT_EQ(CrossEntropyGradScale(plan, 4), 3.0f);
}

TEST(CrossEntropyReduction, SumAndMeanInFp64InTokenOrder) {
  CrossEntropyPlan plan;
  // Ignored tokens carry 0. In fp32, 2^24 + 1 + 1 would be 2^24; fp64 keeps both ones.
  const std::vector<float> loss = {16777216.0f, 1.0f, 0.0f, 1.0f};
  plan.reduction = Reduction::kSum;
  EXPECT_EQ(ReduceLoss(plan, loss.data(), 4, 3), 16777218.0f);
  plan.reduction = Reduction::kMean;
  EXPECT_EQ(ReduceLoss(plan, loss.data(), 4, 3), static_cast<float>(16777218.0 / 3.0));
  EXPECT_TRUE(std::isnan(ReduceLoss(plan, loss.data(), 0, 0)));  // mean of nothing
  const std::vector<float> zeros = {0.0f, 0.0f};
  EXPECT_TRUE(std::isnan(ReduceLoss(plan, zeros.data(), 2, 0)));
  plan.reduction = Reduction::kSum;
  EXPECT_EQ(FloatBitsOf(ReduceLoss(plan, zeros.data(), 2, 0)), 0u);  // sum of nothing is +0
  // A NaN per-token loss reaches the reduction.
  const std::vector<float> with_nan = {1.0f, std::nanf(""), 2.0f};
  EXPECT_TRUE(std::isnan(ReduceLoss(plan, with_nan.data(), 3, 3)));
}

TEST(ValidateHandle, EmptyIsAMissingField) {
  absl::Status s = ValidateHandle("");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("weight_handle"));
  EXPECT_TRUE(ValidateHandle("w-0000000000000001-2x3").ok());
}

// A scratch directory with weights/ (the --weights_dir) and a file outside it.
class ResolveWeightPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("logitd_resolve_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_ / "weights" / "sub");
    Touch(base_ / "weights" / "sub" / "a.safetensors");
    Touch(base_ / "secret.safetensors");
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(base_, ec);
  }
  static void Touch(const std::filesystem::path& p) { std::ofstream(p) << "x"; }
  std::filesystem::path dir() const { return base_ / "weights"; }

  std::filesystem::path base_;
};

TEST_F(ResolveWeightPathTest, AcceptsAFileInside) {
  absl::StatusOr<std::filesystem::path> p = ResolveWeightPath(dir(), "sub/a.safetensors");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, std::filesystem::canonical(dir() / "sub" / "a.safetensors"));
  // Redundant "." components and a link that stays inside are fine.
  std::filesystem::create_symlink("sub", dir() / "alias");
  p = ResolveWeightPath(dir(), "./alias/./a.safetensors");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, std::filesystem::canonical(dir() / "sub" / "a.safetensors"));
}

TEST_F(ResolveWeightPathTest, RefusesDotDotAndAbsolutePaths) {
  for (const char* bad :
       {"../secret.safetensors", "sub/../../secret.safetensors", "sub/../a.safetensors", ".."}) {
    absl::StatusOr<std::filesystem::path> p = ResolveWeightPath(dir(), bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << bad;
    EXPECT_THAT(p.status().message(), HasSubstr(bad));
  }
  const std::string absolute = (base_ / "secret.safetensors").string();
  absl::StatusOr<std::filesystem::path> p = ResolveWeightPath(dir(), absolute);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  EXPECT_THAT(p.status().message(), HasSubstr("absolute"));
  // Even an absolute path that points inside.
  p = ResolveWeightPath(dir(), (dir() / "sub" / "a.safetensors").string());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
}

TEST_F(ResolveWeightPathTest, RefusesSymbolicLinksThatEscape) {
  std::filesystem::create_symlink(base_ / "secret.safetensors", dir() / "file_link");
  std::filesystem::create_symlink(base_, dir() / "dir_link");
  std::filesystem::create_symlink("/", dir() / "root_link");
  for (const char* bad : {"file_link", "dir_link/secret.safetensors", "root_link/etc/passwd",
                          "dir_link/no_such.safetensors"}) {
    absl::StatusOr<std::filesystem::path> p = ResolveWeightPath(dir(), bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << bad << ": " << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr("outside"));
  }
  // What counts is where the path ends: out through a link and back in is
  // a file inside.
  absl::StatusOr<std::filesystem::path> back =
      ResolveWeightPath(dir(), "dir_link/weights/sub/a.safetensors");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::filesystem::canonical(dir() / "sub" / "a.safetensors"));
  // The directory itself is not a file inside it.
  std::filesystem::create_symlink(".", dir() / "self");
  const absl::Status self = ResolveWeightPath(dir(), "self").status();
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  EXPECT_THAT(self.message(), HasSubstr("names the --weights_dir itself"));
  // Messages name the caller's path, not the server's directory.
  const absl::Status out = ResolveWeightPath(dir(), "file_link").status();
  EXPECT_THAT(out.message(), Not(HasSubstr(base_.string()))) << out;
}

TEST_F(ResolveWeightPathTest, MissingEmptyAndNonFiles) {
  absl::StatusOr<std::filesystem::path> p = ResolveWeightPath(dir(), "sub/none.safetensors");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_THAT(p.status().message(), HasSubstr("sub/none.safetensors"));
  p = ResolveWeightPath(dir(), "no_dir/none.safetensors");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_EQ(ResolveWeightPath(dir(), "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveWeightPath(dir(), "sub").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveWeightPath(dir(), absl::string_view("a\0b", 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A dangling link inside is simply missing.
  std::filesystem::create_symlink("gone.safetensors", dir() / "dangling");
  EXPECT_EQ(ResolveWeightPath(dir(), "dangling").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ResolveWeightPathTest, NoDirectoryIsFailedPrecondition) {
  absl::StatusOr<std::filesystem::path> p = ResolveWeightPath("", "sub/a.safetensors");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("--weights_dir"));
  p = ResolveWeightPath(base_ / "no_such_dir", "a.safetensors");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace logitd::service

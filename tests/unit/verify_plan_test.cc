// Verify's one validation (call/verify.h), without gRPC: operations,
// the weight by handle or streamed, candidates' names, dtypes and shapes in
// the operation's words, and the byte limit over everything a verify holds.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/call/verify.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;

constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

CallInput Spec(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape) {
  CallInput in;
  in.given = true;
  in.name = name;
  in.dtype = dtype;
  in.shape = std::move(shape);
  return in;
}

const WeightDims kWeight{1000, 64, "'lm_head' [1000, 64]"};

VerifyRequest Logits(std::vector<std::int64_t> y_shape = {8, 1000}, std::string y_dtype = "FP32") {
  VerifyRequest r;
  r.operation = VerifyOperation::kLogits;
  r.weight_handle = "w-1";
  r.x = Spec("x", "BF16", {8, 64});
  r.candidates.push_back(Spec("y", y_dtype, std::move(y_shape)));
  return r;
}

VerifyRequest Backward() {
  VerifyRequest r;
  r.operation = VerifyOperation::kBackward;
  r.weight_handle = "w-1";
  r.x = Spec("x", "BF16", {8, 64});
  r.dy = Spec("dy", "FP32", {8, 1000});
  r.candidates.push_back(Spec("dx", "FP32", {8, 64}));
  r.candidates.push_back(Spec("dw", "BF16", {1000, 64}));
  return r;
}

absl::Status PlanStatus(const VerifyRequest& r, const WeightDims* w = &kWeight,
                        std::uint64_t limit = kNoLimit) {
  return PlanVerify(r, w, limit).status();
}

TEST(PlanVerifyTest, LogitsAndBackwardPlans) {
  absl::StatusOr<VerifyPlan> p = PlanVerify(Logits(), &kWeight, kNoLimit);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->m, 8);
  EXPECT_EQ(p->v, 1000);
  EXPECT_EQ(p->k, 64);
  EXPECT_FALSE(p->weight_streamed);
  ASSERT_EQ(p->candidates.size(), 1u);
  EXPECT_EQ(p->candidates[0].bytes, 8u * 1000 * 4);
  // logitd's own y, the weight read back and the references' doubles.
  EXPECT_GT(p->scratch_bytes, 8u * 1000 * 4 + 1000u * 64 * 2);

  absl::StatusOr<VerifyPlan> b = PlanVerify(Backward(), &kWeight, kNoLimit);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->candidates[1].dtype, DType::kBf16);
  EXPECT_EQ(b->dy_dtype, DType::kFp32);
}

TEST(PlanVerifyTest, UnknownOperationsAndOutputsNotCheckedYet) {
  VerifyRequest r = Logits();
  r.operation = VerifyOperation::kCrossEntropy;
  r.targets = Spec("targets", "INT64", {8});
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("'y' is not an output of VERIFY_CROSS_ENTROPY"));
  // The cross-entropy's gradients: dX fp32 or bf16, dW fp32 only.
  r.candidates = {Spec("dx", "BF16", {8, 64}), Spec("dw", "FP32", {1000, 64})};
  EXPECT_TRUE(PlanStatus(r).ok()) << PlanStatus(r);
  r.candidates = {Spec("dw", "BF16", {1000, 64})};
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("dw: expected dtype FP32"));
  // LogProbs' top-k and ranks: integer ids and ranks, one k for both.
  r.operation = VerifyOperation::kLogProbs;
  r.candidates = {Spec("rank", "FP32", {8})};
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("rank: expected dtype INT32 or INT64, got FP32"));
  r.candidates = {Spec("rank", "INT32", {8}), Spec("topk_ids", "INT32", {8, 5}),
                  Spec("topk_logprobs", "FP32", {8, 5})};
  absl::StatusOr<VerifyPlan> lp = PlanVerify(r, &kWeight, kNoLimit);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_EQ(lp->logprobs->top_k, 5);
  EXPECT_TRUE(lp->logprobs->want_rank);
  // logitd's own ranks are int64 whatever the candidate's dtype.
  EXPECT_EQ(OwnBytes(lp->candidates[0]), 8u * 8);
  r.candidates = {Spec("topk_ids", "INT64", {8, 5}), Spec("topk_logprobs", "FP32", {8, 4})};
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("topk_logprobs: expected k = 5"));
  r.candidates = {Spec("topk_ids", "INT64", {8, 65})};
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("k in 1..64"));
  r.targets = {};
  r.candidates = {Spec("rank", "INT64", {8})};
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("a rank candidate is each row's target's rank"));
  r.operation = VerifyOperation::kUnknown;
  r.operation_name = "unknown operation 9";
  EXPECT_EQ(PlanStatus(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("got unknown operation 9"));
  r.operation = VerifyOperation::kUnspecified;
  r.operation_name.clear();
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("got VERIFY_OPERATION_UNSPECIFIED"));
}

VerifyRequest CrossEntropy(Reduction reduction, std::vector<std::int64_t> loss_shape) {
  VerifyRequest r;
  r.operation = VerifyOperation::kCrossEntropy;
  r.weight_handle = "w-1";
  r.x = Spec("x", "BF16", {8, 64});
  r.targets = Spec("targets", "INT32", {8});
  r.cross_entropy.reduction = reduction;
  r.candidates.push_back(Spec("loss", "FP32", std::move(loss_shape)));
  r.candidates.push_back(Spec("lse", "FP32", {8}));
  return r;
}

TEST(PlanVerifyTest, CrossEntropysCandidatesTakeTheReductionsShape) {
  absl::StatusOr<VerifyPlan> none =
      PlanVerify(CrossEntropy(Reduction::kNone, {8}), &kWeight, kNoLimit);
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_TRUE(none->cross_entropy.has_value());
  EXPECT_EQ(none->targets_dtype, DType::kInt32);
  EXPECT_EQ(none->targets_bytes, 8u * 4);
  EXPECT_EQ(none->candidates[0].bytes, 8u * 4);
  absl::StatusOr<VerifyPlan> mean =
      PlanVerify(CrossEntropy(Reduction::kMean, {1}), &kWeight, kNoLimit);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(mean->candidates[0].bytes, 4u);
  absl::Status s = PlanStatus(CrossEntropy(Reduction::kSum, {8}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("loss: expected shape [1] ([1]: the reduced loss), got [8]"));

  VerifyRequest bf16 = CrossEntropy(Reduction::kNone, {8});
  bf16.candidates[1].dtype = "BF16";
  EXPECT_THAT(PlanStatus(bf16).message(),
              HasSubstr("lse: expected dtype FP32 (the dtype VERIFY_CROSS_ENTROPY gives it in)"));
  // Rows sampled: per-token losses, yes; a reduced loss or dW, no.
  VerifyRequest sampled = CrossEntropy(Reduction::kNone, {8});
  sampled.sample_rows = 2;
  absl::StatusOr<VerifyPlan> sp = PlanVerify(sampled, &kWeight, kNoLimit);
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->rows, (CheckedRows{0, 7}));
  VerifyRequest sampled_mean = CrossEntropy(Reduction::kMean, {1});
  sampled_mean.sample_rows = 2;
  EXPECT_THAT(PlanStatus(sampled_mean).message(),
              HasSubstr("sample_rows: VERIFY_CROSS_ENTROPY's 'loss' sums every row"));
  sampled.candidates.push_back(Spec("dw", "FP32", {1000, 64}));
  EXPECT_THAT(PlanStatus(sampled).message(), HasSubstr("'dw' is checked on every row"));
  VerifyRequest no_targets = CrossEntropy(Reduction::kNone, {8});
  no_targets.targets = CallInput();
  EXPECT_EQ(PlanStatus(no_targets).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PlanStatus(no_targets).message(), HasSubstr("targets"));
}

TEST(PlanVerifyTest, LogProbsNeedsTargetsForALogprobCandidateOnly) {
  VerifyRequest r;
  r.operation = VerifyOperation::kLogProbs;
  r.weight_handle = "w-1";
  r.x = Spec("x", "BF16", {8, 64});
  r.candidates.push_back(Spec("entropy", "FP32", {8}));
  r.candidates.push_back(Spec("lse", "FP32", {8}));
  absl::StatusOr<VerifyPlan> p = PlanVerify(r, &kWeight, kNoLimit);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->logprobs.has_value());
  EXPECT_EQ(p->logprobs->vocab, 1000);
  r.candidates.push_back(Spec("logprob", "FP32", {8}));
  EXPECT_THAT(PlanStatus(r).message(), HasSubstr("give targets"));
  r.targets = Spec("targets", "INT64", {8});
  EXPECT_TRUE(PlanVerify(r, &kWeight, kNoLimit).ok());
  r.alpha = 2.0f;
  EXPECT_THAT(PlanStatus(r).message(),
              HasSubstr("alpha: given (2), but VERIFY_LOGPROBS takes no scale"));
}

TEST(PlanVerifyTest, ExactlyOneWeightAndAStreamedOnesShape) {
  VerifyRequest neither = Logits();
  neither.weight_handle.clear();
  EXPECT_THAT(PlanStatus(neither, nullptr).message(), HasSubstr("got neither"));

  VerifyRequest streamed = Logits();
  streamed.weight_handle.clear();
  streamed.w = Spec("w", "BF16", {1000, 64});
  absl::StatusOr<VerifyPlan> p = PlanVerify(streamed, nullptr, kNoLimit);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->weight_streamed);
  EXPECT_EQ(p->w_bytes, 1000u * 64 * 2);

  VerifyRequest both = streamed;
  both.weight_handle = "w-1";
  EXPECT_THAT(PlanStatus(both).message(), HasSubstr("got both"));

  streamed.w = Spec("w", "FP32", {1000, 64});
  EXPECT_THAT(PlanStatus(streamed, nullptr).message(), HasSubstr("w: expected dtype BF16"));
  streamed.w = Spec("w", "BF16", {1000});
  EXPECT_THAT(PlanStatus(streamed, nullptr).message(), HasSubstr("w: expected rank 2 [V, K]"));
  // x's K against the streamed weight's.
  streamed.w = Spec("w", "BF16", {1000, 32});
  EXPECT_THAT(PlanStatus(streamed, nullptr).message(), HasSubstr("expected K=32"));
}

TEST(PlanVerifyTest, CandidatesInTheOperationsWords) {
  EXPECT_THAT(PlanStatus(Logits({1000, 8})).message(),
              HasSubstr("y: expected shape [8, 1000] ([M, V]: x's M, the weight's V), got "
                        "[1000, 8]"));
  EXPECT_THAT(PlanStatus(Logits({8, 1000}, "INT32")).message(),
              HasSubstr("y: expected dtype FP32 or BF16"));
  EXPECT_TRUE(PlanStatus(Logits({8, 1000}, "BF16")).ok());

  VerifyRequest twice = Logits();
  twice.candidates.push_back(twice.candidates[0]);
  EXPECT_THAT(PlanStatus(twice).message(), HasSubstr("'y' is given twice"));

  VerifyRequest other = Backward();
  other.candidates.push_back(Spec("y", "FP32", {8, 1000}));
  EXPECT_THAT(PlanStatus(other).message(),
              HasSubstr("'y' is not an output of VERIFY_BACKWARD (it gives dx, dw)"));

  VerifyRequest none = Logits();
  none.candidates.clear();
  EXPECT_THAT(PlanStatus(none).message(), HasSubstr("candidates: expected at least one"));

  VerifyRequest dw_shape = Backward();
  dw_shape.candidates[1].shape = {64, 1000};
  EXPECT_THAT(PlanStatus(dw_shape).message(), HasSubstr("dw: expected shape [1000, 64]"));
}

TEST(PlanVerifyTest, InputsAndOptionsOfTheOperation) {
  VerifyRequest clash = Logits();
  clash.x.name = "y";
  EXPECT_THAT(PlanStatus(clash).message(), HasSubstr("expected distinct TensorSpec names"));

  VerifyRequest dy = Logits();
  dy.dy = Spec("dy", "FP32", {8, 1000});
  EXPECT_THAT(PlanStatus(dy).message(), HasSubstr("VERIFY_LOGITS takes no dy"));

  VerifyRequest alpha = Backward();
  alpha.alpha = 2.0f;
  EXPECT_THAT(PlanStatus(alpha).message(), HasSubstr("VERIFY_BACKWARD takes no scale"));

  VerifyRequest no_dy = Backward();
  no_dy.dy = CallInput();
  EXPECT_THAT(PlanStatus(no_dy).message(), HasSubstr("dy: the request has no such tensor"));

  VerifyRequest nan_alpha = Logits();
  nan_alpha.alpha = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(PlanStatus(nan_alpha).message(), HasSubstr("alpha: expected a finite scale"));

  VerifyRequest sampled = Logits();
  sampled.sample_rows = 3;
  absl::StatusOr<VerifyPlan> p = PlanVerify(sampled, &kWeight, kNoLimit);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rows, (CheckedRows{0, 3, 7}));
  sampled.sample_rows = -1;
  EXPECT_THAT(PlanStatus(sampled).message(), HasSubstr("sample_rows"));
}

TEST(PlanVerifyTest, TheByteLimitCountsEverythingAVerifyHolds) {
  absl::StatusOr<VerifyPlan> p = PlanVerify(Logits(), &kWeight, kNoLimit);
  ASSERT_TRUE(p.ok());
  const std::uint64_t total = 8u * 64 * 2 + 2 * (8u * 1000 * 4) + p->scratch_bytes - 8u * 1000 * 4;
  EXPECT_TRUE(PlanStatus(Logits(), &kWeight, total).ok());
  const absl::Status s = PlanStatus(Logits(), &kWeight, total - 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("verify: request and response need"));
  EXPECT_THAT(s.message(), HasSubstr("logitd's y fp32 [8, 1000]"));
  EXPECT_THAT(s.message(), HasSubstr("fp64 references = "));
  EXPECT_THAT(s.message(), HasSubstr("--max_request_bytes"));
}

// A Backward whose only candidate is dW reads no weight back (dW = Gᵀ·X
// has no W) and holds G a block of columns at a time, so a dW of the
// largest shape gpu-check verifies fits its server's --max_request_bytes of
// 8e9; with dX the weight comes back to the host.
TEST(PlanVerifyTest, AWeightsGradientAloneNeedsNoWeightAndNoWholeG) {
  VerifyRequest dw_only = Backward();
  dw_only.candidates.erase(dw_only.candidates.begin());
  absl::StatusOr<VerifyPlan> p = PlanVerify(dw_only, &kWeight, kNoLimit);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->weight_read_back);
  absl::StatusOr<VerifyPlan> both = PlanVerify(Backward(), &kWeight, kNoLimit);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(both->weight_read_back);
  // The weight read back and logitd's own dX, at least.
  EXPECT_GE(both->scratch_bytes - p->scratch_bytes, 1000u * 64 * 2 + 8u * 64 * 4);

  const WeightDims large{128256, 4096, "large"};
  VerifyRequest full;
  full.operation = VerifyOperation::kBackward;
  full.weight_handle = "w-1";
  full.x = Spec("x", "BF16", {4096, 4096});
  full.dy = Spec("dy", "FP32", {4096, 128256});
  full.candidates.push_back(Spec("dw", "FP32", {128256, 4096}));
  absl::StatusOr<VerifyPlan> f = PlanVerify(full, &large, 8000000000u);
  ASSERT_TRUE(f.ok()) << f.status();
  // dY, the candidate and logitd's own dW are 2.1 GB each; the host's
  // references stay under 1 GB.
  EXPECT_LT(f->scratch_bytes, 2101346304u + 1000000000u);
}

}  // namespace
}  // namespace logitd::service

namespace logitd::service {
namespace {

TEST(PlanVerifyTest, SumsTooLongForTheProvenBoundAreRefused) {
  // 2^22 products: γ_n(2^-23) reaches 1, the bound Σ|products| itself.
  const std::int64_t n = std::int64_t{1} << 22;
  const WeightDims wide{4, n, "'wide' [4, 4194304]"};
  VerifyRequest r = Logits({2, 4});
  r.x = Spec("x", "BF16", {2, n});
  absl::Status s = PlanStatus(r, &wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("y: its elements sum 4194304 products (K)"));
  // One fewer is judged.
  const WeightDims narrower{4, n - 1, "'narrower' [4, 4194303]"};
  r.x = Spec("x", "BF16", {2, n - 1});
  EXPECT_TRUE(PlanStatus(r, &narrower).ok());
  // dW sums M products.
  VerifyRequest b = Backward();
  b.x = Spec("x", "BF16", {n, 64});
  b.dy = Spec("dy", "FP32", {n, 1000});
  b.candidates = {Spec("dw", "FP32", {1000, 64})};
  s = PlanStatus(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dw: its elements sum 4194304 products (M)"));
}

}  // namespace
}  // namespace logitd::service

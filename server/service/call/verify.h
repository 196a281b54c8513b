// Verify, whichever front door it came in by: another implementation's
// outputs of one operation (a framework's GEMM, a Triton kernel, a library
// upgrade) with the inputs they were computed from, judged against the
// contract. Every candidate element is held against the fp64 reference of
// the exact products of its bf16 inputs and its proven bound, and against
// logitd's own output of the same inputs (logitd/reference/verify_checks.h).
// The plan is the operation's own (PlanLogits, PlanBackward,
// PlanCrossEntropy, PlanLogProbs) with the candidates' dtypes as its output
// dtypes, so a candidate of a shape or dtype the operation cannot give is
// refused in the operation's words. The cross-entropy's and LogProbs'
// per-token outputs are held against logitd/reference/cross_entropy.h and
// logprobs.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/reference/candidate_check.h"
#include "logitd/reference/verify_checks.h"
#include "logitd/tensor.h"
#include "server/kernels/backend.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"
#include "server/service/call/call.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"
#include "server/service/call/request.h"

namespace logitd::service {

// "VERIFY_LOGITS", ...: how messages name an operation.
std::string VerifyOperationName(VerifyOperation operation);

// The checks that come before the weight is looked up: an operation Verify
// knows, and exactly one of weight_handle and w.
absl::Status CheckVerifyRequest(const VerifyRequest& request);

// The outputs Verify checks, one slot each; VerifyOutputName gives the
// name the RPC's TensorSpec gives it ("y", "dx", ...), the one place names
// and slots meet.
enum class VerifyOutput {
  kY,             // the logits
  kDx,            // the backward's or the cross-entropy's dX
  kDw,            // and dW
  kLoss,          // the cross-entropy's loss, per token or reduced
  kLse,           // the cross-entropy's and LogProbs' log-sum-exp
  kEntropy,       // LogProbs'
  kLogprob,       // the target's log-probability
  kTopkIds,       // LogProbs' top-k, its ids
  kTopkLogprobs,  // and their log-probabilities
  kRank,          // the target's rank
};
const char* VerifyOutputName(VerifyOutput output);
// The slot of a TensorSpec name; none when no operation gives it.
std::optional<VerifyOutput> VerifyOutputOf(const std::string& name);
// LogProbs' integer outputs (INT32 or INT64): the top-k ids and the rank.
bool IsIntegerOutput(VerifyOutput output);

struct VerifyCandidatePlan {
  std::string name;  // as the request gave it: VerifyOutputName(output)
  VerifyOutput output = VerifyOutput::kY;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  // Its place in VerifyRequest::candidates.
  std::size_t index = 0;
};

// The bytes of logitd's own output of a candidate: the candidate's, but
// LogProbs' top-k ids int32 and ranks int64 whatever the candidate's dtype.
std::uint64_t OwnBytes(const VerifyCandidatePlan& c);

struct VerifyPlan {
  VerifyOperation operation = VerifyOperation::kUnspecified;
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
  float alpha = 1.0f;
  DType dy_dtype = DType::kFp32;
  // Digest the candidates in blocks of rows (VerifyRequest::block_digests).
  bool block_digests = false;
  bool weight_streamed = false;
  std::uint64_t w_bytes = 0;  // streamed, or read back from the backend
  // A registered weight is read back to the host unless no reference needs
  // it (a Backward whose only candidate is dW: dW = Gᵀ·X has no W).
  bool weight_read_back = false;
  std::uint64_t x_bytes = 0;
  std::uint64_t dy_bytes = 0;
  // The cross-entropy's and LogProbs' plans (their options; targets_bytes
  // 0 when no targets come).
  std::optional<CrossEntropyPlan> cross_entropy;
  std::optional<LogProbsPlan> logprobs;
  DType targets_dtype = DType::kInt64;
  std::uint64_t targets_bytes = 0;
  std::vector<VerifyCandidatePlan> candidates;
  // The rows of M checked; empty for all of them.
  CheckedRows rows;
  // Memory besides the inputs: logitd's own outputs, the weight read back
  // (a registered one) and the references' doubles.
  std::uint64_t scratch_bytes = 0;
};

// `registered` is the weight the handle names, or null when w is streamed.
// InvalidArgument for a bad input, candidate name, dtype or shape (each
// named, with the shape the operation gives), UNIMPLEMENTED for an
// operation not served, ResourceExhausted when the inputs, the candidates,
// logitd's own outputs and the references' memory exceed max_request_bytes.
absl::StatusOr<VerifyPlan> PlanVerify(const VerifyRequest& request, const WeightDims* registered,
                                      std::uint64_t max_request_bytes);

struct VerifiedCandidate {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t xxh3 = 0;
  CandidateCheck check;
  // Only some rows of it were checked (sample_rows; dW never is).
  bool sampled = false;
  // Its rows in at most kMaxDigestBlocks blocks of block_rows rows, and
  // each block's xxh3-64 (CandidateVerdict.block_xxh3).
  std::int64_t block_rows = 0;
  std::vector<std::uint64_t> block_xxh3 = {};

  // The check's verdict, a passing one with "_sampled" when sampled.
  std::string Verdict() const;
  bool passed() const { return check.passed(); }
};

struct VerifyOutcome {
  std::vector<VerifiedCandidate> candidates;
  CheckedRows rows;
  // The xxh3-64 of the operation, its options and its inputs' digests.
  std::uint64_t inputs_xxh3 = 0;
  // logitd's own outputs.
  kernels::Timing timing;
  // Forming the references and checking the candidates.
  std::int64_t reference_us = 0;
  // Where the fp64 products were formed (VerifyResult.reference_engine).
  std::string reference_engine;

  // The worst of the candidates' verdicts: "outside_bounds",
  // "outside_precision_class", "within_bounds" or "bitwise_equal_to_logitd"
  // (CandidateCheck::Verdict), a passing one with "_sampled" when a
  // candidate was sampled.
  std::string Verdict() const;
  // Rows of M in all, and the sample's seed (0: evenly spaced).
  std::int64_t rows_total = 0;
  std::uint64_t sample_seed = 0;
};

// The call: the weight (registered, or streamed and loaded for this call
// only, charged to the weight budget meanwhile), the inputs and candidates
// received, logitd's own outputs, then the checks. Cancelled when `stop`
// says the caller went away while the references were being formed.
absl::StatusOr<VerifyOutcome> RunVerify(const OpEnv& env, const VerifyRequest& request, Call* call,
                                        Transport& transport, const StopCheck& stop);

}  // namespace logitd::service

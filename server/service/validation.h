// Checks of request headers against the contract, as pure functions so that
// every bad-input class can be tested without gRPC: dtypes, ranks, shapes
// against the weight, overflow of shape products, the per-call byte limit,
// and the defaults for unspecified output dtypes and alpha.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"

namespace logitd::service {

// The registered weight a request runs against.
struct WeightDims {
  std::int64_t v = 0;
  std::int64_t k = 0;
  // How messages name it: "'lm_head' [32768, 4096]".
  std::string label;
};

// The longest weight name a registration takes.
inline constexpr std::size_t kMaxWeightNameBytes = 1024;

// A weight upload's header, checked: BF16, rank 2 [V, K], no overflow.
struct WeightPlan {
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::uint64_t bytes = 0;
};
absl::StatusOr<WeightPlan> ValidateRegisterWeight(const v1::RegisterWeightHeader& header);
// The plan of a weight of `shape` (from a file): rank 2 [V, K], no overflow.
absl::StatusOr<WeightPlan> WeightPlanOf(const std::vector<std::int64_t>& shape);

struct LogitsPlan {
  std::int64_t m = 0;
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
  std::uint64_t x_bytes = 0;
  std::uint64_t y_bytes = 0;
};
// InvalidArgument for a bad x, out dtype or alpha; ResourceExhausted when x
// and y together exceed max_request_bytes.
absl::StatusOr<LogitsPlan> ValidateLogits(const v1::LogitsHeader& header, const WeightDims& weight,
                                          std::uint64_t max_request_bytes);

// What Backward and CrossEntropy plans share: activations x [M, K] and the
// gradients the call asks for.
struct GradientPlan {
  std::int64_t m = 0;
  std::uint64_t x_bytes = 0;
  bool want_dx = false;
  bool want_dw = false;
  bool accumulate_dw = false;
  DType dx_dtype = DType::kBf16;
  // 0 when the tensor is not returned.
  std::uint64_t dx_bytes = 0;
  std::uint64_t dw_bytes = 0;
  // True when dW travels back (wanted and not accumulated).
  bool returns_dw() const { return want_dw && !accumulate_dw; }
};

struct BackwardPlan : GradientPlan {
  DType dy_dtype = DType::kFp32;
  DType dw_dtype = DType::kFp32;
  std::uint64_t dy_bytes = 0;
};
absl::StatusOr<BackwardPlan> ValidateBackward(const v1::BackwardHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes);

struct CastPlan {
  std::vector<std::int64_t> shape;
  std::int64_t n = 0;
  std::uint64_t in_bytes = 0;
  std::uint64_t out_bytes = 0;
};
absl::StatusOr<CastPlan> ValidateCast(const v1::CastHeader& header,
                                      std::uint64_t max_request_bytes);

struct CrossEntropyPlan : GradientPlan {
  DType targets_dtype = DType::kInt64;
  // The header's, or -100 when the field is absent.
  std::int64_t ignore_index = -100;
  // NONE, SUM or MEAN (UNSPECIFIED becomes MEAN).
  v1::Reduction reduction = v1::REDUCTION_MEAN;
  float z_loss = 0.0f;
  float logit_softcap = 0.0f;
  // The incoming gradient of the reduced loss (0 in the header means 1).
  float grad_scale = 1.0f;
  bool want_lse = false;
  std::uint64_t targets_bytes = 0;
  // [M] for REDUCTION_NONE, else [1].
  std::vector<std::int64_t> loss_shape;
  std::uint64_t loss_bytes = 0;
  // 0 when the tensor is not returned.
  std::uint64_t lse_bytes = 0;
};
// InvalidArgument for a bad x or targets spec, reduction, option or output
// dtype, and for accumulate_dw without want_dw (as Backward); ResourceExhausted
// when the request's and response's tensors exceed max_request_bytes.
absl::StatusOr<CrossEntropyPlan> ValidateCrossEntropy(const v1::CrossEntropyHeader& header,
                                                      const WeightDims& weight,
                                                      std::uint64_t max_request_bytes);

struct LogProbsPlan {
  std::int64_t m = 0;
  bool has_targets = false;
  DType targets_dtype = DType::kInt64;
  // The header's, or -100 when the field is absent.
  std::int64_t ignore_index = -100;
  // > 0 (0 in the header means 1).
  float temperature = 1.0f;
  float logit_softcap = 0.0f;
  // Vocabulary entries that count (vocab_size, or the weight's V).
  std::int64_t vocab = 0;
  std::int64_t top_k = 0;
  bool want_entropy = false;
  bool want_lse = false;
  bool want_rank = false;
  std::uint64_t x_bytes = 0;
  std::uint64_t targets_bytes = 0;
  // 0 when the output is not returned.
  std::uint64_t logprob_bytes = 0;
  std::uint64_t lse_bytes = 0;
  std::uint64_t entropy_bytes = 0;
  std::uint64_t topk_ids_bytes = 0;
  std::uint64_t topk_logprobs_bytes = 0;
  std::uint64_t rank_bytes = 0;
};
absl::StatusOr<LogProbsPlan> ValidateLogProbs(const v1::LogProbsHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes);

// Widens the received targets (INT32 or INT64 [M]) to int64 into `out` and
// checks each is in [0, v) or equal to ignore_index: InvalidArgument naming
// the first that is not, never a clamp. Returns the number of counted
// (non-ignored) tokens.
absl::StatusOr<std::int64_t> ConvertTargets(const Tensor& targets, std::int64_t v,
                                            std::int64_t ignore_index,
                                            std::vector<std::int64_t>* out);
// The same for `n` targets of `dtype` at `data` (need not be aligned).
absl::StatusOr<std::int64_t> ConvertTargets(DType dtype, const std::byte* data, std::int64_t n,
                                            std::int64_t v, std::int64_t ignore_index,
                                            std::vector<std::int64_t>* out);

// The scale the backend multiplies every counted token's dL/dz by before the
// bf16 cast of G: grad_scale, divided (in fp32) by the counted tokens for a
// mean. With nothing counted every gradient row is zero and it is grad_scale.
float CrossEntropyGradScale(const CrossEntropyPlan& plan, std::int64_t counted);

// The loss the response carries for SUM and MEAN: the per-token losses
// (ignored ones are 0) summed in fp64 in token order, divided by `counted`
// for MEAN (NaN when nothing counts), rounded to fp32 once. Deterministic
// for the same per-token losses.
float ReduceLoss(const CrossEntropyPlan& plan, const float* loss, std::int64_t m,
                 std::int64_t counted);

// The file a LoadWeight request names, confined to the server's weights
// directory `dir`: `relative` is resolved against the canonical `dir`, with
// symbolic links followed, and the result must lie inside it. Returns the
// resolved path of an existing regular file.
//   FailedPrecondition: `dir` is empty (no --weights_dir) or cannot be resolved.
//   InvalidArgument: `relative` is empty, holds a NUL byte or names a
//     directory or other non-regular file.
//   PermissionDenied: `relative` is absolute, has a ".." component, or
//     resolves (through symbolic links) outside `dir`.
//   NotFound: nothing exists at the resolved path.
absl::StatusOr<std::filesystem::path> ResolveWeightPath(const std::filesystem::path& dir,
                                                        absl::string_view relative);

// A Probe call's header, checked.
struct ProbePlan {
  std::uint64_t request_bytes = 0;
  std::uint64_t response_bytes = 0;
  std::size_t chunk_bytes = 0;
};
// chunk_bytes 0 becomes the server's `chunk_bytes`; more than that is
// InvalidArgument. ResourceExhausted when request and response bytes together
// exceed max_request_bytes (or overflow).
absl::StatusOr<ProbePlan> ValidateProbe(const v1::ProbeHeader& header, std::size_t chunk_bytes,
                                        std::uint64_t max_request_bytes);

// A weight_handle/handle field: InvalidArgument when empty (a missing field,
// not an unknown handle, which the registry reports as NotFound).
absl::Status ValidateHandle(absl::string_view handle);

}  // namespace logitd::service

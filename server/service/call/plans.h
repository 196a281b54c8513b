// The one validation of a tensor call, whichever front door it came in by:
// a request (request.h) against the weight it names becomes a plan (sizes,
// dtypes, defaults applied) or the status a caller can act on: dtypes,
// ranks, shapes against the weight, overflow of shape products, options,
// shared-memory slots for outputs the call does not make, and the per-call
// byte limit. Pure functions, tested without gRPC. Then what runs once the
// tensors have arrived: targets checked and widened, the cross-entropy's
// gradient scale and reduced loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "server/service/call/request.h"

namespace logitd::service {

// The registered weight a request runs against.
struct WeightDims {
  std::int64_t v = 0;
  std::int64_t k = 0;
  // How messages name it: "'lm_head' [32768, 4096]".
  std::string label;
};

// The element type a request spells (request.h's CallInput::dtype), or
// nullopt for a word logitd does not know.
std::optional<DType> DTypeOfName(absl::string_view name);
// "BF16", "FP32", "INT32", "INT64": how requests and messages spell them.
std::string UpperDTypeName(DType dtype);

// One tensor of a call (or memory it takes), for the per-call byte limit
// and its message.
struct CallPart {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes;
};
// ResourceExhausted when the parts together exceed max_request_bytes,
// listing them: "<method>: request and response need N bytes in one call
// (x bf16 [..] = .. bytes, ...), over the limit of ..."
absl::Status CheckCallBytes(absl::string_view method, const std::vector<CallPart>& parts,
                            std::uint64_t max_request_bytes);

// The checks plans are made of, each InvalidArgument naming the request's
// field, for an operation's plan in its own file (call/<op>.cc).
// The request has the input (CallInput::given).
absl::Status CheckGiven(absl::string_view what, const CallInput& in);
// The input's dtype is one of `allowed`; returns it.
absl::StatusOr<DType> CheckDType(absl::string_view what, const CallInput& in,
                                 std::initializer_list<DType> allowed);
// The shape has rank 2; `dims` names them ("[M, K]").
absl::Status CheckRank2(absl::string_view what, absl::string_view dims,
                        const std::vector<std::int64_t>& shape);
// The byte count of `shape` of `dtype`, its overflow and non-positive dims
// named against the tensor.
absl::StatusOr<std::uint64_t> Bytes(absl::string_view what, const std::vector<std::int64_t>& shape,
                                    DType dtype);
// An output dtype field: one of `allowed`, or `fallback` when unspecified
// (empty).
absl::StatusOr<DType> OutputDType(absl::string_view field, const std::string& requested,
                                  DType fallback, std::initializer_list<DType> allowed);
// x: BF16 [M, K] with K the weight's; returns its bytes.
absl::StatusOr<std::uint64_t> CheckActivations(const CallInput& x, const WeightDims& weight);
// No shared-memory slot for an output the call does not return (`why`).
absl::Status UnusedOutputSlot(const CallOutputs& outputs, absl::string_view name, bool returned,
                              absl::string_view why);
// A non-negative finite option (0 = off); `meaning` says what it takes.
absl::Status CheckOffOrPositive(absl::string_view field, float value, absl::string_view meaning);

struct LogitsPlan {
  std::int64_t m = 0;
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
  std::uint64_t x_bytes = 0;
  std::uint64_t y_bytes = 0;
};
// InvalidArgument for a bad x, out dtype or alpha; ResourceExhausted when x
// and y together exceed max_request_bytes.
absl::StatusOr<LogitsPlan> PlanLogits(const LogitsRequest& request, const WeightDims& weight,
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
absl::StatusOr<BackwardPlan> PlanBackward(const BackwardRequest& request, const WeightDims& weight,
                                          std::uint64_t max_request_bytes);

struct CastPlan {
  std::vector<std::int64_t> shape;
  std::int64_t n = 0;
  std::uint64_t in_bytes = 0;
  std::uint64_t out_bytes = 0;
};
absl::StatusOr<CastPlan> PlanCast(const CastRequest& request, std::uint64_t max_request_bytes);

struct CrossEntropyPlan : GradientPlan {
  DType targets_dtype = DType::kInt64;
  // The request's, or -100 when it gives none.
  std::int64_t ignore_index = -100;
  // kNone, kSum or kMean (unspecified becomes kMean).
  Reduction reduction = Reduction::kMean;
  float z_loss = 0.0f;
  float logit_softcap = 0.0f;
  // The incoming gradient of the reduced loss (0 in the request means 1).
  float grad_scale = 1.0f;
  bool want_lse = false;
  std::uint64_t targets_bytes = 0;
  // [M] for kNone, else [1].
  std::vector<std::int64_t> loss_shape;
  std::uint64_t loss_bytes = 0;
  // 0 when the tensor is not returned.
  std::uint64_t lse_bytes = 0;
};
// InvalidArgument for a bad x or targets, reduction, option or output dtype,
// and for accumulate_dw without want_dw (as Backward); ResourceExhausted when
// the request's and response's tensors exceed max_request_bytes.
absl::StatusOr<CrossEntropyPlan> PlanCrossEntropy(const CrossEntropyRequest& request,
                                                  const WeightDims& weight,
                                                  std::uint64_t max_request_bytes);

struct LogProbsPlan {
  std::int64_t m = 0;
  bool has_targets = false;
  DType targets_dtype = DType::kInt64;
  // The request's, or -100 when it gives none.
  std::int64_t ignore_index = -100;
  // > 0 (0 in the request means 1).
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
absl::StatusOr<LogProbsPlan> PlanLogProbs(const LogProbsRequest& request, const WeightDims& weight,
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
// The same for rows [r0, r0 + rows) of the targets at `data` (row 0's
// address), into the same rows of `out`, for a call run in row blocks.
absl::StatusOr<std::int64_t> ConvertTargetRows(DType dtype, const std::byte* data, std::int64_t r0,
                                               std::int64_t rows, std::int64_t v,
                                               std::int64_t ignore_index, std::int64_t* out);

// The scale the backend multiplies every counted token's dL/dz by before the
// bf16 cast of G: grad_scale, divided (in fp32) by the counted tokens for a
// mean. With nothing counted every gradient row is zero and it is grad_scale.
float CrossEntropyGradScale(const CrossEntropyPlan& plan, std::int64_t counted);

// The loss the response carries for kSum and kMean: the per-token losses
// (ignored ones are 0) summed in fp64 in token order, divided by `counted`
// for kMean (NaN when nothing counts), rounded to fp32 once. Deterministic
// for the same per-token losses.
float ReduceLoss(const CrossEntropyPlan& plan, const float* loss, std::int64_t m,
                 std::int64_t counted);

}  // namespace logitd::service

#include "server/service/call/plans.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "logitd/status_macros.h"

namespace logitd::service {

absl::Status CheckGiven(absl::string_view what, const CallInput& in) {
  if (in.given) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": the request has no such tensor"));
}

// Checks the dtype is one of `allowed` and returns it.
absl::StatusOr<DType> CheckDType(absl::string_view what, const CallInput& in,
                                 std::initializer_list<DType> allowed) {
  const std::optional<DType> dtype = DTypeOfName(in.dtype);
  for (DType a : allowed) {
    if (dtype == a) return a;
  }
  std::vector<std::string> names;
  for (DType a : allowed) names.push_back(UpperDTypeName(a));
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": expected dtype ", absl::StrJoin(names, " or "), ", got ", in.dtype));
}

absl::Status CheckRank2(absl::string_view what, absl::string_view dims,
                        const std::vector<std::int64_t>& shape) {
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected rank 2 ", dims, ", got ", ShapeString(shape)));
  }
  return absl::OkStatus();
}

// Byte count with overflow and non-positive dims reported against the tensor.
absl::StatusOr<std::uint64_t> Bytes(absl::string_view what, const std::vector<std::int64_t>& shape,
                                    DType dtype) {
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, dtype);
  if (!n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n.status().message()));
  }
  return static_cast<std::uint64_t>(*n);
}

// An output dtype: one of `allowed`, or `fallback` when unspecified (empty).
absl::StatusOr<DType> OutputDType(absl::string_view field, const std::string& requested,
                                  DType fallback, std::initializer_list<DType> allowed) {
  const std::optional<DType> dtype = requested.empty() ? fallback : DTypeOfName(requested);
  for (DType a : allowed) {
    if (dtype == a) return a;
  }
  std::vector<std::string> names;
  for (DType a : allowed) names.push_back(UpperDTypeName(a));
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", absl::StrJoin(names, " or "),
                                                 " (unspecified means ", UpperDTypeName(fallback),
                                                 "), got ", requested));
}

// x: BF16 [M, K] with K equal to the weight's.
absl::StatusOr<std::uint64_t> CheckActivations(const CallInput& x, const WeightDims& weight) {
  LOGITD_RETURN_IF_ERROR(CheckGiven("x", x));
  LOGITD_RETURN_IF_ERROR(CheckDType("x", x, {DType::kBf16}).status());
  LOGITD_RETURN_IF_ERROR(CheckRank2("x", "[M, K]", x.shape));
  LOGITD_ASSIGN_OR_RETURN(const std::uint64_t bytes, Bytes("x", x.shape, DType::kBf16));
  if (x.shape[1] != weight.k) {
    return absl::InvalidArgumentError(absl::StrCat("x: expected K=", weight.k, " to match weight ",
                                                   weight.label, ", got ", ShapeString(x.shape)));
  }
  return bytes;
}

// An output slot in shared memory for an output the call does not return.
absl::Status UnusedOutputSlot(const CallOutputs& outputs, absl::string_view name, bool returned,
                              absl::string_view why) {
  if (returned || outputs.count(std::string(name)) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, "_shm: given, but ", why));
}

namespace {

// The start of a Backward or CrossEntropy plan: the gradients asked for
// (accumulating is a way of delivering dW, so it asks for dW) and x, which
// sets M.
template <typename Request>
absl::Status StartGradientPlan(const Request& request, const WeightDims& weight,
                               GradientPlan* plan) {
  plan->want_dx = request.want_dx;
  plan->want_dw = request.want_dw;
  plan->accumulate_dw = request.accumulate_dw;
  if (plan->accumulate_dw && !plan->want_dw) {
    return absl::InvalidArgumentError(
        "accumulate_dw: expected want_dw=true (accumulation computes dW), got want_dw=false");
  }
  LOGITD_ASSIGN_OR_RETURN(plan->x_bytes, CheckActivations(request.x, weight));
  plan->m = request.x.shape[0];
  return absl::OkStatus();
}

// dx_dtype: BF16 (the default) or FP32.
absl::Status SetDxDType(const std::string& requested, GradientPlan* plan) {
  LOGITD_ASSIGN_OR_RETURN(plan->dx_dtype, OutputDType("dx_dtype", requested, DType::kBf16,
                                                      {DType::kBf16, DType::kFp32}));
  return absl::OkStatus();
}

// The target ids of a call over activations `x` of M rows: INT32 or INT64
// [M]. Sets their dtype and byte count.
absl::Status CheckTargets(const CallInput& targets, const CallInput& x, std::int64_t m,
                          DType* dtype, std::uint64_t* bytes) {
  LOGITD_RETURN_IF_ERROR(CheckGiven("targets", targets));
  LOGITD_ASSIGN_OR_RETURN(*dtype, CheckDType("targets", targets, {DType::kInt32, DType::kInt64}));
  if (targets.shape.size() != 1 || targets.shape[0] != m) {
    return absl::InvalidArgumentError(absl::StrCat("targets: expected rank 1 [M] with M=", m,
                                                   " to match x ", ShapeString(x.shape), ", got ",
                                                   ShapeString(targets.shape)));
  }
  LOGITD_ASSIGN_OR_RETURN(*bytes, Bytes("targets", targets.shape, *dtype));
  return absl::OkStatus();
}

// The end of a Backward or CrossEntropy plan. The gradients it returns: dX
// [M, K] when wanted, dW [V, K] of `dw_dtype` when it travels back rather
// than being accumulated; sets their byte counts and adds them to the call's
// `parts`. Then no shared-memory slot for a gradient the call does not
// return, and the per-call byte limit over all the parts.
absl::Status FinishGradientPlan(absl::string_view method, const CallOutputs& outputs,
                                const WeightDims& weight, DType dw_dtype,
                                std::vector<CallPart> parts, std::uint64_t max_request_bytes,
                                GradientPlan* plan) {
  if (plan->want_dx) {
    const std::vector<std::int64_t> dx_shape = {plan->m, weight.k};
    LOGITD_ASSIGN_OR_RETURN(plan->dx_bytes, Bytes("dx", dx_shape, plan->dx_dtype));
    parts.push_back({"dx", plan->dx_dtype, dx_shape, plan->dx_bytes});
  }
  if (plan->returns_dw()) {
    const std::vector<std::int64_t> dw_shape = {weight.v, weight.k};
    LOGITD_ASSIGN_OR_RETURN(plan->dw_bytes, Bytes("dw", dw_shape, dw_dtype));
    parts.push_back({"dw", dw_dtype, dw_shape, plan->dw_bytes});
  }
  LOGITD_RETURN_IF_ERROR(
      UnusedOutputSlot(outputs, "dx", plan->want_dx, "dX is not asked for (want_dx)"));
  LOGITD_RETURN_IF_ERROR(UnusedOutputSlot(outputs, "dw", plan->returns_dw(),
                                          "dW is not returned (want_dw without accumulate_dw)"));
  return CheckCallBytes(method, parts, max_request_bytes);
}

}  // namespace

// A non-negative finite option (0 = off).
absl::Status CheckOffOrPositive(absl::string_view field, float value, absl::string_view meaning) {
  if (std::isfinite(value) && value >= 0.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", meaning, ", got ", value));
}

std::optional<DType> DTypeOfName(absl::string_view name) {
  for (DType d : {DType::kBf16, DType::kFp32, DType::kInt32, DType::kInt64}) {
    if (name == UpperDTypeName(d)) return d;
  }
  return std::nullopt;
}

std::string UpperDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "BF16";
    case DType::kFp32:
      return "FP32";
    case DType::kInt32:
      return "INT32";
    case DType::kInt64:
      return "INT64";
  }
  return "?";
}

absl::Status CheckCallBytes(absl::string_view method, const std::vector<CallPart>& parts,
                            std::uint64_t max_request_bytes) {
  std::uint64_t total = 0;
  bool overflow = false;
  for (const CallPart& p : parts) {
    if (p.bytes > std::numeric_limits<std::uint64_t>::max() - total) overflow = true;
    total += p.bytes;
  }
  if (!overflow && total <= max_request_bytes) return absl::OkStatus();
  std::vector<std::string> items;
  for (const CallPart& p : parts) {
    // Memory that is not a tensor of the call (scratch) has no shape.
    items.push_back(p.shape.empty()
                        ? absl::StrFormat("%s = %d bytes", p.name, p.bytes)
                        : absl::StrFormat("%s %s %s = %d bytes", p.name, DTypeName(p.dtype),
                                          ShapeString(p.shape), p.bytes));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s: request and response need %s bytes in one call (%s), over the limit of %d bytes per "
      "call (server flag --max_request_bytes); split the call into smaller ones",
      method, overflow ? std::string("more than 2^64") : absl::StrCat(total),
      absl::StrJoin(items, ", "), max_request_bytes));
}

absl::StatusOr<LogitsPlan> PlanLogits(const LogitsRequest& request, const WeightDims& weight,
                                      std::uint64_t max_request_bytes) {
  LogitsPlan plan;
  LOGITD_ASSIGN_OR_RETURN(plan.x_bytes, CheckActivations(request.x, weight));
  plan.m = request.x.shape[0];
  LOGITD_ASSIGN_OR_RETURN(plan.out_dtype, OutputDType("out_dtype", request.out_dtype, DType::kFp32,
                                                      {DType::kFp32, DType::kBf16}));
  if (!std::isfinite(request.alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alpha: expected a finite scale (0 means 1), got ", request.alpha));
  }
  plan.alpha = request.alpha == 0.0f ? 1.0f : request.alpha;
  const std::vector<std::int64_t> y_shape = {plan.m, weight.v};
  LOGITD_ASSIGN_OR_RETURN(plan.y_bytes, Bytes("y", y_shape, plan.out_dtype));
  LOGITD_RETURN_IF_ERROR(CheckCallBytes("logits",
                                        {{"x", DType::kBf16, request.x.shape, plan.x_bytes},
                                         {"y", plan.out_dtype, y_shape, plan.y_bytes}},
                                        max_request_bytes));
  return plan;
}

absl::StatusOr<BackwardPlan> PlanBackward(const BackwardRequest& request, const WeightDims& weight,
                                          std::uint64_t max_request_bytes) {
  if (!request.want_dx && !request.want_dw) {
    return absl::InvalidArgumentError(
        "want_dx, want_dw: expected at least one gradient to be requested, got neither");
  }
  BackwardPlan plan;
  LOGITD_RETURN_IF_ERROR(StartGradientPlan(request, weight, &plan));

  const CallInput& dy = request.dy;
  LOGITD_RETURN_IF_ERROR(CheckGiven("dy", dy));
  LOGITD_ASSIGN_OR_RETURN(plan.dy_dtype, CheckDType("dy", dy, {DType::kFp32, DType::kBf16}));
  LOGITD_RETURN_IF_ERROR(CheckRank2("dy", "[M, V]", dy.shape));
  LOGITD_ASSIGN_OR_RETURN(plan.dy_bytes, Bytes("dy", dy.shape, plan.dy_dtype));
  if (dy.shape[1] != weight.v) {
    return absl::InvalidArgumentError(absl::StrCat("dy: expected V=", weight.v, " to match weight ",
                                                   weight.label, ", got ", ShapeString(dy.shape)));
  }
  if (dy.shape[0] != plan.m) {
    return absl::InvalidArgumentError(absl::StrCat("dy: expected M=", plan.m, " to match x ",
                                                   ShapeString(request.x.shape), ", got ",
                                                   ShapeString(dy.shape)));
  }

  LOGITD_RETURN_IF_ERROR(SetDxDType(request.dx_dtype, &plan));
  if (plan.accumulate_dw) {
    if (!request.dw_dtype.empty() && request.dw_dtype != "FP32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "dw_dtype: accumulate_dw adds into the fp32 gradient buffer, so expected FP32 or "
          "unspecified, got ",
          request.dw_dtype));
    }
    plan.dw_dtype = DType::kFp32;
  } else {
    LOGITD_ASSIGN_OR_RETURN(plan.dw_dtype, OutputDType("dw_dtype", request.dw_dtype, DType::kFp32,
                                                       {DType::kFp32, DType::kBf16}));
  }
  LOGITD_RETURN_IF_ERROR(FinishGradientPlan("backward", request.outputs, weight, plan.dw_dtype,
                                            {{"dy", plan.dy_dtype, dy.shape, plan.dy_bytes},
                                             {"x", DType::kBf16, request.x.shape, plan.x_bytes}},
                                            max_request_bytes, &plan));
  return plan;
}

absl::StatusOr<CrossEntropyPlan> PlanCrossEntropy(const CrossEntropyRequest& request,
                                                  const WeightDims& weight,
                                                  std::uint64_t max_request_bytes) {
  CrossEntropyPlan plan;
  plan.want_lse = request.want_lse;
  LOGITD_RETURN_IF_ERROR(StartGradientPlan(request, weight, &plan));
  LOGITD_RETURN_IF_ERROR(
      CheckTargets(request.targets, request.x, plan.m, &plan.targets_dtype, &plan.targets_bytes));
  plan.ignore_index = request.ignore_index.value_or(-100);
  switch (request.reduction) {
    case Reduction::kUnspecified:
    case Reduction::kMean:
      plan.reduction = Reduction::kMean;
      break;
    case Reduction::kNone:
    case Reduction::kSum:
      plan.reduction = request.reduction;
      break;
  }
  if (!request.reduction_unknown.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduction: expected NONE, SUM or MEAN (unspecified means MEAN), got ",
                     request.reduction_unknown));
  }
  LOGITD_RETURN_IF_ERROR(
      CheckOffOrPositive("z_loss", request.z_loss, "a finite coefficient >= 0 (0 = off)"));
  plan.z_loss = request.z_loss;
  LOGITD_RETURN_IF_ERROR(
      CheckOffOrPositive("logit_softcap", request.logit_softcap, "0 (off) or a finite cap > 0"));
  plan.logit_softcap = request.logit_softcap;
  if (!std::isfinite(request.grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_scale: expected a finite incoming gradient (0 means 1), got ", request.grad_scale));
  }
  plan.grad_scale = request.grad_scale == 0.0f ? 1.0f : request.grad_scale;
  LOGITD_RETURN_IF_ERROR(SetDxDType(request.dx_dtype, &plan));

  std::vector<CallPart> parts = {
      {"x", DType::kBf16, request.x.shape, plan.x_bytes},
      {"targets", plan.targets_dtype, request.targets.shape, plan.targets_bytes}};
  plan.loss_shape = {plan.reduction == Reduction::kNone ? plan.m : 1};
  LOGITD_ASSIGN_OR_RETURN(plan.loss_bytes, Bytes("loss", plan.loss_shape, DType::kFp32));
  parts.push_back({"loss", DType::kFp32, plan.loss_shape, plan.loss_bytes});
  if (plan.want_lse) {
    const std::vector<std::int64_t> lse_shape = {plan.m};
    LOGITD_ASSIGN_OR_RETURN(plan.lse_bytes, Bytes("lse", lse_shape, DType::kFp32));
    parts.push_back({"lse", DType::kFp32, lse_shape, plan.lse_bytes});
  }
  LOGITD_RETURN_IF_ERROR(UnusedOutputSlot(request.outputs, "lse", plan.want_lse,
                                          "the log-sum-exp is not asked for (want_lse)"));
  // CrossEntropy's dW is always fp32.
  LOGITD_RETURN_IF_ERROR(FinishGradientPlan("cross entropy", request.outputs, weight, DType::kFp32,
                                            std::move(parts), max_request_bytes, &plan));
  return plan;
}

absl::StatusOr<CastPlan> PlanCast(const CastRequest& request, std::uint64_t max_request_bytes) {
  CastPlan plan;
  const CallInput& in = request.input;
  LOGITD_RETURN_IF_ERROR(CheckGiven("input", in));
  LOGITD_RETURN_IF_ERROR(CheckDType("input", in, {DType::kFp32}).status());
  plan.shape = in.shape;
  if (plan.shape.empty()) {
    return absl::InvalidArgumentError("input: expected rank >= 1, got a shape with no dimensions");
  }
  LOGITD_ASSIGN_OR_RETURN(plan.in_bytes, Bytes("input", plan.shape, DType::kFp32));
  plan.n = static_cast<std::int64_t>(plan.in_bytes / 4);
  plan.out_bytes = plan.in_bytes / 2;
  LOGITD_RETURN_IF_ERROR(CheckCallBytes("cast",
                                        {{"input", DType::kFp32, plan.shape, plan.in_bytes},
                                         {"output", DType::kBf16, plan.shape, plan.out_bytes}},
                                        max_request_bytes));
  return plan;
}

absl::StatusOr<LogProbsPlan> PlanLogProbs(const LogProbsRequest& request, const WeightDims& weight,
                                          std::uint64_t max_request_bytes) {
  LogProbsPlan plan;
  LOGITD_ASSIGN_OR_RETURN(plan.x_bytes, CheckActivations(request.x, weight));
  plan.m = request.x.shape[0];
  std::vector<CallPart> parts = {{"x", DType::kBf16, request.x.shape, plan.x_bytes}};
  plan.has_targets = request.targets.given;
  if (plan.has_targets) {
    LOGITD_RETURN_IF_ERROR(
        CheckTargets(request.targets, request.x, plan.m, &plan.targets_dtype, &plan.targets_bytes));
    parts.push_back({"targets", plan.targets_dtype, {plan.m}, plan.targets_bytes});
  }
  plan.ignore_index = request.ignore_index.value_or(-100);
  const float temperature = request.temperature;
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature: expected a finite temperature > 0 (0 means 1), got ", temperature));
  }
  plan.temperature = temperature == 0.0f ? 1.0f : temperature;
  LOGITD_RETURN_IF_ERROR(
      CheckOffOrPositive("logit_softcap", request.logit_softcap, "0 (off) or a finite cap > 0"));
  plan.logit_softcap = request.logit_softcap;
  if (request.vocab_size < 0 || request.vocab_size > weight.v) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size: expected 0 (all ", weight.v,
                                                   ") to ", weight.v, " entries of weight ",
                                                   weight.label, ", got ", request.vocab_size));
  }
  plan.vocab = request.vocab_size == 0 ? weight.v : request.vocab_size;
  const std::int64_t max_k = std::min<std::int64_t>(kMaxTopK, plan.vocab);
  if (request.top_k < 0 || request.top_k > max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: expected 0 to ", max_k, ", got ", request.top_k));
  }
  plan.top_k = request.top_k;
  plan.want_entropy = request.want_entropy;
  plan.want_lse = request.want_lse;
  plan.want_rank = request.want_rank;
  if (plan.want_rank && !plan.has_targets) {
    return absl::InvalidArgumentError("want_rank: the rank of a target needs targets, got none");
  }
  const std::uint64_t m = static_cast<std::uint64_t>(plan.m);
  if (plan.has_targets) plan.logprob_bytes = m * sizeof(float);
  if (plan.want_lse) plan.lse_bytes = m * sizeof(float);
  if (plan.want_entropy) plan.entropy_bytes = m * sizeof(float);
  plan.topk_ids_bytes = m * static_cast<std::uint64_t>(plan.top_k) * sizeof(std::int32_t);
  plan.topk_logprobs_bytes = m * static_cast<std::uint64_t>(plan.top_k) * sizeof(float);
  if (plan.want_rank) plan.rank_bytes = m * sizeof(std::int64_t);
  if (plan.logprob_bytes + plan.lse_bytes + plan.entropy_bytes + plan.topk_ids_bytes +
          plan.rank_bytes ==
      0) {
    return absl::InvalidArgumentError(
        "expected at least one output: targets (log-probs), top_k, want_entropy or want_lse");
  }
  parts.push_back({"outputs",
                   DType::kFp32,
                   {plan.m},
                   plan.logprob_bytes + plan.lse_bytes + plan.entropy_bytes + plan.topk_ids_bytes +
                       plan.topk_logprobs_bytes + plan.rank_bytes});
  for (const auto& [name, returned, why] :
       {std::make_tuple("logprob", plan.has_targets, "log-probs need targets"),
        std::make_tuple("lse", plan.want_lse, "the log-sum-exp is not asked for (want_lse)"),
        std::make_tuple("entropy", plan.want_entropy,
                        "the entropy is not asked for (want_entropy)"),
        std::make_tuple("topk_ids", plan.top_k > 0, "top_k is 0"),
        std::make_tuple("topk_logprobs", plan.top_k > 0, "top_k is 0"),
        std::make_tuple("rank", plan.want_rank, "the rank is not asked for (want_rank)")}) {
    LOGITD_RETURN_IF_ERROR(UnusedOutputSlot(request.outputs, name, returned, why));
  }
  if (!plan.has_targets && request.targets.shm) {
    return absl::InvalidArgumentError("targets_shm: given, but the header has no targets");
  }
  LOGITD_RETURN_IF_ERROR(CheckCallBytes("log probs", parts, max_request_bytes));
  return plan;
}

}  // namespace logitd::service

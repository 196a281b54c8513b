// Verify's plan: the operation, the weight, the candidates' names, dtypes
// and shapes in the operation's words, and the memory a call holds
// (verify.h). The call itself is in verify.cc.
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "logitd/bf16.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/logprobs.h"
#include "logitd/reference/numerics.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/verify.h"

namespace logitd::service {
namespace {

struct OutputName {
  VerifyOutput output;
  const char* name;
};
constexpr OutputName kOutputNames[] = {
    {VerifyOutput::kY, "y"},
    {VerifyOutput::kDx, "dx"},
    {VerifyOutput::kDw, "dw"},
    {VerifyOutput::kLoss, "loss"},
    {VerifyOutput::kLse, "lse"},
    {VerifyOutput::kEntropy, "entropy"},
    {VerifyOutput::kLogprob, "logprob"},
    {VerifyOutput::kTopkIds, "topk_ids"},
    {VerifyOutput::kTopkLogprobs, "topk_logprobs"},
    {VerifyOutput::kRank, "rank"},
};

// The outputs an operation gives: its method's in the service's table
// (operations.h), in the proto's order.
std::vector<VerifyOutput> OutputsOf(VerifyOperation operation) {
  std::vector<VerifyOutput> outputs;
  const OperationInfo* op = FindVerifiable(operation);
  if (op == nullptr) return outputs;
  for (absl::string_view name : op->outputs) {
    if (const std::optional<VerifyOutput> o = VerifyOutputOf(std::string(name)); o.has_value()) {
      outputs.push_back(*o);
    }
  }
  return outputs;
}

// The outputs of an operation Verify checks so far.
std::vector<VerifyOutput> CheckedOutputsOf(VerifyOperation operation) {
  return OutputsOf(operation);
}

// "a, b, c": the outputs' names, for messages.
std::string NamesOf(const std::vector<VerifyOutput>& outputs) {
  std::vector<std::string> names;
  for (VerifyOutput o : outputs) names.push_back(VerifyOutputName(o));
  return absl::StrJoin(names, ", ");
}

// The slot of a candidate the request names (CheckCandidateNames has
// refused any other name).
VerifyOutput OutputOf(const CallInput& c) { return VerifyOutputOf(c.name).value(); }

// A streamed W: BF16 [V, K]; its dims.
absl::StatusOr<WeightDims> StreamedWeight(const CallInput& w, std::uint64_t* bytes) {
  if (DTypeOfName(w.dtype) != DType::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat("w: expected dtype BF16, got ", w.dtype));
  }
  if (w.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("w: expected rank 2 [V, K], got ", ShapeString(w.shape)));
  }
  absl::StatusOr<std::int64_t> n = CheckedByteCount(w.shape, DType::kBf16);
  if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat("w: ", n.status().message()));
  *bytes = static_cast<std::uint64_t>(*n);
  return WeightDims{w.shape[0], w.shape[1], absl::StrCat("w ", ShapeString(w.shape))};
}

// The candidates' names, dtypes and shapes against what the operation
// gives; `dtypes` receives each output's candidate dtype by name.
absl::Status CheckCandidateNames(const VerifyRequest& r, std::map<VerifyOutput, DType>* dtypes) {
  const std::vector<VerifyOutput> outputs = OutputsOf(r.operation);
  if (r.candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("candidates: expected at least one (",
                                                   VerifyOperationName(r.operation), " gives ",
                                                   NamesOf(outputs), "), got none"));
  }
  for (const CallInput& c : r.candidates) {
    const std::optional<VerifyOutput> output = VerifyOutputOf(c.name);
    if (!output.has_value() ||
        std::find(outputs.begin(), outputs.end(), *output) == outputs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidates: '", c.name, "' is not an output of ",
                       VerifyOperationName(r.operation), " (it gives ", NamesOf(outputs), ")"));
    }
    const std::optional<DType> dtype = DTypeOfName(c.dtype);
    if (IsIntegerOutput(*output)) {
      if (dtype != DType::kInt32 && dtype != DType::kInt64) {
        return absl::InvalidArgumentError(
            absl::StrCat(c.name, ": expected dtype INT32 or INT64, got ", c.dtype));
      }
    } else if (dtype != DType::kFp32 && dtype != DType::kBf16) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.name, ": expected dtype FP32 or BF16 (the dtypes ",
                       VerifyOperationName(r.operation), " can give it in), got ", c.dtype));
    }
    if (!dtypes->emplace(*output, *dtype).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidates: '", c.name, "' is given twice; one candidate an output"));
    }
  }
  return absl::OkStatus();
}

// Every tensor of the call travels under its own name.
absl::Status CheckDistinctNames(const VerifyRequest& r) {
  std::map<std::string, std::string> seen;  // name -> what
  std::vector<std::pair<std::string, const CallInput*>> all = {{"x", &r.x}};
  if (r.w.given) all.push_back({"w", &r.w});
  if (r.dy.given) all.push_back({"dy", &r.dy});
  if (r.targets.given) all.push_back({"targets", &r.targets});
  for (const CallInput& c : r.candidates) all.push_back({absl::StrCat("candidate ", c.name), &c});
  for (const auto& [what, in] : all) {
    if (!in->given) continue;
    auto [it, added] = seen.emplace(in->name, what);
    if (!added) {
      return absl::InvalidArgumentError(
          absl::StrCat(it->second, ", ", what, ": expected distinct TensorSpec names, both are '",
                       in->name, "'"));
    }
  }
  return absl::OkStatus();
}

std::uint64_t Mul(std::int64_t a, std::int64_t b, std::uint64_t size) {
  return static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b) * size;
}

}  // namespace

const char* VerifyOutputName(VerifyOutput output) {
  for (const OutputName& o : kOutputNames) {
    if (o.output == output) return o.name;
  }
  return "?";
}

std::optional<VerifyOutput> VerifyOutputOf(const std::string& name) {
  for (const OutputName& o : kOutputNames) {
    if (name == o.name) return o.output;
  }
  return std::nullopt;
}

bool IsIntegerOutput(VerifyOutput output) {
  return output == VerifyOutput::kTopkIds || output == VerifyOutput::kRank;
}

std::uint64_t OwnBytes(const VerifyCandidatePlan& c) {
  if (!IsIntegerOutput(c.output)) return c.bytes;
  std::uint64_t n = 1;
  for (std::int64_t d : c.shape) n *= static_cast<std::uint64_t>(d);
  return n * (c.output == VerifyOutput::kRank ? 8 : 4);
}

std::string VerifyOperationName(VerifyOperation operation) {
  switch (operation) {
    case VerifyOperation::kUnspecified:
      return "VERIFY_OPERATION_UNSPECIFIED";
    case VerifyOperation::kLogits:
      return "VERIFY_LOGITS";
    case VerifyOperation::kBackward:
      return "VERIFY_BACKWARD";
    case VerifyOperation::kCrossEntropy:
      return "VERIFY_CROSS_ENTROPY";
    case VerifyOperation::kLogProbs:
      return "VERIFY_LOGPROBS";
    case VerifyOperation::kUnknown:
      break;
  }
  return "an unknown operation";
}

absl::Status CheckVerifyRequest(const VerifyRequest& r) {
  switch (r.operation) {
    case VerifyOperation::kLogits:
    case VerifyOperation::kBackward:
    case VerifyOperation::kCrossEntropy:
    case VerifyOperation::kLogProbs:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "operation: expected VERIFY_LOGITS, VERIFY_BACKWARD, VERIFY_CROSS_ENTROPY or "
          "VERIFY_LOGPROBS, got ",
          r.operation_name.empty() ? VerifyOperationName(r.operation) : r.operation_name));
  }
  const bool handle = !r.weight_handle.empty();
  if (handle == r.w.given) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_handle, w: expected exactly one (a registered weight's handle, or w streamed "
        "with the call), got ",
        handle ? "both" : "neither"));
  }
  if (r.sample_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample_rows: expected 0 (every row) or more, got ", r.sample_rows));
  }
  if (r.sample_seed != 0 && r.sample_rows == 0) {
    // Every row would be checked, which the caller who gave a seed did not
    // mean.
    return absl::InvalidArgumentError(
        "sample_seed: given without sample_rows; give sample_rows (the number of rows to draw) "
        "with it, or leave sample_seed 0 to check every row");
  }
  return absl::OkStatus();
}

namespace {

constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

// Inputs an operation does not take.
absl::Status NoneOf(const VerifyRequest& r, bool dy, bool alpha, bool targets) {
  const std::string op = VerifyOperationName(r.operation);
  if (!dy && r.dy.given)
    return absl::InvalidArgumentError(absl::StrCat("dy: given, but ", op, " takes no dy"));
  if (!alpha && r.alpha != 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("alpha: given (", r.alpha, "), but ", op, " takes no scale"));
  }
  if (!targets && r.targets.given) {
    return absl::InvalidArgumentError(absl::StrCat("targets: given, but ", op, " takes none"));
  }
  return absl::OkStatus();
}

// A candidate of an output Verify does not check yet (UNIMPLEMENTED), or of
// a dtype other than FP32 where the operation gives FP32 only (the
// cross-entropy's dX may be BF16 too: the CrossEntropy RPC's dx_dtype).
absl::Status CheckedCandidates(const VerifyRequest& r,
                               const std::map<VerifyOutput, DType>& dtypes) {
  const std::vector<VerifyOutput> checked = CheckedOutputsOf(r.operation);
  for (const auto& [output, dtype] : dtypes) {
    const char* name = VerifyOutputName(output);
    if (std::find(checked.begin(), checked.end(), output) == checked.end()) {
      return absl::UnimplementedError(
          absl::StrCat("candidates: ", VerifyOperationName(r.operation), "'s '", name,
                       "' is not checked yet; Verify checks its ", NamesOf(checked)));
    }
    const bool bf16_allowed =
        r.operation == VerifyOperation::kCrossEntropy && output == VerifyOutput::kDx;
    if (IsIntegerOutput(output)) continue;  // INT32 or INT64, checked with the names
    if (dtype != DType::kFp32 && !(bf16_allowed && dtype == DType::kBf16)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected dtype FP32 (the dtype ",
                                                     VerifyOperationName(r.operation),
                                                     " gives it in), got ", DTypeName(dtype)));
    }
  }
  return absl::OkStatus();
}

// The outputs rows can be sampled for: every one but those a whole call
// decides (dW; the cross-entropy's reduced loss; LogProbs' top-k and ranks,
// whose reference's order this check does not sample).
absl::Status CheckSampledOutputs(const VerifyRequest& r, const VerifyPlan& plan) {
  for (const CallInput& c : r.candidates) {
    const VerifyOutput o = OutputOf(c);
    const bool reduced_loss = plan.cross_entropy.has_value() && o == VerifyOutput::kLoss &&
                              plan.cross_entropy->reduction != Reduction::kNone;
    const bool whole = o == VerifyOutput::kDw || reduced_loss || o == VerifyOutput::kTopkIds ||
                       o == VerifyOutput::kTopkLogprobs || o == VerifyOutput::kRank;
    if (whole && (plan.cross_entropy || plan.logprobs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample_rows: ", VerifyOperationName(r.operation), "'s '", c.name, "' ",
                       reduced_loss ? "sums every row" : "is checked on every row",
                       "; give sample_rows 0, or leave this candidate out"));
    }
  }
  return absl::OkStatus();
}

// Sums too long for their proven bound to decide anything
// (kMaxBoundTerms: γ_n(2^-23) reaches 1 there): refused, naming the length.
absl::Status CheckReductionLengths(const VerifyRequest& r, const VerifyPlan& plan) {
  for (const CallInput& c : r.candidates) {
    // dX sums V products, dW M, everything else rests on logits of K.
    const VerifyOutput o = OutputOf(c);
    const bool dx = o == VerifyOutput::kDx, dw = o == VerifyOutput::kDw;
    const std::int64_t terms = dx ? plan.v : dw ? plan.m : plan.k;
    if (terms >= kMaxBoundTerms) {
      const char* what = dx ? "V" : dw ? "M" : "K";
      return absl::InvalidArgumentError(absl::StrCat(
          c.name, ": its elements sum ", terms, " products (", what, "), at least ", kMaxBoundTerms,
          ", where the proven bound of an fp32 sum reaches the sum of the products' magnitudes "
          "and decides nothing; verify fewer ",
          dw ? "rows of M at a time" : "terms"));
    }
  }
  return absl::OkStatus();
}

// The k of LogProbs' top-k candidates: the second dimension of topk_ids and
// topk_logprobs (the same when both come); 0 when neither does.
absl::StatusOr<std::int64_t> CandidateTopK(const VerifyRequest& r) {
  std::int64_t k = 0;
  std::string first;
  for (const CallInput& c : r.candidates) {
    const VerifyOutput o = OutputOf(c);
    if (o != VerifyOutput::kTopkIds && o != VerifyOutput::kTopkLogprobs) continue;
    if (c.shape.size() != 2 || c.shape[1] < 1 || c.shape[1] > kMaxTopK) {
      return absl::InvalidArgumentError(absl::StrCat(c.name,
                                                     ": expected shape [M, k] with k in 1..",
                                                     kMaxTopK, ", got ", ShapeString(c.shape)));
    }
    if (k != 0 && c.shape[1] != k) {
      return absl::InvalidArgumentError(absl::StrCat(c.name, ": expected k = ", k, " as ", first,
                                                     " has, got ", ShapeString(c.shape)));
    }
    k = c.shape[1];
    first = c.name;
  }
  return k;
}

// Verify of the logits: y [M, V], planned as the operation's own call of
// these candidates' dtypes plans it; the candidates' shapes by name.
absl::Status PlanLogitsVerify(const VerifyRequest& r, const WeightDims& dims,
                              std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                              std::map<VerifyOutput, std::vector<std::int64_t>>* shapes) {
  LOGITD_RETURN_IF_ERROR(NoneOf(r, false, true, false));
  LogitsRequest lr;
  lr.x = r.x;
  lr.out_dtype = UpperDTypeName(dtypes[VerifyOutput::kY]);
  lr.alpha = r.alpha;
  LOGITD_ASSIGN_OR_RETURN(const LogitsPlan lp, PlanLogits(lr, dims, kNoLimit));
  plan->m = lp.m;
  plan->alpha = lp.alpha;
  plan->x_bytes = lp.x_bytes;
  (*shapes)[VerifyOutput::kY] = {plan->m, plan->v};
  return absl::OkStatus();
}

// Verify of the backward GEMMs: dx [M, K] and dw [V, K], planned as the operation's own call of
// these candidates' dtypes plans it; the candidates' shapes by name.
absl::Status PlanBackwardVerify(const VerifyRequest& r, const WeightDims& dims,
                                std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                                std::map<VerifyOutput, std::vector<std::int64_t>>* shapes) {
  LOGITD_RETURN_IF_ERROR(NoneOf(r, true, false, false));
  BackwardRequest br;
  br.x = r.x;
  br.dy = r.dy;
  br.want_dx = dtypes.count(VerifyOutput::kDx) > 0;
  br.want_dw = dtypes.count(VerifyOutput::kDw) > 0;
  if (br.want_dx) br.dx_dtype = UpperDTypeName(dtypes[VerifyOutput::kDx]);
  if (br.want_dw) br.dw_dtype = UpperDTypeName(dtypes[VerifyOutput::kDw]);
  LOGITD_ASSIGN_OR_RETURN(const BackwardPlan bp, PlanBackward(br, dims, kNoLimit));
  plan->m = bp.m;
  plan->x_bytes = bp.x_bytes;
  plan->dy_bytes = bp.dy_bytes;
  plan->dy_dtype = bp.dy_dtype;
  (*shapes)[VerifyOutput::kDx] = {plan->m, plan->k};
  (*shapes)[VerifyOutput::kDw] = {plan->v, plan->k};
  return absl::OkStatus();
}

// Verify of the cross-entropy: loss, lse [M], dx [M, K] and dw [V, K], planned as the operation's
// own call of these candidates' dtypes plans it; the candidates' shapes by name.
absl::Status PlanCrossEntropyVerify(const VerifyRequest& r, const WeightDims& dims,
                                    std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                                    std::map<VerifyOutput, std::vector<std::int64_t>>* shapes) {
  LOGITD_RETURN_IF_ERROR(NoneOf(r, false, false, true));
  LOGITD_RETURN_IF_ERROR(CheckedCandidates(r, dtypes));
  CrossEntropyRequest cr = r.cross_entropy;
  cr.x = r.x;
  cr.targets = r.targets;
  cr.want_lse = dtypes.count(VerifyOutput::kLse) > 0;
  cr.want_dx = dtypes.count(VerifyOutput::kDx) > 0;
  cr.want_dw = dtypes.count(VerifyOutput::kDw) > 0;
  cr.accumulate_dw = false;
  if (cr.want_dx) cr.dx_dtype = UpperDTypeName(dtypes[VerifyOutput::kDx]);
  LOGITD_ASSIGN_OR_RETURN(CrossEntropyPlan cp, PlanCrossEntropy(cr, dims, kNoLimit));
  plan->m = cp.m;
  plan->x_bytes = cp.x_bytes;
  plan->targets_dtype = cp.targets_dtype;
  plan->targets_bytes = cp.targets_bytes;
  (*shapes)[VerifyOutput::kLoss] = cp.loss_shape;
  (*shapes)[VerifyOutput::kLse] = {plan->m};
  (*shapes)[VerifyOutput::kDx] = {plan->m, plan->k};
  (*shapes)[VerifyOutput::kDw] = {plan->v, plan->k};
  plan->cross_entropy = std::move(cp);
  return absl::OkStatus();
}

// Verify of LogProbs: logprob, lse, entropy and rank [M], the top-k [M, top_k], planned as the
// operation's own call of these candidates' dtypes plans it; the candidates' shapes by name.
absl::Status PlanLogProbsVerify(const VerifyRequest& r, const WeightDims& dims,
                                std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                                std::map<VerifyOutput, std::vector<std::int64_t>>* shapes) {
  LOGITD_RETURN_IF_ERROR(NoneOf(r, false, false, true));
  LOGITD_RETURN_IF_ERROR(CheckedCandidates(r, dtypes));
  if (dtypes.count(VerifyOutput::kLogprob) > 0 && !r.targets.given) {
    return absl::InvalidArgumentError(
        "targets: a logprob candidate is the log-probability of each row's target; give "
        "targets");
  }
  if (dtypes.count(VerifyOutput::kRank) > 0 && !r.targets.given) {
    return absl::InvalidArgumentError(
        "targets: a rank candidate is each row's target's rank; give targets");
  }
  LogProbsRequest lr = r.logprobs;
  lr.x = r.x;
  lr.targets = r.targets;
  lr.want_lse = dtypes.count(VerifyOutput::kLse) > 0;
  lr.want_entropy = dtypes.count(VerifyOutput::kEntropy) > 0;
  lr.want_rank = dtypes.count(VerifyOutput::kRank) > 0;
  LOGITD_ASSIGN_OR_RETURN(lr.top_k, CandidateTopK(r));
  LOGITD_ASSIGN_OR_RETURN(LogProbsPlan lp, PlanLogProbs(lr, dims, kNoLimit));
  plan->m = lp.m;
  plan->x_bytes = lp.x_bytes;
  plan->targets_dtype = lp.targets_dtype;
  plan->targets_bytes = lp.targets_bytes;
  for (VerifyOutput o :
       {VerifyOutput::kLogprob, VerifyOutput::kLse, VerifyOutput::kEntropy, VerifyOutput::kRank}) {
    (*shapes)[o] = {plan->m};
  }
  (*shapes)[VerifyOutput::kTopkIds] = {plan->m, lp.top_k};
  (*shapes)[VerifyOutput::kTopkLogprobs] = {plan->m, lp.top_k};
  plan->logprobs = std::move(lp);
  return absl::OkStatus();
}

// The operation's own plan, with the candidates' dtypes as its outputs' and
// no byte limit (Verify's is checked over everything it holds): fills the
// plan's dims and input bytes, and the shape of each output by name.
absl::Status PlanOperation(const VerifyRequest& r, const WeightDims& dims,
                           std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                           std::map<VerifyOutput, std::vector<std::int64_t>>* shapes) {
  switch (r.operation) {
    case VerifyOperation::kLogits:
      return PlanLogitsVerify(r, dims, dtypes, plan, shapes);
    case VerifyOperation::kBackward:
      return PlanBackwardVerify(r, dims, dtypes, plan, shapes);
    case VerifyOperation::kCrossEntropy:
      return PlanCrossEntropyVerify(r, dims, dtypes, plan, shapes);
    case VerifyOperation::kLogProbs:
      return PlanLogProbsVerify(r, dims, dtypes, plan, shapes);
    default:
      return absl::InvalidArgumentError("operation: not one Verify knows");
  }
}

// Each candidate against the shape its output has; its plan, and its bytes
// and logitd's own output's among `parts`.
absl::Status PlanCandidates(const VerifyRequest& r,
                            const std::map<VerifyOutput, std::vector<std::int64_t>>& shapes,
                            const std::map<VerifyOutput, DType>& dtypes, VerifyPlan* plan,
                            std::vector<CallPart>* parts) {
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const CallInput& c = r.candidates[i];
    const VerifyOutput o = OutputOf(c);
    const std::vector<std::int64_t>& want = shapes.at(o);
    if (c.shape != want) {
      // A loss of the wrong shape where the reduction was left unset: say
      // that unset means the mean.
      if (o == VerifyOutput::kLoss && r.operation == VerifyOperation::kCrossEntropy &&
          r.cross_entropy.reduction == Reduction::kUnspecified) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss: expected shape ", ShapeString(want),
            " (cross_entropy.reduction is unset, which means REDUCTION_MEAN: one loss for the "
            "call; give REDUCTION_NONE for a loss per token, [M]), got ",
            ShapeString(c.shape)));
      }
      const char* dims_of =
          o == VerifyOutput::kY    ? "[M, V]: x's M, the weight's V"
          : o == VerifyOutput::kDx ? "[M, K]: x's M, the weight's K"
          : o == VerifyOutput::kDw ? "[V, K]: the weight's"
          : o == VerifyOutput::kTopkIds || o == VerifyOutput::kTopkLogprobs ? "[M, k]: x's M"
          : want.size() == 1 && want[0] == 1 && r.operation == VerifyOperation::kCrossEntropy &&
                  o == VerifyOutput::kLoss
              ? "[1]: the reduced loss"
              : "[M]: one per row of x";
      return absl::InvalidArgumentError(absl::StrCat(c.name, ": expected shape ", ShapeString(want),
                                                     " (", dims_of, "), got ",
                                                     ShapeString(c.shape)));
    }
    VerifyCandidatePlan p;
    p.name = c.name;
    p.output = o;
    p.dtype = dtypes.at(o);
    p.shape = want;
    p.bytes = ElementSize(p.dtype);
    for (std::int64_t d : want) p.bytes *= static_cast<std::uint64_t>(d);
    p.index = i;
    parts->push_back({c.name, p.dtype, p.shape, p.bytes});
    // logitd's own: the candidate's dtype, but int32 ids and int64 ranks as
    // LogProbs gives them (OwnBytes).
    parts->push_back({absl::StrCat("logitd's ", c.name), p.dtype, p.shape, OwnBytes(p)});
    plan->candidates.push_back(std::move(p));
  }
  return absl::OkStatus();
}

// The most the references of one candidate hold at a time (they run one
// after the other).
std::uint64_t ReferenceBytes(const VerifyPlan& plan) {
  const std::int64_t checked =
      plan.rows.empty() ? plan.m : static_cast<std::int64_t>(plan.rows.size());
  if (plan.cross_entropy.has_value()) {
    const bool dx = plan.cross_entropy->want_dx, dw = plan.cross_entropy->want_dw;
    if (!dx && !dw) {
      return CrossEntropyReferenceBytes(plan.m, plan.v, plan.k, /*with_gradients=*/false);
    }
    // g, its pre-cast bound and the flips' weights gathered whole [M, V],
    // then the gradients' products from them.
    return CrossEntropyReferenceBytes(plan.m, plan.v, plan.k, /*with_gradients=*/true) +
           Mul(plan.m, plan.v, 4 * sizeof(double)) +
           CrossEntropyGradientReferenceBytes(plan.m, plan.v, plan.k, dx, dw);
  }
  if (plan.logprobs.has_value()) return LogProbsReferenceBytes(plan.m, plan.v, plan.k);
  std::uint64_t reference = 0;
  for (const VerifyCandidatePlan& c : plan.candidates) {
    const std::uint64_t bytes =
        c.output == VerifyOutput::kY    ? LogitsCheckBytes(checked, plan.v, plan.k)
        : c.output == VerifyOutput::kDx ? GradInputCheckBytes(checked, plan.v, plan.k)
                                        : GradWeightCheckBytes(plan.m, plan.v, plan.k);
    reference = std::max(reference, bytes);
  }
  return reference;
}

}  // namespace

absl::StatusOr<VerifyPlan> PlanVerify(const VerifyRequest& r, const WeightDims* registered,
                                      std::uint64_t max_request_bytes) {
  LOGITD_RETURN_IF_ERROR(CheckVerifyRequest(r));
  VerifyPlan plan;
  plan.operation = r.operation;
  plan.block_digests = r.block_digests;
  plan.weight_streamed = registered == nullptr;
  WeightDims dims;
  if (registered != nullptr) {
    dims = *registered;
    plan.w_bytes = Mul(dims.v, dims.k, 2);
  } else {
    LOGITD_ASSIGN_OR_RETURN(dims, StreamedWeight(r.w, &plan.w_bytes));
  }
  plan.v = dims.v;
  plan.k = dims.k;
  std::map<VerifyOutput, DType> dtypes;
  LOGITD_RETURN_IF_ERROR(CheckCandidateNames(r, &dtypes));
  LOGITD_RETURN_IF_ERROR(CheckDistinctNames(r));
  std::map<VerifyOutput, std::vector<std::int64_t>> shapes;
  LOGITD_RETURN_IF_ERROR(PlanOperation(r, dims, dtypes, &plan, &shapes));
  LOGITD_RETURN_IF_ERROR(CheckReductionLengths(r, plan));

  if (r.sample_rows > 0) LOGITD_RETURN_IF_ERROR(CheckSampledOutputs(r, plan));
  std::vector<CallPart> parts = {{"x", DType::kBf16, r.x.shape, plan.x_bytes}};
  if (r.dy.given) parts.push_back({"dy", plan.dy_dtype, r.dy.shape, plan.dy_bytes});
  if (r.targets.given) {
    parts.push_back({"targets", plan.targets_dtype, r.targets.shape, plan.targets_bytes});
    // Widened to int64 for the backend and the references.
    parts.push_back({"targets widened", DType::kInt64, {plan.m}, Mul(plan.m, 1, 8)});
  }
  if (plan.weight_streamed) parts.push_back({"w", DType::kBf16, r.w.shape, plan.w_bytes});
  LOGITD_RETURN_IF_ERROR(PlanCandidates(r, shapes, dtypes, &plan, &parts));
  std::uint64_t own_bytes = 0;
  for (const VerifyCandidatePlan& c : plan.candidates) own_bytes += OwnBytes(c);
  plan.rows = SampleRows(plan.m, r.sample_rows, r.sample_seed);
  const std::uint64_t reference = ReferenceBytes(plan);
  parts.push_back({"fp64 references", DType::kFp32, {}, reference});
  plan.weight_read_back =
      !plan.weight_streamed &&
      !std::all_of(plan.candidates.begin(), plan.candidates.end(),
                   [](const VerifyCandidatePlan& c) { return c.output == VerifyOutput::kDw; });
  if (plan.weight_read_back) {
    parts.push_back({"the weight read back", DType::kBf16, {plan.v, plan.k}, plan.w_bytes});
  }
  // The cross-entropy's per-token losses, when the candidate is reduced.
  const std::uint64_t token_losses = plan.cross_entropy ? Mul(plan.m, 1, 4) : 0;
  if (token_losses > 0) parts.push_back({"per-token losses", DType::kFp32, {plan.m}, token_losses});
  plan.scratch_bytes = own_bytes + reference + (plan.weight_read_back ? plan.w_bytes : 0) +
                       (r.targets.given ? Mul(plan.m, 1, 8) : 0) + token_losses;
  LOGITD_RETURN_IF_ERROR(CheckCallBytes("verify", parts, max_request_bytes));
  return plan;
}

}  // namespace logitd::service

#include "server/service/call/verify.h"

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
#include "logitd/status_macros.h"

namespace logitd::service {
namespace {

// The outputs an operation gives, by the names its RPC gives them.
std::vector<std::string> OutputsOf(VerifyOperation operation) {
  switch (operation) {
    case VerifyOperation::kLogits:
      return {"y"};
    case VerifyOperation::kCrossEntropy:
      return {"loss", "lse", "dx", "dw"};
    case VerifyOperation::kLogProbs:
      return {"logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"};
    default:
      return {"dx", "dw"};
  }
}

// The outputs of an operation Verify checks so far.
std::vector<std::string> CheckedOutputsOf(VerifyOperation operation) {
  switch (operation) {
    case VerifyOperation::kCrossEntropy:
      return {"loss", "lse"};
    case VerifyOperation::kLogProbs:
      return {"logprob", "lse", "entropy"};
    default:
      return OutputsOf(operation);
  }
}

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
absl::Status CheckCandidateNames(const VerifyRequest& r, std::map<std::string, DType>* dtypes) {
  const std::vector<std::string> outputs = OutputsOf(r.operation);
  if (r.candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("candidates: expected at least one (",
                                                   VerifyOperationName(r.operation), " gives ",
                                                   absl::StrJoin(outputs, ", "), "), got none"));
  }
  for (const CallInput& c : r.candidates) {
    if (std::find(outputs.begin(), outputs.end(), c.name) == outputs.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "candidates: '", c.name, "' is not an output of ", VerifyOperationName(r.operation),
          " (it gives ", absl::StrJoin(outputs, ", "), ")"));
    }
    const std::optional<DType> dtype = DTypeOfName(c.dtype);
    if (dtype != DType::kFp32 && dtype != DType::kBf16) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.name, ": expected dtype FP32 or BF16 (the dtypes ",
                       VerifyOperationName(r.operation), " can give it in), got ", c.dtype));
    }
    if (!dtypes->emplace(c.name, *dtype).second) {
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

// The xxh3-64 the request announced for an input, else of its bytes.
std::uint64_t DigestOf(const CallInput& in, const void* data, std::uint64_t bytes) {
  if (in.xxh3.has_value()) return *in.xxh3;
  return Xxh3(data, bytes);
}

}  // namespace

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
// a dtype other than FP32 where the operation gives FP32 only.
absl::Status CheckedCandidates(const VerifyRequest& r, const std::map<std::string, DType>& dtypes) {
  const std::vector<std::string> checked = CheckedOutputsOf(r.operation);
  for (const auto& [name, dtype] : dtypes) {
    if (std::find(checked.begin(), checked.end(), name) == checked.end()) {
      return absl::UnimplementedError(
          absl::StrCat("candidates: ", VerifyOperationName(r.operation), "'s '", name,
                       "' is not checked yet; Verify checks its ", absl::StrJoin(checked, ", ")));
    }
    if (dtype != DType::kFp32) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected dtype FP32 (the dtype ",
                                                     VerifyOperationName(r.operation),
                                                     " gives it in), got ", DTypeName(dtype)));
    }
  }
  return absl::OkStatus();
}

// The operation's own plan, with the candidates' dtypes as its outputs' and
// no byte limit (Verify's is checked over everything it holds): fills the
// plan's dims and input bytes, and the shape of each output by name.
absl::Status PlanOperation(const VerifyRequest& r, const WeightDims& dims,
                           std::map<std::string, DType>& dtypes, VerifyPlan* plan,
                           std::map<std::string, std::vector<std::int64_t>>* shapes) {
  switch (r.operation) {
    case VerifyOperation::kLogits: {
      LOGITD_RETURN_IF_ERROR(NoneOf(r, false, true, false));
      LogitsRequest lr;
      lr.x = r.x;
      lr.out_dtype = UpperDTypeName(dtypes["y"]);
      lr.alpha = r.alpha;
      LOGITD_ASSIGN_OR_RETURN(const LogitsPlan lp, PlanLogits(lr, dims, kNoLimit));
      plan->m = lp.m;
      plan->alpha = lp.alpha;
      plan->x_bytes = lp.x_bytes;
      (*shapes)["y"] = {plan->m, plan->v};
      return absl::OkStatus();
    }
    case VerifyOperation::kBackward: {
      LOGITD_RETURN_IF_ERROR(NoneOf(r, true, false, false));
      BackwardRequest br;
      br.x = r.x;
      br.dy = r.dy;
      br.want_dx = dtypes.count("dx") > 0;
      br.want_dw = dtypes.count("dw") > 0;
      if (br.want_dx) br.dx_dtype = UpperDTypeName(dtypes["dx"]);
      if (br.want_dw) br.dw_dtype = UpperDTypeName(dtypes["dw"]);
      LOGITD_ASSIGN_OR_RETURN(const BackwardPlan bp, PlanBackward(br, dims, kNoLimit));
      plan->m = bp.m;
      plan->x_bytes = bp.x_bytes;
      plan->dy_bytes = bp.dy_bytes;
      plan->dy_dtype = bp.dy_dtype;
      (*shapes)["dx"] = {plan->m, plan->k};
      (*shapes)["dw"] = {plan->v, plan->k};
      return absl::OkStatus();
    }
    case VerifyOperation::kCrossEntropy: {
      LOGITD_RETURN_IF_ERROR(NoneOf(r, false, false, true));
      LOGITD_RETURN_IF_ERROR(CheckedCandidates(r, dtypes));
      CrossEntropyRequest cr = r.cross_entropy;
      cr.x = r.x;
      cr.targets = r.targets;
      cr.want_lse = dtypes.count("lse") > 0;
      LOGITD_ASSIGN_OR_RETURN(CrossEntropyPlan cp, PlanCrossEntropy(cr, dims, kNoLimit));
      plan->m = cp.m;
      plan->x_bytes = cp.x_bytes;
      plan->targets_dtype = cp.targets_dtype;
      plan->targets_bytes = cp.targets_bytes;
      (*shapes)["loss"] = cp.loss_shape;
      (*shapes)["lse"] = {plan->m};
      plan->cross_entropy = std::move(cp);
      return absl::OkStatus();
    }
    case VerifyOperation::kLogProbs: {
      LOGITD_RETURN_IF_ERROR(NoneOf(r, false, false, true));
      LOGITD_RETURN_IF_ERROR(CheckedCandidates(r, dtypes));
      if (dtypes.count("logprob") > 0 && !r.targets.given) {
        return absl::InvalidArgumentError(
            "targets: a logprob candidate is the log-probability of each row's target; give "
            "targets");
      }
      LogProbsRequest lr = r.logprobs;
      lr.x = r.x;
      lr.targets = r.targets;
      lr.want_lse = dtypes.count("lse") > 0;
      lr.want_entropy = dtypes.count("entropy") > 0;
      LOGITD_ASSIGN_OR_RETURN(LogProbsPlan lp, PlanLogProbs(lr, dims, kNoLimit));
      plan->m = lp.m;
      plan->x_bytes = lp.x_bytes;
      plan->targets_dtype = lp.targets_dtype;
      plan->targets_bytes = lp.targets_bytes;
      for (const char* name : {"logprob", "lse", "entropy"}) (*shapes)[name] = {plan->m};
      plan->logprobs = std::move(lp);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("operation: not one Verify knows");
  }
}

// Each candidate against the shape its output has; its plan, and its bytes
// and logitd's own output's among `parts`.
absl::Status PlanCandidates(const VerifyRequest& r,
                            const std::map<std::string, std::vector<std::int64_t>>& shapes,
                            const std::map<std::string, DType>& dtypes, VerifyPlan* plan,
                            std::vector<CallPart>* parts) {
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const CallInput& c = r.candidates[i];
    const std::vector<std::int64_t>& want = shapes.at(c.name);
    if (c.shape != want) {
      const char* dims_of = c.name == "y"    ? "[M, V]: x's M, the weight's V"
                            : c.name == "dx" ? "[M, K]: x's M, the weight's K"
                            : c.name == "dw" ? "[V, K]: the weight's"
                            : want.size() == 1 && want[0] == 1 &&
                                    r.operation == VerifyOperation::kCrossEntropy &&
                                    c.name == "loss"
                                ? "[1]: the reduced loss"
                                : "[M]: one per row of x";
      return absl::InvalidArgumentError(absl::StrCat(c.name, ": expected shape ", ShapeString(want),
                                                     " (", dims_of, "), got ",
                                                     ShapeString(c.shape)));
    }
    VerifyCandidatePlan p;
    p.name = c.name;
    p.dtype = dtypes.at(c.name);
    p.shape = want;
    p.bytes = ElementSize(p.dtype);
    for (std::int64_t d : want) p.bytes *= static_cast<std::uint64_t>(d);
    p.index = i;
    parts->push_back({c.name, p.dtype, p.shape, p.bytes});
    parts->push_back({absl::StrCat("logitd's ", c.name), p.dtype, p.shape, p.bytes});
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
    return CrossEntropyReferenceBytes(plan.m, plan.v, plan.k, /*with_gradients=*/false);
  }
  if (plan.logprobs.has_value()) return LogProbsReferenceBytes(plan.m, plan.v, plan.k);
  std::uint64_t reference = 0;
  for (const VerifyCandidatePlan& c : plan.candidates) {
    const std::uint64_t bytes = c.name == "y"    ? LogitsCheckBytes(checked, plan.v, plan.k)
                                : c.name == "dx" ? GradInputCheckBytes(checked, plan.v, plan.k)
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
  std::map<std::string, DType> dtypes;
  LOGITD_RETURN_IF_ERROR(CheckCandidateNames(r, &dtypes));
  LOGITD_RETURN_IF_ERROR(CheckDistinctNames(r));
  std::map<std::string, std::vector<std::int64_t>> shapes;
  LOGITD_RETURN_IF_ERROR(PlanOperation(r, dims, dtypes, &plan, &shapes));

  if (r.sample_rows > 0 && (plan.cross_entropy || plan.logprobs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample_rows: ", VerifyOperationName(r.operation),
        " checks every row (its reference is one pass over the vocabulary for all of them); "
        "give 0"));
  }
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
  for (const VerifyCandidatePlan& c : plan.candidates) own_bytes += c.bytes;
  plan.rows = SampleRows(plan.m, r.sample_rows);
  const std::uint64_t reference = ReferenceBytes(plan);
  parts.push_back({"fp64 references", DType::kFp32, {}, reference});
  if (!plan.weight_streamed) {
    parts.push_back({"the weight read back", DType::kBf16, {plan.v, plan.k}, plan.w_bytes});
  }
  // The cross-entropy's per-token losses, when the candidate is reduced.
  const std::uint64_t token_losses = plan.cross_entropy ? Mul(plan.m, 1, 4) : 0;
  if (token_losses > 0) parts.push_back({"per-token losses", DType::kFp32, {plan.m}, token_losses});
  plan.scratch_bytes = own_bytes + reference + (plan.weight_streamed ? 0 : plan.w_bytes) +
                       (r.targets.given ? Mul(plan.m, 1, 8) : 0) + token_losses;
  LOGITD_RETURN_IF_ERROR(CheckCallBytes("verify", parts, max_request_bytes));
  return plan;
}

std::string VerifyOutcome::Verdict() const {
  // Worst first.
  const char* const order[] = {"outside_bounds", "outside_probabilistic_bounds", "within_bounds",
                               "bitwise_equal_to_logitd"};
  std::size_t worst = 3;
  for (const VerifiedCandidate& c : candidates) {
    const std::string v = c.check.Verdict();
    for (std::size_t i = 0; i < worst; ++i) {
      if (v == order[i]) worst = i;
    }
  }
  return order[worst];
}

namespace {

// The weight on the backend, and its bf16 values on the host.
struct VerifyWeight {
  std::shared_ptr<kernels::Weight> weight;
  const Bf16Bits* host = nullptr;
  kernels::HostBuffer copy;  // a registered weight read back
  std::uint64_t xxh3 = 0;
};

// Declares every tensor of the call (a streamed weight charged to the
// weight budget and the tenant's quota before its bytes arrive, held by
// *reservation) and receives them.
absl::Status ReceiveVerify(const OpEnv& env, const VerifyRequest& r, const VerifyPlan& plan,
                           Call* call, Transport& transport, BudgetReservation* reservation) {
  if (plan.weight_streamed) {
    LOGITD_ASSIGN_OR_RETURN(
        *reservation,
        env.registry->ReserveWeight(call->tenant(), "verify's streamed w", plan.v, plan.k));
    LOGITD_RETURN_IF_ERROR(call->Input("w", r.w, plan.w_bytes));
  }
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  if (plan.operation == VerifyOperation::kBackward) {
    LOGITD_RETURN_IF_ERROR(call->Input("dy", r.dy, plan.dy_bytes));
  }
  if (r.targets.given)
    LOGITD_RETURN_IF_ERROR(call->Input("targets", r.targets, plan.targets_bytes));
  for (const VerifyCandidatePlan& c : plan.candidates) {
    LOGITD_RETURN_IF_ERROR(call->Input(c.name, r.candidates[c.index], c.bytes));
  }
  call->Scratch(plan.scratch_bytes);
  return call->Receive("verify", transport);
}

// A streamed weight loaded for this call; a registered one read back.
absl::StatusOr<VerifyWeight> WeightOfCall(const OpEnv& env, const VerifyRequest& r,
                                          const VerifyPlan& plan,
                                          const std::optional<WeightRecord>& record, Call* call) {
  VerifyWeight w;
  if (plan.weight_streamed) {
    w.host = call->in<Bf16Bits>("w");
    LOGITD_ASSIGN_OR_RETURN(w.weight, env.backend->LoadWeight(w.host, plan.v, plan.k));
    w.xxh3 = DigestOf(r.w, w.host, plan.w_bytes);
    return w;
  }
  w.weight = record->weight;
  LOGITD_ASSIGN_OR_RETURN(w.copy, env.backend->AllocateHost(plan.w_bytes));
  LOGITD_RETURN_IF_ERROR(env.backend->ReadWeight(*w.weight, w.copy.as<Bf16Bits>()));
  w.host = w.copy.as<Bf16Bits>();
  w.xxh3 = record->xxh3;
  return w;
}

// The cross-entropy's or LogProbs' options, for the inputs' digest.
std::string OptionsText(const VerifyPlan& plan) {
  if (plan.cross_entropy.has_value()) {
    const CrossEntropyPlan& c = *plan.cross_entropy;
    return absl::StrFormat(";ignore=%d;reduction=%d;z_loss=%08x;softcap=%08x;grad_scale=%08x",
                           c.ignore_index, static_cast<int>(c.reduction), FloatBits(c.z_loss),
                           FloatBits(c.logit_softcap), FloatBits(c.grad_scale));
  }
  if (plan.logprobs.has_value()) {
    const LogProbsPlan& l = *plan.logprobs;
    return absl::StrFormat(";ignore=%d;temperature=%08x;softcap=%08x;vocab=%d", l.ignore_index,
                           FloatBits(l.temperature), FloatBits(l.logit_softcap), l.vocab);
  }
  return "";
}

// The targets widened to int64 and checked against the vocabulary that
// counts; the tokens not ignored.
struct VerifyTargets {
  std::vector<std::int64_t> ids;  // empty when the call has none
  std::int64_t counted = 0;
};

absl::StatusOr<VerifyTargets> TargetsOfCall(const VerifyRequest& r, const VerifyPlan& plan,
                                            Call* call) {
  VerifyTargets t;
  if (!r.targets.given) return t;
  const std::int64_t vocab = plan.logprobs ? plan.logprobs->vocab : plan.v;
  const std::int64_t ignore =
      plan.logprobs ? plan.logprobs->ignore_index : plan.cross_entropy->ignore_index;
  LOGITD_ASSIGN_OR_RETURN(t.counted, ConvertTargets(plan.targets_dtype, call->in("targets"), plan.m,
                                                    vocab, ignore, &t.ids));
  return t;
}

// logitd's own cross-entropy of the call's inputs: the per-token losses
// (into `loss` when the candidate is per token, else reduced into it as the
// CrossEntropy RPC reduces them) and lse; either may be null.
absl::Status RunOwnCrossEntropy(const OpEnv& env, const CrossEntropyPlan& cp, Call* call,
                                kernels::Weight& weight, const VerifyTargets& targets, float* loss,
                                float* lse, kernels::Timing* timing) {
  const bool per_token = cp.reduction == Reduction::kNone && loss != nullptr;
  std::vector<float> token_loss(per_token ? 0 : static_cast<std::size_t>(cp.m));
  kernels::CrossEntropyArgs args;
  args.x = call->in<Bf16Bits>("x");
  args.m = cp.m;
  args.targets = targets.ids.data();
  args.ignore_index = cp.ignore_index;
  args.z_loss = cp.z_loss;
  args.logit_softcap = cp.logit_softcap;
  args.grad_scale = CrossEntropyGradScale(cp, targets.counted);
  args.loss = per_token ? loss : token_loss.data();
  args.lse = lse;
  LOGITD_RETURN_IF_ERROR(env.backend->CrossEntropy(weight, args, timing));
  if (loss != nullptr && !per_token) {
    *loss = ReduceLoss(cp, token_loss.data(), cp.m, targets.counted);
  }
  return absl::OkStatus();
}

// logitd's own outputs of the same inputs, by candidate name, in the
// candidates' dtypes.
absl::Status RunOwn(const OpEnv& env, const VerifyPlan& plan, Call* call, kernels::Weight& weight,
                    const VerifyTargets& targets, std::map<std::string, kernels::HostBuffer>* own,
                    kernels::Timing* timing) {
  for (const VerifyCandidatePlan& c : plan.candidates) {
    LOGITD_ASSIGN_OR_RETURN((*own)[c.name], env.backend->AllocateHost(c.bytes));
  }
  const auto out = [&](const std::string& name) -> std::byte* {
    auto it = own->find(name);
    return it == own->end() ? nullptr : it->second.data();
  };
  const auto dtype_of = [&](const std::string& name, DType fallback) {
    for (const VerifyCandidatePlan& c : plan.candidates) {
      if (c.name == name) return c.dtype;
    }
    return fallback;
  };
  if (plan.operation == VerifyOperation::kLogits) {
    kernels::LogitsArgs args;
    args.x = call->in<Bf16Bits>("x");
    args.m = plan.m;
    args.alpha = plan.alpha;
    args.out_dtype = dtype_of("y", DType::kFp32);
    args.y = out("y");
    return env.backend->Logits(weight, args, timing);
  }
  if (plan.cross_entropy.has_value()) {
    return RunOwnCrossEntropy(env, *plan.cross_entropy, call, weight, targets,
                              reinterpret_cast<float*>(out("loss")),
                              reinterpret_cast<float*>(out("lse")), timing);
  }
  if (plan.logprobs.has_value()) {
    const LogProbsPlan& lp = *plan.logprobs;
    kernels::LogProbsArgs args;
    args.x = call->in<Bf16Bits>("x");
    args.m = plan.m;
    args.targets = targets.ids.empty() ? nullptr : targets.ids.data();
    args.ignore_index = lp.ignore_index;
    args.temperature = lp.temperature;
    args.logit_softcap = lp.logit_softcap;
    args.vocab = lp.vocab;
    args.logprob = reinterpret_cast<float*>(out("logprob"));
    args.lse = reinterpret_cast<float*>(out("lse"));
    args.entropy = reinterpret_cast<float*>(out("entropy"));
    return env.backend->LogProbs(weight, args, timing);
  }
  kernels::BackwardArgs args;
  args.dy = call->in("dy");
  args.dy_dtype = plan.dy_dtype;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.dx = out("dx");
  args.dx_dtype = dtype_of("dx", DType::kBf16);
  args.dw = out("dw");
  args.dw_dtype = dtype_of("dw", DType::kFp32);
  return env.backend->Backward(weight, args, timing);
}

// Each candidate against the references and logitd's own output, one after
// the other; Cancelled when `stop` says the caller went away.
absl::Status CheckCandidates(const VerifyRequest& r, const VerifyPlan& plan, const LmHeadInputs& in,
                             Call* call, const std::map<std::string, kernels::HostBuffer>& own,
                             const StopCheck& stop, VerifyOutcome* outcome) {
  for (const VerifyCandidatePlan& c : plan.candidates) {
    VerifiedCandidate v{c.name, c.dtype, c.shape, 0, CandidateCheck(c.dtype)};
    const std::byte* data = call->in(c.name);
    const std::byte* mine = own.at(c.name).data();
    v.xxh3 = DigestOf(r.candidates[c.index], data, c.bytes);
    bool done = false;
    if (c.name == "y") {
      done = CheckLogits(in, plan.alpha, plan.rows, data, mine, c.dtype, &v.check, stop);
    } else if (c.name == "dx") {
      done = CheckGradInput(in, plan.rows, data, mine, c.dtype, &v.check, stop);
    } else {
      done = CheckGradWeight(in, data, mine, c.dtype, &v.check, stop);
    }
    if (!done) {
      return absl::CancelledError("verify: the caller went away while the references were formed");
    }
    outcome->candidates.push_back(std::move(v));
  }
  return absl::OkStatus();
}

// The per-token candidates of the cross-entropy or LogProbs against one
// reference of all of them (its proven bound is also the probabilistic
// one: these bounds have no probabilistic form yet).
absl::Status CheckPerToken(const VerifyRequest& r, const VerifyPlan& plan, const LmHeadInputs& in,
                           const VerifyTargets& targets, Call* call,
                           const std::map<std::string, kernels::HostBuffer>& own,
                           const StopCheck& stop, VerifyOutcome* outcome) {
  // name -> (values, bounds), each [M] or [1].
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> refs;
  bool done = false;
  if (plan.cross_entropy.has_value()) {
    const CrossEntropyPlan& cp = *plan.cross_entropy;
    CeReferenceOptions o;
    o.ignore_index = cp.ignore_index;
    o.reduction = cp.reduction == Reduction::kNone  ? CeReduction::kNone
                  : cp.reduction == Reduction::kSum ? CeReduction::kSum
                                                    : CeReduction::kMean;
    o.z_loss = cp.z_loss;
    o.logit_softcap = cp.logit_softcap;
    o.grad_scale = cp.grad_scale;
    CrossEntropyReference ref;
    done = ReferenceCrossEntropy(in, targets.ids.data(), o, LogitModel::kFp32Sum, &ref, {}, stop);
    refs["lse"] = {ref.lse, ref.lse_bound};
    if (o.reduction == CeReduction::kNone) {
      refs["loss"] = {ref.loss, ref.loss_bound};
    } else if (o.reduction == CeReduction::kSum) {
      refs["loss"] = {{ref.sum}, {ref.sum_bound}};
    } else {
      refs["loss"] = {{ref.mean}, {ref.mean_bound}};
    }
  } else {
    const LogProbsPlan& lp = *plan.logprobs;
    LpReferenceOptions o;
    o.ignore_index = lp.ignore_index;
    o.temperature = lp.temperature;
    o.logit_softcap = lp.logit_softcap;
    o.vocab_size = lp.vocab;
    LogProbsReference ref;
    done = ReferenceLogProbs(in, targets.ids.empty() ? nullptr : targets.ids.data(), o,
                             LogitModel::kFp32Sum, &ref, {}, stop);
    refs["logprob"] = {ref.logprob, ref.logprob_bound};
    refs["lse"] = {ref.lse, ref.lse_bound};
    refs["entropy"] = {ref.entropy, ref.entropy_bound};
  }
  if (!done) {
    return absl::CancelledError("verify: the caller went away while the references were formed");
  }
  for (const VerifyCandidatePlan& c : plan.candidates) {
    VerifiedCandidate v{c.name, c.dtype, c.shape, 0, CandidateCheck(c.dtype)};
    const std::byte* data = call->in(c.name);
    v.xxh3 = DigestOf(r.candidates[c.index], data, c.bytes);
    const auto& [values, bounds] = refs.at(c.name);
    v.check.AddRange(0, static_cast<std::int64_t>(values.size()), data, own.at(c.name).data(),
                     values.data(), bounds.data(), bounds.data());
    outcome->candidates.push_back(std::move(v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VerifyOutcome> RunVerify(const OpEnv& env, const VerifyRequest& r, Call* call,
                                        Transport& transport, const StopCheck& stop) {
  LOGITD_RETURN_IF_ERROR(CheckVerifyRequest(r));
  std::optional<WeightRecord> record;
  WeightDims registered;
  if (!r.weight_handle.empty()) {
    LOGITD_ASSIGN_OR_RETURN(record, FindWeight(*env.registry, call->tenant(), r.weight_handle));
    registered = WeightDims{record->v, record->k, record->Label()};
  }
  LOGITD_ASSIGN_OR_RETURN(const VerifyPlan plan,
                          PlanVerify(r, record ? &registered : nullptr, env.max_request_bytes));
  BudgetReservation reservation;
  LOGITD_RETURN_IF_ERROR(ReceiveVerify(env, r, plan, call, transport, &reservation));
  LOGITD_ASSIGN_OR_RETURN(VerifyWeight w, WeightOfCall(env, r, plan, record, call));
  LOGITD_ASSIGN_OR_RETURN(const VerifyTargets targets, TargetsOfCall(r, plan, call));
  VerifyOutcome outcome;
  std::map<std::string, kernels::HostBuffer> own;
  LOGITD_RETURN_IF_ERROR(RunOwn(env, plan, call, *w.weight, targets, &own, &outcome.timing));

  const absl::Time reference_start = absl::Now();
  LmHeadInputs in;
  in.x = call->in<Bf16Bits>("x");
  in.w = w.host;
  in.dy = call->in("dy");
  in.dy_dtype = plan.dy_dtype;
  in.m = plan.m;
  in.v = plan.v;
  in.k = plan.k;
  if (plan.cross_entropy || plan.logprobs) {
    LOGITD_RETURN_IF_ERROR(CheckPerToken(r, plan, in, targets, call, own, stop, &outcome));
  } else {
    LOGITD_RETURN_IF_ERROR(CheckCandidates(r, plan, in, call, own, stop, &outcome));
  }
  outcome.reference_us = Micros(absl::Now() - reference_start);
  outcome.rows = plan.rows;
  std::string inputs = absl::StrFormat("verify;%s;alpha=%08x;w=%016x;x=%016x;dy=%016x",
                                       VerifyOperationName(plan.operation), FloatBits(plan.alpha),
                                       w.xxh3, DigestOf(r.x, in.x, plan.x_bytes),
                                       r.dy.given ? DigestOf(r.dy, in.dy, plan.dy_bytes) : 0);
  if (r.targets.given) {
    absl::StrAppendFormat(&inputs, ";targets=%016x",
                          DigestOf(r.targets, call->in("targets"), plan.targets_bytes));
  }
  absl::StrAppend(&inputs, OptionsText(plan));
  outcome.inputs_xxh3 = Xxh3(inputs.data(), inputs.size());
  call->ReleaseInputs();
  call->Finish(outcome.timing);
  return outcome;
}

}  // namespace logitd::service

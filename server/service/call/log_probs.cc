// LogProbs: per-token log-probabilities of the fp32 logits and what is
// computed from them (lse, entropy, top-k, rank), without the [M, V] logits.
#include "server/kernels/ops/log_probs.h"

#include <cstdint>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kLogProbsInputs[] = {"x", "targets"};
constexpr absl::string_view kLogProbsOutputs[] = {"logprob",  "lse",           "entropy",
                                                  "topk_ids", "topk_logprobs", "rank"};

// LogProbs' slots: x and (optionally) targets in; the outputs asked for.
absl::Status LogProbsSlots(const LogProbsRequest& r, const LogProbsPlan& plan, Call* call) {
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  if (plan.has_targets) {
    LOGITD_RETURN_IF_ERROR(call->Input("targets", r.targets, plan.targets_bytes));
    LOGITD_RETURN_IF_ERROR(
        call->Output("logprob", DType::kFp32, {m}, plan.logprob_bytes, r.outputs));
  }
  if (plan.want_lse) {
    LOGITD_RETURN_IF_ERROR(call->Output("lse", DType::kFp32, {m}, plan.lse_bytes, r.outputs));
  }
  if (plan.want_entropy) {
    LOGITD_RETURN_IF_ERROR(
        call->Output("entropy", DType::kFp32, {m}, plan.entropy_bytes, r.outputs));
  }
  if (plan.top_k > 0) {
    LOGITD_RETURN_IF_ERROR(
        call->Output("topk_ids", DType::kInt32, {m, plan.top_k}, plan.topk_ids_bytes, r.outputs));
    LOGITD_RETURN_IF_ERROR(call->Output("topk_logprobs", DType::kFp32, {m, plan.top_k},
                                        plan.topk_logprobs_bytes, r.outputs));
  }
  if (plan.want_rank) {
    LOGITD_RETURN_IF_ERROR(call->Output("rank", DType::kInt64, {m}, plan.rank_bytes, r.outputs));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LogProbsRequest> LogProbsRequestFrom(RequestFields& f) {
  LogProbsRequest r;
  r.weight_handle = f.String("weight_handle");
  LOGITD_ASSIGN_OR_RETURN(r.x, f.Input("x"));
  LOGITD_ASSIGN_OR_RETURN(r.targets, f.OptionalInput("targets"));
  LogProbsOptionsFrom(f, &r);
  r.top_k = f.Int("top_k");
  r.want_entropy = f.Bool("want_entropy");
  r.want_lse = f.Bool("want_lse");
  r.want_rank = f.Bool("want_rank");
  r.outputs = f.Outputs(kLogProbsOutputs);
  return r;
}

void LogProbsOptionsFrom(RequestFields& f, LogProbsRequest* r) {
  r->ignore_index = f.OptionalInt("ignore_index");
  r->temperature = f.Float("temperature");
  r->logit_softcap = f.Float("logit_softcap");
  r->vocab_size = f.Int("vocab_size");
}

absl::StatusOr<OpResult> RunLogProbs(const OpEnv& env, const LogProbsRequest& r, Call* call,
                                     Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(*env.registry, call->tenant(), r.weight_handle));
  LOGITD_ASSIGN_OR_RETURN(const LogProbsPlan plan,
                          PlanLogProbs(r, DimsOf(w), env.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(LogProbsSlots(r, plan, call));
  // Besides the slots: the targets widened to int64.
  if (plan.has_targets) call->Scratch(static_cast<std::uint64_t>(plan.m) * sizeof(std::int64_t));
  call->ReadInPlace();
  // Sized once the call is admitted (the first block, or after Receive).
  std::vector<std::int64_t> targets;
  // Every output but the targets, which are widened as their rows arrive.
  const auto whole_args = [&] {
    kernels::LogProbsArgs args;
    args.weight = w.weight.get();
    args.x = call->in<Bf16Bits>("x");
    args.m = plan.m;
    args.targets = plan.has_targets ? targets.data() : nullptr;
    args.ignore_index = plan.ignore_index;
    args.temperature = plan.temperature;
    args.logit_softcap = plan.logit_softcap;
    args.vocab = plan.vocab;
    args.logprob = call->out<float>("logprob");
    args.lse = call->out<float>("lse");
    args.entropy = call->out<float>("entropy");
    args.top_k = plan.top_k;
    args.topk_ids = call->out<std::int32_t>("topk_ids");
    args.topk_logprobs = call->out<float>("topk_logprobs");
    args.rank = call->out<std::int64_t>("rank");
    return args;
  };
  // Rows [r0, r0 + rows): their targets checked and widened, then the block.
  const auto block = [&](std::int64_t r0, std::int64_t rows, kernels::Timing* t) -> absl::Status {
    if (plan.has_targets) {
      targets.resize(static_cast<std::size_t>(plan.m));
      LOGITD_RETURN_IF_ERROR(ConvertTargetRows(plan.targets_dtype, call->in("targets"), r0, rows,
                                               plan.vocab, plan.ignore_index, targets.data())
                                 .status());
    }
    return env.backend->Kernel(kernels::LogProbsRowsOf(whole_args(), w.k, r0, rows), t);
  };
  if (call->Pipelines(transport)) {
    return call->RunInRowBlocks("log probs", transport, plan.m,
                                env.backend->LogProbsBlockRows(*w.weight, plan.m), OpResult{},
                                block);
  }
  LOGITD_RETURN_IF_ERROR(call->Receive("log probs", transport));
  // Every target checked before anything is computed.
  if (plan.has_targets) {
    targets.resize(static_cast<std::size_t>(plan.m));
    LOGITD_RETURN_IF_ERROR(ConvertTargetRows(plan.targets_dtype, call->in("targets"), 0, plan.m,
                                             plan.vocab, plan.ignore_index, targets.data())
                               .status());
  }
  const kernels::LogProbsArgs args = whole_args();
  return Compute(call, [&](kernels::Timing* t) { return env.backend->Kernel(args, t); });
}

LOGITD_OPERATION(LogProbs, (TensorOperation<LogProbsRequest, &LogProbsRequestFrom, &RunLogProbs>(
                               "LogProbs", true, kLogProbsInputs, kLogProbsOutputs,
                               VerifyOperation::kLogProbs)));

}  // namespace logitd::service

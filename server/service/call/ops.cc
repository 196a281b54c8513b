#include "server/service/call/ops.h"

#include <cstring>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/kernels/ops/cast.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

WeightDims DimsOf(const WeightRecord& w) { return WeightDims{w.v, w.k, w.Label()}; }

// The backend's work, then the inputs let go and the outputs finished.
template <typename Run>
absl::StatusOr<OpResult> Compute(Call* call, Run run) {
  OpResult result;
  LOGITD_RETURN_IF_ERROR(run(&result.timing));
  // Inputs read in place matched their digest before any output is trusted.
  LOGITD_RETURN_IF_ERROR(call->CheckInPlace());
  call->ReleaseInputs();
  call->Finish(result.timing);
  return result;
}

// CrossEntropy's slots: x and targets in; loss always out, lse, dX and dW
// as asked.
absl::Status CrossEntropySlots(const CrossEntropyRequest& r, const CrossEntropyPlan& plan,
                               const WeightRecord& w, Call* call) {
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  LOGITD_RETURN_IF_ERROR(call->Input("targets", r.targets, plan.targets_bytes));
  LOGITD_RETURN_IF_ERROR(
      call->Output("loss", DType::kFp32, plan.loss_shape, plan.loss_bytes, r.outputs));
  if (plan.want_lse) {
    LOGITD_RETURN_IF_ERROR(call->Output("lse", DType::kFp32, {m}, plan.lse_bytes, r.outputs));
  }
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(call->Output("dx", plan.dx_dtype, {m, w.k}, plan.dx_bytes, r.outputs));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(call->Output("dw", DType::kFp32, {w.v, w.k}, plan.dw_bytes, r.outputs));
  }
  return absl::OkStatus();
}

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

absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view handle) {
  if (handle.empty()) {
    return absl::InvalidArgumentError(
        "weight_handle: expected a handle from RegisterWeight, got an empty string");
  }
  return registry.Find(tenant, handle);
}

absl::StatusOr<OpResult> RunLogits(const OpEnv& env, const LogitsRequest& r, Call* call,
                                   Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(*env.registry, call->tenant(), r.weight_handle));
  LOGITD_ASSIGN_OR_RETURN(const LogitsPlan plan, PlanLogits(r, DimsOf(w), env.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  LOGITD_RETURN_IF_ERROR(call->Output("y", plan.out_dtype, {plan.m, w.v}, plan.y_bytes, r.outputs));
  // Rows [r0, r0 + rows) of X to the same rows of Y.
  const auto rows_of = [&](std::int64_t r0, std::int64_t rows) {
    kernels::LogitsArgs args;
    args.x = call->in<Bf16Bits>("x") + r0 * w.k;
    args.m = rows;
    args.alpha = plan.alpha;
    args.out_dtype = plan.out_dtype;
    args.y = call->out("y") + static_cast<std::size_t>(r0 * w.v) * ElementSize(plan.out_dtype);
    return args;
  };
  call->ReadInPlace();
  if (call->Pipelines(transport)) {
    return call->RunInRowBlocks("logits", transport, plan.m,
                                env.backend->LogitsBlockRows(*w.weight, plan.m, plan.out_dtype),
                                OpResult{},
                                [&](std::int64_t r0, std::int64_t rows, kernels::Timing* t) {
                                  return env.backend->Logits(*w.weight, rows_of(r0, rows), t);
                                });
  }
  LOGITD_RETURN_IF_ERROR(call->Receive("logits", transport));
  const kernels::LogitsArgs args = rows_of(0, plan.m);
  return Compute(call, [&](kernels::Timing* t) { return env.backend->Logits(*w.weight, args, t); });
}

absl::StatusOr<OpResult> RunBackward(const OpEnv& env, const BackwardRequest& r, Call* call,
                                     Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(*env.registry, call->tenant(), r.weight_handle));
  LOGITD_ASSIGN_OR_RETURN(const BackwardPlan plan,
                          PlanBackward(r, DimsOf(w), env.max_request_bytes));
  // The gradient buffer is charged to the budget before the backend may
  // create it, and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, env.registry->BeginAccumulate(call->tenant(), w.handle));
  }
  LOGITD_RETURN_IF_ERROR(call->Input("dy", r.dy, plan.dy_bytes));
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(
        call->Output("dx", plan.dx_dtype, {plan.m, w.k}, plan.dx_bytes, r.outputs));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(call->Output("dw", plan.dw_dtype, {w.v, w.k}, plan.dw_bytes, r.outputs));
  }
  call->ReadInPlace();
  LOGITD_RETURN_IF_ERROR(call->Receive("backward", transport));
  kernels::BackwardArgs args;
  args.dy = call->in("dy");
  args.dy_dtype = plan.dy_dtype;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.dx = call->out("dx");
  args.dx_dtype = plan.dx_dtype;
  args.dw = call->out("dw");
  args.dw_dtype = plan.dw_dtype;
  args.accumulate_dw = plan.accumulate_dw;
  return Compute(call,
                 [&](kernels::Timing* t) { return env.backend->Backward(*w.weight, args, t); });
}

absl::StatusOr<OpResult> RunCast(const OpEnv& env, const CastRequest& r, Call* call,
                                 Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(const CastPlan plan, PlanCast(r, env.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(call->Input("input", r.input, plan.in_bytes));
  LOGITD_RETURN_IF_ERROR(
      call->Output("output", DType::kBf16, plan.shape, plan.out_bytes, r.outputs));
  call->ReadInPlace();
  LOGITD_RETURN_IF_ERROR(call->Receive("cast", transport));
  return Compute(call, [&](kernels::Timing* t) {
    return env.backend->Kernel(
        kernels::CastArgs{call->in<float>("input"), plan.n, call->out<Bf16Bits>("output")}, t);
  });
}

namespace {

// One cross-entropy call's targets and losses, and its rows as the
// backend takes them.
class CrossEntropyCall {
 public:
  CrossEntropyCall(const OpEnv& env, const CrossEntropyPlan& plan, const WeightRecord& w,
                   Call* call)
      : env_(env), plan_(plan), w_(w), call_(call) {}

  // Every target checked (before anything is computed), counted, widened;
  // the per-token losses a reduced loss is formed from.
  absl::Status ConvertTargets() {
    LOGITD_ASSIGN_OR_RETURN(
        counted_, logitd::service::ConvertTargets(plan_.targets_dtype, call_->in("targets"),
                                                  plan_.m, w_.v, plan_.ignore_index, &targets_));
    if (!per_token()) {
      LOGITD_ASSIGN_OR_RETURN(token_loss_, env_.backend->AllocateHost(plan_.m * sizeof(float)));
    }
    return absl::OkStatus();
  }

  // Rows [r0, r0 + rows) of every input and output (the loss per token).
  kernels::CrossEntropyArgs Rows(std::int64_t r0, std::int64_t rows) const {
    kernels::CrossEntropyArgs args;
    args.weight = w_.weight.get();
    args.x = call_->in<Bf16Bits>("x") + r0 * w_.k;
    args.m = rows;
    args.targets = targets_.data() + r0;
    args.ignore_index = plan_.ignore_index;
    args.z_loss = plan_.z_loss;
    args.logit_softcap = plan_.logit_softcap;
    args.grad_scale = CrossEntropyGradScale(plan_, counted_);
    args.loss = (per_token() ? call_->out<float>("loss") : token_loss_.as<float>()) + r0;
    args.lse = plan_.want_lse ? call_->out<float>("lse") + r0 : nullptr;
    args.dx = plan_.want_dx ? call_->out("dx") +
                                  static_cast<std::size_t>(r0 * w_.k) * ElementSize(plan_.dx_dtype)
                            : nullptr;
    args.dx_dtype = plan_.dx_dtype;
    args.dw = call_->out<float>("dw");
    args.accumulate_dw = plan_.accumulate_dw;
    return args;
  }

  // The reduced loss, once every token's is in.
  absl::Status Reduce() {
    if (!per_token()) {
      const float reduced = ReduceLoss(plan_, token_loss_.as<float>(), plan_.m, counted_);
      std::memcpy(call_->out("loss"), &reduced, sizeof(float));
    }
    return absl::OkStatus();
  }

  std::int64_t counted() const { return counted_; }

 private:
  bool per_token() const { return plan_.reduction == Reduction::kNone; }

  const OpEnv& env_;
  const CrossEntropyPlan& plan_;
  const WeightRecord& w_;
  Call* const call_;
  std::vector<std::int64_t> targets_;
  kernels::HostBuffer token_loss_;
  std::int64_t counted_ = 0;
};

}  // namespace

absl::StatusOr<OpResult> RunCrossEntropy(const OpEnv& env, const CrossEntropyRequest& r, Call* call,
                                         Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(*env.registry, call->tenant(), r.weight_handle));
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyPlan plan,
                          PlanCrossEntropy(r, DimsOf(w), env.max_request_bytes));
  // As in Backward: the buffer is charged before the backend may create it
  // and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, env.registry->BeginAccumulate(call->tenant(), w.handle));
  }
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(CrossEntropySlots(r, plan, w, call));
  // Besides the slots: the targets widened to int64 and the per-token losses
  // the backend always writes (a reduced loss is formed from them here).
  call->Scratch(static_cast<std::uint64_t>(m) * (sizeof(std::int64_t) + sizeof(float)));
  call->ReadInPlace();
  CrossEntropyCall ce(env, plan, w, call);
  // In row blocks without dW (dW sums over every row): the targets whole
  // first (a mean's scale counts them all; the clients send them first),
  // then each block as its rows of X arrive, the reduced loss last.
  if (call->Pipelines(transport) && !plan.returns_dw() && !plan.accumulate_dw) {
    Call::RowBlockSteps steps;
    steps.before = [&](const Call::RowBlockSteps::WaitWhole& whole, OpResult* early) {
      LOGITD_RETURN_IF_ERROR(whole("targets"));
      LOGITD_RETURN_IF_ERROR(ce.ConvertTargets());
      early->counted_tokens = ce.counted();
      return absl::OkStatus();
    };
    steps.after = [&] { return ce.Reduce(); };
    LOGITD_ASSIGN_OR_RETURN(OpResult result,
                            call->RunInRowBlocks(
                                "cross entropy", transport, m,
                                env.backend->CrossEntropyBlockRows(*w.weight, m), OpResult{},
                                [&](std::int64_t r0, std::int64_t rows, kernels::Timing* t) {
                                  return env.backend->Kernel(ce.Rows(r0, rows), t);
                                },
                                steps));
    result.counted_tokens = ce.counted();
    return result;
  }
  LOGITD_RETURN_IF_ERROR(call->Receive("cross entropy", transport));
  LOGITD_RETURN_IF_ERROR(ce.ConvertTargets());
  const kernels::CrossEntropyArgs args = ce.Rows(0, m);
  LOGITD_ASSIGN_OR_RETURN(OpResult result, Compute(call, [&](kernels::Timing* t) {
                            LOGITD_RETURN_IF_ERROR(env.backend->Kernel(args, t));
                            return ce.Reduce();
                          }));
  result.counted_tokens = ce.counted();
  return result;
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

}  // namespace logitd::service

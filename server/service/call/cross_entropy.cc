// CrossEntropy: the fused loss of the logits X.W^T against the targets,
// with its lse, dX and dW, without the [M, V] logits.
#include "server/kernels/ops/cross_entropy.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kCrossEntropyInputs[] = {"x", "targets"};
constexpr absl::string_view kCrossEntropyOutputs[] = {"loss", "lse", "dx", "dw"};

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

Reduction ReductionOfName(const std::string& name, std::string* unknown) {
  if (name == "REDUCTION_UNSPECIFIED") return Reduction::kUnspecified;
  if (name == "REDUCTION_NONE") return Reduction::kNone;
  if (name == "REDUCTION_SUM") return Reduction::kSum;
  if (name == "REDUCTION_MEAN") return Reduction::kMean;
  *unknown = name;
  return Reduction::kUnspecified;
}

absl::StatusOr<CrossEntropyRequest> CrossEntropyRequestFrom(RequestFields& f) {
  CrossEntropyRequest r;
  r.weight_handle = f.String("weight_handle");
  r.want_lse = f.Bool("want_lse");
  r.want_dx = f.Bool("want_dx");
  r.want_dw = f.Bool("want_dw");
  r.accumulate_dw = f.Bool("accumulate_dw");
  LOGITD_ASSIGN_OR_RETURN(r.x, f.Input("x"));
  LOGITD_ASSIGN_OR_RETURN(r.targets, f.Input("targets"));
  CrossEntropyOptionsFrom(f, &r);
  r.dx_dtype = f.DType("dx_dtype");
  r.outputs = f.Outputs(kCrossEntropyOutputs);
  return r;
}

void CrossEntropyOptionsFrom(RequestFields& f, CrossEntropyRequest* r) {
  r->ignore_index = f.OptionalInt("ignore_index");
  r->reduction = ReductionOfName(f.Enum("reduction"), &r->reduction_unknown);
  r->z_loss = f.Float("z_loss");
  r->logit_softcap = f.Float("logit_softcap");
  r->grad_scale = f.Float("grad_scale");
}

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
      early->figures = {{"counted_tokens", ce.counted()}};
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
    result.figures = {{"counted_tokens", ce.counted()}};
    return result;
  }
  LOGITD_RETURN_IF_ERROR(call->Receive("cross entropy", transport));
  LOGITD_RETURN_IF_ERROR(ce.ConvertTargets());
  const kernels::CrossEntropyArgs args = ce.Rows(0, m);
  LOGITD_ASSIGN_OR_RETURN(OpResult result, Compute(call, [&](kernels::Timing* t) {
                            LOGITD_RETURN_IF_ERROR(env.backend->Kernel(args, t));
                            return ce.Reduce();
                          }));
  result.figures = {{"counted_tokens", ce.counted()}};
  return result;
}

LOGITD_OPERATION(CrossEntropy,
                 (TensorOperation<CrossEntropyRequest, &CrossEntropyRequestFrom, &RunCrossEntropy>(
                     "CrossEntropy", true, kCrossEntropyInputs, kCrossEntropyOutputs,
                     VerifyOperation::kCrossEntropy)));

}  // namespace logitd::service

// Backward: G = bf16(dY) once; dX = G.W and dW = G^T.X, returned or
// accumulated into the weight's fp32 gradient buffer.
#include <cstdint>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kBackwardInputs[] = {"dy", "x"};
constexpr absl::string_view kBackwardOutputs[] = {"dx", "dw"};

}  // namespace

absl::StatusOr<BackwardRequest> BackwardRequestFrom(RequestFields& f) {
  BackwardRequest r;
  r.weight_handle = f.String("weight_handle");
  r.want_dx = f.Bool("want_dx");
  r.want_dw = f.Bool("want_dw");
  r.accumulate_dw = f.Bool("accumulate_dw");
  LOGITD_ASSIGN_OR_RETURN(r.x, f.Input("x"));
  LOGITD_ASSIGN_OR_RETURN(r.dy, f.Input("dy"));
  r.dx_dtype = f.DType("dx_dtype");
  r.dw_dtype = f.DType("dw_dtype");
  r.outputs = f.Outputs(kBackwardOutputs);
  return r;
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

LOGITD_OPERATION(Backward, (TensorOperation<BackwardRequest, &BackwardRequestFrom, &RunBackward>(
                               "Backward", true, kBackwardInputs, kBackwardOutputs,
                               VerifyOperation::kBackward)));

}  // namespace logitd::service

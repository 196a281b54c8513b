// Logits: Y[M, V] = alpha * X.W^T, fp32 or bf16 out; run whole or in row
// blocks (the backend's LogitsBlockRows).
#include <cstdint>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kLogitsInputs[] = {"x"};
constexpr absl::string_view kLogitsOutputs[] = {"y"};

}  // namespace

absl::StatusOr<LogitsRequest> LogitsRequestFrom(RequestFields& f) {
  LogitsRequest r;
  r.weight_handle = f.String("weight_handle");
  LOGITD_ASSIGN_OR_RETURN(r.x, f.Input("x"));
  r.out_dtype = f.DType("out_dtype");
  r.alpha = f.Float("alpha");
  r.outputs = f.Outputs(kLogitsOutputs);
  return r;
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

LOGITD_OPERATION(Logits,
                 (TensorOperation<LogitsRequest, &LogitsRequestFrom, &RunLogits>(
                     "Logits", true, kLogitsInputs, kLogitsOutputs, VerifyOperation::kLogits)));

}  // namespace logitd::service

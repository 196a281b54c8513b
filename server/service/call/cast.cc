// Cast: fp32 to bf16, round to nearest even, any shape.
#include "server/kernels/ops/cast.h"

#include <cstdint>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kCastInputs[] = {"input"};
constexpr absl::string_view kCastOutputs[] = {"output"};

}  // namespace

absl::StatusOr<CastRequest> CastRequestFrom(RequestFields& f) {
  CastRequest r;
  LOGITD_ASSIGN_OR_RETURN(r.input, f.Input("input"));
  r.outputs = f.Outputs(kCastOutputs);
  return r;
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

LOGITD_OPERATION(Cast, (TensorOperation<CastRequest, &CastRequestFrom, &RunCast>(
                           "Cast", true, kCastInputs, kCastOutputs, std::nullopt)));

}  // namespace logitd::service

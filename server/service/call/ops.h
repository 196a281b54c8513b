// What every operation's run uses, the same for every front door: the
// weight the request names, the plan (plans.h), the call's slots, one
// admission and reception (call.h), the backend, and what the call reports
// besides its outputs. The front door read its request before and delivers
// the outputs after. Each operation's run is in its own file in call/,
// which registers its row (operations.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/kernels/backend.h"
#include "server/service/call/call.h"
#include "server/service/call/plans.h"
#include "server/service/call/request.h"
#include "server/service/call/request_fields.h"
#include "server/service/state/registry.h"

namespace logitd::service {

// What an operation uses of the service, which owns it all.
struct OpEnv {
  kernels::Backend* backend = nullptr;
  WeightRegistry* registry = nullptr;
  std::uint64_t max_request_bytes = 0;
};

// The weight a call names: a missing handle is InvalidArgument, an unknown
// one NotFound (another tenant's too).
absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view handle);
// How plans and messages see a registered weight.
WeightDims DimsOf(const WeightRecord& w);

// The backend's work (`run(kernels::Timing*)`), then the inputs let go and
// the outputs finished.
template <typename Run>
absl::StatusOr<OpResult> Compute(Call* call, Run run) {
  OpResult result;
  if (absl::Status s = run(&result.timing); !s.ok()) return s;
  // Inputs read in place matched their digest before any output is trusted.
  if (absl::Status s = call->CheckInPlace(); !s.ok()) return s;
  call->ReleaseInputs();
  call->Finish(result.timing);
  return result;
}

// The operations other layers run directly (the Open Inference Protocol's
// models, v1's validation), each in its own file in call/ (logits.cc, ...):
// the request read from a request's fields, and the run.
absl::StatusOr<LogitsRequest> LogitsRequestFrom(RequestFields& fields);
absl::StatusOr<BackwardRequest> BackwardRequestFrom(RequestFields& fields);
absl::StatusOr<CastRequest> CastRequestFrom(RequestFields& fields);
absl::StatusOr<CrossEntropyRequest> CrossEntropyRequestFrom(RequestFields& fields);
absl::StatusOr<LogProbsRequest> LogProbsRequestFrom(RequestFields& fields);
// The options alone, as Verify's header carries them in a block of the
// operation's own header type.
void CrossEntropyOptionsFrom(RequestFields& fields, CrossEntropyRequest* request);
void LogProbsOptionsFrom(RequestFields& fields, LogProbsRequest* request);
// A reduction by its name in the proto ("REDUCTION_MEAN"); *unknown receives
// any other name (refused by the plan, naming it).
Reduction ReductionOfName(const std::string& name, std::string* unknown);

absl::StatusOr<OpResult> RunLogits(const OpEnv& env, const LogitsRequest& request, Call* call,
                                   Transport& transport);
absl::StatusOr<OpResult> RunBackward(const OpEnv& env, const BackwardRequest& request, Call* call,
                                     Transport& transport);
absl::StatusOr<OpResult> RunCast(const OpEnv& env, const CastRequest& request, Call* call,
                                 Transport& transport);
absl::StatusOr<OpResult> RunCrossEntropy(const OpEnv& env, const CrossEntropyRequest& request,
                                         Call* call, Transport& transport);
absl::StatusOr<OpResult> RunLogProbs(const OpEnv& env, const LogProbsRequest& request, Call* call,
                                     Transport& transport);

}  // namespace logitd::service

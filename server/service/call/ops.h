// One run per operation, the same for every front door: the weight the
// request names, the plan (plans.h), the call's slots, one admission and
// reception (call.h), the backend, and what the call reports besides its
// outputs. The front door translated its request before and delivers the
// outputs after.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/kernels/backend.h"
#include "server/service/call/call.h"
#include "server/service/call/request.h"
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

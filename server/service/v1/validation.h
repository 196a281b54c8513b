// Checks of logitd.v1's requests that are this wire's own, as pure
// functions tested without gRPC: weight uploads and loads, probes, handles;
// and the tensor-call headers through the one validation every front door
// shares (call/plans.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "server/service/call/plans.h"

namespace logitd::service {

// The longest weight name a registration takes.
inline constexpr std::size_t kMaxWeightNameBytes = 1024;

// A weight upload's header, checked: BF16, rank 2 [V, K], no overflow.
struct WeightPlan {
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::uint64_t bytes = 0;
};
absl::StatusOr<WeightPlan> ValidateRegisterWeight(const v1::RegisterWeightHeader& header);
// The plan of a weight of `shape` (from a file): rank 2 [V, K], no overflow.
absl::StatusOr<WeightPlan> WeightPlanOf(const std::vector<std::int64_t>& shape);

// logitd.v1's tensor-call headers checked: translated (v1/requests.h) and
// planned (call/plans.h), as the handlers do, for the tests and the fuzzer.
absl::StatusOr<LogitsPlan> ValidateLogits(const v1::LogitsHeader& header, const WeightDims& weight,
                                          std::uint64_t max_request_bytes);
absl::StatusOr<BackwardPlan> ValidateBackward(const v1::BackwardHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes);
absl::StatusOr<CastPlan> ValidateCast(const v1::CastHeader& header,
                                      std::uint64_t max_request_bytes);
absl::StatusOr<CrossEntropyPlan> ValidateCrossEntropy(const v1::CrossEntropyHeader& header,
                                                      const WeightDims& weight,
                                                      std::uint64_t max_request_bytes);
absl::StatusOr<LogProbsPlan> ValidateLogProbs(const v1::LogProbsHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes);

// The file a LoadWeight request names, confined to the server's weights
// directory `dir`: `relative` is resolved against the canonical `dir`, with
// symbolic links followed, and the result must lie inside it. Returns the
// resolved path of an existing regular file.
//   FailedPrecondition: `dir` is empty (no --weights_dir) or cannot be resolved.
//   InvalidArgument: `relative` is empty, holds a NUL byte or names a
//     directory or other non-regular file.
//   PermissionDenied: `relative` is absolute, has a ".." component, or
//     resolves (through symbolic links) outside `dir`.
//   NotFound: nothing exists at the resolved path.
absl::StatusOr<std::filesystem::path> ResolveWeightPath(const std::filesystem::path& dir,
                                                        absl::string_view relative);

// A Probe call's header, checked.
struct ProbePlan {
  std::uint64_t request_bytes = 0;
  std::uint64_t response_bytes = 0;
  std::size_t chunk_bytes = 0;
};
// chunk_bytes 0 becomes the server's `chunk_bytes`; more than that is
// InvalidArgument. ResourceExhausted when request and response bytes together
// exceed max_request_bytes (or overflow).
absl::StatusOr<ProbePlan> ValidateProbe(const v1::ProbeHeader& header, std::size_t chunk_bytes,
                                        std::uint64_t max_request_bytes);

// A weight_handle/handle field: InvalidArgument when empty (a missing field,
// not an unknown handle, which the registry reports as NotFound).
absl::Status ValidateHandle(absl::string_view handle);

}  // namespace logitd::service

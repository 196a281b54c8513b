// logitd.v1's tensor-call headers translated into the protocol-neutral
// requests of call/request.h, after the checks only this wire has: every
// tensor the call needs has a TensorSpec with a name (its chunks name it)
// and an xxh3 (a request's digest is always sent), and the names of one
// call's inputs differ. Its shared-memory slots resolve through the
// service's RegisterShm regions, for the caller's tenant.
#pragma once

#include "absl/status/statusor.h"
#include "logitd/v1/logitd.pb.h"
#include "server/service/call/request.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"

namespace logitd::service {

// Where a request's shared-memory slots resolve.
struct V1Shm {
  const ShmRegistry* registry = nullptr;
  Tenant tenant;
};

absl::StatusOr<LogitsRequest> LogitsRequestOf(const v1::LogitsHeader& header, const V1Shm& shm);
absl::StatusOr<BackwardRequest> BackwardRequestOf(const v1::BackwardHeader& header,
                                                  const V1Shm& shm);
absl::StatusOr<CastRequest> CastRequestOf(const v1::CastHeader& header, const V1Shm& shm);
absl::StatusOr<CrossEntropyRequest> CrossEntropyRequestOf(const v1::CrossEntropyHeader& header,
                                                          const V1Shm& shm);
absl::StatusOr<LogProbsRequest> LogProbsRequestOf(const v1::LogProbsHeader& header,
                                                  const V1Shm& shm);

// Verify's header: the weight by handle or streamed, the inputs, the
// candidates (each named as the operation names its output), and the
// shared-memory slots of any of them by name; a slot for a tensor the
// header does not have is refused, naming it.
absl::StatusOr<VerifyRequest> VerifyRequestOf(const v1::VerifyHeader& header, const V1Shm& shm);

// A TensorSpec's dtype as requests spell it: "FP32", or "unknown dtype 17"
// for a value this build does not know.
std::string ProtoDTypeName(v1::DType dtype);

// The header's checks of a request tensor: present, named, with a digest
// unless it is `streamed` (its digest may then follow its chunks).
absl::Status CheckRequestSpec(absl::string_view what, bool present, const v1::TensorSpec& spec,
                              bool streamed);

}  // namespace logitd::service

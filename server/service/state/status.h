// The one mapping from absl::Status (what every layer of logitd returns) to
// grpc::Status (what a handler hands back). The early-return macros are
// logitd/status_macros.h's, included here for the handlers.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "logitd/status_macros.h"

namespace logitd::service {

// Same code, same message. Every absl code has a gRPC code of the same name.
grpc::Status ToGrpcStatus(const absl::Status& status);
grpc::StatusCode ToGrpcCode(absl::StatusCode code);

}  // namespace logitd::service

// The one mapping from absl::Status (what every layer of logitd returns) to
// grpc::Status (what a handler hands back), plus the two early-return macros
// the handlers use to stay thin.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace logitd::service {

// Same code, same message. Every absl code has a gRPC code of the same name.
grpc::Status ToGrpcStatus(const absl::Status& status);
grpc::StatusCode ToGrpcCode(absl::StatusCode code);

}  // namespace logitd::service

#define LOGITD_STATUS_CONCAT_INNER_(a, b) a##b
#define LOGITD_STATUS_CONCAT_(a, b) LOGITD_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when it is not OK.
#define LOGITD_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    const ::absl::Status logitd_status_ = (expr);    \
    if (!logitd_status_.ok()) return logitd_status_; \
  } while (false)

// `LOGITD_ASSIGN_OR_RETURN(T x, StatusOrExpr);` declares x from the value, or
// returns the error from the enclosing function.
#define LOGITD_ASSIGN_OR_RETURN(lhs, expr) \
  LOGITD_ASSIGN_OR_RETURN_IMPL_(LOGITD_STATUS_CONCAT_(logitd_statusor_, __LINE__), lhs, expr)
#define LOGITD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()

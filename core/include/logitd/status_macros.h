// The early-return macros every layer of logitd uses with absl::Status and
// absl::StatusOr, in one place.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

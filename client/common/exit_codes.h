// The exit codes of every logitctl command, the validation harness and
// `logitctl verify` included: one rule.
//   0  success: every check passed
//   1  a check failed (a verdict, a bound, a digest), or the server failed the
//      operation itself (INTERNAL, DATA_LOSS, UNKNOWN, a deadline, ...)
//   2  a usage or input error: the command line, a local file, what the
//      server refuses of what was sent (IsInputError: a shape, a dtype, an
//      unknown handle, a size past its limits), or a server that cannot be
//      reached or refuses this client (IsServerUnreachable)
#ifndef LOGITD_CLIENT_COMMON_EXIT_CODES_H_
#define LOGITD_CLIENT_COMMON_EXIT_CODES_H_

#include "absl/status/status.h"

namespace logitd::exit_codes {

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;

// The server cannot be reached, or refuses this client.
inline bool IsServerUnreachable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return true;
    default:
      return false;
  }
}

// The server refuses what was sent: the caller's input, as a usage error is.
inline bool IsInputError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

// The exit code of a command that ends with `status` from the server.
inline int ForStatus(const absl::Status& status) {
  if (status.ok()) return kOk;
  return IsInputError(status) || IsServerUnreachable(status) ? kUsage : kFailed;
}

}  // namespace logitd::exit_codes

#endif  // LOGITD_CLIENT_COMMON_EXIT_CODES_H_

// The absl -> gRPC status mapping: every code keeps its meaning and message.
#include "server/service/state/status.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace logitd::service {
namespace {

TEST(StatusMapping, EveryCodeMapsToItsNamesake) {
  const std::vector<std::pair<absl::StatusCode, grpc::StatusCode>> cases = {
      {absl::StatusCode::kOk, grpc::StatusCode::OK},
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [from, to] : cases) {
    EXPECT_EQ(ToGrpcCode(from), to) << absl::StatusCodeToString(from);
    if (from == absl::StatusCode::kOk) continue;
    const grpc::Status g = ToGrpcStatus(absl::Status(from, "what came"));
    EXPECT_EQ(g.error_code(), to);
    EXPECT_EQ(g.error_message(), "what came");
  }
}

TEST(StatusMapping, OkIsOk) { EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok()); }

TEST(StatusMapping, UnknownCodeIsNotOk) {
  EXPECT_EQ(ToGrpcCode(static_cast<absl::StatusCode>(99)), grpc::StatusCode::UNKNOWN);
}

absl::Status Fails() { return absl::NotFoundError("nope"); }
absl::StatusOr<int> Value(bool ok) {
  if (!ok) return absl::DataLossError("lost");
  return 7;
}

absl::Status UsesMacros(bool first_ok, bool second_ok, int* out) {
  if (!first_ok) LOGITD_RETURN_IF_ERROR(Fails());
  LOGITD_ASSIGN_OR_RETURN(const int v, Value(second_ok));
  *out = v;
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnEarlyWithTheError) {
  int v = 0;
  EXPECT_EQ(UsesMacros(false, true, &v).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(UsesMacros(true, false, &v).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(UsesMacros(true, true, &v).ok());
  EXPECT_EQ(v, 7);
}

}  // namespace
}  // namespace logitd::service

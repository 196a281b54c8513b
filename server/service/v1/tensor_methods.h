// logitd.v1's tensor calls, served from the operations' table
// (call/operations.h) through gRPC's callback generic service rather than a
// generated override per method: every row with a `run` is a method of
// logitd.v1.Logitd the service marks generic (tensor_handlers.cc) and serves
// here, with no code of its own in v1. Its messages are read as any tensor
// call's (logitd/service/tensor_call.proto): the header parsed as the
// method's own header type and read by its fields' names
// (V1RequestFields), the result built as the method's own result type. So
// an operation is served once its row exists: read the header, run the
// operation every front door runs, respond.
// tests/service/tensor_methods_test.cc serves every row this way.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/service/call/operations.h"
#include "server/service/call/ops.h"
#include "server/service/state/shm.h"
#include "server/service/transport/call_runner.h"
#include "server/service/transport/raw_stream.h"
#include "server/service/v1/tensor_call.h"

namespace logitd::service {

// What a tensor method uses of the service, which owns it all.
struct V1Env {
  TensorCallEnv tensor;
  OpEnv op;
  const ShmRegistry* shm = nullptr;
  const CallRunner* runner = nullptr;
  std::size_t max_receive_message_bytes = 0;
};

// The header and result types of logitd.v1.Logitd's `method` when its
// request and response have a tensor call's shape (a oneof of header or
// result = 1, TensorChunk chunk = 2, TensorDigest digest = 3); Internal
// naming what differs otherwise.
absl::StatusOr<AnyTypes> TensorCallTypes(absl::string_view method);

// Serves one call of the row `op` (its `run` set) on its own thread
// (raw_stream.h): the call's status.
grpc::Status ServeOperation(const V1Env& env, const OperationInfo& op,
                            grpc::CallbackServerContext* context, RawStream* raw);

}  // namespace logitd::service

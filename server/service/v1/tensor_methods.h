// logitd.v1's bidirectional tensor calls in one table (tensor_methods.cc):
// a row per method, served through gRPC's callback generic service rather
// than a generated override per method. The service marks each row's
// method generic and hands its calls here (service.cc), so a method of the
// proto is served once its row exists, with no override, no raw-method
// template and no handler declaration of its own. Most rows are one
// instance of ServeTensorOp: read the header, translate it
// (v1/requests.h), run the operation every front door runs (call/ops.h),
// respond. tests/service/tensor_methods_test.cc holds the table to the
// operations table (call/operations.h): every tensor operation has its row.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "logitd/status_macros.h"
#include "server/service/call/ops.h"
#include "server/service/state/shm.h"
#include "server/service/transport/call_runner.h"
#include "server/service/transport/message_stream.h"
#include "server/service/transport/raw_stream.h"
#include "server/service/v1/requests.h"
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

// Serves one call of `method` on its own thread (raw_stream.h): the call's
// status.
using V1Serve = grpc::Status (*)(const V1Env& env, absl::string_view method,
                                 grpc::CallbackServerContext* context, RawStream* raw);

struct V1Method {
  // The method of logitd.v1.Logitd ("Logits").
  absl::string_view method;
  V1Serve serve;
};

// The rows, in the proto's order. Verify is not among them: its handler is
// the service's own (verify_handler.cc), dispatched the same way.
absl::Span<const V1Method> V1TensorMethods();
// The row of `method`; null for none.
const V1Method* FindV1TensorMethod(absl::string_view method);

// A tensor operation's call: `Of` translates the header (`Header Of(const
// Request::header&, const V1Shm&)`), `Run` runs it (ops.h), `Fill`, when
// given, adds the operation's own figures to the result.
template <typename Request, typename Response, auto Of, auto Run, auto Fill = nullptr>
grpc::Status ServeTensorOp(const V1Env& env, absl::string_view method,
                           grpc::CallbackServerContext* context, RawStream* raw) {
  MessageStream<Response, Request> stream(raw, env.max_receive_message_bytes);
  return env.runner->Run(method, context, [&](CallStats* stats) -> absl::Status {
    TensorCall<Request, Response> call(env.tensor, method, context, &stream, stats);
    LOGITD_RETURN_IF_ERROR(call.ReadHeader());
    LOGITD_ASSIGN_OR_RETURN(const auto request, Of(call.header(), V1Shm{env.shm, call.tenant()}));
    if constexpr (Fill != nullptr) call.OnResult(Fill);
    LOGITD_ASSIGN_OR_RETURN(const OpResult result, Run(env.op, request, &call.call(), call));
    return call.Respond(result, call.header().digest_last());
  });
}

}  // namespace logitd::service

// The tensor calls of logitd.v1: Logits, Backward, FetchGradient,
// ZeroGradient, Cast, CrossEntropy and LogProbs. Each reads its header,
// translates it (v1/requests.h), runs the operation every front door runs
// (call/ops.h) and sends the result; how tensors travel (chunks or shared
// memory) is TensorCall's (tensor_call.h).
#include <utility>

#include "server/service/call/ops.h"
#include "server/service/state/status.h"
#include "server/service/v1/requests.h"
#include "server/service/v1/service.h"

namespace logitd::service {

TensorCallEnv LogitdService::tensor_env() {
  TensorCallEnv env;
  env.call.backend = backend_;
  env.call.admission = &admission_;
  env.call.shm_in_place = options_.shm.in_place;
  env.sending = &sending_;
  env.faults = faults_;
  env.max_request_bytes = options_.max_request_bytes;
  env.chunk_bytes = options_.chunk_bytes;
  return env;
}

OpEnv LogitdService::op_env() { return OpEnv{backend_, &registry_, options_.max_request_bytes}; }

template <typename Request, typename Response>
RawHandler LogitdService::TensorCallHandler(absl::string_view method,
                                            TensorHandler<TensorCall<Request, Response>> handler) {
  return [this, method, handler](grpc::CallbackServerContext* context, RawStream* raw) {
    MessageStream<Response, Request> stream(raw, options_.max_receive_message_bytes);
    return runner_.Run(method, context, [&](CallStats* stats) {
      TensorCall<Request, Response> call(tensor_env(), method, context, &stream, stats);
      return (this->*handler)(&call);
    });
  };
}

RawBidiReactor* LogitdService::Logits(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Logits", &LogitdService::DoLogits));
}

absl::Status LogitdService::DoLogits(LogitsCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_ASSIGN_OR_RETURN(const LogitsRequest request,
                          LogitsRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  LOGITD_ASSIGN_OR_RETURN(const OpResult result,
                          RunLogits(op_env(), request, &call->call(), *call));
  return call->Respond(result, call->header().digest_last());
}

RawBidiReactor* LogitdService::Backward(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Backward", &LogitdService::DoBackward));
}

absl::Status LogitdService::DoBackward(BackwardCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_ASSIGN_OR_RETURN(const BackwardRequest request,
                          BackwardRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  LOGITD_ASSIGN_OR_RETURN(const OpResult result,
                          RunBackward(op_env(), request, &call->call(), *call));
  return call->Respond(result, call->header().digest_last());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* LogitdService::FetchGradient(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ServeServerStreaming(context, request, &threads_,
                              TensorCallHandler("FetchGradient", &LogitdService::DoFetchGradient));
}

absl::Status LogitdService::DoFetchGradient(FetchGradientCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadRequest());
  const v1::FetchGradientRequest& request = call->request();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), request.weight_handle()));
  // Not admitted nor held to --max_request_bytes: the buffer already counts
  // against the weight budget, and refusing here would strand an
  // accumulated gradient.
  const std::uint64_t bytes = WeightRegistry::GradientBytes(w.v, w.k);
  LOGITD_RETURN_IF_ERROR(call->call().Output("dw", DType::kFp32, {w.v, w.k}, bytes, {}));
  LOGITD_RETURN_IF_ERROR(call->call().AllocateOutputs(*call));
  const absl::Time fetch_start = absl::Now();
  LOGITD_ASSIGN_OR_RETURN(const std::uint64_t calls,
                          backend_->FetchGradient(*w.weight, call->call().out<float>("dw"),
                                                  request.zero_after_fetch()));
  // The copy out of the gradient buffer (device to host on cuda): the
  // trailer's d2h.
  call->stats()->d2h_us = Micros(absl::Now() - fetch_start);

  v1::FetchGradientResponse head;
  head.mutable_result()->set_accumulated_calls(calls);
  return call->Send(&head, head.mutable_result(), request.digest_last());
}

grpc::Status LogitdService::ZeroGradient(grpc::ServerContext* context,
                                         const v1::ZeroGradientRequest* request,
                                         v1::ZeroGradientResponse* /*response*/) {
  return runner_.Run("ZeroGradient", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                            FindWeight(registry_, stats->tenant, request->weight_handle()));
    return backend_->ZeroGradient(*w.weight);
  });
}

RawBidiReactor* LogitdService::Cast(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Cast", &LogitdService::DoCast));
}

absl::Status LogitdService::DoCast(CastCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_ASSIGN_OR_RETURN(const CastRequest request,
                          CastRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  LOGITD_ASSIGN_OR_RETURN(const OpResult result, RunCast(op_env(), request, &call->call(), *call));
  return call->Respond(result, call->header().digest_last());
}

RawBidiReactor* LogitdService::CrossEntropy(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_,
                   TensorCallHandler("CrossEntropy", &LogitdService::DoCrossEntropy));
}

absl::Status LogitdService::DoCrossEntropy(CrossEntropyCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyRequest request,
                          CrossEntropyRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  call->OnResult([](const OpResult& result, v1::CrossEntropyResponse* head) {
    head->mutable_result()->set_counted_tokens(result.counted_tokens);
  });
  LOGITD_ASSIGN_OR_RETURN(const OpResult result,
                          RunCrossEntropy(op_env(), request, &call->call(), *call));
  return call->Respond(result, call->header().digest_last());
}

RawBidiReactor* LogitdService::LogProbs(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("LogProbs", &LogitdService::DoLogProbs));
}

absl::Status LogitdService::DoLogProbs(LogProbsCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_ASSIGN_OR_RETURN(const LogProbsRequest request,
                          LogProbsRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  LOGITD_ASSIGN_OR_RETURN(const OpResult result,
                          RunLogProbs(op_env(), request, &call->call(), *call));
  return call->Respond(result, call->header().digest_last());
}

RawBidiReactor* LogitdService::Verify(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Verify", &LogitdService::DoVerify));
}

}  // namespace logitd::service

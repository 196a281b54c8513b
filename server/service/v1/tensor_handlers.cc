// The tensor calls of logitd.v1 as the service serves them: the methods
// marked generic (the operations' rows with a run, and Verify) dispatched by name,
// FetchGradient and ZeroGradient. How tensors travel (chunks or shared
// memory) is TensorCall's (tensor_call.h).
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/service/call/ops.h"
#include "server/service/state/logging.h"
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

V1Env LogitdService::v1_env() {
  return V1Env{tensor_env(), op_env(), &shm_, &runner_, options_.max_receive_message_bytes};
}

namespace {

// The reactor of a call of a method this service does not serve.
class UnimplementedReactor final : public RawBidiReactor {
 public:
  explicit UnimplementedReactor(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("method ", method, " is not served by this server")));
  }
  void OnDone() override { delete this; }
};

constexpr absl::string_view kServicePrefix = "/logitd.v1.Logitd/";

}  // namespace

void LogitdService::MarkTensorMethodsGeneric() {
  const google::protobuf::ServiceDescriptor* service =
      v1::LogitsRequest::descriptor()->file()->FindServiceByName("Logitd");
  auto mark = [&](absl::string_view name) {
    const google::protobuf::MethodDescriptor* method = service->FindMethodByName(std::string(name));
    if (method == nullptr) {
      LogError(
          absl::StrCat("the operations' table names ", name, ", which logitd.v1.Logitd lacks"));
      std::abort();
    }
    MarkMethodGeneric(method->index());
  };
  for (const OperationInfo& op : Operations()) {
    if (op.run == nullptr) continue;
    if (absl::StatusOr<AnyTypes> types = TensorCallTypes(op.method); !types.ok()) {
      LogError(std::string(types.status().message()));
      std::abort();
    }
    mark(op.method);
  }
  mark("Verify");
  generic_ = std::make_unique<GenericMethods>(this);
}

void LogitdService::RegisterWith(grpc::ServerBuilder* builder) {
  builder->RegisterService(this);
  builder->RegisterCallbackGenericService(generic_.get());
}

RawBidiReactor* LogitdService::ServeGeneric(grpc::GenericCallbackServerContext* context) {
  absl::string_view name = context->method();
  if (absl::ConsumePrefix(&name, kServicePrefix)) {
    if (const OperationInfo* op = FindOperation(name); op != nullptr && op->run != nullptr) {
      return ServeBidi(context, &threads_,
                       [this, op](grpc::CallbackServerContext* c, RawStream* raw) {
                         return ServeOperation(v1_env(), *op, c, raw);
                       });
    }
    if (name == "Verify") {
      return ServeBidi(context, &threads_, TensorCallHandler("Verify", &LogitdService::DoVerify));
    }
  }
  return new UnimplementedReactor(context->method());
}

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

}  // namespace logitd::service

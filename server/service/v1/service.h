// The logitd.v1.Logitd gRPC service, one of the server's front doors over
// the state they share (shared/shared_state.h): thin handlers that translate a request
// (v1/requests.h), run the operation every front door runs (call/ops.h) and
// send the result back. Every call runs through CallRunner (call.h:
// authentication, trailers, metrics, log); every tensor call through
// TensorCall (tensor_call.h: this wire's chunks, results and digests, over
// the protocol-neutral call of call/call.h: admission, slots, buffers). Everything a call takes
// (buffers, budget, weight references) is owned by RAII objects, so it is returned whatever the
// outcome. The handlers live in four files: service.cc (server info, shared memory, probe),
// weight_handlers.cc, tensor_handlers.cc and verify_handler.cc.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "server/kernels/backend.h"
#include "server/service/call/ops.h"
#include "server/service/faults/faults.h"
#include "server/service/shared/shared_state.h"
#include "server/service/state/admission.h"
#include "server/service/state/auth.h"
#include "server/service/state/metrics.h"
#include "server/service/state/options.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"
#include "server/service/transport/call_runner.h"
#include "server/service/transport/message_stream.h"
#include "server/service/transport/raw_stream.h"
#include "server/service/v1/tensor_call.h"
#include "server/service/v1/tensor_methods.h"

namespace logitd::service {

// The generated service with RegisterWeight and FetchGradient served as raw
// byte streams (see raw_stream.h and message_stream.h); the bidirectional
// tensor calls are marked generic and served from the operations' rows
// (call/operations.h, tensor_methods.h) and Verify by the service's generic
// service; the other calls are the
// generated synchronous methods.
using RawTensorService = v1::Logitd::WithRawCallbackMethod_RegisterWeight<
    v1::Logitd::WithRawCallbackMethod_FetchGradient<v1::Logitd::Service>>;
using RawBidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

class LogitdService final : public RawTensorService {
 public:
  // Not owning: `state` outlives the service.
  explicit LogitdService(SharedState* state);
  ~LogitdService() override;
  LogitdService(const LogitdService&) = delete;
  LogitdService& operator=(const LogitdService&) = delete;

  // Registers the service and its generic service (the tensor calls) with
  // `builder`; the service outlives the server built.
  void RegisterWith(grpc::ServerBuilder* builder);

  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* RegisterWeight(grpc::CallbackServerContext* context,
                                                            grpc::ByteBuffer* response) override;
  grpc::Status LoadWeight(grpc::ServerContext* context, const v1::LoadWeightRequest* request,
                          v1::WeightInfo* response) override;
  grpc::Status ListWeights(grpc::ServerContext* context, const v1::ListWeightsRequest* request,
                           v1::ListWeightsResponse* response) override;
  grpc::Status ReleaseWeight(grpc::ServerContext* context, const v1::ReleaseWeightRequest* request,
                             v1::ReleaseWeightResponse* response) override;
  // The calls that stream tensors back, served as raw streams: each handler
  // runs on a thread of its own (raw_stream.h).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchGradient(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::Status ZeroGradient(grpc::ServerContext* context, const v1::ZeroGradientRequest* request,
                            v1::ZeroGradientResponse* response) override;
  grpc::Status ListRuns(grpc::ServerContext* context, const v1::ListRunsRequest* request,
                        v1::ListRunsResponse* response) override;
  grpc::Status ListProjects(grpc::ServerContext* context, const v1::ListProjectsRequest* request,
                            v1::ListProjectsResponse* response) override;
  grpc::Status ListCases(grpc::ServerContext* context, const v1::ListCasesRequest* request,
                         v1::ListCasesResponse* response) override;
  grpc::Status PromoteRun(grpc::ServerContext* context, const v1::PromoteRunRequest* request,
                          v1::PromoteRunResponse* response) override;
  grpc::Status SetRules(grpc::ServerContext* context, const v1::SetRulesRequest* request,
                        v1::SetRulesResponse* response) override;
  grpc::Status ListRules(grpc::ServerContext* context, const v1::ListRulesRequest* request,
                         v1::ListRulesResponse* response) override;
  grpc::Status DeleteProject(grpc::ServerContext* context, const v1::DeleteProjectRequest* request,
                             v1::DeleteProjectResponse* response) override;
  grpc::Status RecordValidation(grpc::ServerContext* context,
                                const v1::RecordValidationRequest* request,
                                v1::RecordValidationResponse* response) override;
  grpc::Status Probe(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream) override;
  grpc::Status RegisterShm(grpc::ServerContext* context, const v1::RegisterShmRequest* request,
                           v1::ShmRegion* response) override;
  grpc::Status ReleaseShm(grpc::ServerContext* context, const v1::ReleaseShmRequest* request,
                          v1::ReleaseShmResponse* response) override;

 private:
  class GenericMethods;
  using FetchGradientCall = TensorCall<v1::FetchGradientRequest, v1::FetchGradientResponse>;
  using VerifyCall = TensorCall<v1::VerifyRequest, v1::VerifyResponse>;
  // A tensor handler: validate, declare the call's slots, receive, run the
  // backend, send.
  template <typename Call>
  using TensorHandler = absl::Status (LogitdService::*)(Call* call);

  // Runs `handler` for a raw call (a thread of threads_ per call).
  template <typename Request, typename Response>
  RawHandler TensorCallHandler(absl::string_view method,
                               TensorHandler<TensorCall<Request, Response>> handler);
  TensorCallEnv tensor_env();
  OpEnv op_env();
  V1Env v1_env();
  // Marks the tensor methods generic (the constructor's).
  void MarkTensorMethodsGeneric();
  // The reactor of a call of a method marked generic: its row's, Verify's,
  // or UNIMPLEMENTED for a method of no row.
  RawBidiReactor* ServeGeneric(grpc::GenericCallbackServerContext* context);

  absl::Status DoRegisterWeight(grpc::ServerContextBase* context,
                                MessageStream<v1::WeightInfo, v1::RegisterWeightRequest>* reader,
                                v1::WeightInfo* response, CallStats* stats);
  absl::Status DoLoadWeight(const v1::LoadWeightRequest& request, v1::WeightInfo* response,
                            CallStats* stats);
  // RegisterWeight's and LoadWeight's last step, for a weight [v, k] whose
  // bf16 bytes `w` the host holds: the backend's copy of it inserted for the
  // tenant under `handle` and `name`, charged to `reservation` (or to one
  // taken now for `label`, when the one taken earlier was released). `w` is
  // dropped once the backend holds the weight. Logs the outcome, `source`
  // (how the bytes came) after the weight's label.
  absl::StatusOr<InsertResult> InsertWeight(const Tenant& tenant, BudgetReservation reservation,
                                            absl::string_view label, const std::string& handle,
                                            const std::string& name, std::int64_t v, std::int64_t k,
                                            std::uint64_t xxh3, Tensor w, absl::string_view source);
  absl::Status DoFetchGradient(FetchGradientCall* call);
  absl::Status DoVerify(VerifyCall* call);
  // Verify's history (history_handlers.cc): whether the header's `record`
  // can be kept (before the run), and the run compared with its baseline
  // and kept (after it), its id and comparison in *result.
  absl::Status CheckRecord(const v1::VerifyHeader& header) const;
  // Whether the header's `compare` can be answered (it needs `record`).
  absl::Status CheckCompare(const v1::VerifyHeader& header, const Tenant& tenant) const;
  // `operation`: the run's ("": the header's, "VERIFY_LOGITS"…).
  absl::Status Record(const v1::VerifyHeader& header, const Tenant& tenant,
                      v1::VerifyResult* result, absl::string_view operation = "") const;
  // Record's work; a failure of the store is its status.
  absl::Status RecordRun(const v1::VerifyHeader& header, const Tenant& tenant,
                         absl::string_view operation, v1::VerifyResult* result) const;
  absl::Status DoProbe(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream,
                       CallStats* stats);

  // The shared state's parts, as the handlers use them.
  FaultInjector* const faults_;
  kernels::Backend* const backend_;
  const ServiceOptions& options_;
  Authenticator* const auth_;
  WeightRegistry& registry_;
  RequestAdmission& admission_;
  ShmRegistry& shm_;
  const CallRunner& runner_;
  // Output buffers gRPC still sends from; waited for before the service
  // goes (and with it, the backend that made them, later).
  SendingBuffers sending_;
  // Serves the methods marked generic.
  std::unique_ptr<GenericMethods> generic_;
  // The tensor calls' threads; last, so that they have all exited before
  // anything they use goes.
  CallThreads threads_;
};

// Hands the calls of the methods marked generic to the service.
class LogitdService::GenericMethods final : public grpc::CallbackGenericService {
 public:
  explicit GenericMethods(LogitdService* service) : service_(service) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return service_->ServeGeneric(context);
  }

 private:
  LogitdService* const service_;
};

}  // namespace logitd::service

// The Open Inference Protocol front door (KServe v2, the protocol Triton
// speaks): inference.GRPCInferenceService on logitd's own port, a peer of
// logitd.v1 over the same shared state (shared/shared_state.h): weights,
// backend, admission and authentication. A registered
// weight is two models, named by its registration name or its handle,
// version "1": NAME (input `x` BF16 [M, K], output `logits` FP32 or BF16
// [M, V], logitd's Logits) and NAME/logprobs (inputs `x` and optional
// `targets`, the per-token outputs of logitd's LogProbs). Tensors travel in
// the messages or, with --allow_shm, in system shared memory (oip_shm.h).
// Every call runs through the service's CallRunner (call.h), so tokens,
// tenants, metrics and the log apply as for logitd's own calls.
#pragma once

#include <grpcpp/grpcpp.h>

#include "kserve/grpc_predict_v2.grpc.pb.h"
#include "server/service/call/ops.h"
#include "server/service/oip/oip_infer.h"
#include "server/service/oip/oip_shm.h"
#include "server/service/shared/shared_state.h"

namespace logitd::service {

class OipService final : public inference::GRPCInferenceService::Service {
 public:
  // Not owning: `state` outlives this.
  explicit OipService(SharedState* state) : state_(state), shm_regions_(&state->shm()) {}

  grpc::Status ServerLive(grpc::ServerContext* context, const inference::ServerLiveRequest* request,
                          inference::ServerLiveResponse* response) override;
  grpc::Status ServerReady(grpc::ServerContext* context,
                           const inference::ServerReadyRequest* request,
                           inference::ServerReadyResponse* response) override;
  grpc::Status ModelReady(grpc::ServerContext* context, const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response) override;
  grpc::Status ServerMetadata(grpc::ServerContext* context,
                              const inference::ServerMetadataRequest* request,
                              inference::ServerMetadataResponse* response) override;
  grpc::Status ModelMetadata(grpc::ServerContext* context,
                             const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) override;
  grpc::Status ModelInfer(grpc::ServerContext* context, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override;
  // The system shared-memory extension (oip_shm.cc); FAILED_PRECONDITION
  // without --allow_shm.
  grpc::Status SystemSharedMemoryStatus(
      grpc::ServerContext* context, const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override;
  grpc::Status SystemSharedMemoryRegister(
      grpc::ServerContext* context, const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* response) override;
  grpc::Status SystemSharedMemoryUnregister(
      grpc::ServerContext* context, const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* response) override;

 private:
  absl::Status DoModelInfer(grpc::ServerContext* context,
                            const inference::ModelInferRequest& request,
                            inference::ModelInferResponse* response, CallStats* stats);
  // The two models of a weight, on a call whose tensors are not bound yet.
  absl::Status InferLogits(const WeightRecord& w, OipInferCall* call);
  absl::Status InferLogProbs(const WeightRecord& w, OipInferCall* call);
  OpEnv op_env() const;

  SharedState* const state_;
  OipShmRegions shm_regions_;
};

}  // namespace logitd::service

// The logitd.v1.Logitd gRPC service: thin handlers that validate a request,
// look up its weight, call the Backend and stream the result back in chunks.
// Everything a call takes (buffers, budget, weight references) is owned by
// RAII objects in the handler, so it is returned whatever the outcome.
#pragma once

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
#include "logitd/v1/logitd.grpc.pb.h"
#include "server/kernels/backend.h"
#include "server/service/admission.h"
#include "server/service/auth.h"
#include "server/service/faults.h"
#include "server/service/message_stream.h"
#include "server/service/metrics.h"
#include "server/service/raw_stream.h"
#include "server/service/registry.h"
#include "server/service/shm.h"

namespace logitd::service {

struct ServiceOptions {
  // Bytes of weights and their fp32 gradient buffers the server holds at most.
  std::uint64_t weight_budget_bytes = 16ull << 30;
  // Bytes of request and response tensors one call may move, together.
  std::uint64_t max_request_bytes = (4ull << 30) + 1;
  // Size of the chunks responses are streamed in, bytes.
  std::size_t chunk_bytes = kDefaultChunkBytes;
  // The largest chunk of a request, the largest request message (a chunk
  // and its framing) and the largest message sent; reported in ServerInfo.
  std::size_t max_request_chunk_bytes = kGrpcDefaultMaxMessageBytes;
  std::size_t max_receive_message_bytes = kGrpcDefaultMaxMessageBytes + kChunkFramingBytes;
  std::size_t max_send_message_bytes = kGrpcDefaultMaxMessageBytes;
  // Directory LoadWeight reads safetensors files from; empty refuses LoadWeight.
  std::filesystem::path weights_dir;
  FaultSet faults;
  // Who may call and as which tenant; null = no tokens, loopback peers only,
  // every caller the default tenant.
  std::shared_ptr<Authenticator> auth;
  // Where each call is recorded (not owned; must outlive the service). Null:
  // no metrics.
  Metrics* metrics = nullptr;  // Request memory budget and concurrency cap for tensor calls.
  AdmissionOptions admission;
  // Same-host shared memory (--allow_shm, --shm_max_region_bytes).
  ShmOptions shm;
  // Tensor calls running at once, each on its own thread; one more is
  // refused with RESOURCE_EXHAUSTED. Admission (above) is what normally
  // limits load; this bounds the threads when calls pile up anyway.
  int max_call_threads = 64;
};

// The generated service with the tensor calls served as raw byte streams
// (see raw_stream.h and message_stream.h); the other calls are the generated
// synchronous methods.
using RawTensorService = v1::Logitd::WithRawCallbackMethod_RegisterWeight<
    v1::Logitd::WithRawCallbackMethod_Logits<v1::Logitd::WithRawCallbackMethod_Backward<
        v1::Logitd::WithRawCallbackMethod_FetchGradient<v1::Logitd::WithRawCallbackMethod_Cast<
            v1::Logitd::WithRawCallbackMethod_CrossEntropy<v1::Logitd::Service>>>>>>;
using RawBidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

class LogitdService final : public RawTensorService {
 public:
  LogitdService(std::unique_ptr<kernels::Backend> backend, ServiceOptions options);
  ~LogitdService() override;
  LogitdService(const LogitdService&) = delete;
  LogitdService& operator=(const LogitdService&) = delete;

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
  RawBidiReactor* Logits(grpc::CallbackServerContext* context) override;
  RawBidiReactor* Backward(grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchGradient(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::Status ZeroGradient(grpc::ServerContext* context, const v1::ZeroGradientRequest* request,
                            v1::ZeroGradientResponse* response) override;
  RawBidiReactor* Cast(grpc::CallbackServerContext* context) override;
  RawBidiReactor* CrossEntropy(grpc::CallbackServerContext* context) override;
  grpc::Status Probe(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream) override;
  grpc::Status RegisterShm(grpc::ServerContext* context, const v1::RegisterShmRequest* request,
                           v1::ShmRegion* response) override;
  grpc::Status ReleaseShm(grpc::ServerContext* context, const v1::ReleaseShmRequest* request,
                          v1::ReleaseShmResponse* response) override;

  const kernels::Backend& backend() const { return *backend_; }
  const WeightRegistry& registry() const { return registry_; }
  const RequestAdmission& admission() const { return admission_; }
  const ShmRegistry& shm() const { return shm_; }
  Authenticator& authenticator() const { return *auth_; }

 private:
  // Bytes moved by one call, for its log line, and where its time went, for
  // its "logitd-timing" trailer (see logitd.proto). -1: not measured for this
  // call, left out of the trailer.
  struct CallStats {
    // Who the call acts for: set by Run, before the handler body runs.
    Tenant tenant;
    std::uint64_t bytes_in = 0;
    std::uint64_t bytes_out = 0;
    // Tensor payload bytes (chunk data) received and sent, for the metrics.
    std::uint64_t tensor_bytes_in = 0;
    std::uint64_t tensor_bytes_out = 0;
    std::int64_t queue_us = -1;
    std::int64_t receive_us = -1;
    std::int64_t h2d_us = -1;
    std::int64_t compute_us = -1;
    std::int64_t d2h_us = -1;
    // The GEMMs the backend ran, for the "logitd-gemm" trailer.
    std::string gemms;
    // When the response started streaming out: send_us runs from here to the
    // end of the handler.
    std::optional<absl::Time> send_start;
  };

  // Runs a handler body, maps its status and writes the call's log line.
  template <typename Body>
  grpc::Status Run(absl::string_view method, grpc::ServerContextBase* context, Body&& body);

  absl::Status DoRegisterWeight(grpc::ServerContextBase* context,
                                MessageStream<v1::WeightInfo, v1::RegisterWeightRequest>* reader,
                                v1::WeightInfo* response, CallStats* stats);
  absl::Status DoLoadWeight(const v1::LoadWeightRequest& request, v1::WeightInfo* response,
                            CallStats* stats);
  absl::Status DoLogits(grpc::ServerContextBase* context,
                        MessageStream<v1::LogitsResponse, v1::LogitsRequest>* stream,
                        CallStats* stats);
  absl::Status DoBackward(grpc::ServerContextBase* context,
                          MessageStream<v1::BackwardResponse, v1::BackwardRequest>* stream,
                          CallStats* stats);
  absl::Status DoFetchGradient(
      MessageStream<v1::FetchGradientResponse, v1::FetchGradientRequest>* stream, CallStats* stats);
  absl::Status DoCast(grpc::ServerContextBase* context,
                      MessageStream<v1::CastResponse, v1::CastRequest>* stream, CallStats* stats);
  absl::Status DoCrossEntropy(
      grpc::ServerContextBase* context,
      MessageStream<v1::CrossEntropyResponse, v1::CrossEntropyRequest>* stream, CallStats* stats);
  // An output tensor streamed after the result message.
  struct StreamedOutput {
    std::string name;
    kernels::HostBuffer buffer;
    std::uint64_t bytes = 0;
  };
  // Streams `outputs` in order after the result message, each one's chunks
  // straight from its buffer, which is held (see SendingBuffers) until gRPC
  // has sent them. With `digest_last` the specs in the result carry xxh3 0:
  // the digests are computed on another thread while the chunks travel and
  // follow as TensorDigest messages, each passed through `fault` (the test
  // faults' hook; identity otherwise).
  template <typename Response, typename Stream>
  absl::Status SendOutputs(Stream* stream, std::vector<StreamedOutput> outputs, bool digest_last,
                           const std::function<std::uint64_t(std::uint64_t)>& fault,
                           CallStats* stats);
  absl::Status DoProbe(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream,
                       CallStats* stats);

  // Declared before registry_ so that registered weights (backend objects)
  // are destroyed before the backend that made them.
  std::unique_ptr<kernels::Backend> backend_;
  const ServiceOptions options_;
  std::shared_ptr<Authenticator> auth_;
  WeightRegistry registry_;
  FaultInjector faults_;
  RequestAdmission admission_;
  // Mapped regions; unmapped when the service goes (at shutdown).
  ShmRegistry shm_;
  // Output buffers gRPC still sends from; waited for before the backend goes.
  SendingBuffers sending_;
  // The tensor calls' threads; last, so that they have all exited before
  // anything they use goes.
  CallThreads threads_;
};

}  // namespace logitd::service

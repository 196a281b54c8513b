#include "server/service/v1/service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/service/state/build_info.h"
#include "server/service/state/logging.h"
#include "server/service/state/status.h"
#include "server/service/transport/request_stream.h"
#include "server/service/v1/validation.h"

namespace logitd::service {
namespace {

template <typename Response, typename Stream>
absl::Status WriteMessage(Stream* stream, const Response& response, std::uint64_t* bytes_out) {
  *bytes_out += response.ByteSizeLong();
  // A write fails only once the call is over: the client cancelled, its
  // deadline passed or its connection went. Recorded as what it is, before
  // gRPC's own cancellation flag may be seen.
  if (!stream->Write(response)) {
    return absl::CancelledError("the client stopped reading the response");
  }
  return absl::OkStatus();
}

}  // namespace

LogitdService::LogitdService(SharedState* state)
    : faults_(state->faults().get()),
      backend_(&state->backend()),
      options_(state->options()),
      auth_(&state->authenticator()),
      registry_(state->registry()),
      admission_(state->admission()),
      shm_(state->shm()),
      runner_(state->runner()),
      threads_(state->options().max_call_threads) {
  MarkTensorMethodsGeneric();
}

LogitdService::~LogitdService() {
  // gRPC lets go of the last chunks' slices when their bytes are written,
  // which can be after the calls ended; the backend must outlive them.
  if (!sending_.WaitIdle(absl::Seconds(10))) {
    LogWarning(absl::StrCat(sending_.held(),
                            " response buffers were still held by gRPC 10 s after shutdown"));
  }
}

grpc::Status LogitdService::GetServerInfo(grpc::ServerContext* context,
                                          const v1::GetServerInfoRequest* /*request*/,
                                          v1::ServerInfo* response) {
  return runner_.Run("GetServerInfo", context, [&](CallStats* stats) {
    const kernels::BackendInfo info = backend_->Info();
    response->set_version(std::string(Version()));
    response->set_build_id(std::string(BuildId()));
    response->set_backend(info.backend);
    response->set_device_name(info.device_name);
    response->set_compute_capability(info.compute_capability);
    response->set_multiprocessor_count(info.multiprocessor_count);
    response->set_driver_version(info.driver_version);
    response->set_cuda_runtime_version(info.cuda_runtime_version);
    response->set_cublaslt_version(info.cublaslt_version);
    response->set_blas_version(info.blas_version);
    response->set_max_request_bytes(options_.max_request_bytes);
    response->set_chunk_bytes(options_.chunk_bytes);
    response->set_max_receive_message_bytes(options_.max_receive_message_bytes);
    response->set_max_request_chunk_bytes(options_.max_request_chunk_bytes);
    response->set_max_send_message_bytes(options_.max_send_message_bytes);
    response->set_split_k(info.split_k);
    response->set_algo_choices(info.algo_choices);
    response->set_algo_cache_path(info.algo_cache_path);
    response->set_request_digest_last(true);
    response->set_request_memory_bytes(admission_.options().memory_bytes);
    response->set_max_concurrent_requests(admission_.options().max_concurrent_requests);
    // With tokens, a caller sees its own tenant's weights and calls only:
    // one tenant does not watch another's activity (the server-wide figures
    // are the operator's, on the metrics endpoint).
    const bool tenants = auth_->tokens_enabled();
    const Tenant& tenant = stats->tenant;
    const AdmissionStats admitted =
        tenants ? admission_.TenantStats(tenant.id) : admission_.Stats();
    response->set_weight_budget_bytes(tenants && tenant.quota_bytes > 0
                                          ? std::min(tenant.quota_bytes, registry_.budget_bytes())
                                          : registry_.budget_bytes());
    response->set_weight_bytes_in_use(tenants ? registry_.tenant_bytes_in_use(tenant.id)
                                              : registry_.bytes_in_use());
    response->set_device_bytes_in_use(tenants ? 0 : backend_->DeviceBytesInUse());
    response->set_request_bytes_in_flight(admitted.bytes_in_flight);
    response->set_request_bytes_high_water(admitted.bytes_high_water);
    response->set_requests_in_flight(admitted.requests_in_flight);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::Probe(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream) {
  return runner_.Run("Probe", context,
                     [&](CallStats* stats) { return DoProbe(context, stream, stats); });
}

// The transport floor a tensor call is measured against: the same framing
// and chunking, no tensors (no reassembly, digests or copies into chunk
// messages) and no compute. One chunk message is built once and written
// again and again.
absl::Status LogitdService::DoProbe(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::ProbeRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(const ProbePlan plan, ValidateProbe(first.header(), options_.chunk_bytes,
                                                              options_.max_request_bytes));

  std::uint64_t received = 0;
  v1::ProbeRequest msg;
  while (stream->Read(&msg)) {
    stats->bytes_in += msg.ByteSizeLong();
    if (msg.part_case() != v1::ProbeRequest::kData) {
      return absl::InvalidArgumentError(
          "probe: expected data after the header, got a second header or an empty message");
    }
    received += msg.data().size();
    if (received > plan.request_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("probe: the request carries more than the %d bytes its header announced",
                          plan.request_bytes));
    }
  }
  if (context->IsCancelled()) {
    return absl::CancelledError("the client cancelled the call while sending its bytes");
  }
  if (received != plan.request_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("probe: the header announced %d request bytes, the stream carried %d",
                        plan.request_bytes, received));
  }
  stats->receive_us = Micros(absl::Now() - start);

  stats->send_start = absl::Now();
  v1::ProbeChunk chunk;
  chunk.mutable_data()->assign(
      static_cast<std::size_t>(std::min<std::uint64_t>(plan.chunk_bytes, plan.response_bytes)),
      '\0');
  for (std::uint64_t sent = 0; sent < plan.response_bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(plan.chunk_bytes, plan.response_bytes - sent);
    if (n < chunk.data().size()) chunk.mutable_data()->resize(static_cast<std::size_t>(n));
    LOGITD_RETURN_IF_ERROR(WriteMessage(stream, chunk, &stats->bytes_out));
    sent += n;
  }
  return absl::OkStatus();
}

grpc::Status LogitdService::RegisterShm(grpc::ServerContext* context,
                                        const v1::RegisterShmRequest* request,
                                        v1::ShmRegion* response) {
  return runner_.Run("RegisterShm", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const ShmRecord r,
                            shm_.Register(stats->tenant, request->name(), request->bytes()));
    const std::string pinned = PinShmRegion(*backend_, r.mapping.get());
    response->set_handle(r.handle);
    response->set_name(r.mapping->name());
    response->set_bytes(r.mapping->bytes());
    stats->bytes_out = response->ByteSizeLong();
    Log(LogLevel::kInfo, absl::StrCat("shm region ", r.handle, " mapped: '", r.mapping->name(),
                                      "', ", r.mapping->bytes(), " bytes, ", pinned));
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::ReleaseShm(grpc::ServerContext* context,
                                       const v1::ReleaseShmRequest* request,
                                       v1::ReleaseShmResponse* response) {
  return runner_.Run("ReleaseShm", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_RETURN_IF_ERROR(ValidateHandle(request->handle()));
    return shm_.Release(stats->tenant, request->handle());
  });
}

}  // namespace logitd::service

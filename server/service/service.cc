#include "server/service/service.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chunk_message.h"
#include "common/raw_call.h"
#include "common/wire.h"
#include "logitd/bf16.h"
#include "logitd/safetensors.h"
#include "logitd/tensor.h"
#include "server/service/build_info.h"
#include "server/service/logging.h"
#include "server/service/request_stream.h"
#include "server/service/status.h"
#include "server/service/validation.h"

namespace logitd::service {
namespace {

constexpr std::size_t kMaxLoggedMessage = 300;

// The handlers' ReceiveChunks: the shared one, asking the call's context
// whether the client is gone.
template <typename Request, typename Stream, typename Stats>
absl::Status ReceiveChunks(grpc::ServerContextBase* context, Stream* stream,
                           wire::Assembler* assembler, Stats* stats) {
  return service::ReceiveChunks<Request>(stream, assembler, stats,
                                         [context] { return context->IsCancelled(); });
}

template <typename Response, typename Stream>
absl::Status WriteMessage(Stream* stream, const Response& response, std::uint64_t* bytes_out) {
  *bytes_out += response.ByteSizeLong();
  if (!stream->Write(response)) {
    return absl::UnavailableError("the client stopped reading the response");
  }
  return absl::OkStatus();
}

// The spec of an output without its digest (xxh3 0).
v1::TensorSpec UndigestedSpec(absl::string_view name, DType dtype,
                              const std::vector<std::int64_t>& shape) {
  v1::TensorSpec spec;
  spec.set_name(std::string(name));
  spec.set_dtype(wire::ToProto(dtype));
  for (std::int64_t d : shape) spec.add_shape(d);
  return spec;
}

// The spec of an output with the xxh3 of its bytes.
v1::TensorSpec OutputSpec(absl::string_view name, DType dtype,
                          const std::vector<std::int64_t>& shape, const void* data,
                          std::uint64_t bytes) {
  v1::TensorSpec spec = UndigestedSpec(name, dtype, shape);
  spec.set_xxh3(Xxh3(data, static_cast<std::size_t>(bytes)));
  return spec;
}

// The spec of an output in the result message: with its digest, except for
// an output written to shared memory whose slot asked for skip_digest, and a
// streamed output whose digest follows its chunks (the call asked for
// digest_last); those carry xxh3 0.
v1::TensorSpec ResultSpec(absl::string_view name, DType dtype,
                          const std::vector<std::int64_t>& shape, const void* data,
                          std::uint64_t bytes, const v1::ShmRef* slot, bool digest_last) {
  const bool later_or_never = slot != nullptr ? slot->skip_digest() : digest_last;
  if (later_or_never) return UndigestedSpec(name, dtype, shape);
  return OutputSpec(name, dtype, shape, data, bytes);
}

// Where an output written to shared memory lies, for the result message.
void FillShmRef(const v1::ShmRef& asked, const ShmSlice& slice, std::uint64_t bytes,
                v1::ShmRef* out) {
  out->set_region(asked.region());
  out->set_offset(slice.offset);
  out->set_bytes(bytes);
  out->set_skip_digest(asked.skip_digest());
}

// An input tensor in a host buffer from the backend (page-locked and pooled
// on cuda: no page faults while it fills, and the device reads it at full
// speed). From a shared-memory slice it is copied out of the region, then
// its digest checked against the spec (validated already, so its dtype and
// shape give exactly `bytes`), as for a streamed tensor: DataLoss when the
// bytes are not the ones the spec describes; copied first because the client
// can still write the region, and what is computed must be what was
// checked. Otherwise it is announced to `assembler`, to be received into it.
absl::StatusOr<kernels::HostBuffer> InputBuffer(kernels::Backend& backend,
                                                const v1::TensorSpec& spec, std::uint64_t bytes,
                                                const std::optional<ShmSlice>& slice,
                                                wire::Assembler* assembler) {
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer buffer,
                          backend.AllocateHost(static_cast<std::size_t>(bytes)));
  if (!slice) {
    LOGITD_RETURN_IF_ERROR(assembler->ExpectInto(spec, buffer.data(), bytes));
    return buffer;
  }
  if (slice->bytes != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", spec.name(), "': shm bytes ", slice->bytes,
                                                   " is not the ", bytes, " bytes its spec takes"));
  }
  std::memcpy(buffer.data(), slice->data, static_cast<std::size_t>(bytes));
  const std::uint64_t got = Xxh3(buffer.data(), static_cast<std::size_t>(bytes));
  if (got != spec.xxh3()) {
    return absl::DataLossError(absl::StrFormat(
        "'%s': xxh3 of the %d bytes read from shared memory (region offset %d) is %016x, the spec "
        "says %016x: the region was changed after the spec was computed",
        spec.name(), slice->bytes, slice->offset, got, spec.xxh3()));
  }
  return buffer;
}

std::int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// Admits a call that will hold `bytes` of request memory (see admission.h),
// waiting at most until its deadline; records a wait as its queue time.
template <typename Stats>
absl::StatusOr<AdmissionTicket> AdmitCall(RequestAdmission& admission,
                                          grpc::ServerContextBase* context, absl::string_view what,
                                          std::uint64_t bytes, Stats* stats) {
  LOGITD_ASSIGN_OR_RETURN(AdmissionTicket ticket,
                          admission.Admit(
                              what, bytes, absl::FromChrono(context->deadline()),
                              [context] { return context->IsCancelled(); }, stats->tenant.id));
  if (ticket.waited() > absl::ZeroDuration()) stats->queue_us = Micros(ticket.waited());
  return ticket;
}

// Fills the result's Timing and the call's stats for its trailer, and starts
// the send clock: called just before the result message is written.
template <typename Stats>
void FillTiming(std::int64_t receive_us, const kernels::Timing& t, v1::Timing* out, Stats* stats) {
  out->set_queue_us(std::max<std::int64_t>(stats->queue_us, 0));
  out->set_receive_us(receive_us);
  out->set_h2d_us(t.h2d_us);
  out->set_compute_us(t.compute_us);
  out->set_d2h_us(t.d2h_us);
  stats->receive_us = receive_us;
  stats->compute_us = t.compute_us;
  stats->gemms = absl::StrJoin(t.gemms, "; ");
  if (t.transfers_measured) {
    stats->h2d_us = t.h2d_us;
    stats->d2h_us = t.d2h_us;
  }
  stats->send_start = absl::Now();
}

// The "logitd-timing" trailer: the measured parts only, in a fixed order.
std::string TimingTrailer(std::initializer_list<std::pair<absl::string_view, std::int64_t>> parts) {
  std::string out;
  for (const auto& [key, us] : parts) {
    if (us < 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ",", key, "=", us);
  }
  return out;
}

// The calls that need the backend's device (refused once it is lost).
bool UsesDevice(absl::string_view method) {
  for (absl::string_view m : {"RegisterWeight", "LoadWeight", "Logits", "Backward", "FetchGradient",
                              "ZeroGradient", "Cast", "CrossEntropy"}) {
    if (method == m) return true;
  }
  return false;
}

// Counts a call in logitd_inflight_requests while it runs.
class InflightCall {
 public:
  explicit InflightCall(Metrics* metrics) : metrics_(metrics) {
    if (metrics_ != nullptr) metrics_->CallStarted();
  }
  ~InflightCall() {
    if (metrics_ != nullptr) metrics_->CallFinished();
  }
  InflightCall(const InflightCall&) = delete;
  InflightCall& operator=(const InflightCall&) = delete;

 private:
  Metrics* metrics_;
};

WeightDims DimsOf(const WeightRecord& w) { return WeightDims{w.v, w.k, w.Label()}; }

void FillWeightInfo(const WeightRecord& w, bool already_registered, v1::WeightInfo* out) {
  out->set_handle(w.handle);
  out->set_name(w.name);
  out->add_shape(w.v);
  out->add_shape(w.k);
  out->set_xxh3(w.xxh3);
  out->set_bytes(w.bytes);
  out->set_has_gradient(w.has_gradient);
  out->set_already_registered(already_registered);
  out->set_registrations(w.registrations);
}

// The weight a call names: a missing handle is InvalidArgument, an unknown
// one NotFound.
absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view handle) {
  LOGITD_RETURN_IF_ERROR(ValidateHandle(handle));
  return registry.Find(tenant, handle);
}

// Without --auth_tokens: no tokens, loopback peers only.
std::shared_ptr<Authenticator> DefaultAuthenticator() {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(AuthOptions{});
  return auth.ok() ? std::shared_ptr<Authenticator>(std::move(*auth)) : nullptr;
}

}  // namespace

LogitdService::LogitdService(std::unique_ptr<kernels::Backend> backend, ServiceOptions options)
    : backend_(std::move(backend)),
      options_(options),
      auth_(options.auth != nullptr ? options.auth : DefaultAuthenticator()),
      registry_(options.weight_budget_bytes),
      faults_(options.faults),
      admission_(options.admission),
      shm_(options.shm),
      threads_(options.max_call_threads) {}

LogitdService::~LogitdService() {
  // gRPC lets go of the last chunks' slices when their bytes are written,
  // which can be after the calls ended; the backend must outlive them.
  if (!sending_.WaitIdle(absl::Seconds(10))) {
    LogWarning(absl::StrCat(sending_.held(),
                            " response buffers were still held by gRPC 10 s after shutdown"));
  }
}

template <typename Response, typename Stream>
absl::Status LogitdService::SendOutputs(Stream* stream, std::vector<StreamedOutput> outputs,
                                        bool digest_last,
                                        const std::function<std::uint64_t(std::uint64_t)>& fault,
                                        CallStats* stats) {
  // Held here as well as by the slices: the hasher may still read a buffer
  // after gRPC has let go of all of its chunks.
  std::vector<std::shared_ptr<const void>> held;
  std::uint64_t total = 0;
  for (StreamedOutput& o : outputs) {
    held.push_back(sending_.Hold(std::move(o.buffer)));
    total += o.bytes;
  }
  std::vector<std::uint64_t> digests(outputs.size());
  const auto hash_all = [&] {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      digests[i] = Xxh3(held[i].get(), static_cast<std::size_t>(outputs[i].bytes));
    }
  };
  std::thread hasher;
  if (digest_last) {
    if (total >= wire::kHashAsideBytes) {
      hasher = std::thread(hash_all);
    } else {
      hash_all();
    }
  }
  absl::Status sent;
  for (std::size_t i = 0; i < outputs.size() && sent.ok(); ++i) {
    sent =
        wire::SendChunkMessages(outputs[i].name, static_cast<const std::byte*>(held[i].get()),
                                static_cast<std::size_t>(outputs[i].bytes), options_.chunk_bytes,
                                held[i], [&](const grpc::ByteBuffer& message, std::size_t payload) {
                                  stats->bytes_out += message.Length();
                                  stats->tensor_bytes_out += payload;
                                  return stream->Write(message);
                                });
  }
  if (hasher.joinable()) hasher.join();
  LOGITD_RETURN_IF_ERROR(sent);
  if (!digest_last) return absl::OkStatus();
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    Response tail;
    tail.mutable_digest()->set_name(outputs[i].name);
    tail.mutable_digest()->set_xxh3(fault(digests[i]));
    LOGITD_RETURN_IF_ERROR(WriteMessage(stream, tail, &stats->bytes_out));
  }
  return absl::OkStatus();
}

// The identity: outputs whose digests no test fault touches.
namespace {
std::uint64_t Unchanged(std::uint64_t digest) { return digest; }
}  // namespace

template <typename Body>
grpc::Status LogitdService::Run(absl::string_view method, grpc::ServerContextBase* context,
                                Body&& body) {
  const absl::Time start = absl::Now();
  const InflightCall inflight(options_.metrics);
  CallStats stats;
  // The one authentication step of every logitd.v1 call: the body runs only
  // for an authenticated caller, and acts for its tenant.
  absl::Status status;
  if (absl::StatusOr<Tenant> tenant = auth_->Authenticate(*context); !tenant.ok()) {
    status = tenant.status();
  } else if (absl::Status health = backend_->Health(); !health.ok() && UsesDevice(method)) {
    // A lost device fails every call that needs it at once, with the cause;
    // UNAVAILABLE tells clients to retry (another replica, or this one
    // after its restart).
    status = health;
  } else {
    stats.tenant = *std::move(tenant);
    status = body(&stats);
  }
  const absl::Time end = absl::Now();
  const std::int64_t send_us = stats.send_start ? Micros(end - *stats.send_start) : -1;
  context->AddTrailingMetadata(std::string(wire::kTimingTrailer),
                               TimingTrailer({{"queue_us", stats.queue_us},
                                              {"receive_us", stats.receive_us},
                                              {"h2d_us", stats.h2d_us},
                                              {"compute_us", stats.compute_us},
                                              {"d2h_us", stats.d2h_us},
                                              {"send_us", send_us},
                                              {"total_us", Micros(end - start)}}));
  if (!stats.gemms.empty())
    context->AddTrailingMetadata(std::string(wire::kGemmTrailer), stats.gemms);
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled && context->IsCancelled()) {
    // The failure is a consequence of the client going away, not its cause.
    status = absl::CancelledError(
        absl::StrCat("call cancelled by the client or its deadline (", status.message(), ")"));
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordCall(method, absl::StatusCodeToString(status.code()),
                                 absl::ToDoubleSeconds(end - start), stats.tensor_bytes_in,
                                 stats.tensor_bytes_out);
  }
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    std::string line =
        absl::StrFormat("rpc=%s code=%s in=%d out=%d ms=%.3f peer=%s", method,
                        absl::StatusCodeToString(status.code()), stats.bytes_in, stats.bytes_out,
                        absl::ToDoubleMilliseconds(end - start), context->peer());
    if (auth_->tokens_enabled()) {
      absl::StrAppend(&line, " tenant=", stats.tenant.id.empty() ? "-" : stats.tenant.id);
    }
    if (!status.ok()) {
      absl::string_view msg = status.message();
      if (msg.size() > kMaxLoggedMessage) msg = msg.substr(0, kMaxLoggedMessage);
      absl::StrAppend(&line, " error=\"", msg, "\"");
    }
    Log(level, line);
  }
  return ToGrpcStatus(status);
}

grpc::Status LogitdService::GetServerInfo(grpc::ServerContext* context,
                                          const v1::GetServerInfoRequest* /*request*/,
                                          v1::ServerInfo* response) {
  return Run("GetServerInfo", context, [&](CallStats* stats) {
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

grpc::ServerReadReactor<grpc::ByteBuffer>* LogitdService::RegisterWeight(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ServeClientStreaming(
      context, response, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
        MessageStream<v1::WeightInfo, v1::RegisterWeightRequest> stream(
            raw, options_.max_receive_message_bytes);
        v1::WeightInfo info;
        const grpc::Status status = Run("RegisterWeight", c, [&](CallStats* stats) {
          return DoRegisterWeight(c, &stream, &info, stats);
        });
        if (status.ok()) stream.Write(info);
        return status;
      });
}

absl::Status LogitdService::DoRegisterWeight(
    grpc::ServerContextBase* context,
    MessageStream<v1::WeightInfo, v1::RegisterWeightRequest>* reader, v1::WeightInfo* response,
    CallStats* stats) {
  v1::RegisterWeightRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(reader, &first, &stats->bytes_in));
  const v1::RegisterWeightHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightPlan plan, ValidateRegisterWeight(header));
  const v1::TensorSpec& spec = header.weight();
  // The handle comes from the announced digest; Finish() below proves the
  // bytes match it, so it is derived from the content.
  const std::string handle = WeightRegistry::MakeHandle(spec.xxh3(), plan.v, plan.k);
  const std::string label = absl::StrCat("'", header.name().empty() ? handle : header.name(), "'");

  // Charge the budget on the declared shape before a byte is received. A
  // weight held already costs nothing more: its copy will not be kept.
  BudgetReservation reservation;
  if (!registry_.Find(stats->tenant, handle).ok()) {
    LOGITD_ASSIGN_OR_RETURN(reservation,
                            registry_.ReserveWeight(stats->tenant, label, plan.v, plan.k));
  }

  // The upload's assembly buffer is request memory until the backend has it.
  LOGITD_ASSIGN_OR_RETURN(const AdmissionTicket admitted,
                          AdmitCall(admission_, context, "register weight", plan.bytes, stats));
  wire::Assembler assembler(plan.bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(spec));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::RegisterWeightRequest>(context, reader, &assembler, stats));
  LOGITD_ASSIGN_OR_RETURN(Tensor w, assembler.Take(spec.name()));

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(stats->tenant, handle);
      existing.ok()) {
    FillWeightInfo(*existing, /*already_registered=*/true, response);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  }
  if (!reservation.active()) {
    // It was held at the header but released while the bytes arrived.
    LOGITD_ASSIGN_OR_RETURN(reservation,
                            registry_.ReserveWeight(stats->tenant, label, plan.v, plan.k));
  }
  LOGITD_ASSIGN_OR_RETURN(std::shared_ptr<kernels::Weight> weight,
                          backend_->LoadWeight(w.data<Bf16Bits>(), plan.v, plan.k));
  w = Tensor();  // the host copy is not needed once the backend holds the weight
  InsertResult inserted =
      registry_.Insert(stats->tenant, std::move(reservation), handle, header.name(), plan.v, plan.k,
                       spec.xxh3(), std::move(weight));
  FillWeightInfo(inserted.record, inserted.already_registered, response);
  stats->bytes_out = response->ByteSizeLong();
  LogInfo(absl::StrCat(
      inserted.already_registered ? "weight already registered: " : "weight registered: ", handle,
      " ", inserted.record.Label(), " bytes=", inserted.record.bytes,
      " in_use=", registry_.bytes_in_use(), "/", registry_.budget_bytes()));
  return absl::OkStatus();
}

grpc::Status LogitdService::LoadWeight(grpc::ServerContext* context,
                                       const v1::LoadWeightRequest* request,
                                       v1::WeightInfo* response) {
  return Run("LoadWeight", context, [&](CallStats* stats) {
    stats->bytes_in = request->ByteSizeLong();
    return DoLoadWeight(*request, response, stats);
  });
}

namespace {

// An error reading a weight file, as the caller sees it: the file's path on
// the server replaced by the one the caller gave, and a file that is not
// valid safetensors (or lacks what the call asks of it) FAILED_PRECONDITION:
// the file must be fixed, sending the call again does not help. Never
// DATA_LOSS, which means bytes damaged on the way and worth a retry.
absl::Status WeightFileError(const absl::Status& s, const std::filesystem::path& file,
                             absl::string_view relative) {
  if (s.ok()) return s;
  const std::string message = absl::StrReplaceAll(s.message(), {{file.string(), relative}});
  switch (s.code()) {
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return absl::FailedPreconditionError(message);
    default:
      return absl::Status(s.code(), message);
  }
}

}  // namespace

absl::Status LogitdService::DoLoadWeight(const v1::LoadWeightRequest& request,
                                         v1::WeightInfo* response, CallStats* stats) {
  LOGITD_ASSIGN_OR_RETURN(const std::filesystem::path file,
                          ResolveWeightPath(options_.weights_dir, request.path()));
  const std::string where =
      absl::StrCat("path '", request.path(), "' tensor '", request.tensor(), "'");
  if (request.tensor().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected the name of a tensor in the file, got an empty one"));
  }
  // The header alone: dtype and shape are checked, and the budget charged,
  // before any of the tensor's bytes are read.
  absl::StatusOr<SafetensorsTensorInfo> stated =
      StatSafetensorsTensor(file.string(), request.tensor());
  LOGITD_RETURN_IF_ERROR(WeightFileError(stated.status(), file, request.path()));
  const SafetensorsTensorInfo& stat = *stated;
  if (stat.dtype != "BF16" && stat.dtype != "F32" && stat.dtype != "F16") {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": expected dtype BF16, F32 or F16 (rounded to bf16), got ", stat.dtype));
  }
  if (request.name().size() > kMaxWeightNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name: expected at most ", kMaxWeightNameBytes,
                                                   " bytes, got ", request.name().size()));
  }
  const std::string name = request.name().empty() ? request.tensor() : request.name();
  absl::StatusOr<WeightPlan> checked = WeightPlanOf(stat.shape);
  if (!checked.ok()) {
    // The file's tensor is not a weight this server can use.
    return absl::FailedPreconditionError(absl::StrCat(where, ": ", checked.status().message()));
  }
  const WeightPlan plan = *checked;
  const std::string label =
      absl::StrCat("'", name, "' ", ShapeString(std::vector<std::int64_t>{plan.v, plan.k}));

  // The handle needs the bytes' digest, so the budget is charged first. A
  // full budget may still take a weight it already holds: the file is read
  // only when a held weight has the same shape, and its copy is not kept.
  BudgetReservation reservation;
  absl::StatusOr<BudgetReservation> reserved =
      registry_.ReserveWeight(stats->tenant, label, plan.v, plan.k);
  if (reserved.ok()) {
    reservation = std::move(*reserved);
  } else {
    bool same_shape = false;
    for (const WeightRecord& w : registry_.List(stats->tenant)) {
      same_shape = same_shape || (w.v == plan.v && w.k == plan.k);
    }
    if (!same_shape) return reserved.status();
  }

  absl::StatusOr<Tensor> loaded = ReadSafetensorsTensor(file.string(), request.tensor());
  LOGITD_RETURN_IF_ERROR(WeightFileError(loaded.status(), file, request.path()));
  Tensor read = *std::move(loaded);
  Tensor w;
  std::string converted;
  if (read.dtype() == DType::kBf16) {
    w = std::move(read);
  } else {
    // F32 as stored, or F16 widened exactly to fp32 by the reader.
    converted = stat.dtype;
    w = Tensor(DType::kBf16, read.shape());
    const float* src = read.data<float>();
    Bf16Bits* dst = w.data<Bf16Bits>();
    for (std::int64_t i = 0; i < read.numel(); ++i) dst[i] = FloatToBf16(src[i]);
    read = Tensor();
  }
  const std::uint64_t digest = Xxh3(w.bytes(), static_cast<std::size_t>(w.nbytes()));
  const std::string handle = WeightRegistry::MakeHandle(digest, plan.v, plan.k);
  const std::string how =
      converted.empty()
          ? "bf16 as stored"
          : absl::StrCat("converted ", converted == "F16" ? "fp16" : "fp32", " -> bf16 (RNE)");

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(stats->tenant, handle);
      existing.ok()) {
    FillWeightInfo(*existing, /*already_registered=*/true, response);
    response->set_converted_from(converted);
    stats->bytes_out = response->ByteSizeLong();
    LogInfo(absl::StrCat("weight already registered: ", handle, " ", existing->Label(),
                         " loaded from file:", request.path(), " tensor=", request.tensor(), " ",
                         how));
    return absl::OkStatus();
  }
  if (!reservation.active()) {
    LOGITD_ASSIGN_OR_RETURN(reservation,
                            registry_.ReserveWeight(stats->tenant, label, plan.v, plan.k));
  }
  LOGITD_ASSIGN_OR_RETURN(std::shared_ptr<kernels::Weight> weight,
                          backend_->LoadWeight(w.data<Bf16Bits>(), plan.v, plan.k));
  w = Tensor();
  InsertResult inserted = registry_.Insert(stats->tenant, std::move(reservation), handle, name,
                                           plan.v, plan.k, digest, std::move(weight));
  FillWeightInfo(inserted.record, inserted.already_registered, response);
  response->set_converted_from(converted);
  stats->bytes_out = response->ByteSizeLong();
  LogInfo(absl::StrCat(
      inserted.already_registered ? "weight already registered: " : "weight registered: ", handle,
      " ", inserted.record.Label(), " loaded from file:", request.path(),
      " tensor=", request.tensor(), " ", how, " bytes=", inserted.record.bytes,
      " in_use=", registry_.bytes_in_use(), "/", registry_.budget_bytes()));
  return absl::OkStatus();
}

grpc::Status LogitdService::ListWeights(grpc::ServerContext* context,
                                        const v1::ListWeightsRequest* /*request*/,
                                        v1::ListWeightsResponse* response) {
  return Run("ListWeights", context, [&](CallStats* stats) {
    for (const WeightRecord& w : registry_.List(stats->tenant)) {
      FillWeightInfo(w, /*already_registered=*/false, response->add_weights());
    }
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::ReleaseWeight(grpc::ServerContext* context,
                                          const v1::ReleaseWeightRequest* request,
                                          v1::ReleaseWeightResponse* response) {
  return Run("ReleaseWeight", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_RETURN_IF_ERROR(ValidateHandle(request->handle()));
    LOGITD_ASSIGN_OR_RETURN(const WeightRegistry::Released released,
                            registry_.Release(stats->tenant, request->handle(), request->force()));
    response->set_bytes_freed(released.bytes_freed);
    response->set_bytes_freed_when_calls_end(released.bytes_freed_when_calls_end);
    response->set_registrations_left(released.registrations_left);
    stats->bytes_out = response->ByteSizeLong();
    LogInfo(absl::StrCat("weight released: ", request->handle(), " bytes=", released.bytes_freed,
                         " bytes_when_calls_end=", released.bytes_freed_when_calls_end,
                         " registrations_left=", released.registrations_left,
                         " in_use=", registry_.bytes_in_use(), "/", registry_.budget_bytes()));
    return absl::OkStatus();
  });
}

RawBidiReactor* LogitdService::Logits(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
    MessageStream<v1::LogitsResponse, v1::LogitsRequest> stream(raw,
                                                                options_.max_receive_message_bytes);
    return Run("Logits", c, [&](CallStats* stats) { return DoLogits(c, &stream, stats); });
  });
}

absl::Status LogitdService::DoLogits(grpc::ServerContextBase* context,
                                     MessageStream<v1::LogitsResponse, v1::LogitsRequest>* stream,
                                     CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::LogitsRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::LogitsHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, stats->tenant, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const LogitsPlan plan,
                          ValidateLogits(header, DimsOf(w), options_.max_request_bytes));
  // Shared-memory slices are checked (and the regions held) before any work.
  std::optional<ShmSlice> x_shm;
  std::optional<ShmSlice> y_shm;
  if (header.has_x_shm()) {
    LOGITD_ASSIGN_OR_RETURN(x_shm, shm_.Resolve(stats->tenant, "x", header.x_shm(), plan.x_bytes,
                                                /*is_output=*/false, 1));
  }
  if (header.has_y_shm()) {
    LOGITD_ASSIGN_OR_RETURN(y_shm, shm_.Resolve(stats->tenant, "y", header.y_shm(), plan.y_bytes,
                                                /*is_output=*/true, ElementSize(plan.out_dtype)));
  }

  LOGITD_ASSIGN_OR_RETURN(
      const AdmissionTicket admitted,
      AdmitCall(admission_, context, "logits", plan.x_bytes + plan.y_bytes, stats));
  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer x,
                          InputBuffer(*backend_, header.x(), plan.x_bytes, x_shm, &assembler));
  // With X in shared memory the stream must carry no chunks: any is refused.
  LOGITD_RETURN_IF_ERROR(ReceiveChunks<v1::LogitsRequest>(context, stream, &assembler, stats));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  kernels::HostBuffer y_buffer;
  std::byte* y = nullptr;
  if (y_shm) {
    y = y_shm->data;
  } else {
    LOGITD_ASSIGN_OR_RETURN(y_buffer, backend_->AllocateHost(plan.y_bytes));
    y = y_buffer.data();
  }
  kernels::LogitsArgs args;
  args.x = x.as<Bf16Bits>();
  args.m = plan.m;
  args.alpha = plan.alpha;
  args.out_dtype = plan.out_dtype;
  args.y = y;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Logits(*w.weight, args, &timing));
  x = kernels::HostBuffer();  // inputs go before the response is streamed

  faults_.OnLogits(plan.out_dtype, y, plan.y_bytes);
  v1::LogitsResponse head;
  v1::LogitsResult* result = head.mutable_result();
  // With digest_last, Y is hashed while its chunks travel.
  const bool digest_last = !y_shm && header.digest_last();
  *result->mutable_y() = ResultSpec("y", plan.out_dtype, {plan.m, w.v}, y, plan.y_bytes,
                                    y_shm ? &header.y_shm() : nullptr, digest_last);
  if (!digest_last) result->mutable_y()->set_xxh3(faults_.LogitsDigest(result->y().xxh3()));
  if (y_shm) FillShmRef(header.y_shm(), *y_shm, plan.y_bytes, result->mutable_y_shm());
  FillTiming(receive_us, timing, result->mutable_timing(), stats);
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  if (y_shm) return absl::OkStatus();
  std::vector<StreamedOutput> outputs;
  outputs.push_back({"y", std::move(y_buffer), plan.y_bytes});
  return SendOutputs<v1::LogitsResponse>(
      stream, std::move(outputs), digest_last,
      [this](std::uint64_t digest) { return faults_.LogitsDigest(digest); }, stats);
}

RawBidiReactor* LogitdService::Backward(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
    MessageStream<v1::BackwardResponse, v1::BackwardRequest> stream(
        raw, options_.max_receive_message_bytes);
    return Run("Backward", c, [&](CallStats* stats) { return DoBackward(c, &stream, stats); });
  });
}

absl::Status LogitdService::DoBackward(
    grpc::ServerContextBase* context,
    MessageStream<v1::BackwardResponse, v1::BackwardRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::BackwardRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::BackwardHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, stats->tenant, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const BackwardPlan plan,
                          ValidateBackward(header, DimsOf(w), options_.max_request_bytes));
  // The gradient buffer is charged to the budget before the backend may
  // create it, and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(stats->tenant, w.handle));
  }

  // Shared-memory slices are checked (and the regions held) before any work.
  std::optional<ShmSlice> dy_shm;
  std::optional<ShmSlice> x_shm;
  std::optional<ShmSlice> dx_shm;
  std::optional<ShmSlice> dw_shm;
  if (header.has_dy_shm()) {
    LOGITD_ASSIGN_OR_RETURN(dy_shm, shm_.Resolve(stats->tenant, "dy", header.dy_shm(),
                                                 plan.dy_bytes, /*is_output=*/false, 1));
  }
  if (header.has_x_shm()) {
    LOGITD_ASSIGN_OR_RETURN(x_shm, shm_.Resolve(stats->tenant, "x", header.x_shm(), plan.x_bytes,
                                                /*is_output=*/false, 1));
  }
  if (header.has_dx_shm()) {
    if (!plan.want_dx) {
      return absl::InvalidArgumentError("dx_shm: given, but dX is not asked for (want_dx)");
    }
    LOGITD_ASSIGN_OR_RETURN(dx_shm,
                            shm_.Resolve(stats->tenant, "dx", header.dx_shm(), plan.dx_bytes,
                                         /*is_output=*/true, ElementSize(plan.dx_dtype)));
  }
  if (header.has_dw_shm()) {
    if (!plan.returns_dw()) {
      return absl::InvalidArgumentError(
          "dw_shm: given, but dW is not returned (want_dw without accumulate_dw)");
    }
    LOGITD_ASSIGN_OR_RETURN(dw_shm,
                            shm_.Resolve(stats->tenant, "dw", header.dw_shm(), plan.dw_bytes,
                                         /*is_output=*/true, ElementSize(plan.dw_dtype)));
  }

  LOGITD_ASSIGN_OR_RETURN(
      const AdmissionTicket admitted,
      AdmitCall(admission_, context, "backward",
                plan.dy_bytes + plan.x_bytes + plan.dx_bytes + plan.dw_bytes, stats));
  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer dy,
                          InputBuffer(*backend_, header.dy(), plan.dy_bytes, dy_shm, &assembler));
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer x,
                          InputBuffer(*backend_, header.x(), plan.x_bytes, x_shm, &assembler));
  LOGITD_RETURN_IF_ERROR(ReceiveChunks<v1::BackwardRequest>(context, stream, &assembler, stats));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  kernels::HostBuffer dx_buffer;
  kernels::HostBuffer dw_buffer;
  std::byte* dx = dx_shm ? dx_shm->data : nullptr;
  std::byte* dw = dw_shm ? dw_shm->data : nullptr;
  if (plan.want_dx && !dx_shm) {
    LOGITD_ASSIGN_OR_RETURN(dx_buffer, backend_->AllocateHost(plan.dx_bytes));
    dx = dx_buffer.data();
  }
  if (plan.returns_dw() && !dw_shm) {
    LOGITD_ASSIGN_OR_RETURN(dw_buffer, backend_->AllocateHost(plan.dw_bytes));
    dw = dw_buffer.data();
  }
  kernels::BackwardArgs args;
  args.dy = dy.data();
  args.dy_dtype = plan.dy_dtype;
  args.x = x.as<Bf16Bits>();
  args.m = plan.m;
  args.dx = plan.want_dx ? dx : nullptr;
  args.dx_dtype = plan.dx_dtype;
  args.dw = plan.returns_dw() ? dw : nullptr;
  args.dw_dtype = plan.dw_dtype;
  args.accumulate_dw = plan.accumulate_dw;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Backward(*w.weight, args, &timing));
  dy = kernels::HostBuffer();
  x = kernels::HostBuffer();

  v1::BackwardResponse head;
  v1::BackwardResult* result = head.mutable_result();
  const bool digest_last = header.digest_last();
  if (plan.want_dx) {
    faults_.OnDx(dx, plan.dx_bytes);
    *result->mutable_dx() = ResultSpec("dx", plan.dx_dtype, {plan.m, w.k}, dx, plan.dx_bytes,
                                       dx_shm ? &header.dx_shm() : nullptr, digest_last);
    if (dx_shm) FillShmRef(header.dx_shm(), *dx_shm, plan.dx_bytes, result->mutable_dx_shm());
  }
  if (plan.returns_dw()) {
    faults_.OnDw(dw, plan.dw_bytes);
    *result->mutable_dw() = ResultSpec("dw", plan.dw_dtype, {w.v, w.k}, dw, plan.dw_bytes,
                                       dw_shm ? &header.dw_shm() : nullptr, digest_last);
    if (dw_shm) FillShmRef(header.dw_shm(), *dw_shm, plan.dw_bytes, result->mutable_dw_shm());
  }
  FillTiming(receive_us, timing, result->mutable_timing(), stats);
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  std::vector<StreamedOutput> outputs;
  if (plan.want_dx && !dx_shm) outputs.push_back({"dx", std::move(dx_buffer), plan.dx_bytes});
  if (plan.returns_dw() && !dw_shm) outputs.push_back({"dw", std::move(dw_buffer), plan.dw_bytes});
  return SendOutputs<v1::BackwardResponse>(stream, std::move(outputs), digest_last, Unchanged,
                                           stats);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* LogitdService::FetchGradient(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ServeServerStreaming(
      context, request, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
        MessageStream<v1::FetchGradientResponse, v1::FetchGradientRequest> stream(
            raw, options_.max_receive_message_bytes);
        return Run("FetchGradient", c,
                   [&](CallStats* stats) { return DoFetchGradient(&stream, stats); });
      });
}

absl::Status LogitdService::DoFetchGradient(
    MessageStream<v1::FetchGradientResponse, v1::FetchGradientRequest>* stream, CallStats* stats) {
  // One request message; the client's half-close after it is not waited for.
  v1::FetchGradientRequest request;
  if (!stream->Read(&request)) {
    LOGITD_RETURN_IF_ERROR(ReadError(*stream));
    return absl::InvalidArgumentError("expected a FetchGradientRequest, got an empty stream");
  }
  stats->bytes_in = request.ByteSizeLong();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, stats->tenant, request.weight_handle()));
  // Not held to --max_request_bytes: the buffer already counts against the
  // weight budget, and refusing here would strand an accumulated gradient.
  const std::uint64_t bytes = WeightRegistry::GradientBytes(w.v, w.k);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer dw, backend_->AllocateHost(bytes));
  const absl::Time fetch_start = absl::Now();
  LOGITD_ASSIGN_OR_RETURN(
      const std::uint64_t calls,
      backend_->FetchGradient(*w.weight, dw.as<float>(), request.zero_after_fetch()));
  // The copy out of the gradient buffer (device to host on cuda): the
  // trailer's d2h.
  stats->d2h_us = Micros(absl::Now() - fetch_start);
  faults_.OnDw(dw.data(), bytes);

  v1::FetchGradientResponse head;
  v1::FetchGradientResult* result = head.mutable_result();
  *result->mutable_dw() =
      ResultSpec("dw", DType::kFp32, {w.v, w.k}, dw.data(), bytes, nullptr, request.digest_last());
  result->set_accumulated_calls(calls);
  stats->send_start = absl::Now();
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  std::vector<StreamedOutput> outputs;
  outputs.push_back({"dw", std::move(dw), bytes});
  return SendOutputs<v1::FetchGradientResponse>(stream, std::move(outputs), request.digest_last(),
                                                Unchanged, stats);
}

grpc::Status LogitdService::ZeroGradient(grpc::ServerContext* context,
                                         const v1::ZeroGradientRequest* request,
                                         v1::ZeroGradientResponse* /*response*/) {
  return Run("ZeroGradient", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                            FindWeight(registry_, stats->tenant, request->weight_handle()));
    return backend_->ZeroGradient(*w.weight);
  });
}

RawBidiReactor* LogitdService::Cast(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
    MessageStream<v1::CastResponse, v1::CastRequest> stream(raw,
                                                            options_.max_receive_message_bytes);
    return Run("Cast", c, [&](CallStats* stats) { return DoCast(c, &stream, stats); });
  });
}

absl::Status LogitdService::DoCast(grpc::ServerContextBase* context,
                                   MessageStream<v1::CastResponse, v1::CastRequest>* stream,
                                   CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::CastRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::CastHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const CastPlan plan, ValidateCast(header, options_.max_request_bytes));

  LOGITD_ASSIGN_OR_RETURN(
      const AdmissionTicket admitted,
      AdmitCall(admission_, context, "cast", plan.in_bytes + plan.out_bytes, stats));
  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_ASSIGN_OR_RETURN(
      kernels::HostBuffer in,
      InputBuffer(*backend_, header.input(), plan.in_bytes, std::nullopt, &assembler));
  LOGITD_RETURN_IF_ERROR(ReceiveChunks<v1::CastRequest>(context, stream, &assembler, stats));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer out, backend_->AllocateHost(plan.out_bytes));
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->CastToBf16(in.as<float>(), plan.n, out.as<Bf16Bits>(), &timing));
  in = kernels::HostBuffer();
  faults_.OnCast(out.data(), plan.out_bytes);

  v1::CastResponse head;
  v1::CastResult* result = head.mutable_result();
  *result->mutable_output() = ResultSpec("output", DType::kBf16, plan.shape, out.data(),
                                         plan.out_bytes, nullptr, header.digest_last());
  FillTiming(receive_us, timing, result->mutable_timing(), stats);
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  std::vector<StreamedOutput> outputs;
  outputs.push_back({"output", std::move(out), plan.out_bytes});
  return SendOutputs<v1::CastResponse>(stream, std::move(outputs), header.digest_last(), Unchanged,
                                       stats);
}

RawBidiReactor* LogitdService::CrossEntropy(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
    MessageStream<v1::CrossEntropyResponse, v1::CrossEntropyRequest> stream(
        raw, options_.max_receive_message_bytes);
    return Run("CrossEntropy", c,
               [&](CallStats* stats) { return DoCrossEntropy(c, &stream, stats); });
  });
}

absl::Status LogitdService::DoCrossEntropy(
    grpc::ServerContextBase* context,
    MessageStream<v1::CrossEntropyResponse, v1::CrossEntropyRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::CrossEntropyRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::CrossEntropyHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, stats->tenant, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyPlan plan,
                          ValidateCrossEntropy(header, DimsOf(w), options_.max_request_bytes));
  // As in Backward: the buffer is charged before the backend may create it
  // and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(stats->tenant, w.handle));
  }

  // Besides the tensors that travel: the targets widened to int64 and the
  // per-token losses the backend always writes.
  const std::uint64_t m = static_cast<std::uint64_t>(plan.m);
  LOGITD_ASSIGN_OR_RETURN(
      const AdmissionTicket admitted,
      AdmitCall(admission_, context, "cross entropy",
                plan.x_bytes + plan.targets_bytes + plan.loss_bytes + plan.lse_bytes +
                    plan.dx_bytes + plan.dw_bytes + m * sizeof(std::int64_t) + m * sizeof(float),
                stats));
  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer x, InputBuffer(*backend_, header.x(), plan.x_bytes,
                                                             std::nullopt, &assembler));
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.targets()));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::CrossEntropyRequest>(context, stream, &assembler, stats));
  std::vector<std::int64_t> targets;
  std::int64_t counted = 0;
  {
    LOGITD_ASSIGN_OR_RETURN(const Tensor received, assembler.Take(header.targets().name()));
    LOGITD_ASSIGN_OR_RETURN(counted, ConvertTargets(received, w.v, plan.ignore_index, &targets));
  }
  const std::int64_t receive_us = Micros(absl::Now() - start);

  // Per-token losses always come back from the backend; a reduced loss is
  // formed from them here.
  const std::uint64_t token_loss_bytes = static_cast<std::uint64_t>(plan.m) * sizeof(float);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer token_loss, backend_->AllocateHost(token_loss_bytes));
  kernels::HostBuffer lse;
  kernels::HostBuffer dx;
  kernels::HostBuffer dw;
  if (plan.want_lse) {
    LOGITD_ASSIGN_OR_RETURN(lse, backend_->AllocateHost(plan.lse_bytes));
  }
  if (plan.want_dx) {
    LOGITD_ASSIGN_OR_RETURN(dx, backend_->AllocateHost(plan.dx_bytes));
  }
  if (plan.returns_dw()) {
    LOGITD_ASSIGN_OR_RETURN(dw, backend_->AllocateHost(plan.dw_bytes));
  }
  kernels::CrossEntropyArgs args;
  args.x = x.as<Bf16Bits>();
  args.m = plan.m;
  args.targets = targets.data();
  args.ignore_index = plan.ignore_index;
  args.z_loss = plan.z_loss;
  args.logit_softcap = plan.logit_softcap;
  args.grad_scale = CrossEntropyGradScale(plan, counted);
  args.loss = token_loss.as<float>();
  args.lse = plan.want_lse ? lse.as<float>() : nullptr;
  args.dx = plan.want_dx ? dx.data() : nullptr;
  args.dx_dtype = plan.dx_dtype;
  args.dw = plan.returns_dw() ? dw.as<float>() : nullptr;
  args.accumulate_dw = plan.accumulate_dw;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->CrossEntropy(*w.weight, args, &timing));
  x = kernels::HostBuffer();
  targets = std::vector<std::int64_t>();

  kernels::HostBuffer reduced;
  if (plan.reduction != v1::REDUCTION_NONE) {
    LOGITD_ASSIGN_OR_RETURN(reduced, backend_->AllocateHost(plan.loss_bytes));
    *reduced.as<float>() = ReduceLoss(plan, token_loss.as<float>(), plan.m, counted);
  }
  kernels::HostBuffer loss =
      plan.reduction == v1::REDUCTION_NONE ? std::move(token_loss) : std::move(reduced);

  v1::CrossEntropyResponse head;
  v1::CrossEntropyResult* result = head.mutable_result();
  const bool digest_last = header.digest_last();
  *result->mutable_loss() = ResultSpec("loss", DType::kFp32, plan.loss_shape, loss.data(),
                                       plan.loss_bytes, nullptr, digest_last);
  if (plan.want_lse) {
    *result->mutable_lse() =
        ResultSpec("lse", DType::kFp32, {plan.m}, lse.data(), plan.lse_bytes, nullptr, digest_last);
  }
  if (plan.want_dx) {
    faults_.OnDx(dx.data(), plan.dx_bytes);
    *result->mutable_dx() = ResultSpec("dx", plan.dx_dtype, {plan.m, w.k}, dx.data(), plan.dx_bytes,
                                       nullptr, digest_last);
  }
  if (plan.returns_dw()) {
    faults_.OnDw(dw.data(), plan.dw_bytes);
    *result->mutable_dw() =
        ResultSpec("dw", DType::kFp32, {w.v, w.k}, dw.data(), plan.dw_bytes, nullptr, digest_last);
  }
  result->set_counted_tokens(counted);
  FillTiming(receive_us, timing, result->mutable_timing(), stats);
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  std::vector<StreamedOutput> outputs;
  outputs.push_back({"loss", std::move(loss), plan.loss_bytes});
  if (plan.want_lse) outputs.push_back({"lse", std::move(lse), plan.lse_bytes});
  if (plan.want_dx) outputs.push_back({"dx", std::move(dx), plan.dx_bytes});
  if (plan.returns_dw()) outputs.push_back({"dw", std::move(dw), plan.dw_bytes});
  return SendOutputs<v1::CrossEntropyResponse>(stream, std::move(outputs), digest_last, Unchanged,
                                               stats);
}

grpc::Status LogitdService::Probe(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ProbeChunk, v1::ProbeRequest>* stream) {
  return Run("Probe", context, [&](CallStats* stats) { return DoProbe(context, stream, stats); });
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
  return Run("RegisterShm", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const ShmRecord r,
                            shm_.Register(stats->tenant, request->name(), request->bytes()));
    // Page-locked, the device copies to and from the region at full speed;
    // a region that cannot be stays usable at the pageable rate.
    const absl::Time pin_start = absl::Now();
    absl::StatusOr<std::shared_ptr<void>> pin =
        backend_->PinHostMemory(r.mapping->base(), static_cast<std::size_t>(r.mapping->bytes()));
    std::string pinned = "not page-locked (the backend has no device)";
    if (!pin.ok()) {
      pinned = absl::StrCat("not page-locked (", pin.status().message(),
                            "): device copies use the pageable path");
    } else if (*pin != nullptr) {
      r.mapping->set_pin(*std::move(pin));
      pinned = absl::StrCat("page-locked in ", absl::FormatDuration(absl::Now() - pin_start));
    }
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
  return Run("ReleaseShm", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_RETURN_IF_ERROR(ValidateHandle(request->handle()));
    return shm_.Release(stats->tenant, request->handle());
  });
}

}  // namespace logitd::service

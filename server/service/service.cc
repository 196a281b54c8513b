#include "server/service/service.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/wire.h"
#include "logitd/bf16.h"
#include "logitd/safetensors.h"
#include "logitd/tensor.h"
#include "server/service/build_info.h"
#include "server/service/logging.h"
#include "server/service/status.h"
#include "server/service/validation.h"

namespace logitd::service {
namespace {

constexpr std::size_t kMaxLoggedMessage = 300;

// Reads the call's first message, which must be its header.
template <typename Request, typename Stream>
absl::Status ReadHeader(Stream* stream, Request* first, std::uint64_t* bytes_in) {
  if (!stream->Read(first)) {
    return absl::InvalidArgumentError("expected a header first, got an empty request stream");
  }
  *bytes_in += first->ByteSizeLong();
  if (first->part_case() != Request::kHeader) {
    return absl::InvalidArgumentError(
        "expected a header first, got a chunk (or a message with neither) as the first message");
  }
  return absl::OkStatus();
}

// Feeds the rest of the request stream into `assembler` and checks that
// every announced tensor arrived whole and undamaged.
template <typename Request, typename Stream>
absl::Status ReceiveChunks(grpc::ServerContext* context, Stream* stream, wire::Assembler* assembler,
                           std::uint64_t* bytes_in) {
  Request msg;
  while (stream->Read(&msg)) {
    *bytes_in += msg.ByteSizeLong();
    switch (msg.part_case()) {
      case Request::kChunk:
        LOGITD_RETURN_IF_ERROR(assembler->Add(msg.chunk()));
        break;
      case Request::kHeader:
        return absl::InvalidArgumentError(
            "expected chunks after the header, got a second header (one call carries one header)");
      default:
        return absl::InvalidArgumentError(
            "expected a chunk, got a request message with neither header nor chunk");
    }
  }
  if (context->IsCancelled()) {
    return absl::CancelledError("the client cancelled the call while sending its tensors");
  }
  return assembler->Finish();
}

template <typename Response, typename Stream>
absl::Status WriteMessage(Stream* stream, const Response& response, std::uint64_t* bytes_out) {
  *bytes_out += response.ByteSizeLong();
  if (!stream->Write(response)) {
    return absl::UnavailableError("the client stopped reading the response");
  }
  return absl::OkStatus();
}

// Streams `bytes` of `buffer` as chunks of `name`.
template <typename Response, typename Stream>
absl::Status SendTensor(Stream* stream, absl::string_view name, const kernels::HostBuffer& buffer,
                        std::uint64_t bytes, std::size_t chunk_bytes, std::uint64_t* bytes_out) {
  return wire::SendChunks(name, buffer.data(), static_cast<std::size_t>(bytes), chunk_bytes,
                          [&](v1::TensorChunk&& chunk) {
                            Response r;
                            *r.mutable_chunk() = std::move(chunk);
                            *bytes_out += r.ByteSizeLong();
                            return stream->Write(r);
                          });
}

v1::TensorSpec OutputSpec(absl::string_view name, DType dtype,
                          const std::vector<std::int64_t>& shape, const kernels::HostBuffer& buffer,
                          std::uint64_t bytes) {
  v1::TensorSpec spec;
  spec.set_name(std::string(name));
  spec.set_dtype(wire::ToProto(dtype));
  for (std::int64_t d : shape) spec.add_shape(d);
  spec.set_xxh3(Xxh3(buffer.data(), static_cast<std::size_t>(bytes)));
  return spec;
}

std::int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

void FillTiming(std::int64_t receive_us, const kernels::Timing& t, v1::Timing* out) {
  out->set_queue_us(0);
  out->set_receive_us(receive_us);
  out->set_h2d_us(t.h2d_us);
  out->set_compute_us(t.compute_us);
  out->set_d2h_us(t.d2h_us);
}

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
absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, absl::string_view handle) {
  LOGITD_RETURN_IF_ERROR(ValidateHandle(handle));
  return registry.Find(handle);
}

}  // namespace

LogitdService::LogitdService(std::unique_ptr<kernels::Backend> backend, ServiceOptions options)
    : backend_(std::move(backend)),
      options_(options),
      registry_(options.weight_budget_bytes),
      faults_(options.faults) {}

LogitdService::~LogitdService() = default;

template <typename Body>
grpc::Status LogitdService::Run(absl::string_view method, grpc::ServerContext* context,
                                Body&& body) {
  const absl::Time start = absl::Now();
  CallStats stats;
  absl::Status status = body(&stats);
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled && context->IsCancelled()) {
    // The failure is a consequence of the client going away, not its cause.
    status = absl::CancelledError(
        absl::StrCat("call cancelled by the client or its deadline (", status.message(), ")"));
  }
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    std::string line =
        absl::StrFormat("rpc=%s code=%s in=%d out=%d ms=%.3f peer=%s", method,
                        absl::StatusCodeToString(status.code()), stats.bytes_in, stats.bytes_out,
                        absl::ToDoubleMilliseconds(absl::Now() - start), context->peer());
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
    response->set_weight_budget_bytes(registry_.budget_bytes());
    response->set_weight_bytes_in_use(registry_.bytes_in_use());
    response->set_max_request_bytes(options_.max_request_bytes);
    response->set_chunk_bytes(options_.chunk_bytes);
    response->set_device_bytes_in_use(backend_->DeviceBytesInUse());
    response->set_split_k(info.split_k);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::RegisterWeight(grpc::ServerContext* context,
                                           grpc::ServerReader<v1::RegisterWeightRequest>* reader,
                                           v1::WeightInfo* response) {
  return Run("RegisterWeight", context,
             [&](CallStats* stats) { return DoRegisterWeight(context, reader, response, stats); });
}

absl::Status LogitdService::DoRegisterWeight(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::RegisterWeightRequest>* reader,
                                             v1::WeightInfo* response, CallStats* stats) {
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
  if (!registry_.Find(handle).ok()) {
    LOGITD_ASSIGN_OR_RETURN(reservation, registry_.ReserveWeight(label, plan.v, plan.k));
  }

  wire::Assembler assembler(plan.bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(spec));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::RegisterWeightRequest>(context, reader, &assembler, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(Tensor w, assembler.Take(spec.name()));

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(handle); existing.ok()) {
    FillWeightInfo(*existing, /*already_registered=*/true, response);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  }
  if (!reservation.active()) {
    // It was held at the header but released while the bytes arrived.
    LOGITD_ASSIGN_OR_RETURN(reservation, registry_.ReserveWeight(label, plan.v, plan.k));
  }
  LOGITD_ASSIGN_OR_RETURN(std::shared_ptr<kernels::Weight> weight,
                          backend_->LoadWeight(w.data<Bf16Bits>(), plan.v, plan.k));
  w = Tensor();  // the host copy is not needed once the backend holds the weight
  InsertResult inserted = registry_.Insert(std::move(reservation), handle, header.name(), plan.v,
                                           plan.k, spec.xxh3(), std::move(weight));
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
  LOGITD_ASSIGN_OR_RETURN(const SafetensorsTensorInfo stat,
                          StatSafetensorsTensor(file.string(), request.tensor()));
  if (stat.dtype != "BF16" && stat.dtype != "F32" && stat.dtype != "F16") {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected dtype BF16, F32 or F16 (rounded to bf16), got ", stat.dtype));
  }
  v1::RegisterWeightHeader header;
  header.set_name(request.name().empty() ? request.tensor() : request.name());
  header.mutable_weight()->set_name("weight");
  header.mutable_weight()->set_dtype(v1::DTYPE_BF16);
  for (std::int64_t d : stat.shape) header.mutable_weight()->add_shape(d);
  absl::StatusOr<WeightPlan> checked = ValidateRegisterWeight(header);
  if (!checked.ok()) {
    return absl::Status(checked.status().code(),
                        absl::StrCat(where, ": ", checked.status().message()));
  }
  const WeightPlan plan = *checked;
  const std::string label = absl::StrCat("'", header.name(), "' ",
                                         ShapeString(std::vector<std::int64_t>{plan.v, plan.k}));

  // The handle needs the bytes' digest, so the budget is charged first. A
  // full budget may still take a weight it already holds: the file is read
  // only when a held weight has the same shape, and its copy is not kept.
  BudgetReservation reservation;
  absl::StatusOr<BudgetReservation> reserved = registry_.ReserveWeight(label, plan.v, plan.k);
  if (reserved.ok()) {
    reservation = std::move(*reserved);
  } else {
    bool same_shape = false;
    for (const WeightRecord& w : registry_.List()) {
      same_shape = same_shape || (w.v == plan.v && w.k == plan.k);
    }
    if (!same_shape) return reserved.status();
  }

  LOGITD_ASSIGN_OR_RETURN(Tensor read, ReadSafetensorsTensor(file.string(), request.tensor()));
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

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(handle); existing.ok()) {
    FillWeightInfo(*existing, /*already_registered=*/true, response);
    response->set_converted_from(converted);
    stats->bytes_out = response->ByteSizeLong();
    LogInfo(absl::StrCat("weight already registered: ", handle, " ", existing->Label(),
                         " loaded from file:", request.path(), " tensor=", request.tensor(), " ",
                         how));
    return absl::OkStatus();
  }
  if (!reservation.active()) {
    LOGITD_ASSIGN_OR_RETURN(reservation, registry_.ReserveWeight(label, plan.v, plan.k));
  }
  LOGITD_ASSIGN_OR_RETURN(std::shared_ptr<kernels::Weight> weight,
                          backend_->LoadWeight(w.data<Bf16Bits>(), plan.v, plan.k));
  w = Tensor();
  InsertResult inserted = registry_.Insert(std::move(reservation), handle, header.name(), plan.v,
                                           plan.k, digest, std::move(weight));
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
    for (const WeightRecord& w : registry_.List()) {
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
                            registry_.Release(request->handle(), request->force()));
    response->set_bytes_freed(released.bytes_freed);
    response->set_registrations_left(released.registrations_left);
    stats->bytes_out = response->ByteSizeLong();
    LogInfo(absl::StrCat("weight released: ", request->handle(), " bytes=", released.bytes_freed,
                         " registrations_left=", released.registrations_left,
                         " in_use=", registry_.bytes_in_use(), "/", registry_.budget_bytes()));
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::Logits(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::LogitsResponse, v1::LogitsRequest>* stream) {
  return Run("Logits", context, [&](CallStats* stats) { return DoLogits(context, stream, stats); });
}

absl::Status LogitdService::DoLogits(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::LogitsResponse, v1::LogitsRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::LogitsRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::LogitsHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindWeight(registry_, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const LogitsPlan plan,
                          ValidateLogits(header, DimsOf(w), options_.max_request_bytes));

  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.x()));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::LogitsRequest>(context, stream, &assembler, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(Tensor x, assembler.Take(header.x().name()));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer y, backend_->AllocateHost(plan.y_bytes));
  kernels::LogitsArgs args;
  args.x = x.data<Bf16Bits>();
  args.m = plan.m;
  args.alpha = plan.alpha;
  args.out_dtype = plan.out_dtype;
  args.y = y.data();
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Logits(*w.weight, args, &timing));
  x = Tensor();  // inputs go before the response is streamed

  faults_.OnLogits(plan.out_dtype, y.data(), plan.y_bytes);
  v1::LogitsResponse head;
  v1::LogitsResult* result = head.mutable_result();
  *result->mutable_y() = OutputSpec("y", plan.out_dtype, {plan.m, w.v}, y, plan.y_bytes);
  result->mutable_y()->set_xxh3(faults_.LogitsDigest(result->y().xxh3()));
  FillTiming(receive_us, timing, result->mutable_timing());
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  return SendTensor<v1::LogitsResponse>(stream, "y", y, plan.y_bytes, options_.chunk_bytes,
                                        &stats->bytes_out);
}

grpc::Status LogitdService::Backward(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackwardResponse, v1::BackwardRequest>* stream) {
  return Run("Backward", context,
             [&](CallStats* stats) { return DoBackward(context, stream, stats); });
}

absl::Status LogitdService::DoBackward(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackwardResponse, v1::BackwardRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::BackwardRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::BackwardHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindWeight(registry_, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const BackwardPlan plan,
                          ValidateBackward(header, DimsOf(w), options_.max_request_bytes));
  // The gradient buffer is charged to the budget before the backend may
  // create it, and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(w.handle));
  }

  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.dy()));
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.x()));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::BackwardRequest>(context, stream, &assembler, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(Tensor dy, assembler.Take(header.dy().name()));
  LOGITD_ASSIGN_OR_RETURN(Tensor x, assembler.Take(header.x().name()));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  kernels::HostBuffer dx;
  kernels::HostBuffer dw;
  if (plan.want_dx) {
    LOGITD_ASSIGN_OR_RETURN(dx, backend_->AllocateHost(plan.dx_bytes));
  }
  if (plan.returns_dw()) {
    LOGITD_ASSIGN_OR_RETURN(dw, backend_->AllocateHost(plan.dw_bytes));
  }
  kernels::BackwardArgs args;
  args.dy = dy.bytes();
  args.dy_dtype = plan.dy_dtype;
  args.x = x.data<Bf16Bits>();
  args.m = plan.m;
  args.dx = plan.want_dx ? dx.data() : nullptr;
  args.dx_dtype = plan.dx_dtype;
  args.dw = plan.returns_dw() ? dw.data() : nullptr;
  args.dw_dtype = plan.dw_dtype;
  args.accumulate_dw = plan.accumulate_dw;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Backward(*w.weight, args, &timing));
  dy = Tensor();
  x = Tensor();

  v1::BackwardResponse head;
  v1::BackwardResult* result = head.mutable_result();
  if (plan.want_dx) {
    faults_.OnDx(dx.data(), plan.dx_bytes);
    *result->mutable_dx() = OutputSpec("dx", plan.dx_dtype, {plan.m, w.k}, dx, plan.dx_bytes);
  }
  if (plan.returns_dw()) {
    faults_.OnDw(dw.data(), plan.dw_bytes);
    *result->mutable_dw() = OutputSpec("dw", plan.dw_dtype, {w.v, w.k}, dw, plan.dw_bytes);
  }
  FillTiming(receive_us, timing, result->mutable_timing());
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(SendTensor<v1::BackwardResponse>(
        stream, "dx", dx, plan.dx_bytes, options_.chunk_bytes, &stats->bytes_out));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(SendTensor<v1::BackwardResponse>(
        stream, "dw", dw, plan.dw_bytes, options_.chunk_bytes, &stats->bytes_out));
  }
  return absl::OkStatus();
}

grpc::Status LogitdService::FetchGradient(grpc::ServerContext* context,
                                          const v1::FetchGradientRequest* request,
                                          grpc::ServerWriter<v1::FetchGradientResponse>* writer) {
  return Run("FetchGradient", context,
             [&](CallStats* stats) { return DoFetchGradient(*request, writer, stats); });
}

absl::Status LogitdService::DoFetchGradient(const v1::FetchGradientRequest& request,
                                            grpc::ServerWriter<v1::FetchGradientResponse>* writer,
                                            CallStats* stats) {
  stats->bytes_in = request.ByteSizeLong();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindWeight(registry_, request.weight_handle()));
  // Not held to --max_request_bytes: the buffer already counts against the
  // weight budget, and refusing here would strand an accumulated gradient.
  const std::uint64_t bytes = WeightRegistry::GradientBytes(w.v, w.k);
  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer dw, backend_->AllocateHost(bytes));
  LOGITD_ASSIGN_OR_RETURN(
      const std::uint64_t calls,
      backend_->FetchGradient(*w.weight, dw.as<float>(), request.zero_after_fetch()));
  faults_.OnDw(dw.data(), bytes);

  v1::FetchGradientResponse head;
  v1::FetchGradientResult* result = head.mutable_result();
  *result->mutable_dw() = OutputSpec("dw", DType::kFp32, {w.v, w.k}, dw, bytes);
  result->set_accumulated_calls(calls);
  LOGITD_RETURN_IF_ERROR(WriteMessage(writer, head, &stats->bytes_out));
  return SendTensor<v1::FetchGradientResponse>(writer, "dw", dw, bytes, options_.chunk_bytes,
                                               &stats->bytes_out);
}

grpc::Status LogitdService::ZeroGradient(grpc::ServerContext* context,
                                         const v1::ZeroGradientRequest* request,
                                         v1::ZeroGradientResponse* /*response*/) {
  return Run("ZeroGradient", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindWeight(registry_, request->weight_handle()));
    return backend_->ZeroGradient(*w.weight);
  });
}

grpc::Status LogitdService::Cast(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CastResponse, v1::CastRequest>* stream) {
  return Run("Cast", context, [&](CallStats* stats) { return DoCast(context, stream, stats); });
}

absl::Status LogitdService::DoCast(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CastResponse, v1::CastRequest>* stream, CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::CastRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::CastHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const CastPlan plan, ValidateCast(header, options_.max_request_bytes));

  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.input()));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::CastRequest>(context, stream, &assembler, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(Tensor in, assembler.Take(header.input().name()));
  const std::int64_t receive_us = Micros(absl::Now() - start);

  LOGITD_ASSIGN_OR_RETURN(kernels::HostBuffer out, backend_->AllocateHost(plan.out_bytes));
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(
      backend_->CastToBf16(in.data<float>(), plan.n, out.as<Bf16Bits>(), &timing));
  in = Tensor();
  faults_.OnCast(out.data(), plan.out_bytes);

  v1::CastResponse head;
  v1::CastResult* result = head.mutable_result();
  *result->mutable_output() = OutputSpec("output", DType::kBf16, plan.shape, out, plan.out_bytes);
  FillTiming(receive_us, timing, result->mutable_timing());
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  return SendTensor<v1::CastResponse>(stream, "output", out, plan.out_bytes, options_.chunk_bytes,
                                      &stats->bytes_out);
}

grpc::Status LogitdService::CrossEntropy(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CrossEntropyResponse, v1::CrossEntropyRequest>* stream) {
  return Run("CrossEntropy", context,
             [&](CallStats* stats) { return DoCrossEntropy(context, stream, stats); });
}

absl::Status LogitdService::DoCrossEntropy(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CrossEntropyResponse, v1::CrossEntropyRequest>* stream,
    CallStats* stats) {
  const absl::Time start = absl::Now();
  v1::CrossEntropyRequest first;
  LOGITD_RETURN_IF_ERROR(ReadHeader(stream, &first, &stats->bytes_in));
  const v1::CrossEntropyHeader& header = first.header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindWeight(registry_, header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyPlan plan,
                          ValidateCrossEntropy(header, DimsOf(w), options_.max_request_bytes));
  // As in Backward: the buffer is charged before the backend may create it
  // and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(w.handle));
  }

  wire::Assembler assembler(options_.max_request_bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.x()));
  LOGITD_RETURN_IF_ERROR(assembler.Expect(header.targets()));
  LOGITD_RETURN_IF_ERROR(
      ReceiveChunks<v1::CrossEntropyRequest>(context, stream, &assembler, &stats->bytes_in));
  LOGITD_ASSIGN_OR_RETURN(Tensor x, assembler.Take(header.x().name()));
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
  args.x = x.data<Bf16Bits>();
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
  x = Tensor();
  targets = std::vector<std::int64_t>();

  kernels::HostBuffer reduced;
  if (plan.reduction != v1::REDUCTION_NONE) {
    LOGITD_ASSIGN_OR_RETURN(reduced, backend_->AllocateHost(plan.loss_bytes));
    *reduced.as<float>() = ReduceLoss(plan, token_loss.as<float>(), plan.m, counted);
  }
  const kernels::HostBuffer& loss = plan.reduction == v1::REDUCTION_NONE ? token_loss : reduced;

  v1::CrossEntropyResponse head;
  v1::CrossEntropyResult* result = head.mutable_result();
  *result->mutable_loss() =
      OutputSpec("loss", DType::kFp32, plan.loss_shape, loss, plan.loss_bytes);
  if (plan.want_lse) {
    *result->mutable_lse() = OutputSpec("lse", DType::kFp32, {plan.m}, lse, plan.lse_bytes);
  }
  if (plan.want_dx) {
    faults_.OnDx(dx.data(), plan.dx_bytes);
    *result->mutable_dx() = OutputSpec("dx", plan.dx_dtype, {plan.m, w.k}, dx, plan.dx_bytes);
  }
  if (plan.returns_dw()) {
    faults_.OnDw(dw.data(), plan.dw_bytes);
    *result->mutable_dw() = OutputSpec("dw", DType::kFp32, {w.v, w.k}, dw, plan.dw_bytes);
  }
  result->set_counted_tokens(counted);
  FillTiming(receive_us, timing, result->mutable_timing());
  LOGITD_RETURN_IF_ERROR(WriteMessage(stream, head, &stats->bytes_out));
  LOGITD_RETURN_IF_ERROR(SendTensor<v1::CrossEntropyResponse>(
      stream, "loss", loss, plan.loss_bytes, options_.chunk_bytes, &stats->bytes_out));
  if (plan.want_lse) {
    LOGITD_RETURN_IF_ERROR(SendTensor<v1::CrossEntropyResponse>(
        stream, "lse", lse, plan.lse_bytes, options_.chunk_bytes, &stats->bytes_out));
  }
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(SendTensor<v1::CrossEntropyResponse>(
        stream, "dx", dx, plan.dx_bytes, options_.chunk_bytes, &stats->bytes_out));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(SendTensor<v1::CrossEntropyResponse>(
        stream, "dw", dw, plan.dw_bytes, options_.chunk_bytes, &stats->bytes_out));
  }
  return absl::OkStatus();
}

}  // namespace logitd::service

// The weight calls: RegisterWeight (the bytes streamed), LoadWeight (a
// safetensors file in --weights_dir), ListWeights and ReleaseWeight.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "logitd/bf16.h"
#include "logitd/safetensors.h"
#include "logitd/tensor.h"
#include "logitd/wire/wire.h"
#include "server/service/state/logging.h"
#include "server/service/state/status.h"
#include "server/service/transport/request_stream.h"
#include "server/service/v1/service.h"
#include "server/service/v1/validation.h"

namespace logitd::service {
namespace {

// Rows of the longest Logits call on any weight (2^31): the block rows of a
// call that long are the backend's whole-call figure.
constexpr std::int64_t kLongestCall = std::int64_t{1} << 31;

void FillWeightInfo(const kernels::Backend& backend, const WeightRecord& w, bool already_registered,
                    v1::WeightInfo* out) {
  out->set_logits_block_rows_fp32(backend.LogitsBlockRows(*w.weight, kLongestCall, DType::kFp32));
  out->set_logits_block_rows_bf16(backend.LogitsBlockRows(*w.weight, kLongestCall, DType::kBf16));
  out->set_logprobs_block_rows(backend.LogProbsBlockRows(*w.weight, kLongestCall));
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

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* LogitdService::RegisterWeight(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return ServeClientStreaming(
      context, response, &threads_, [this](grpc::CallbackServerContext* c, RawStream* raw) {
        MessageStream<v1::WeightInfo, v1::RegisterWeightRequest> stream(
            raw, options_.max_receive_message_bytes);
        v1::WeightInfo info;
        const grpc::Status status = runner_.Run("RegisterWeight", c, [&](CallStats* stats) {
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
                          admission_.Admit(
                              "register weight", plan.bytes, absl::FromChrono(context->deadline()),
                              [context] { return context->IsCancelled(); }, stats->tenant.id));
  if (admitted.waited() > absl::ZeroDuration()) stats->queue_us = Micros(admitted.waited());
  wire::Assembler assembler(plan.bytes);
  LOGITD_RETURN_IF_ERROR(assembler.Expect(spec));
  LOGITD_RETURN_IF_ERROR(ReceiveChunks<v1::RegisterWeightRequest>(
      reader, &assembler, stats, [context] { return context->IsCancelled(); }));
  LOGITD_ASSIGN_OR_RETURN(Tensor w, assembler.Take(spec.name()));

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(stats->tenant, handle);
      existing.ok()) {
    FillWeightInfo(*backend_, *existing, /*already_registered=*/true, response);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  }
  // The reservation may have been released while the bytes arrived.
  LOGITD_ASSIGN_OR_RETURN(const InsertResult inserted,
                          InsertWeight(stats->tenant, std::move(reservation), label, handle,
                                       header.name(), plan.v, plan.k, spec.xxh3(), std::move(w),
                                       /*source=*/""));
  FillWeightInfo(*backend_, inserted.record, inserted.already_registered, response);
  stats->bytes_out = response->ByteSizeLong();
  return absl::OkStatus();
}

absl::StatusOr<InsertResult> LogitdService::InsertWeight(
    const Tenant& tenant, BudgetReservation reservation, absl::string_view label,
    const std::string& handle, const std::string& name, std::int64_t v, std::int64_t k,
    std::uint64_t xxh3, Tensor w, absl::string_view source) {
  if (!reservation.active()) {
    LOGITD_ASSIGN_OR_RETURN(reservation, registry_.ReserveWeight(tenant, label, v, k));
  }
  LOGITD_ASSIGN_OR_RETURN(std::shared_ptr<kernels::Weight> weight,
                          backend_->LoadWeight(w.data<Bf16Bits>(), v, k));
  w = Tensor();  // the host copy is not needed once the backend holds the weight
  InsertResult inserted =
      registry_.Insert(tenant, std::move(reservation), handle, name, v, k, xxh3, std::move(weight));
  LogInfo(absl::StrCat(
      inserted.already_registered ? "weight already registered: " : "weight registered: ", handle,
      " ", inserted.record.Label(), source, " bytes=", inserted.record.bytes,
      " in_use=", registry_.bytes_in_use(), "/", registry_.budget_bytes()));
  return inserted;
}

grpc::Status LogitdService::LoadWeight(grpc::ServerContext* context,
                                       const v1::LoadWeightRequest* request,
                                       v1::WeightInfo* response) {
  return runner_.Run("LoadWeight", context, [&](CallStats* stats) {
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

// The header alone: the tensor's dtype and shape, checked before any of
// its bytes are read.
absl::StatusOr<SafetensorsTensorInfo> StatWeightFile(const std::filesystem::path& file,
                                                     const v1::LoadWeightRequest& request,
                                                     const std::string& where) {
  if (request.tensor().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected the name of a tensor in the file, got an empty one"));
  }
  absl::StatusOr<SafetensorsTensorInfo> stated =
      StatSafetensorsTensor(file.string(), request.tensor());
  LOGITD_RETURN_IF_ERROR(WeightFileError(stated.status(), file, request.path()));
  if (stated->dtype != "BF16" && stated->dtype != "F32" && stated->dtype != "F16") {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": expected dtype BF16, F32 or F16 (rounded to bf16), got ", stated->dtype));
  }
  return stated;
}

// The tensor's values as bf16: as stored, or F32 (F16 widened exactly by
// the reader) rounded to nearest even; *converted names the file's dtype
// when they were converted.
absl::StatusOr<Tensor> ReadWeightAsBf16(const std::filesystem::path& file,
                                        const v1::LoadWeightRequest& request,
                                        const std::string& file_dtype, std::string* converted) {
  absl::StatusOr<Tensor> loaded = ReadSafetensorsTensor(file.string(), request.tensor());
  LOGITD_RETURN_IF_ERROR(WeightFileError(loaded.status(), file, request.path()));
  if (loaded->dtype() == DType::kBf16) return loaded;
  *converted = file_dtype;
  Tensor w(DType::kBf16, loaded->shape());
  const float* src = loaded->data<float>();
  Bf16Bits* dst = w.data<Bf16Bits>();
  for (std::int64_t i = 0; i < loaded->numel(); ++i) dst[i] = FloatToBf16(src[i]);
  return w;
}

}  // namespace

absl::Status LogitdService::DoLoadWeight(const v1::LoadWeightRequest& request,
                                         v1::WeightInfo* response, CallStats* stats) {
  LOGITD_ASSIGN_OR_RETURN(const std::filesystem::path file,
                          ResolveWeightPath(options_.weights_dir, request.path()));
  const std::string where =
      absl::StrCat("path '", request.path(), "' tensor '", request.tensor(), "'");
  LOGITD_ASSIGN_OR_RETURN(const SafetensorsTensorInfo stat, StatWeightFile(file, request, where));
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

  std::string converted;
  LOGITD_ASSIGN_OR_RETURN(Tensor w, ReadWeightAsBf16(file, request, stat.dtype, &converted));
  const std::uint64_t digest = Xxh3(w.bytes(), static_cast<std::size_t>(w.nbytes()));
  const std::string handle = WeightRegistry::MakeHandle(digest, plan.v, plan.k);
  const std::string how =
      converted.empty()
          ? "bf16 as stored"
          : absl::StrCat("converted ", converted == "F16" ? "fp16" : "fp32", " -> bf16 (RNE)");
  const std::string source =
      absl::StrCat(" loaded from file:", request.path(), " tensor=", request.tensor(), " ", how);

  if (absl::StatusOr<WeightRecord> existing = registry_.AddRegistration(stats->tenant, handle);
      existing.ok()) {
    FillWeightInfo(*backend_, *existing, /*already_registered=*/true, response);
    response->set_converted_from(converted);
    stats->bytes_out = response->ByteSizeLong();
    LogInfo(absl::StrCat("weight already registered: ", handle, " ", existing->Label(), source));
    return absl::OkStatus();
  }
  LOGITD_ASSIGN_OR_RETURN(const InsertResult inserted,
                          InsertWeight(stats->tenant, std::move(reservation), label, handle, name,
                                       plan.v, plan.k, digest, std::move(w), source));
  FillWeightInfo(*backend_, inserted.record, inserted.already_registered, response);
  response->set_converted_from(converted);
  stats->bytes_out = response->ByteSizeLong();
  return absl::OkStatus();
}

grpc::Status LogitdService::ListWeights(grpc::ServerContext* context,
                                        const v1::ListWeightsRequest* /*request*/,
                                        v1::ListWeightsResponse* response) {
  return runner_.Run("ListWeights", context, [&](CallStats* stats) {
    for (const WeightRecord& w : registry_.List(stats->tenant)) {
      FillWeightInfo(*backend_, w, /*already_registered=*/false, response->add_weights());
    }
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::ReleaseWeight(grpc::ServerContext* context,
                                          const v1::ReleaseWeightRequest* request,
                                          v1::ReleaseWeightResponse* response) {
  return runner_.Run("ReleaseWeight", context, [&](CallStats* stats) -> absl::Status {
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

}  // namespace logitd::service

#include "server/service/oip_service.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "logitd/bf16.h"
#include "server/service/build_info.h"
#include "server/service/status.h"
#include "server/service/validation.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kInput = "x";
constexpr absl::string_view kOutput = "logits";
constexpr absl::string_view kVersion = "1";
// Room for a response's framing next to its tensor: names, shape, id.
constexpr std::uint64_t kResponseFramingBytes = 4096;

// The weight a model name names: its handle, else its registration name
// (unique among the tenant's weights). NotFound naming the model otherwise.
absl::StatusOr<WeightRecord> FindModel(const WeightRegistry& registry, const Tenant& tenant,
                                       absl::string_view model, absl::string_view version) {
  if (model.empty()) return absl::InvalidArgumentError("model name: expected one, got none");
  if (!version.empty() && version != kVersion) {
    return absl::NotFoundError(
        absl::StrCat("model '", model, "' version '", version,
                     "' not found: logitd's models have version \"1\" only"));
  }
  if (ValidateHandle(model).ok()) {
    if (absl::StatusOr<WeightRecord> w = registry.Find(tenant, model); w.ok()) return w;
  }
  std::vector<WeightRecord> named;
  for (WeightRecord& w : registry.List(tenant)) {
    if (w.name == model) named.push_back(std::move(w));
  }
  if (named.size() == 1) return std::move(named.front());
  if (named.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "model '", model,
        "' not found: no weight of this caller is registered under that name or handle"));
  }
  std::vector<std::string> handles;
  for (const WeightRecord& w : named) handles.push_back(w.handle);
  return absl::FailedPreconditionError(
      absl::StrCat("model '", model, "' is ambiguous: ", named.size(),
                   " weights are registered under that name; name one by its handle (",
                   absl::StrJoin(handles, ", "), ")"));
}

// A request parameter `alpha`: a string ("0.5") or an integer. The KServe
// proto's InferParameter has no double; Triton's double_param arrives as an
// unknown field, i.e. with no value set.
absl::StatusOr<float> AlphaParameter(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      return static_cast<float>(p.int64_param());
    case inference::InferParameter::kStringParam: {
      double alpha = 0;
      if (absl::SimpleAtod(p.string_param(), &alpha)) return static_cast<float>(alpha);
      break;
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(
      "parameter 'alpha': expected a number as a string (e.g. \"0.5\") or an integer (the KServe "
      "v2 InferParameter has no double)");
}

struct InferPlan {
  WeightRecord w;
  std::int64_t m = 0;
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
  std::uint64_t x_bytes = 0;
  std::uint64_t y_bytes = 0;
};

// The request's parameters: out_dtype and alpha; others are ignored.
absl::Status ReadParameters(const inference::ModelInferRequest& request, InferPlan* plan) {
  const auto& params = request.parameters();
  if (auto it = params.find("out_dtype"); it != params.end()) {
    const std::string& v = it->second.string_param();
    if (v == "fp32" || v == "FP32") {
      plan->out_dtype = DType::kFp32;
    } else if (v == "bf16" || v == "BF16") {
      plan->out_dtype = DType::kBf16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter 'out_dtype': expected the string \"fp32\" or \"bf16\", got '", v, "'"));
    }
  }
  if (auto it = params.find("alpha"); it != params.end()) {
    LOGITD_ASSIGN_OR_RETURN(plan->alpha, AlphaParameter(it->second));
  }
  return absl::OkStatus();
}

// The one input, `x` BF16 [M, K] in raw_input_contents, and the outputs
// asked for (none, or `logits`).
absl::Status CheckTensors(const inference::ModelInferRequest& request, InferPlan* plan) {
  const std::string label = plan->w.Label();
  const std::string expected =
      absl::StrCat("expected one input '", kInput, "' BF16 [M, ", plan->w.k,
                   "] in raw_input_contents (row-major, no padding) for model ", label);
  if (request.inputs_size() != 1 || request.inputs(0).name() != kInput) {
    return absl::InvalidArgumentError(absl::StrCat(
        expected, "; got ", request.inputs_size(), " inputs",
        request.inputs_size() > 0 ? absl::StrCat(", the first '", request.inputs(0).name(), "'")
                                  : ""));
  }
  const auto& x = request.inputs(0);
  if (x.parameters().contains("shared_memory_region")) {
    return absl::UnimplementedError(
        "input 'x': the shared-memory extension is not served on this protocol yet; send it in "
        "raw_input_contents, or use logitd's own Logits RPC with shared memory");
  }
  if (x.datatype() != "BF16") {
    return absl::InvalidArgumentError(
        absl::StrCat(expected, "; got datatype '", x.datatype(), "'"));
  }
  if (x.shape_size() != 2 || x.shape(0) < 1 || x.shape(1) != plan->w.k) {
    return absl::InvalidArgumentError(
        absl::StrCat(expected, "; got shape [", absl::StrJoin(x.shape(), ", "), "]"));
  }
  if (x.has_contents() || request.raw_input_contents_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        expected, "; BF16 travels as raw bytes only, got ", request.raw_input_contents_size(),
        " raw_input_contents", x.has_contents() ? " and typed contents" : ""));
  }
  plan->m = x.shape(0);
  if (plan->m > (std::int64_t{1} << 40) / plan->w.k) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; M=", plan->m, " is too large"));
  }
  plan->x_bytes = static_cast<std::uint64_t>(plan->m * plan->w.k) * 2;
  if (request.raw_input_contents(0).size() != plan->x_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; [", plan->m, ", ", plan->w.k,
                                                   "] is ", plan->x_bytes, " bytes, got ",
                                                   request.raw_input_contents(0).size()));
  }
  for (const auto& out : request.outputs()) {
    if (out.name() != kOutput) {
      return absl::InvalidArgumentError(absl::StrCat("requested output '", out.name(),
                                                     "': expected '", kOutput,
                                                     "', the one output of model ", label));
    }
    if (out.parameters().contains("shared_memory_region")) {
      return absl::UnimplementedError(
          "output 'logits': the shared-memory extension is not served on this protocol yet");
    }
  }
  return absl::OkStatus();
}

// One OIP message holds a whole tensor: a response over the server's message
// limit cannot be sent.
absl::Status CheckSizes(const inference::ModelInferRequest& request, const ServiceOptions& options,
                        InferPlan* plan) {
  // gRPC lets requests of up to twice this limit through (see main.cc), so
  // that the refusal names it.
  const std::uint64_t in_limit = options.max_receive_message_bytes;
  if (request.ByteSizeLong() > in_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request (", request.ByteSizeLong(), " bytes, x [", plan->m, ", ", plan->w.k,
        "]) is over the server's max message size of ", in_limit,
        " bytes; one Open Inference Protocol message holds a whole tensor: send fewer rows per "
        "call, or use logitd's streaming Logits RPC (logitd.v1.Logitd/Logits, which can also use "
        "shared memory)"));
  }
  const std::uint64_t elem = plan->out_dtype == DType::kFp32 ? 4 : 2;
  const std::uint64_t row = static_cast<std::uint64_t>(plan->w.v) * elem;
  plan->y_bytes = static_cast<std::uint64_t>(plan->m) * row;
  const std::uint64_t limit = options.max_send_message_bytes;
  const std::uint64_t framing = kResponseFramingBytes + request.id().size();
  if (plan->y_bytes + framing > limit) {
    const std::uint64_t rows = limit > framing ? (limit - framing) / row : 0;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response, logits [", plan->m, ", ", plan->w.v, "] ", DTypeName(plan->out_dtype), " (",
        plan->y_bytes, " bytes), is over the server's max message size of ", limit,
        " bytes; one Open Inference Protocol message holds a whole tensor: send at most ", rows,
        " rows of this model per call, or use logitd's streaming Logits RPC "
        "(logitd.v1.Logitd/Logits, which can also use shared memory)"));
  }
  if (plan->x_bytes + plan->y_bytes > options.max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the call moves ", plan->x_bytes + plan->y_bytes,
        " tensor bytes, over the server's --max_request_bytes of ", options.max_request_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status OipService::ServerLive(grpc::ServerContext* context,
                                    const inference::ServerLiveRequest* /*request*/,
                                    inference::ServerLiveResponse* response) {
  return core_.runner->Run("oip.ServerLive", context, [&](CallStats*) {
    response->set_live(true);
    return absl::OkStatus();
  });
}

grpc::Status OipService::ServerReady(grpc::ServerContext* context,
                                     const inference::ServerReadyRequest* /*request*/,
                                     inference::ServerReadyResponse* response) {
  return core_.runner->Run("oip.ServerReady", context, [&](CallStats*) {
    response->set_ready(core_.backend->Health().ok());
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelReady(grpc::ServerContext* context,
                                    const inference::ModelReadyRequest* request,
                                    inference::ModelReadyResponse* response) {
  return core_.runner->Run("oip.ModelReady", context, [&](CallStats* stats) {
    // As Triton: an unknown model is not ready, not an error.
    const bool found =
        FindModel(*core_.registry, stats->tenant, request->name(), request->version()).ok();
    response->set_ready(found && core_.backend->Health().ok());
    return absl::OkStatus();
  });
}

grpc::Status OipService::ServerMetadata(grpc::ServerContext* context,
                                        const inference::ServerMetadataRequest* /*request*/,
                                        inference::ServerMetadataResponse* response) {
  return core_.runner->Run("oip.ServerMetadata", context, [&](CallStats*) {
    response->set_name("logitd");
    response->set_version(std::string(Version()));
    // No protocol extensions yet (system shared memory is to come).
    response->clear_extensions();
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelMetadata(grpc::ServerContext* context,
                                       const inference::ModelMetadataRequest* request,
                                       inference::ModelMetadataResponse* response) {
  return core_.runner->Run("oip.ModelMetadata", context, [&](CallStats* stats) -> absl::Status {
    LOGITD_ASSIGN_OR_RETURN(const WeightRecord w, FindModel(*core_.registry, stats->tenant,
                                                            request->name(), request->version()));
    response->set_name(request->name());
    response->add_versions(std::string(kVersion));
    response->set_platform("logitd");
    auto* x = response->add_inputs();
    x->set_name(std::string(kInput));
    x->set_datatype("BF16");
    x->add_shape(-1);
    x->add_shape(w.k);
    auto* y = response->add_outputs();
    y->set_name(std::string(kOutput));
    y->set_datatype("FP32");
    y->add_shape(-1);
    y->add_shape(w.v);
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelInfer(grpc::ServerContext* context,
                                    const inference::ModelInferRequest* request,
                                    inference::ModelInferResponse* response) {
  return core_.runner->Run("oip.ModelInfer", context, [&](CallStats* stats) {
    return DoModelInfer(context, *request, response, stats);
  });
}

absl::Status OipService::DoModelInfer(grpc::ServerContext* context,
                                      const inference::ModelInferRequest& request,
                                      inference::ModelInferResponse* response, CallStats* stats) {
  stats->bytes_in = request.ByteSizeLong();
  // A lost device fails the call at once, with its cause (UNAVAILABLE).
  LOGITD_RETURN_IF_ERROR(core_.backend->Health());
  InferPlan plan;
  LOGITD_ASSIGN_OR_RETURN(plan.w, FindModel(*core_.registry, stats->tenant, request.model_name(),
                                            request.model_version()));
  LOGITD_RETURN_IF_ERROR(ReadParameters(request, &plan));
  LOGITD_RETURN_IF_ERROR(CheckTensors(request, &plan));
  LOGITD_RETURN_IF_ERROR(CheckSizes(request, *core_.options, &plan));
  LOGITD_ASSIGN_OR_RETURN(
      AdmissionTicket ticket,
      core_.admission->Admit(
          "ModelInfer", plan.x_bytes + plan.y_bytes, absl::FromChrono(context->deadline()),
          [context] { return context->IsCancelled(); }, stats->tenant.id));
  if (ticket.waited() > absl::ZeroDuration()) stats->queue_us = Micros(ticket.waited());

  // The input's bytes, aligned for bf16 (a protobuf string's usually are).
  const std::string& raw = request.raw_input_contents(0);
  std::vector<Bf16Bits> aligned;
  const Bf16Bits* x = reinterpret_cast<const Bf16Bits*>(raw.data());
  if (reinterpret_cast<std::uintptr_t>(raw.data()) % alignof(Bf16Bits) != 0) {
    aligned.resize(static_cast<std::size_t>(plan.x_bytes / 2));
    std::memcpy(aligned.data(), raw.data(), raw.size());
    x = aligned.data();
  }
  std::string* y = response->add_raw_output_contents();
  y->resize(static_cast<std::size_t>(plan.y_bytes));

  kernels::LogitsArgs args;
  args.x = x;
  args.m = plan.m;
  args.alpha = plan.alpha;
  args.out_dtype = plan.out_dtype;
  args.y = y->data();
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(core_.backend->Logits(*plan.w.weight, args, &timing));
  stats->compute_us = timing.compute_us;
  stats->gemms = absl::StrJoin(timing.gemms, "; ");
  if (timing.transfers_measured) {
    stats->h2d_us = timing.h2d_us;
    stats->d2h_us = timing.d2h_us;
  }

  response->set_model_name(request.model_name());
  response->set_model_version(std::string(kVersion));
  response->set_id(request.id());
  auto* out = response->add_outputs();
  out->set_name(std::string(kOutput));
  out->set_datatype(plan.out_dtype == DType::kFp32 ? "FP32" : "BF16");
  out->add_shape(plan.m);
  out->add_shape(plan.w.v);
  stats->tensor_bytes_in = plan.x_bytes;
  stats->tensor_bytes_out = plan.y_bytes;
  stats->bytes_out = response->ByteSizeLong();
  stats->send_start = absl::Now();
  return absl::OkStatus();
}

}  // namespace logitd::service

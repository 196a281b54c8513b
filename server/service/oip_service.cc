#include "server/service/oip_service.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "logitd/bf16.h"
#include "server/service/build_info.h"
#include "server/service/status.h"
#include "server/service/validation.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kInput = "x";
constexpr absl::string_view kOutput = "logits";
constexpr absl::string_view kVersion = "1";

// The weight a model name names: its handle, else its registration name
// (unique among the tenant's weights). NotFound naming the model otherwise.
absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view model) {
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

// The weight model `model` names, version "1" (or empty) only.
absl::StatusOr<WeightRecord> FindModel(const WeightRegistry& registry, const Tenant& tenant,
                                       absl::string_view model, absl::string_view version) {
  if (model.empty()) return absl::InvalidArgumentError("model name: expected one, got none");
  if (!version.empty() && version != kVersion) {
    return absl::NotFoundError(
        absl::StrCat("model '", model, "' version '", version,
                     "' not found: logitd's models have version \"1\" only"));
  }
  return FindWeight(registry, tenant, model);
}

// A number parameter: double_param (Triton's float), an integer, or a
// string ("0.5"; curl and the KServe proto, which has no double).
absl::StatusOr<double> NumberParameter(absl::string_view key, const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kDoubleParam:
      return p.double_param();
    case inference::InferParameter::kInt64Param:
      return static_cast<double>(p.int64_param());
    case inference::InferParameter::kUint64Param:
      return static_cast<double>(p.uint64_param());
    case inference::InferParameter::kStringParam: {
      double v = 0;
      if (absl::SimpleAtod(p.string_param(), &v)) return v;
      break;
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter '", key,
                   "': expected a number (a double, an integer, or a string such as \"0.5\")"));
}

struct LogitsParameters {
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
};

// NAME's request parameters: out_dtype and alpha; others are ignored.
absl::StatusOr<LogitsParameters> ReadLogitsParameters(const OipParameters& params) {
  LogitsParameters p;
  if (auto it = params.find("out_dtype"); it != params.end()) {
    const std::string& v = it->second.string_param();
    if (v == "fp32" || v == "FP32") {
      p.out_dtype = DType::kFp32;
    } else if (v == "bf16" || v == "BF16") {
      p.out_dtype = DType::kBf16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter 'out_dtype': expected the string \"fp32\" or \"bf16\", got '", v, "'"));
    }
  }
  if (auto it = params.find("alpha"); it != params.end()) {
    LOGITD_ASSIGN_OR_RETURN(const double alpha, NumberParameter("alpha", it->second));
    p.alpha = static_cast<float>(alpha);
  }
  return p;
}

// Input `x`, BF16 [M, K] with K the weight's: returns M.
absl::StatusOr<std::int64_t> CheckX(OipInferCall* call, const WeightRecord& w,
                                    absl::string_view expected) {
  const OipInferCall::InputTensor* x = call->input(kInput);
  if (x == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; got no input '", kInput, "'"));
  }
  if (x->datatype() != "BF16") {
    return absl::InvalidArgumentError(
        absl::StrCat(expected, "; got x of datatype '", x->datatype(), "'"));
  }
  if (x->shape_size() != 2 || x->shape(0) < 1 || x->shape(1) != w.k) {
    return absl::InvalidArgumentError(
        absl::StrCat(expected, "; got x of shape [", absl::StrJoin(x->shape(), ", "), "]"));
  }
  const std::int64_t m = x->shape(0);
  if (m > (std::int64_t{1} << 40) / w.k) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; M=", m, " is too large"));
  }
  LOGITD_RETURN_IF_ERROR(
      call->CheckInputBytes(kInput, static_cast<std::uint64_t>(m * w.k) * 2, expected));
  return m;
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
    // Triton's name for the extension, listed where it is served.
    if (core_.shm->allowed()) response->add_extensions("system_shared_memory");
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
    const auto add = [](auto* list, absl::string_view name, absl::string_view datatype,
                        std::vector<std::int64_t> shape) {
      auto* t = list->Add();
      t->set_name(std::string(name));
      t->set_datatype(std::string(datatype));
      for (std::int64_t d : shape) t->add_shape(d);
    };
    add(response->mutable_inputs(), kInput, "BF16", {-1, w.k});
    add(response->mutable_outputs(), kOutput, "FP32", {-1, w.v});
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
  LOGITD_ASSIGN_OR_RETURN(
      const WeightRecord w,
      FindModel(*core_.registry, stats->tenant, request.model_name(), request.model_version()));
  OipInferCall call(core_, &shm_regions_, context, request, response, stats);
  return InferLogits(w, &call);
}

absl::Status OipService::InferLogits(const WeightRecord& w, OipInferCall* call) {
  LOGITD_ASSIGN_OR_RETURN(const LogitsParameters p,
                          ReadLogitsParameters(call->request().parameters()));
  const std::string expected = absl::StrCat(
      "expected one input '", kInput, "' BF16 [M, ", w.k,
      "] in raw_input_contents or system shared memory (row-major, no padding) for model ",
      w.Label());
  LOGITD_RETURN_IF_ERROR(call->BindInputs({kInput}, expected));
  LOGITD_ASSIGN_OR_RETURN(const std::int64_t m, CheckX(call, w, expected));
  LOGITD_RETURN_IF_ERROR(call->BindRequestedOutputs({kOutput}, w.Label()));
  call->AddOutput(kOutput, p.out_dtype, {m, w.v});
  LOGITD_RETURN_IF_ERROR(call->CheckMessageSizes(m, "Logits"));
  const std::uint64_t x_bytes = static_cast<std::uint64_t>(m * w.k) * 2;
  const std::uint64_t y_bytes = static_cast<std::uint64_t>(m * w.v) * ElementSize(p.out_dtype);
  if (x_bytes + y_bytes > core_.options->max_request_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the call moves ", x_bytes + y_bytes,
                     " tensor bytes, over the server's --max_request_bytes of ",
                     core_.options->max_request_bytes));
  }
  LOGITD_RETURN_IF_ERROR(call->Start(0));
  LOGITD_ASSIGN_OR_RETURN(const std::byte* x, call->InputData(kInput, alignof(Bf16Bits)));

  kernels::LogitsArgs args;
  args.x = reinterpret_cast<const Bf16Bits*>(x);
  args.m = m;
  args.alpha = p.alpha;
  args.out_dtype = p.out_dtype;
  args.y = call->OutputData(kOutput);
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(core_.backend->Logits(*w.weight, args, &timing));
  call->Finish(timing);
  return absl::OkStatus();
}

}  // namespace logitd::service

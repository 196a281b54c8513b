#include "server/service/oip_service.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
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
constexpr absl::string_view kTargets = "targets";
constexpr absl::string_view kOutput = "logits";
constexpr absl::string_view kVersion = "1";
// NAME/logprobs is the LogProbs model of the weight NAME names.
constexpr absl::string_view kLogProbsSuffix = "/logprobs";

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

struct OipModel {
  WeightRecord w;
  bool logprobs = false;
};

// The model `model` names: NAME/logprobs when NAME names a weight, else the
// weight `model` names. Version "1" (or empty) only.
absl::StatusOr<OipModel> FindModel(const WeightRegistry& registry, const Tenant& tenant,
                                   absl::string_view model, absl::string_view version) {
  if (model.empty()) return absl::InvalidArgumentError("model name: expected one, got none");
  if (!version.empty() && version != kVersion) {
    return absl::NotFoundError(
        absl::StrCat("model '", model, "' version '", version,
                     "' not found: logitd's models have version \"1\" only"));
  }
  if (absl::EndsWith(model, kLogProbsSuffix) && model.size() > kLogProbsSuffix.size()) {
    absl::StatusOr<WeightRecord> w =
        FindWeight(registry, tenant, model.substr(0, model.size() - kLogProbsSuffix.size()));
    if (w.ok()) return OipModel{*std::move(w), true};
    if (!absl::IsNotFound(w.status())) return w.status();
  }
  LOGITD_ASSIGN_OR_RETURN(WeightRecord w, FindWeight(registry, tenant, model));
  return OipModel{std::move(w), false};
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

// An integer parameter: int64_param, uint64_param or a string ("8").
absl::StatusOr<std::int64_t> IntegerParameter(absl::string_view key,
                                              const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      return p.int64_param();
    case inference::InferParameter::kUint64Param:
      if (p.uint64_param() <= std::numeric_limits<std::int64_t>::max()) {
        return static_cast<std::int64_t>(p.uint64_param());
      }
      break;
    case inference::InferParameter::kStringParam: {
      std::int64_t v = 0;
      if (absl::SimpleAtoi(p.string_param(), &v)) return v;
      break;
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter '", key, "': expected an integer (int64_param, or a string such as \"8\")"));
}

// A boolean parameter: bool_param or a string ("true", "false").
absl::StatusOr<bool> BoolParameter(absl::string_view key, const inference::InferParameter& p) {
  if (p.parameter_choice_case() == inference::InferParameter::kBoolParam) return p.bool_param();
  bool v = false;
  if (p.parameter_choice_case() == inference::InferParameter::kStringParam &&
      absl::SimpleAtob(p.string_param(), &v)) {
    return v;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter '", key,
                   "': expected a boolean (bool_param, or the string \"true\" or \"false\")"));
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

// NAME/logprobs' request parameters, into the LogProbs header they mean;
// others are ignored. The ranges ValidateLogProbs does not check as the
// parameters say them: a temperature > 0 (the header's 0 would mean 1),
// top_k that fits the header's field.
absl::Status ReadLogProbsParameters(const OipParameters& params, v1::LogProbsHeader* h) {
  for (const auto& [key, p] : params) {
    if (key == "temperature" || key == "logit_softcap") {
      LOGITD_ASSIGN_OR_RETURN(const double v, NumberParameter(key, p));
      const float f = static_cast<float>(v);
      if (key == "temperature" && !(f > 0.0f && std::isfinite(f))) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter 'temperature': expected a finite number > 0, got ", v));
      }
      if (key == "temperature") {
        h->set_temperature(f);
      } else {
        h->set_logit_softcap(f);
      }
    } else if (key == "top_k" || key == "vocab_size" || key == "ignore_index") {
      LOGITD_ASSIGN_OR_RETURN(const std::int64_t v, IntegerParameter(key, p));
      if (key == "top_k" && (v < 0 || v > kMaxTopK)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter 'top_k': expected 0 to ", kMaxTopK, ", got ", v));
      }
      if (key == "top_k") h->set_top_k(static_cast<std::uint32_t>(v));
      if (key == "vocab_size") h->set_vocab_size(v);
      if (key == "ignore_index") h->set_ignore_index(v);
    } else if (key == "want_entropy" || key == "want_lse" || key == "want_rank") {
      LOGITD_ASSIGN_OR_RETURN(const bool v, BoolParameter(key, p));
      if (key == "want_entropy") h->set_want_entropy(v);
      if (key == "want_lse") h->set_want_lse(v);
      if (key == "want_rank") h->set_want_rank(v);
    }
  }
  return absl::OkStatus();
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

// The outputs of NAME/logprobs, in the order the response carries them:
// [M], or [M, top_k] for the top-k; computed when the plan gives them bytes.
struct LogProbsOutput {
  absl::string_view name;
  DType dtype;
  bool per_k;
  std::uint64_t LogProbsPlan::*bytes;
};
constexpr LogProbsOutput kLogProbsOutputs[] = {
    {"logprob", DType::kFp32, false, &LogProbsPlan::logprob_bytes},
    {"lse", DType::kFp32, false, &LogProbsPlan::lse_bytes},
    {"entropy", DType::kFp32, false, &LogProbsPlan::entropy_bytes},
    {"topk_ids", DType::kInt32, true, &LogProbsPlan::topk_ids_bytes},
    {"topk_logprobs", DType::kFp32, true, &LogProbsPlan::topk_logprobs_bytes},
    {"rank", DType::kInt64, false, &LogProbsPlan::rank_bytes},
};

// NAME/logprobs' requested outputs ask for what they need: lse, entropy and
// rank switch their want_ on; logprob and rank need targets, the top-k
// outputs top_k > 0.
absl::Status RequestedLogProbsOutputs(const OipInferCall& call, v1::LogProbsHeader* h) {
  if (call.requested("lse")) h->set_want_lse(true);
  if (call.requested("entropy")) h->set_want_entropy(true);
  if (call.requested("rank")) h->set_want_rank(true);
  for (absl::string_view name : {"logprob", "rank"}) {
    if (call.requested(name) && !h->has_targets()) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested output '", name, "': expected input 'targets', got none"));
    }
  }
  for (absl::string_view name : {"topk_ids", "topk_logprobs"}) {
    if (call.requested(name) && h->top_k() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requested output '", name, "': expected parameter 'top_k' from 1 to ", kMaxTopK));
    }
  }
  return absl::OkStatus();
}

// The LogProbs header NAME/logprobs' request means: its tensors' specs and
// its parameters. The Open Inference Protocol carries no digests (a tensor
// comes whole in its message or from a region), so the specs carry a
// placeholder xxh3 of 1, which ValidateLogProbs only checks is there.
absl::StatusOr<v1::LogProbsHeader> LogProbsHeaderOf(const OipInferCall& call, const WeightRecord& w,
                                                    std::int64_t m) {
  v1::LogProbsHeader h;
  h.set_weight_handle(w.handle);
  v1::TensorSpec* x = h.mutable_x();
  x->set_name(std::string(kInput));
  x->set_dtype(v1::DTYPE_BF16);
  x->add_shape(m);
  x->add_shape(w.k);
  x->set_xxh3(1);
  if (const OipInferCall::InputTensor* t = call.input(kTargets); t != nullptr) {
    v1::TensorSpec* targets = h.mutable_targets();
    targets->set_name(std::string(kTargets));
    if (t->datatype() == "INT32" || t->datatype() == "INT64") {
      targets->set_dtype(t->datatype() == "INT32" ? v1::DTYPE_INT32 : v1::DTYPE_INT64);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "input 'targets': expected datatype INT32 or INT64, got '", t->datatype(), "'"));
    }
    for (std::int64_t d : t->shape()) targets->add_shape(d);
    targets->set_xxh3(1);
  }
  LOGITD_RETURN_IF_ERROR(ReadLogProbsParameters(call.request().parameters(), &h));
  LOGITD_RETURN_IF_ERROR(RequestedLogProbsOutputs(call, &h));
  return h;
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
    LOGITD_ASSIGN_OR_RETURN(const OipModel model, FindModel(*core_.registry, stats->tenant,
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
    add(response->mutable_inputs(), kInput, "BF16", {-1, model.w.k});
    if (!model.logprobs) {
      add(response->mutable_outputs(), kOutput, "FP32", {-1, model.w.v});
      return absl::OkStatus();
    }
    // INT32 is taken as well.
    add(response->mutable_inputs(), kTargets, "INT64", {-1});
    for (const LogProbsOutput& out : kLogProbsOutputs) {
      add(response->mutable_outputs(), out.name, OipDatatype(out.dtype),
          out.per_k ? std::vector<std::int64_t>{-1, -1} : std::vector<std::int64_t>{-1});
    }
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
      const OipModel model,
      FindModel(*core_.registry, stats->tenant, request.model_name(), request.model_version()));
  OipInferCall call(core_, &shm_regions_, context, request, response, stats);
  return model.logprobs ? InferLogProbs(model.w, &call) : InferLogits(model.w, &call);
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

// The same checks, targets and backend call as logitd.v1's LogProbs
// (LogitdService::DoLogProbs), so that the same inputs give the same bits.
absl::Status OipService::InferLogProbs(const WeightRecord& w, OipInferCall* call) {
  const std::string label = absl::StrCat(w.Label(), kLogProbsSuffix);
  const std::string expected = absl::StrCat(
      "expected input '", kInput, "' BF16 [M, ", w.k, "] and optionally '", kTargets,
      "' INT32 or INT64 [M], in raw_input_contents or system shared memory, for model ", label);
  LOGITD_RETURN_IF_ERROR(call->BindInputs({kInput, kTargets}, expected));
  LOGITD_ASSIGN_OR_RETURN(const std::int64_t m, CheckX(call, w, expected));
  LOGITD_RETURN_IF_ERROR(call->BindRequestedOutputs(
      {"logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"}, label));
  LOGITD_ASSIGN_OR_RETURN(const v1::LogProbsHeader h, LogProbsHeaderOf(*call, w, m));
  LOGITD_ASSIGN_OR_RETURN(
      const LogProbsPlan plan,
      ValidateLogProbs(h, WeightDims{w.v, w.k, label}, core_.options->max_request_bytes));
  if (plan.has_targets) {
    LOGITD_RETURN_IF_ERROR(call->CheckInputBytes(kTargets, plan.targets_bytes, expected));
  }
  for (const LogProbsOutput& out : kLogProbsOutputs) {
    if (plan.*out.bytes == 0) continue;
    std::vector<std::int64_t> shape = {m};
    if (out.per_k) shape.push_back(plan.top_k);
    call->AddOutput(out.name, out.dtype, std::move(shape));
  }
  LOGITD_RETURN_IF_ERROR(call->CheckMessageSizes(m, "LogProbs"));
  // Besides the tensors: the targets widened to int64.
  LOGITD_RETURN_IF_ERROR(
      call->Start(plan.has_targets ? static_cast<std::uint64_t>(m) * sizeof(std::int64_t) : 0));
  LOGITD_ASSIGN_OR_RETURN(const std::byte* x, call->InputData(kInput, alignof(Bf16Bits)));
  std::vector<std::int64_t> targets;
  if (plan.has_targets) {
    LOGITD_ASSIGN_OR_RETURN(const std::byte* t, call->InputData(kTargets, 1));
    LOGITD_RETURN_IF_ERROR(
        ConvertTargets(plan.targets_dtype, t, m, plan.vocab, plan.ignore_index, &targets).status());
  }

  kernels::LogProbsArgs args;
  args.x = reinterpret_cast<const Bf16Bits*>(x);
  args.m = m;
  args.targets = plan.has_targets ? targets.data() : nullptr;
  args.ignore_index = plan.ignore_index;
  args.temperature = plan.temperature;
  args.logit_softcap = plan.logit_softcap;
  args.vocab = plan.vocab;
  args.logprob = reinterpret_cast<float*>(call->OutputData("logprob"));
  args.lse = reinterpret_cast<float*>(call->OutputData("lse"));
  args.entropy = reinterpret_cast<float*>(call->OutputData("entropy"));
  args.top_k = plan.top_k;
  args.topk_ids = reinterpret_cast<std::int32_t*>(call->OutputData("topk_ids"));
  args.topk_logprobs = reinterpret_cast<float*>(call->OutputData("topk_logprobs"));
  args.rank = reinterpret_cast<std::int64_t*>(call->OutputData("rank"));
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(core_.backend->LogProbs(*w.weight, args, &timing));
  call->Finish(timing);
  return absl::OkStatus();
}

}  // namespace logitd::service

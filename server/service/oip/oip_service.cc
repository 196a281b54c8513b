#include "server/service/oip/oip_service.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/service/call/ops.h"
#include "server/service/call/plans.h"
#include "server/service/state/build_info.h"
#include "server/service/state/logging.h"
#include "server/service/state/status.h"

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
absl::StatusOr<WeightRecord> FindModelWeight(const WeightRegistry& registry, const Tenant& tenant,
                                             absl::string_view model) {
  if (!model.empty()) {
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
        FindModelWeight(registry, tenant, model.substr(0, model.size() - kLogProbsSuffix.size()));
    if (w.ok()) return OipModel{*std::move(w), true};
    if (!absl::IsNotFound(w.status())) return w.status();
  }
  LOGITD_ASSIGN_OR_RETURN(WeightRecord w, FindModelWeight(registry, tenant, model));
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

// NAME's request parameters: out_dtype and alpha; others are ignored.
absl::Status ReadLogitsParameters(const OipParameters& params, LogitsRequest* r) {
  if (auto it = params.find("out_dtype"); it != params.end()) {
    if (it->second.parameter_choice_case() != inference::InferParameter::kStringParam) {
      return absl::InvalidArgumentError(
          "parameter 'out_dtype': expected the string \"fp32\" or \"bf16\"");
    }
    // As logitd.v1's out_dtype: FP32 or BF16, refused otherwise by the plan.
    r->out_dtype = absl::AsciiStrToUpper(it->second.string_param());
  }
  if (auto it = params.find("alpha"); it != params.end()) {
    LOGITD_ASSIGN_OR_RETURN(const double alpha, NumberParameter("alpha", it->second));
    r->alpha = static_cast<float>(alpha);
  }
  return absl::OkStatus();
}

// NAME/logprobs' request parameters, into the request they mean; others are
// ignored. A temperature the parameter gives is taken as given: 0 (which
// logitd.v1's proto3 field cannot tell from "unspecified") is refused.
absl::Status ReadLogProbsParameters(const OipParameters& params, LogProbsRequest* r) {
  for (const auto& [key, p] : params) {
    if (key == "temperature" || key == "logit_softcap") {
      LOGITD_ASSIGN_OR_RETURN(const double v, NumberParameter(key, p));
      const float f = static_cast<float>(v);
      if (key == "temperature" && f == 0.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat("temperature: expected a finite temperature > 0, got ", v));
      }
      (key == "temperature" ? r->temperature : r->logit_softcap) = f;
    } else if (key == "top_k" || key == "vocab_size" || key == "ignore_index") {
      LOGITD_ASSIGN_OR_RETURN(const std::int64_t v, IntegerParameter(key, p));
      if (key == "top_k") r->top_k = v;
      if (key == "vocab_size") r->vocab_size = v;
      if (key == "ignore_index") r->ignore_index = v;
    } else if (key == "want_entropy" || key == "want_lse" || key == "want_rank") {
      LOGITD_ASSIGN_OR_RETURN(const bool v, BoolParameter(key, p));
      if (key == "want_entropy") r->want_entropy = v;
      if (key == "want_lse") r->want_lse = v;
      if (key == "want_rank") r->want_rank = v;
    }
  }
  return absl::OkStatus();
}

// The outputs of NAME/logprobs, in the order the response carries them:
// [M], or [M, top_k] for the top-k.
struct LogProbsOutput {
  absl::string_view name;
  DType dtype;
  bool per_k;
};
constexpr LogProbsOutput kLogProbsOutputs[] = {
    {"logprob", DType::kFp32, false},      {"lse", DType::kFp32, false},
    {"entropy", DType::kFp32, false},      {"topk_ids", DType::kInt32, true},
    {"topk_logprobs", DType::kFp32, true}, {"rank", DType::kInt64, false},
};

// NAME/logprobs' requested outputs ask for what they need: lse, entropy and
// rank switch their want_ on; logprob and rank need targets, the top-k
// outputs top_k > 0.
absl::Status RequestedLogProbsOutputs(const OipInferCall& call, LogProbsRequest* r) {
  if (call.requested("lse")) r->want_lse = true;
  if (call.requested("entropy")) r->want_entropy = true;
  if (call.requested("rank")) r->want_rank = true;
  for (absl::string_view name : {"logprob", "rank"}) {
    if (call.requested(name) && !r->targets.given) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested output '", name, "': expected input 'targets', got none"));
    }
  }
  for (absl::string_view name : {"topk_ids", "topk_logprobs"}) {
    if (call.requested(name) && r->top_k == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requested output '", name, "': expected parameter 'top_k' from 1 to ", kMaxTopK));
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status OipService::ServerLive(grpc::ServerContext* context,
                                    const inference::ServerLiveRequest* /*request*/,
                                    inference::ServerLiveResponse* response) {
  return state_->runner().Run("oip.ServerLive", context, [&](CallStats*) {
    response->set_live(true);
    return absl::OkStatus();
  });
}

grpc::Status OipService::ServerReady(grpc::ServerContext* context,
                                     const inference::ServerReadyRequest* /*request*/,
                                     inference::ServerReadyResponse* response) {
  return state_->runner().Run("oip.ServerReady", context, [&](CallStats*) {
    response->set_ready(state_->backend().Health().ok());
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelReady(grpc::ServerContext* context,
                                    const inference::ModelReadyRequest* request,
                                    inference::ModelReadyResponse* response) {
  return state_->runner().Run("oip.ModelReady", context, [&](CallStats* stats) {
    // As Triton: an unknown model is not ready, not an error.
    const bool found =
        FindModel(state_->registry(), stats->tenant, request->name(), request->version()).ok();
    response->set_ready(found && state_->backend().Health().ok());
    return absl::OkStatus();
  });
}

grpc::Status OipService::ServerMetadata(grpc::ServerContext* context,
                                        const inference::ServerMetadataRequest* /*request*/,
                                        inference::ServerMetadataResponse* response) {
  return state_->runner().Run("oip.ServerMetadata", context, [&](CallStats*) {
    response->set_name("logitd");
    response->set_version(std::string(Version()));
    // Triton's name for the extension, listed where it is served.
    if (state_->shm().allowed()) response->add_extensions("system_shared_memory");
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelMetadata(grpc::ServerContext* context,
                                       const inference::ModelMetadataRequest* request,
                                       inference::ModelMetadataResponse* response) {
  return state_->runner().Run("oip.ModelMetadata", context, [&](CallStats* stats) -> absl::Status {
    LOGITD_ASSIGN_OR_RETURN(const OipModel model, FindModel(state_->registry(), stats->tenant,
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
      add(response->mutable_outputs(), out.name, UpperDTypeName(out.dtype),
          out.per_k ? std::vector<std::int64_t>{-1, -1} : std::vector<std::int64_t>{-1});
    }
    return absl::OkStatus();
  });
}

grpc::Status OipService::ModelInfer(grpc::ServerContext* context,
                                    const inference::ModelInferRequest* request,
                                    inference::ModelInferResponse* response) {
  return state_->runner().Run("oip.ModelInfer", context, [&](CallStats* stats) {
    return DoModelInfer(context, *request, response, stats);
  });
}

absl::Status OipService::DoModelInfer(grpc::ServerContext* context,
                                      const inference::ModelInferRequest& request,
                                      inference::ModelInferResponse* response, CallStats* stats) {
  stats->bytes_in = request.ByteSizeLong();
  // (A lost device has failed the call already: the runner's NeedsDevice.)
  LOGITD_ASSIGN_OR_RETURN(
      const OipModel model,
      FindModel(state_->registry(), stats->tenant, request.model_name(), request.model_version()));
  OipInferCall call(state_, &shm_regions_, context, request, response, stats,
                    model.logprobs ? "LogProbs" : "Logits");
  return model.logprobs ? InferLogProbs(model.w, &call) : InferLogits(model.w, &call);
}

grpc::Status OipService::SystemSharedMemoryStatus(
    grpc::ServerContext* context, const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  return state_->runner().Run(
      "oip.SystemSharedMemoryStatus", context, [&](CallStats* stats) -> absl::Status {
        stats->bytes_in = request->ByteSizeLong();
        LOGITD_ASSIGN_OR_RETURN(const std::vector<OipRegion> regions,
                                shm_regions_.Status(stats->tenant, request->name()));
        for (const OipRegion& r : regions) {
          auto& out = (*response->mutable_regions())[r.name];
          out.set_name(r.name);
          out.set_key(r.key);
          out.set_offset(r.offset);
          out.set_byte_size(r.byte_size);
        }
        stats->bytes_out = response->ByteSizeLong();
        return absl::OkStatus();
      });
}

grpc::Status OipService::SystemSharedMemoryRegister(
    grpc::ServerContext* context, const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse* /*response*/) {
  return state_->runner().Run(
      "oip.SystemSharedMemoryRegister", context, [&](CallStats* stats) -> absl::Status {
        stats->bytes_in = request->ByteSizeLong();
        const OipRegion region{request->name(), request->key(), request->offset(),
                               request->byte_size()};
        LOGITD_ASSIGN_OR_RETURN(const std::shared_ptr<ShmMapping> mapping,
                                shm_regions_.Register(stats->tenant, region));
        const std::string pinned = PinShmRegion(state_->backend(), mapping.get());
        Log(LogLevel::kInfo, absl::StrCat("oip shm region '", region.name, "' mapped: '",
                                          mapping->name(), "', bytes [", region.offset, ", ",
                                          region.offset + region.byte_size, "), ", pinned));
        return absl::OkStatus();
      });
}

grpc::Status OipService::SystemSharedMemoryUnregister(
    grpc::ServerContext* context, const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse* /*response*/) {
  return state_->runner().Run("oip.SystemSharedMemoryUnregister", context,
                              [&](CallStats* stats) -> absl::Status {
                                stats->bytes_in = request->ByteSizeLong();
                                return shm_regions_.Unregister(stats->tenant, request->name());
                              });
}

absl::Status OipService::InferLogits(const WeightRecord& w, OipInferCall* call) {
  const std::string expected = absl::StrCat(
      "expected one input '", kInput, "' BF16 [M, ", w.k,
      "] in raw_input_contents or system shared memory (row-major, no padding) for model ",
      w.Label());
  LOGITD_RETURN_IF_ERROR(call->BindInputs({kInput}, expected));
  LOGITD_RETURN_IF_ERROR(call->BindRequestedOutputs({kOutput}, w.Label(), {{"y", "logits"}}));
  LogitsRequest r;
  r.weight_handle = w.handle;
  r.x = call->Input(kInput);
  if (!r.x.given) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; got no input '", kInput, "'"));
  }
  LOGITD_RETURN_IF_ERROR(ReadLogitsParameters(call->request().parameters(), &r));
  r.outputs = call->Outputs();
  LOGITD_RETURN_IF_ERROR(RunLogits(op_env(), r, &call->call(), *call).status());
  call->Finish();
  return absl::OkStatus();
}

// The same request logitd.v1's LogProbs makes of its header, run by the same
// operation, so that the same inputs give the same bits.
absl::Status OipService::InferLogProbs(const WeightRecord& w, OipInferCall* call) {
  const std::string label = absl::StrCat(w.Label(), kLogProbsSuffix);
  const std::string expected = absl::StrCat(
      "expected input '", kInput, "' BF16 [M, ", w.k, "] and optionally '", kTargets,
      "' INT32 or INT64 [M], in raw_input_contents or system shared memory, for model ", label);
  LOGITD_RETURN_IF_ERROR(call->BindInputs({kInput, kTargets}, expected));
  LOGITD_RETURN_IF_ERROR(call->BindRequestedOutputs(
      {"logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"}, label));
  LogProbsRequest r;
  r.weight_handle = w.handle;
  r.x = call->Input(kInput);
  if (!r.x.given) {
    return absl::InvalidArgumentError(absl::StrCat(expected, "; got no input '", kInput, "'"));
  }
  r.targets = call->Input(kTargets);
  LOGITD_RETURN_IF_ERROR(ReadLogProbsParameters(call->request().parameters(), &r));
  LOGITD_RETURN_IF_ERROR(RequestedLogProbsOutputs(*call, &r));
  r.outputs = call->Outputs();
  LOGITD_RETURN_IF_ERROR(RunLogProbs(op_env(), r, &call->call(), *call).status());
  call->Finish();
  return absl::OkStatus();
}

OpEnv OipService::op_env() const {
  return OpEnv{&state_->backend(), &state_->registry(), state_->options().max_request_bytes};
}

}  // namespace logitd::service

#include "server/service/oip/oip_infer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/service/call/plans.h"
#include "server/service/state/status.h"

namespace logitd::service {
namespace {

// Room for a response's framing next to its tensors: names, shapes, id.
constexpr std::uint64_t kResponseFramingBytes = 4096;

std::string ShapeOf(const OipInferCall::InputTensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

}  // namespace

OipInferCall::OipInferCall(SharedState* state, const OipShmRegions* regions,
                           grpc::ServerContext* context,
                           const inference::ModelInferRequest& request,
                           inference::ModelInferResponse* response, CallStats* stats,
                           absl::string_view rpc)
    : state_(state),
      regions_(regions),
      request_(request),
      response_(response),
      stats_(stats),
      rpc_(rpc),
      call_(
          CallEnv{&state->backend(), &state->admission(), state->options().shm.in_place},
          stats->tenant, absl::FromChrono(context->deadline()),
          [context] { return context->IsCancelled(); }, stats) {}

absl::Status OipInferCall::BindInputs(std::initializer_list<absl::string_view> names,
                                      absl::string_view expected) {
  int raw_index = 0;
  for (const InputTensor& t : request_.inputs()) {
    const std::string what = absl::StrCat("input '", t.name(), "'");
    if (std::find(names.begin(), names.end(), t.name()) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(expected, "; got ", what));
    }
    for (const auto& [n, bound] : inputs_) {
      if (n == t.name()) {
        return absl::InvalidArgumentError(absl::StrCat(expected, "; got ", what, " twice"));
      }
    }
    if (t.has_contents()) {
      return absl::InvalidArgumentError(absl::StrCat(
          expected, "; ", what,
          ": tensors travel as raw bytes or in shared memory only, got typed contents"));
    }
    Bound in;
    in.tensor = &t;
    LOGITD_ASSIGN_OR_RETURN(in.shm, ParseOipShmRef(what, t.parameters()));
    if (!in.shm) {
      if (raw_index >= request_.raw_input_contents_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(expected, "; ", what, " has no raw_input_contents (the request has ",
                         request_.raw_input_contents_size(), ")"));
      }
      in.raw = &request_.raw_input_contents(raw_index++);
    }
    inputs_.emplace_back(t.name(), std::move(in));
  }
  if (raw_index != request_.raw_input_contents_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(expected, "; got ", request_.raw_input_contents_size(),
                     " raw_input_contents for ", raw_index, " inputs outside shared memory"));
  }
  return absl::OkStatus();
}

CallInput OipInferCall::Input(absl::string_view name) const {
  CallInput in;
  for (const auto& [n, bound] : inputs_) {
    if (n != name) continue;
    in.given = true;
    in.name = n;
    in.dtype = bound.tensor->datatype();
    in.shape.assign(bound.tensor->shape().begin(), bound.tensor->shape().end());
    if (bound.shm) {
      in.from = CallInput::From::kShm;
      in.shm = [regions = regions_, tenant = stats_->tenant, ref = *bound.shm](
                   absl::string_view what, std::uint64_t bytes, bool /*is_output*/,
                   std::uint64_t /*align*/) {
        return regions->Resolve(tenant, absl::StrCat("input '", what, "'"), ref, bytes);
      };
    } else {
      in.from = CallInput::From::kMessage;
      in.message = *bound.raw;
    }
  }
  return in;
}

absl::Status OipInferCall::BindRequestedOutputs(std::initializer_list<absl::string_view> names,
                                                absl::string_view model,
                                                std::map<std::string, std::string> renamed) {
  renamed_ = std::move(renamed);
  for (const auto& out : request_.outputs()) {
    if (std::find(names.begin(), names.end(), out.name()) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested output '", out.name(), "': expected one of '",
                       absl::StrJoin(names, "', '"), "', the outputs of model ", model));
    }
    if (requested(out.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested output '", out.name(), "': expected each output once"));
    }
    Requested r;
    r.name = out.name();
    LOGITD_ASSIGN_OR_RETURN(
        r.shm, ParseOipShmRef(absl::StrCat("output '", out.name(), "'"), out.parameters()));
    requested_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

const OipInferCall::Requested* OipInferCall::FindRequested(absl::string_view model_name) const {
  for (const Requested& r : requested_) {
    if (r.name == model_name) return &r;
  }
  return nullptr;
}

bool OipInferCall::requested(absl::string_view name) const {
  return FindRequested(name) != nullptr;
}

bool OipInferCall::Returned(absl::string_view model_name) const {
  return requested_.empty() || requested(model_name);
}

std::string OipInferCall::ModelName(absl::string_view name) const {
  const auto it = renamed_.find(std::string(name));
  return it == renamed_.end() ? std::string(name) : it->second;
}

CallOutputs OipInferCall::Outputs() const {
  CallOutputs outputs;
  for (const Requested& r : requested_) {
    if (!r.shm) continue;
    std::string name = r.name;
    for (const auto& [op_name, model_name] : renamed_) {
      if (model_name == r.name) name = op_name;
    }
    outputs[name].shm = [regions = regions_, tenant = stats_->tenant, ref = *r.shm,
                         model_name = r.name](absl::string_view, std::uint64_t bytes,
                                              bool /*is_output*/, std::uint64_t /*align*/) {
      return regions->Resolve(tenant, absl::StrCat("output '", model_name, "'"), ref, bytes);
    };
  }
  return outputs;
}

absl::Status OipInferCall::CheckSlots(const std::vector<InputSlot>& inputs,
                                      const std::vector<OutputSlot>& outputs) {
  const std::string instead =
      absl::StrCat("use logitd's streaming ", rpc_, " RPC (logitd.v1.Logitd/", rpc_,
                   ", which can also use shared memory)");
  // gRPC lets requests of up to twice this limit through (see main.cc), so
  // that the refusal names it.
  const std::uint64_t in_limit = state_->options().max_receive_message_bytes;
  if (request_.ByteSizeLong() > in_limit) {
    std::vector<std::string> raw;
    for (const auto& [name, in] : inputs_) {
      if (in.raw != nullptr) raw.push_back(absl::StrCat(name, " ", ShapeOf(*in.tensor)));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request (", request_.ByteSizeLong(), " bytes, ", absl::StrJoin(raw, ", "),
        ") is over the server's max message size of ", in_limit,
        " bytes; one Open Inference Protocol message holds a whole tensor: send fewer rows per "
        "call, put the inputs in system shared memory, or ",
        instead));
  }
  std::uint64_t bytes = 0;
  std::int64_t m = 1;
  std::vector<std::string> raw;
  for (const OutputSlot& out : outputs) {
    const std::string name = ModelName(out.name);
    if (!Returned(name) || out.slice) continue;
    bytes += out.bytes;
    if (!out.shape.empty()) m = std::max<std::int64_t>(out.shape[0], 1);
    raw.push_back(absl::StrCat(name, " ", ShapeString(out.shape), " ", UpperDTypeName(out.dtype)));
  }
  const std::uint64_t limit = state_->options().max_send_message_bytes;
  const std::uint64_t framing = kResponseFramingBytes + request_.id().size();
  if (bytes + framing <= limit) return absl::OkStatus();
  const std::uint64_t row = std::max<std::uint64_t>(bytes / static_cast<std::uint64_t>(m), 1);
  const std::uint64_t rows = limit > framing ? (limit - framing) / row : 0;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response, ", absl::StrJoin(raw, ", "), " (", bytes,
      " bytes), is over the server's max message size of ", limit,
      " bytes; one Open Inference Protocol message holds a whole tensor: send at most ", rows,
      " rows of this model per call, put the outputs in system shared memory, or ", instead));
}

// A returned output is declared in the response now, so that
// raw_output_contents follows the outputs' order: Triton's clients find an
// output's bytes at its index. An output in shared memory has an empty
// entry there, and carries its shared-memory parameters.
std::byte* OipInferCall::PlaceOutput(const OutputSlot& out) {
  const std::string name = ModelName(out.name);
  if (!Returned(name)) return nullptr;
  auto* t = response_->add_outputs();
  t->set_name(name);
  t->set_datatype(UpperDTypeName(out.dtype));
  for (std::int64_t d : out.shape) t->add_shape(d);
  std::string* raw = response_->add_raw_output_contents();
  const Requested* r = FindRequested(name);
  if (r != nullptr && r->shm) {
    auto& params = *t->mutable_parameters();
    params["shared_memory_region"].set_string_param(r->shm->region);
    params["shared_memory_byte_size"].set_int64_param(static_cast<std::int64_t>(out.bytes));
    if (r->shm->offset != 0) {
      params["shared_memory_offset"].set_int64_param(static_cast<std::int64_t>(r->shm->offset));
    }
    return nullptr;
  }
  raw->resize(static_cast<std::size_t>(out.bytes));
  stats_->tensor_bytes_out += out.bytes;
  return reinterpret_cast<std::byte*>(raw->data());
}

void OipInferCall::Finish() {
  // Tensor bytes that travelled in the messages, as logitd.v1 counts them:
  // not those in shared memory.
  std::uint64_t in_bytes = 0;
  for (const auto& [name, in] : inputs_) {
    if (in.raw != nullptr) in_bytes += in.raw->size();
  }
  response_->set_model_name(request_.model_name());
  response_->set_model_version("1");
  response_->set_id(request_.id());
  stats_->tensor_bytes_in = in_bytes;
  stats_->bytes_out = response_->ByteSizeLong();
  stats_->send_start = absl::Now();
}

}  // namespace logitd::service

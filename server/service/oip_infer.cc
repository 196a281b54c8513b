#include "server/service/oip_infer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/service/status.h"

namespace logitd::service {
namespace {

// Room for a response's framing next to its tensors: names, shapes, id.
constexpr std::uint64_t kResponseFramingBytes = 4096;

std::string ShapeOf(const OipInferCall::InputTensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

}  // namespace

std::string OipDatatype(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "BF16";
    case DType::kFp32:
      return "FP32";
    case DType::kInt32:
      return "INT32";
    case DType::kInt64:
      return "INT64";
  }
  return "";
}

OipInferCall::OipInferCall(const ServiceCore& core, const OipShmRegions* regions,
                           grpc::ServerContext* context,
                           const inference::ModelInferRequest& request,
                           inference::ModelInferResponse* response, CallStats* stats)
    : core_(core),
      regions_(regions),
      context_(context),
      request_(request),
      response_(response),
      stats_(stats) {}

absl::Status OipInferCall::BindInputs(std::initializer_list<absl::string_view> names,
                                      absl::string_view expected) {
  int raw_index = 0;
  for (const InputTensor& t : request_.inputs()) {
    const std::string what = absl::StrCat("input '", t.name(), "'");
    if (std::find(names.begin(), names.end(), t.name()) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(expected, "; got ", what));
    }
    if (input(t.name()) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(expected, "; got ", what, " twice"));
    }
    if (t.has_contents()) {
      return absl::InvalidArgumentError(absl::StrCat(
          expected, "; ", what,
          ": tensors travel as raw bytes or in shared memory only, got typed contents"));
    }
    Input in;
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

const OipInferCall::InputTensor* OipInferCall::input(absl::string_view name) const {
  for (const auto& [n, in] : inputs_) {
    if (n == name) return in.tensor;
  }
  return nullptr;
}

absl::Status OipInferCall::CheckInputBytes(absl::string_view name, std::uint64_t bytes,
                                           absl::string_view expected) {
  for (auto& [n, in] : inputs_) {
    if (n != name) continue;
    in.want = bytes;
    if (in.raw == nullptr || in.raw->size() == bytes) continue;
    return absl::InvalidArgumentError(absl::StrCat(expected, "; ", name, " ", ShapeOf(*in.tensor),
                                                   " is ", bytes, " bytes, got ", in.raw->size()));
  }
  return absl::OkStatus();
}

absl::Status OipInferCall::BindRequestedOutputs(std::initializer_list<absl::string_view> names,
                                                absl::string_view model) {
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

bool OipInferCall::requested(absl::string_view name) const {
  for (const Requested& r : requested_) {
    if (r.name == name) return true;
  }
  return false;
}

void OipInferCall::AddOutput(absl::string_view name, DType dtype, std::vector<std::int64_t> shape) {
  Output out;
  out.name = std::string(name);
  out.dtype = dtype;
  out.bytes = ElementSize(dtype);
  for (std::int64_t d : shape) out.bytes *= static_cast<std::uint64_t>(d);
  out.shape = std::move(shape);
  out.returned = requested_.empty() || requested(name);
  for (const Requested& r : requested_) {
    if (r.name == name) out.shm = r.shm;
  }
  outputs_.push_back(std::move(out));
}

absl::Status OipInferCall::CheckMessageSizes(std::int64_t m, absl::string_view rpc) const {
  const std::string instead =
      absl::StrCat("use logitd's streaming ", rpc, " RPC (logitd.v1.Logitd/", rpc,
                   ", which can also use shared memory)");
  // gRPC lets requests of up to twice this limit through (see main.cc), so
  // that the refusal names it.
  const std::uint64_t in_limit = core_.options->max_receive_message_bytes;
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
  std::vector<std::string> raw;
  for (const Output& out : outputs_) {
    if (!out.returned || out.shm) continue;
    bytes += out.bytes;
    raw.push_back(absl::StrCat(out.name, " ", ShapeString(out.shape), " ", OipDatatype(out.dtype)));
  }
  const std::uint64_t limit = core_.options->max_send_message_bytes;
  const std::uint64_t framing = kResponseFramingBytes + request_.id().size();
  if (bytes + framing <= limit) return absl::OkStatus();
  const std::uint64_t row = bytes / static_cast<std::uint64_t>(m);
  const std::uint64_t rows = limit > framing ? (limit - framing) / row : 0;
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response, ", absl::StrJoin(raw, ", "), " (", bytes,
      " bytes), is over the server's max message size of ", limit,
      " bytes; one Open Inference Protocol message holds a whole tensor: send at most ", rows,
      " rows of this model per call, put the outputs in system shared memory, or ", instead));
}

std::uint64_t OipInferCall::TensorBytes() const {
  std::uint64_t bytes = 0;
  for (const auto& [name, in] : inputs_) bytes += in.want;
  for (const Output& out : outputs_) bytes += out.bytes;
  return bytes;
}

absl::Status OipInferCall::Start(std::uint64_t scratch_bytes) {
  for (auto& [name, in] : inputs_) {
    if (!in.shm) continue;
    LOGITD_ASSIGN_OR_RETURN(
        in.slice,
        regions_->Resolve(stats_->tenant, absl::StrCat("input '", name, "'"), *in.shm, in.want));
  }
  for (Output& out : outputs_) {
    if (!out.shm) continue;
    LOGITD_ASSIGN_OR_RETURN(
        out.slice, regions_->Resolve(stats_->tenant, absl::StrCat("output '", out.name, "'"),
                                     *out.shm, out.bytes));
  }
  grpc::ServerContext* context = context_;
  LOGITD_ASSIGN_OR_RETURN(
      ticket_,
      core_.admission->Admit(
          "ModelInfer", TensorBytes() + scratch_bytes, absl::FromChrono(context->deadline()),
          [context] { return context->IsCancelled(); }, stats_->tenant.id));
  if (ticket_.waited() > absl::ZeroDuration()) stats_->queue_us = Micros(ticket_.waited());
  for (Output& out : outputs_) LOGITD_RETURN_IF_ERROR(PlaceOutput(&out));
  return absl::OkStatus();
}

// A returned output is declared in the response now, so that
// raw_output_contents follows the outputs' order: Triton's clients find an
// output's bytes at its index. An output in shared memory has an empty
// entry there, and carries its shared-memory parameters.
absl::Status OipInferCall::PlaceOutput(Output* out) {
  const bool in_place =
      out->shm && reinterpret_cast<std::uintptr_t>(out->slice.data) % ElementSize(out->dtype) == 0;
  if (out->returned) {
    auto* t = response_->add_outputs();
    t->set_name(out->name);
    t->set_datatype(OipDatatype(out->dtype));
    for (std::int64_t d : out->shape) t->add_shape(d);
    std::string* raw = response_->add_raw_output_contents();
    if (out->shm) {
      auto& params = *t->mutable_parameters();
      params["shared_memory_region"].set_string_param(out->shm->region);
      params["shared_memory_byte_size"].set_int64_param(static_cast<std::int64_t>(out->bytes));
      if (out->shm->offset != 0) {
        params["shared_memory_offset"].set_int64_param(static_cast<std::int64_t>(out->shm->offset));
      }
    } else {
      raw->resize(static_cast<std::size_t>(out->bytes));
      out->data = reinterpret_cast<std::byte*>(raw->data());
      return absl::OkStatus();
    }
  }
  if (in_place) {
    out->data = out->slice.data;
    return absl::OkStatus();
  }
  LOGITD_ASSIGN_OR_RETURN(out->aside,
                          core_.backend->AllocateHost(static_cast<std::size_t>(out->bytes)));
  out->data = out->aside.data();
  return absl::OkStatus();
}

absl::StatusOr<const std::byte*> OipInferCall::InputData(absl::string_view name,
                                                         std::size_t align) {
  for (auto& [n, in] : inputs_) {
    if (n != name) continue;
    const std::byte* src =
        in.shm ? in.slice.data : reinterpret_cast<const std::byte*>(in.raw->data());
    const std::size_t bytes = in.shm ? in.slice.bytes : in.raw->size();
    if (!in.shm && reinterpret_cast<std::uintptr_t>(src) % align == 0) return src;
    LOGITD_ASSIGN_OR_RETURN(in.copy, core_.backend->AllocateHost(bytes));
    std::memcpy(in.copy.data(), src, bytes);
    return static_cast<const std::byte*>(in.copy.data());
  }
  return nullptr;
}

std::byte* OipInferCall::OutputData(absl::string_view name) const {
  for (const Output& out : outputs_) {
    if (out.name == name) return out.data;
  }
  return nullptr;
}

void OipInferCall::Finish(const kernels::Timing& timing) {
  // Tensor bytes that travelled in the messages, as logitd.v1 counts them:
  // not those in shared memory.
  std::uint64_t in_bytes = 0, out_bytes = 0;
  for (auto& [name, in] : inputs_) {
    if (!in.shm) in_bytes += in.want;
    in.copy = kernels::HostBuffer();
  }
  for (Output& out : outputs_) {
    if (out.shm && out.data != out.slice.data) {
      std::memcpy(out.slice.data, out.data, static_cast<std::size_t>(out.bytes));
    }
    if (out.returned && !out.shm) out_bytes += out.bytes;
  }
  stats_->compute_us = timing.compute_us;
  stats_->gemms = absl::StrJoin(timing.gemms, "; ");
  if (timing.transfers_measured) {
    stats_->h2d_us = timing.h2d_us;
    stats_->d2h_us = timing.d2h_us;
  }
  response_->set_model_name(request_.model_name());
  response_->set_model_version("1");
  response_->set_id(request_.id());
  stats_->tensor_bytes_in = in_bytes;
  stats_->tensor_bytes_out = out_bytes;
  stats_->bytes_out = response_->ByteSizeLong();
  stats_->send_start = absl::Now();
}

}  // namespace logitd::service

#include "client/cpp/call_tensors.h"

#include "absl/strings/str_format.h"
#include "logitd/shared_region.h"

namespace logitd::client {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::optional<TimingTrailer> TrailerOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  std::optional<TimingTrailer> out;
  const auto it =
      trailers.find(grpc::string_ref(wire::kTimingTrailer.data(), wire::kTimingTrailer.size()));
  if (it != trailers.end()) {
    absl::StatusOr<TimingTrailer> t =
        ParseTimingTrailer(absl::string_view(it->second.data(), it->second.size()));
    if (t.ok()) out = *std::move(t);
  }
  const auto gemm =
      trailers.find(grpc::string_ref(wire::kGemmTrailer.data(), wire::kGemmTrailer.size()));
  if (gemm != trailers.end()) {
    if (!out.has_value()) out.emplace();
    out->gemms.assign(gemm->second.data(), gemm->second.size());
  }
  return out;
}

Timing TimingOf(const v1::Timing& t, const grpc::ClientContext& context) {
  Timing out;
  out.queue_us = t.queue_us();
  out.receive_us = t.receive_us();
  out.h2d_us = t.h2d_us();
  out.compute_us = t.compute_us();
  out.d2h_us = t.d2h_us();
  out.trailer = TrailerOf(context);
  // A call run in row blocks sends its result before its timing is known:
  // the trailer has it.
  if (out.trailer && out.trailer->pipeline_rows) {
    const TimingTrailer& tr = *out.trailer;
    out.queue_us = tr.queue_us.value_or(0);
    out.receive_us = tr.receive_us.value_or(0);
    out.h2d_us = tr.h2d_us.value_or(0);
    out.compute_us = tr.compute_us.value_or(0);
    out.d2h_us = tr.d2h_us.value_or(0);
  }
  return out;
}

absl::Status CheckNotEmpty(absl::string_view what, const Tensor& t) {
  if (t.rank() == 0 && t.nbytes() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": expected a tensor with a shape, got an empty one (default-constructed or moved-from)"));
  }
  return absl::OkStatus();
}

namespace {

// The bytes [slot.offset, slot.offset + bytes) of the slot's mapped region,
// checked to lie inside it.
absl::StatusOr<const std::byte*> SlotBytes(absl::string_view what, const ShmSlot& slot,
                                           std::uint64_t bytes) {
  if (slot.region == nullptr || !slot.region->valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " shm slot: expected a mapped SharedRegion, got none"));
  }
  if (slot.handle.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " shm slot: expected the region handle RegisterShm returned, got none"));
  }
  const std::uint64_t size = slot.region->size();
  if (slot.offset > size || bytes > size - slot.offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, " shm slot: offset ", slot.offset,
                                                   " + bytes ", bytes, " exceeds region '",
                                                   slot.region->name(), "' of ", size, " bytes"));
  }
  return slot.region->data() + slot.offset;
}

// The spec of an input that is either a tensor (streamed) or the bytes of a
// shared-memory slot (dtype and shape given); sets *ref for a slot.
absl::StatusOr<v1::TensorSpec> InputSpec(absl::string_view name, const Tensor* tensor,
                                         const std::optional<ShmSlot>& slot, DType dtype,
                                         const std::vector<std::int64_t>& shape,
                                         std::optional<v1::ShmRef>* ref) {
  if (!slot) {
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected a tensor or a shm slot, got neither"));
    }
    if (absl::Status s = CheckNotEmpty(name, *tensor); !s.ok()) return s;
    return wire::MakeSpec(name, *tensor);
  }
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, dtype);
  if (!n.ok()) return n.status();
  absl::StatusOr<const std::byte*> bytes = SlotBytes(name, *slot, static_cast<std::uint64_t>(*n));
  if (!bytes.ok()) return bytes.status();
  v1::TensorSpec spec;
  spec.set_name(std::string(name));
  spec.set_dtype(wire::ToProto(dtype));
  for (std::int64_t d : shape) spec.add_shape(d);
  spec.set_xxh3(slot->xxh3 ? *slot->xxh3 : Xxh3(*bytes, static_cast<std::size_t>(*n)));
  v1::ShmRef r;
  r.set_region(slot->handle);
  r.set_offset(slot->offset);
  r.set_bytes(static_cast<std::uint64_t>(*n));
  *ref = std::move(r);
  return spec;
}

// The ref asking for an output at `slot`: the room from its offset to the
// end of the region.
v1::ShmRef OutputRef(const ShmSlot& slot) {
  v1::ShmRef r;
  r.set_region(slot.handle);
  r.set_offset(slot.offset);
  r.set_bytes(slot.region->size() - slot.offset);
  r.set_skip_digest(slot.skip_digest);
  return r;
}

// Checks an output the server says it wrote at `slot`: DataLoss unless it is
// where it was asked for, its shape matches its bytes, and the bytes in the
// region have the announced digest.
absl::StatusOr<ShmOutput> CheckShmOutput(const v1::TensorSpec& spec, const v1::ShmRef& where,
                                         const ShmSlot& slot) {
  if (where.offset() != slot.offset) {
    return absl::DataLossError(
        absl::StrCat("response from server: '", spec.name(), "' not at the requested shm slot"));
  }
  absl::StatusOr<DType> dtype = wire::FromProto(spec.dtype());
  if (!dtype.ok()) return absl::DataLossError(dtype.status().message());
  const std::vector<std::int64_t> shape(spec.shape().begin(), spec.shape().end());
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, *dtype);
  if (!n.ok() || static_cast<std::uint64_t>(*n) != where.bytes()) {
    return absl::DataLossError(absl::StrCat("response from server: '", spec.name(),
                                            "': shape does not match its shm bytes"));
  }
  absl::StatusOr<const std::byte*> bytes =
      SlotBytes(spec.name(), slot, static_cast<std::uint64_t>(*n));
  if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
  if (where.skip_digest() && !slot.skip_digest) {
    return absl::DataLossError(absl::StrCat("response from server: '", spec.name(),
                                            "' was written without a digest, which was not asked"));
  }
  // A server that hashed anyway (skip_digest unset) is still checked.
  const std::uint64_t got = where.skip_digest() ? 0 : Xxh3(*bytes, static_cast<std::size_t>(*n));
  if (got != spec.xxh3()) {
    return absl::DataLossError(absl::StrFormat(
        "response from server: xxh3 of '%s' (%d bytes in shared memory) is %016x, the server "
        "announced %016x",
        spec.name(), *n, got, spec.xxh3()));
  }
  ShmOutput out;
  out.dtype = *dtype;
  out.shape = shape;
  out.xxh3 = got;
  out.offset = slot.offset;
  out.bytes = static_cast<std::uint64_t>(*n);
  return out;
}

}  // namespace

absl::Status CallTensors::Input(absl::string_view name, const Tensor* tensor,
                                const std::optional<ShmSlot>& slot, DType dtype,
                                const std::vector<std::int64_t>& shape) {
  InputSlot in;
  in.name = std::string(name);
  in.tensor = tensor;
  if (!slot && tensor != nullptr && DigestAfter(tensor->nbytes())) {
    if (absl::Status s = CheckNotEmpty(name, *tensor); !s.ok()) return s;
    in.spec.set_name(in.name);
    in.spec.set_dtype(wire::ToProto(tensor->dtype()));
    for (std::int64_t d : tensor->shape()) in.spec.add_shape(d);
    in.digest_after = true;  // xxh3 0: it follows the chunks
    inputs_.push_back(std::move(in));
    return absl::OkStatus();
  }
  absl::StatusOr<v1::TensorSpec> spec = InputSpec(name, tensor, slot, dtype, shape, &in.ref);
  if (!spec.ok()) return spec.status();
  in.spec = *std::move(spec);
  inputs_.push_back(std::move(in));
  return absl::OkStatus();
}

absl::Status CallTensors::InputBytes(absl::string_view name, const std::byte* data, DType dtype,
                                     const std::vector<std::int64_t>& shape) {
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, dtype);
  if (!n.ok()) return n.status();
  InputSlot in;
  in.name = std::string(name);
  in.data = data;
  in.nbytes = static_cast<std::size_t>(*n);
  in.spec.set_name(in.name);
  in.spec.set_dtype(wire::ToProto(dtype));
  for (std::int64_t d : shape) in.spec.add_shape(d);
  if (DigestAfter(in.nbytes)) {
    in.digest_after = true;
  } else {
    in.spec.set_xxh3(Xxh3(data, in.nbytes));
  }
  inputs_.push_back(std::move(in));
  return absl::OkStatus();
}

absl::Status CallTensors::Output(absl::string_view name, const std::optional<ShmSlot>& slot,
                                 Tensor* into) {
  if (slot) {
    if (absl::Status s = SlotBytes(name, *slot, 0).status(); !s.ok()) return s;
  }
  outputs_.push_back(OutputSlot{std::string(name), slot, into, nullptr, 0});
  return absl::OkStatus();
}

void CallTensors::FillHeader(google::protobuf::Message* header) const {
  const google::protobuf::Descriptor* type = header->GetDescriptor();
  const google::protobuf::Reflection* fields = header->GetReflection();
  const auto set = [&](const std::string& field, const google::protobuf::Message& value) {
    const google::protobuf::FieldDescriptor* f = type->FindFieldByName(field);
    if (f != nullptr) fields->MutableMessage(header, f)->CopyFrom(value);
  };
  for (const InputSlot& in : inputs_) {
    set(in.name, in.spec);
    if (in.ref) set(in.name + "_shm", *in.ref);
  }
  for (const OutputSlot& out : outputs_) {
    if (out.slot) set(out.name + "_shm", OutputRef(*out.slot));
  }
}

namespace {

// The message field `name` of `message` when it is set, else null.
const google::protobuf::Message* SetField(const google::protobuf::Message& message,
                                          const std::string& name) {
  const google::protobuf::FieldDescriptor* f = message.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || !message.GetReflection()->HasField(message, f)) return nullptr;
  return &message.GetReflection()->GetMessage(message, f);
}

}  // namespace

std::vector<const v1::TensorSpec*> CallTensors::Streamed(
    const google::protobuf::Message& result) const {
  std::vector<const v1::TensorSpec*> specs;
  for (const OutputSlot& out : outputs_) {
    const auto* spec = static_cast<const v1::TensorSpec*>(SetField(result, out.name));
    if (spec != nullptr && SetField(result, out.name + "_shm") == nullptr) specs.push_back(spec);
  }
  return specs;
}

void CallTensors::OfferInto(ResponseTensors* tensors) const {
  for (const OutputSlot& out : outputs_) {
    if (out.into != nullptr) tensors->Recycle(out.name, out.into);
    if (out.into_bytes != nullptr) tensors->Place(out.name, out.into_bytes, out.into_capacity);
  }
}

const CallTensors::OutputSlot* CallTensors::FindOutput(absl::string_view name) const {
  for (const OutputSlot& out : outputs_) {
    if (out.name == name) return &out;
  }
  return nullptr;
}

absl::StatusOr<CallTensors::Received> CallTensors::Take(absl::string_view name,
                                                        const google::protobuf::Message& result,
                                                        ResponseTensors* tensors) const {
  Received got;
  const OutputSlot* out = FindOutput(name);
  const auto* spec = static_cast<const v1::TensorSpec*>(SetField(result, std::string(name)));
  if (out == nullptr || spec == nullptr) return got;
  const auto* where = static_cast<const v1::ShmRef*>(SetField(result, absl::StrCat(name, "_shm")));
  if (where != nullptr && !out->slot) {
    return absl::DataLossError(
        absl::StrCat("response from server: '", name, "' placed in shared memory unasked"));
  }
  if (where == nullptr && out->slot) {
    return absl::DataLossError(absl::StrCat("response from server: expected '", name,
                                            "' at the requested shm slot, got it streamed"));
  }
  if (where != nullptr) {
    absl::StatusOr<ShmOutput> o = CheckShmOutput(*spec, *where, *out->slot);
    if (!o.ok()) return o.status();
    got.shm = *std::move(o);
    return got;
  }
  absl::StatusOr<Tensor> t = tensors->Take(*spec);
  if (!t.ok()) return t.status();
  if (out->into != nullptr) {
    *out->into = std::move(*t);
    // Present, but handed over: an empty tensor marks it.
    got.tensor.emplace();
    return got;
  }
  got.tensor = std::move(*t);
  return got;
}

}  // namespace logitd::client

#include "server/service/tensor_call.h"

#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/chunk_message.h"
#include "logitd/tensor.h"
#include "server/service/status.h"

namespace logitd::service {

TensorCallBase::TensorCallBase(const TensorCallEnv& env, absl::string_view method,
                               grpc::ServerContextBase* context, CallStats* stats)
    : env_(env),
      method_(method),
      context_(context),
      stats_(stats),
      assembler_(env.max_request_bytes) {}

absl::Status TensorCallBase::Input(absl::string_view name, const v1::TensorSpec& spec,
                                   std::uint64_t bytes, const v1::ShmRef* shm) {
  InputSlot slot;
  slot.name = std::string(name);
  slot.spec = spec;
  slot.bytes = bytes;
  if (shm != nullptr) {
    LOGITD_ASSIGN_OR_RETURN(slot.slice, env_.shm->Resolve(tenant(), name, *shm, bytes,
                                                          /*is_output=*/false, 1));
  }
  inputs_.push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status TensorCallBase::Output(absl::string_view name, DType dtype,
                                    std::vector<std::int64_t> shape, std::uint64_t bytes,
                                    const v1::ShmRef* shm) {
  OutputSlot slot;
  slot.name = std::string(name);
  slot.dtype = dtype;
  slot.shape = std::move(shape);
  slot.bytes = bytes;
  if (shm != nullptr) {
    slot.asked = *shm;
    LOGITD_ASSIGN_OR_RETURN(slot.slice, env_.shm->Resolve(tenant(), name, *shm, bytes,
                                                          /*is_output=*/true, ElementSize(dtype)));
    slot.data = slot.slice->data;
  }
  outputs_.push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status TensorCallBase::Admit(absl::string_view what) {
  std::uint64_t bytes = scratch_bytes_;
  for (const InputSlot& s : inputs_) bytes += s.bytes;
  for (const OutputSlot& s : outputs_) bytes += s.bytes;
  grpc::ServerContextBase* context = context_;
  LOGITD_ASSIGN_OR_RETURN(AdmissionTicket ticket,
                          env_.admission->Admit(
                              what, bytes, absl::FromChrono(context->deadline()),
                              [context] { return context->IsCancelled(); }, tenant().id));
  if (ticket.waited() > absl::ZeroDuration()) stats_->queue_us = Micros(ticket.waited());
  ticket_ = std::move(ticket);
  for (InputSlot& slot : inputs_) LOGITD_RETURN_IF_ERROR(FillInput(&slot));
  return absl::OkStatus();
}

// An input lands in a host buffer from the backend (page-locked and pooled
// on cuda: no page faults while it fills, and the device reads it at full
// speed). From a shared-memory slice it is copied out of the region, then
// its digest checked against the spec, as for a streamed tensor: DataLoss
// when the bytes are not the ones the spec describes; copied first because
// the client can still write the region, and what is computed must be what
// was checked. Otherwise it is announced, to be received into the buffer.
absl::Status TensorCallBase::FillInput(InputSlot* slot) {
  LOGITD_ASSIGN_OR_RETURN(slot->buffer,
                          env_.backend->AllocateHost(static_cast<std::size_t>(slot->bytes)));
  if (!slot->slice) return assembler_.ExpectInto(slot->spec, slot->buffer.data(), slot->bytes);
  const ShmSlice& slice = *slot->slice;
  if (slice.bytes != slot->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", slot->name, "': shm bytes ", slice.bytes,
                                                   " is not the ", slot->bytes,
                                                   " bytes its spec takes"));
  }
  // Hashed as copied: the digest is of the bytes in the buffer.
  const std::uint64_t got =
      CopyXxh3(slot->buffer.data(), slice.data, static_cast<std::size_t>(slot->bytes));
  if (got != slot->spec.xxh3()) {
    return absl::DataLossError(absl::StrFormat(
        "'%s': xxh3 of the %d bytes read from shared memory (region offset %d) is %016x, the spec "
        "says %016x: the region was changed after the spec was computed",
        slot->name, slice.bytes, slice.offset, got, slot->spec.xxh3()));
  }
  return absl::OkStatus();
}

absl::Status TensorCallBase::AllocateOutputs() {
  for (OutputSlot& slot : outputs_) {
    if (slot.slice) continue;
    LOGITD_ASSIGN_OR_RETURN(slot.buffer,
                            env_.backend->AllocateHost(static_cast<std::size_t>(slot.bytes)));
    slot.data = slot.buffer.data();
  }
  return absl::OkStatus();
}

const std::byte* TensorCallBase::InData(absl::string_view name) const {
  for (const InputSlot& s : inputs_) {
    if (s.name == name) return s.buffer.data();
  }
  return nullptr;
}

std::byte* TensorCallBase::OutData(absl::string_view name) const {
  for (const OutputSlot& s : outputs_) {
    if (s.name == name) return s.data;
  }
  return nullptr;
}

void TensorCallBase::ReleaseInputs() {
  for (InputSlot& s : inputs_) s.buffer = kernels::HostBuffer();
}

void TensorCallBase::Timed(const kernels::Timing& t, v1::Timing* out) {
  out->set_queue_us(std::max<std::int64_t>(stats_->queue_us, 0));
  out->set_receive_us(std::max<std::int64_t>(stats_->receive_us, 0));
  out->set_h2d_us(t.h2d_us);
  out->set_compute_us(t.compute_us);
  out->set_d2h_us(t.d2h_us);
  stats_->compute_us = t.compute_us;
  stats_->gemms = absl::StrJoin(t.gemms, "; ");
  if (t.transfers_measured) {
    stats_->h2d_us = t.h2d_us;
    stats_->d2h_us = t.d2h_us;
  }
}

std::uint64_t TensorCallBase::Digest(absl::string_view name, const void* data,
                                     std::uint64_t bytes) const {
  const std::uint64_t digest = Xxh3(data, static_cast<std::size_t>(bytes));
  return env_.faults != nullptr ? env_.faults->OutputDigest(method_, name, digest) : digest;
}

absl::Status TensorCallBase::FillResult(google::protobuf::Message* result, bool digest_last) {
  const google::protobuf::Descriptor* type = result->GetDescriptor();
  const google::protobuf::Reflection* fields = result->GetReflection();
  for (const OutputSlot& s : outputs_) {
    const google::protobuf::FieldDescriptor* spec_field = type->FindFieldByName(s.name);
    if (spec_field == nullptr || spec_field->message_type() != v1::TensorSpec::descriptor()) {
      return absl::InternalError(
          absl::StrCat(type->full_name(), " has no TensorSpec field for output ", s.name));
    }
    auto* spec = static_cast<v1::TensorSpec*>(fields->MutableMessage(result, spec_field));
    spec->set_name(s.name);
    spec->set_dtype(wire::ToProto(s.dtype));
    spec->clear_shape();
    for (std::int64_t d : s.shape) spec->add_shape(d);
    // Xxh3 0: the digest follows the chunks, or (shared memory, skip_digest)
    // is not computed at all.
    const bool later_or_never = s.slice ? s.asked->skip_digest() : digest_last;
    spec->set_xxh3(later_or_never ? 0 : Digest(s.name, s.data, s.bytes));
    if (!s.slice) continue;
    const google::protobuf::FieldDescriptor* shm_field = type->FindFieldByName(s.name + "_shm");
    if (shm_field == nullptr || shm_field->message_type() != v1::ShmRef::descriptor()) {
      return absl::InternalError(
          absl::StrCat(type->full_name(), " has no ShmRef field for output ", s.name));
    }
    auto* where = static_cast<v1::ShmRef*>(fields->MutableMessage(result, shm_field));
    where->set_region(s.asked->region());
    where->set_offset(s.slice->offset);
    where->set_bytes(s.bytes);
    where->set_skip_digest(s.asked->skip_digest());
  }
  return absl::OkStatus();
}

absl::Status TensorCallBase::SendStreamed(
    const std::function<bool(const grpc::ByteBuffer&)>& write, bool digest_last,
    std::vector<std::pair<std::string, std::uint64_t>>* digests) {
  // Held here as well as by the chunks' slices: the hasher may still read a
  // buffer after gRPC has let go of all of its chunks.
  struct Sent {
    std::string name;
    std::shared_ptr<const void> held;
    std::uint64_t bytes;
  };
  std::vector<Sent> sent;
  std::uint64_t total = 0;
  for (OutputSlot& s : outputs_) {
    if (s.slice) continue;
    sent.push_back({s.name, env_.sending->Hold(std::move(s.buffer)), s.bytes});
    s.data = nullptr;
    total += s.bytes;
  }
  std::vector<std::uint64_t> hashed(sent.size());
  const auto hash_all = [&] {
    for (std::size_t i = 0; i < sent.size(); ++i) {
      hashed[i] = Digest(sent[i].name, sent[i].held.get(), sent[i].bytes);
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
  absl::Status status;
  for (std::size_t i = 0; i < sent.size() && status.ok(); ++i) {
    status = wire::SendChunkMessages(
        sent[i].name, static_cast<const std::byte*>(sent[i].held.get()),
        static_cast<std::size_t>(sent[i].bytes), env_.chunk_bytes, sent[i].held,
        [&](const grpc::ByteBuffer& message, std::size_t payload) {
          stats_->bytes_out += message.Length();
          stats_->tensor_bytes_out += payload;
          return write(message);
        });
  }
  if (hasher.joinable()) hasher.join();
  LOGITD_RETURN_IF_ERROR(status);
  if (!digest_last) return absl::OkStatus();
  for (std::size_t i = 0; i < sent.size(); ++i) digests->emplace_back(sent[i].name, hashed[i]);
  return absl::OkStatus();
}

}  // namespace logitd::service

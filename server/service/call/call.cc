#include "server/service/call/call.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "logitd/status_macros.h"
#include "logitd/tensor.h"
#include "server/service/call/plans.h"

namespace logitd::service {
namespace {

bool Aligned(const void* p, std::size_t align) {
  return reinterpret_cast<std::uintptr_t>(p) % align == 0;
}

}  // namespace

Call::Call(const CallEnv& env, const Tenant& tenant, absl::Time deadline,
           std::function<bool()> cancelled, CallStats* stats)
    : env_(env),
      tenant_(tenant),
      deadline_(deadline),
      cancelled_(std::move(cancelled)),
      stats_(stats) {}

Call::~Call() {
  if (in_place_hasher_.joinable()) in_place_hasher_.join();
}

bool Call::InPlace(const InputSlot& slot) const {
  if (!read_in_place_ || slot.in.from != CallInput::From::kShm || !slot.slice || !slot.in.xxh3) {
    return false;
  }
  const std::optional<DType> dtype = DTypeOfName(slot.in.dtype);
  return Aligned(slot.slice->data, dtype ? ElementSize(*dtype) : 8);
}

absl::Status Call::CheckInPlace() {
  if (in_place_hasher_.joinable()) in_place_hasher_.join();
  return in_place_status_;
}

absl::Status Call::Input(absl::string_view name, const CallInput& in, std::uint64_t bytes) {
  InputSlot slot;
  slot.name = std::string(name);
  slot.in = in;
  slot.bytes = bytes;
  switch (in.from) {
    case CallInput::From::kShm: {
      LOGITD_ASSIGN_OR_RETURN(slot.slice, in.shm(name, bytes, /*is_output=*/false, 1));
      if (slot.slice->bytes != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("'", name, "': shm bytes ",
                                                       slot.slice->bytes, " is not the ", bytes,
                                                       " bytes its spec takes"));
      }
      break;
    }
    case CallInput::From::kMessage:
      if (in.message.size() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": expected ", bytes, " bytes (", in.dtype, " ", ShapeString(in.shape), "), got ",
            in.message.size(), " in the request message"));
      }
      break;
    case CallInput::From::kStream:
      break;
  }
  inputs_.push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status Call::Output(absl::string_view name, DType dtype, std::vector<std::int64_t> shape,
                          std::uint64_t bytes, const CallOutputs& outputs) {
  OutputSlot slot;
  slot.name = std::string(name);
  slot.dtype = dtype;
  slot.shape = std::move(shape);
  slot.bytes = bytes;
  if (auto it = outputs.find(slot.name); it != outputs.end() && it->second.shm) {
    LOGITD_ASSIGN_OR_RETURN(slot.slice,
                            it->second.shm(name, bytes, /*is_output=*/true, ElementSize(dtype)));
  }
  outputs_.push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status Call::Receive(absl::string_view what, Transport& transport) {
  LOGITD_ASSIGN_OR_RETURN(std::vector<InputSlot*> streamed, Admit(what, transport));
  LOGITD_RETURN_IF_ERROR(transport.ReceiveStreamed(std::move(streamed)));
  return AllocateOutputs(transport);
}

std::optional<std::uint64_t> Call::InputDigest(absl::string_view name) const {
  for (const InputSlot& s : inputs_) {
    if (s.name == name) return s.in.xxh3;
  }
  return std::nullopt;
}

absl::Status Call::ReceiveWhile(absl::string_view what, Transport& transport,
                                const std::function<absl::Status(const WaitWhole& whole)>& early) {
  if (!transport.ReceivesAside()) {
    LOGITD_RETURN_IF_ERROR(Receive(what, transport));
    return early([](absl::string_view) { return absl::OkStatus(); });
  }
  LOGITD_ASSIGN_OR_RETURN(std::vector<InputSlot*> streamed, Admit(what, transport));
  InputProgress progress;
  // Each input whole, as one row; by the name its chunks travel under.
  for (const InputSlot* slot : streamed) progress.Expect(slot->in.name, slot->bytes, 1);
  LOGITD_RETURN_IF_ERROR(transport.StartReceive(streamed, &progress));
  // From here the front door's thread is receiving: every way out waits for
  // it (FinishReceive) before the buffers it fills can go.
  absl::Status status = early([&](absl::string_view slot) {
    for (const InputSlot* s : streamed) {
      if (s->name == slot) return progress.WaitInput(s->in.name);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) {
    // Not waiting for the rest of the request: its status is early's.
    transport.StopReceiving();
    transport.FinishReceive().IgnoreError();
    return status;
  }
  LOGITD_RETURN_IF_ERROR(transport.FinishReceive());
  return AllocateOutputs(transport);
}

bool Call::Pipelines(const Transport& transport) const {
  if (!transport.Pipelined()) return false;
  // Outputs all streamed or all in shared memory: a result that names an
  // output in a region carries its digest, so it could not go before the
  // streamed ones.
  std::size_t in_regions = 0;
  for (const OutputSlot& s : outputs_) in_regions += s.slice ? 1 : 0;
  if (in_regions != 0 && in_regions != outputs_.size()) return false;
  for (const InputSlot& s : inputs_) {
    if (s.in.from == CallInput::From::kStream) return true;
  }
  return false;
}

absl::StatusOr<OpResult> Call::RunInRowBlocks(absl::string_view what, Transport& transport,
                                              std::int64_t m, std::int64_t block_rows,
                                              OpResult early, const Block& block) {
  return RunInRowBlocks(what, transport, m, block_rows, std::move(early), block, RowBlockSteps{});
}

absl::StatusOr<OpResult> Call::RunInRowBlocks(absl::string_view what, Transport& transport,
                                              std::int64_t m, std::int64_t block_rows,
                                              OpResult early, const Block& block,
                                              const RowBlockSteps& steps) {
  LOGITD_ASSIGN_OR_RETURN(std::vector<InputSlot*> streamed, Admit(what, transport));
  InputProgress progress;
  // By the name its chunks travel under (the client's choice).
  for (const InputSlot* slot : streamed) progress.Expect(slot->in.name, slot->bytes, m);
  LOGITD_RETURN_IF_ERROR(transport.StartReceive(streamed, &progress));
  // From here the front door's thread is receiving: every way out waits for
  // it (FinishReceive) before the buffers it fills can go.
  absl::Status status = AllocateOutputs(transport);
  if (status.ok() && steps.before) {
    const RowBlockSteps::WaitWhole whole = [&](absl::string_view slot) {
      for (const InputSlot* s : streamed) {
        if (s->name == slot) return progress.WaitInput(s->in.name);
      }
      return absl::OkStatus();
    };
    status = steps.before(whole, &early);
  }
  if (status.ok()) status = transport.StartSend(early, m);
  if (!status.ok()) {
    transport.StopReceiving();
    transport.FinishReceive().IgnoreError();
    return status;
  }
  stats_->pipeline_rows = block_rows;
  OpResult result = std::move(early);
  kernels::Timing& total = result.timing;
  for (std::int64_t r0 = 0; r0 < m && status.ok();) {
    const std::int64_t rows = kernels::BlockRowsAt(m, r0, block_rows);
    status = progress.WaitRows(r0 + rows);
    kernels::Timing t;
    if (status.ok()) status = block(r0, rows, &t);
    if (!status.ok()) break;
    if (total.gemms.empty()) total.gemms = t.gemms;
    if (total.plan.empty()) total.plan = t.plan;
    total.h2d_us += t.h2d_us;
    total.compute_us += t.compute_us;
    total.d2h_us += t.d2h_us;
    total.transfers_measured = t.transfers_measured;
    r0 += rows;
    // The last rows are done once `after` has formed what it forms: an
    // output of one row in a call of one row (a reduced loss when M = 1)
    // streams as a row output does.
    if (r0 < m || !steps.after) transport.RowsDone(r0);
  }
  if (status.ok() && steps.after) {
    status = steps.after();
    if (status.ok()) transport.RowsDone(m);
  }
  // The reception's status (every digest) before anything a client may
  // accept goes out: a block that ran on bytes that then failed their
  // digest is not sent as a result. A failed call does not wait for the
  // rest of its request.
  if (!status.ok()) transport.StopReceiving();
  const absl::Status received = transport.FinishReceive();
  if (status.ok()) status = received;
  const absl::Status in_place = CheckInPlace();
  if (status.ok()) status = in_place;
  ReleaseInputs();
  if (status.ok()) Finish(result.timing);
  LOGITD_RETURN_IF_ERROR(transport.FinishSend(status));
  result.sent = true;
  return result;
}

absl::StatusOr<std::vector<InputSlot*>> Call::Admit(absl::string_view what, Transport& transport) {
  LOGITD_RETURN_IF_ERROR(transport.CheckSlots(inputs_, outputs_));
  std::uint64_t bytes = scratch_bytes_;
  // An input read in place takes no memory of the call's.
  for (const InputSlot& s : inputs_) bytes += InPlace(s) ? 0 : s.bytes;
  for (const OutputSlot& s : outputs_) bytes += s.bytes;
  LOGITD_ASSIGN_OR_RETURN(AdmissionTicket ticket,
                          env_.admission->Admit(what, bytes, deadline_, cancelled_, tenant_.id));
  if (ticket.waited() > absl::ZeroDuration()) stats_->queue_us = Micros(ticket.waited());
  ticket_ = std::move(ticket);
  std::vector<InputSlot*> streamed;
  for (InputSlot& slot : inputs_) {
    LOGITD_RETURN_IF_ERROR(FillInput(&slot));
    if (slot.in.from == CallInput::From::kStream) streamed.push_back(&slot);
  }
  std::vector<const InputSlot*> in_place;
  for (const InputSlot& slot : inputs_) {
    if (InPlace(slot)) in_place.push_back(&slot);
  }
  if (!in_place.empty()) {
    // Hashed while the backend reads the same bytes; CheckInPlace waits.
    in_place_hasher_ = std::thread([this, in_place = std::move(in_place)] {
      for (const InputSlot* slot : in_place) {
        const ShmSlice& slice = *slot->slice;
        const std::uint64_t got = Xxh3(slice.data, static_cast<std::size_t>(slot->bytes));
        if (got == *slot->in.xxh3) continue;
        in_place_status_ = absl::DataLossError(absl::StrFormat(
            "'%s': xxh3 of the %d bytes read from shared memory in place (region offset %d) is "
            "%016x, the spec says %016x: the region was changed after the spec was computed, or "
            "while the call ran (--shm_in_place)",
            slot->name, slice.bytes, slice.offset, got, *slot->in.xxh3));
        return;
      }
    });
  }
  return streamed;
}

absl::Status Call::AllocateOutputs(Transport& transport) {
  for (OutputSlot& slot : outputs_) {
    // Every output, in order, so that a response can list them.
    std::byte* placed = transport.PlaceOutput(slot);
    if (slot.slice && Aligned(slot.slice->data, ElementSize(slot.dtype))) {
      slot.data = slot.slice->data;
      continue;
    }
    if (!slot.slice && placed != nullptr) {
      slot.data = placed;
      continue;
    }
    // A host buffer of the call's own: streamed back later, or (a region
    // slice not aligned for its dtype) copied into the region by Finish.
    LOGITD_ASSIGN_OR_RETURN(slot.buffer,
                            env_.backend->AllocateHost(static_cast<std::size_t>(slot.bytes)));
    slot.data = slot.buffer.data();
  }
  return absl::OkStatus();
}

// An input lands in a host buffer from the backend (page-locked and pooled
// on cuda: no page faults while it fills, and the device reads it at full
// speed). From a shared-memory slice it is copied out of the region, then
// its digest checked against the request's, as for a streamed tensor:
// DataLoss when the bytes are not the ones the request describes; copied
// first because the client can still write the region, and what is computed
// must be what was checked. From the request message it is read in place
// where aligned for its dtype. Otherwise the transport receives it.
absl::Status Call::FillInput(InputSlot* slot) {
  const std::size_t bytes = static_cast<std::size_t>(slot->bytes);
  if (slot->in.from == CallInput::From::kMessage) {
    const auto* src = reinterpret_cast<const std::byte*>(slot->in.message.data());
    const std::optional<DType> dtype = DTypeOfName(slot->in.dtype);
    if (Aligned(src, dtype ? ElementSize(*dtype) : 8)) {
      slot->data = src;
      return absl::OkStatus();
    }
    LOGITD_ASSIGN_OR_RETURN(slot->buffer, env_.backend->AllocateHost(bytes));
    std::memcpy(slot->buffer.data(), src, bytes);
    slot->data = slot->buffer.data();
    return absl::OkStatus();
  }
  if (InPlace(*slot)) {
    // Read where it lies; its digest is checked by CheckInPlace.
    slot->data = slot->slice->data;
    return absl::OkStatus();
  }
  LOGITD_ASSIGN_OR_RETURN(slot->buffer, env_.backend->AllocateHost(bytes));
  slot->data = slot->buffer.data();
  if (!slot->slice) return absl::OkStatus();
  const ShmSlice& slice = *slot->slice;
  if (!slot->in.xxh3) {
    std::memcpy(slot->buffer.data(), slice.data, bytes);
    return absl::OkStatus();
  }
  // Hashed as copied: the digest is of the bytes in the buffer.
  const std::uint64_t got = CopyXxh3(slot->buffer.data(), slice.data, bytes);
  if (got != *slot->in.xxh3) {
    return absl::DataLossError(absl::StrFormat(
        "'%s': xxh3 of the %d bytes read from shared memory (region offset %d) is %016x, the spec "
        "says %016x: the region was changed after the spec was computed",
        slot->name, slice.bytes, slice.offset, got, *slot->in.xxh3));
  }
  return absl::OkStatus();
}

const std::byte* Call::InData(absl::string_view name) const {
  for (const InputSlot& s : inputs_) {
    if (s.name == name) return s.data;
  }
  return nullptr;
}

std::byte* Call::OutData(absl::string_view name) const {
  for (const OutputSlot& s : outputs_) {
    if (s.name == name) return s.data;
  }
  return nullptr;
}

void Call::ReleaseInputs() {
  for (InputSlot& s : inputs_) {
    s.buffer = kernels::HostBuffer();
    s.data = nullptr;
  }
}

void Call::Finish(const kernels::Timing& timing) {
  for (OutputSlot& s : outputs_) {
    if (s.slice && s.data != s.slice->data) {
      std::memcpy(s.slice->data, s.data, static_cast<std::size_t>(s.bytes));
      s.buffer = kernels::HostBuffer();
      s.data = s.slice->data;
    }
  }
  stats_->compute_us = timing.compute_us;
  stats_->gemms = absl::StrJoin(timing.gemms, "; ");
  if (timing.transfers_measured) {
    stats_->h2d_us = timing.h2d_us;
    stats_->d2h_us = timing.d2h_us;
  }
}

}  // namespace logitd::service

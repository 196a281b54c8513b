#include "server/service/v1/tensor_call.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "logitd/tensor.h"
#include "logitd/wire/chunk_message.h"
#include "server/service/call/plans.h"
#include "server/service/state/status.h"

namespace logitd::service {

TensorCallBase::TensorCallBase(const TensorCallEnv& env, absl::string_view method,
                               grpc::ServerContextBase* context, CallStats* stats)
    : start_(absl::Now()),
      env_(env),
      method_(method),
      context_(context),
      stats_(stats),
      call_(
          env.call, stats->tenant, absl::FromChrono(context->deadline()),
          [context] { return context->IsCancelled(); }, stats),
      assembler_(env.max_request_bytes) {}

absl::Status TensorCallBase::Announce(const std::vector<InputSlot*>& streamed) {
  for (InputSlot* slot : streamed) {
    v1::TensorSpec spec;
    spec.set_name(slot->in.name);
    spec.set_dtype(wire::ToProto(*DTypeOfName(slot->in.dtype)));
    for (std::int64_t d : slot->in.shape) spec.add_shape(d);
    spec.set_xxh3(slot->in.xxh3.value_or(0));
    LOGITD_RETURN_IF_ERROR(
        assembler_.ExpectInto(spec, slot->buffer.data(), static_cast<std::uint64_t>(slot->bytes)));
  }
  return absl::OkStatus();
}

TensorCallBase::~TensorCallBase() {
  // Every path through RunInRowBlocks joins both; this is for one that
  // returned before it could.
  if (sender_.joinable()) FinishStreaming(absl::CancelledError(""), nullptr).IgnoreError();
  if (receiver_.joinable()) receiver_.join();
}

absl::Status TensorCallBase::StartReceive(std::vector<InputSlot*> streamed,
                                          InputProgress* progress) {
  assembler_.OnLanded(
      [progress](absl::string_view name, std::uint64_t bytes) { progress->Landed(name, bytes); });
  LOGITD_RETURN_IF_ERROR(Announce(streamed));
  receiver_ = std::thread([this, progress, streamed = std::move(streamed)] {
    absl::Status status = ReceiveChunks();
    stats_->receive_us = Micros(absl::Now() - start_);
    if (status.ok()) DigestsReceived(streamed);
    received_ = status;
    progress->Ended(std::move(status));
  });
  return absl::OkStatus();
}

absl::Status TensorCallBase::FinishReceive() {
  if (receiver_.joinable()) receiver_.join();
  return received_;
}

void TensorCallBase::RowsDone(std::int64_t rows) {
  {
    absl::MutexLock lock(&send_mu_);
    rows_done_ = rows;
  }
  send_cv_.SignalAll();
}

void TensorCallBase::StartStreaming(std::function<bool(const grpc::ByteBuffer&)> write,
                                    std::int64_t m) {
  chunk_bytes_ = env_.chunk_bytes != 0 ? env_.chunk_bytes : kDefaultChunkBytes;
  std::uint64_t total = 0;
  for (OutputSlot& s : call_.outputs()) {
    if (s.slice) continue;
    // An output of one row per input row goes out as its rows are done;
    // any other (a reduced loss) once every block is. Held by the chunks'
    // slices too: gRPC may send from it after the call has returned. The
    // backend still writes through s.data.
    const std::uint64_t row_bytes =
        !s.shape.empty() && s.shape[0] == m && m > 0 ? s.bytes / static_cast<std::uint64_t>(m) : 0;
    streamed_.push_back({s.name, env_.sending->Hold(std::move(s.buffer)), s.bytes, row_bytes});
    total += s.bytes;
  }
  // As SendStreamed: a large output's digest is worked out beside the
  // sender, which then only builds and writes chunk messages.
  if (total >= wire::kHashAsideBytes) hasher_ = std::thread([this] { HashOutputs(); });
  sender_ = std::thread([this, write = std::move(write)] {
    sent_ = StreamOutputs(write);
    if (!sent_.ok()) {
      absl::MutexLock lock(&send_mu_);
      sender_failed_ = true;
    }
    send_cv_.SignalAll();
  });
}

std::optional<std::uint64_t> TensorCallBase::AwaitReady(const Streamed& out, std::uint64_t want) {
  absl::MutexLock lock(&send_mu_);
  const auto ready_now = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_) {
    return all_done_ ? out.bytes
                     : std::min(out.bytes, static_cast<std::uint64_t>(rows_done_) * out.row_bytes);
  };
  while (!stop_sending_ && !sender_failed_ && ready_now() < std::min(want, out.bytes)) {
    send_cv_.Wait(&send_mu_);
  }
  if (stop_sending_ || sender_failed_) return std::nullopt;
  return ready_now();
}

absl::Status TensorCallBase::StreamOutputs(
    const std::function<bool(const grpc::ByteBuffer&)>& write) {
  const bool hash_here = !hasher_.joinable();
  for (const Streamed& s : streamed_) {
    const auto* data = static_cast<const std::byte*>(s.held.get());
    wire::Xxh3Stream hash;
    std::uint64_t sent = 0;
    while (sent < s.bytes) {
      // Whole chunks only until the output is complete: every chunk but
      // the last carries chunk_bytes.
      const std::optional<std::uint64_t> ready = AwaitReady(s, sent + chunk_bytes_);
      if (!ready) return absl::CancelledError("the call failed while its outputs went out");
      while (sent < *ready && (*ready - sent >= chunk_bytes_ || *ready == s.bytes)) {
        const std::size_t len =
            static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes_, s.bytes - sent));
        if (hash_here) hash.Update(data + sent, len);
        grpc::ByteBuffer message = wire::ChunkMessage(s.name, sent, data + sent, len, s.held);
        stats_->bytes_out += message.Length();
        stats_->tensor_bytes_out += len;
        if (!write(message)) {
          // The call is over (see WriteMessage): recorded as cancelled.
          return absl::CancelledError(absl::StrFormat(
              "%s: the client stopped reading at byte %d of %d", s.name, sent, s.bytes));
        }
        sent += len;
      }
    }
    if (hash_here) sent_digests_.emplace_back(s.name, SentDigest(s.name, hash.Digest()));
  }
  return absl::OkStatus();
}

void TensorCallBase::HashOutputs() {
  for (const Streamed& s : streamed_) {
    const auto* data = static_cast<const std::byte*>(s.held.get());
    wire::Xxh3Stream hash;
    std::uint64_t hashed = 0;
    while (hashed < s.bytes) {
      const std::optional<std::uint64_t> ready = AwaitReady(s, hashed + chunk_bytes_);
      if (!ready) return;
      hash.Update(data + hashed, static_cast<std::size_t>(*ready - hashed));
      hashed = *ready;
    }
    sent_digests_.emplace_back(s.name, SentDigest(s.name, hash.Digest()));
  }
}

absl::Status TensorCallBase::FinishStreaming(
    absl::Status computed, std::vector<std::pair<std::string, std::uint64_t>>* digests) {
  {
    absl::MutexLock lock(&send_mu_);
    if (computed.ok()) {
      all_done_ = true;
    } else {
      stop_sending_ = true;
    }
  }
  send_cv_.SignalAll();
  if (sender_.joinable()) sender_.join();
  if (hasher_.joinable()) hasher_.join();
  LOGITD_RETURN_IF_ERROR(computed);
  LOGITD_RETURN_IF_ERROR(sent_);
  if (digests != nullptr) *digests = std::move(sent_digests_);
  return absl::OkStatus();
}

absl::Status TensorCallBase::ReceiveStreamed(std::vector<InputSlot*> streamed) {
  LOGITD_RETURN_IF_ERROR(Announce(streamed));
  LOGITD_RETURN_IF_ERROR(ReceiveChunks());
  stats_->receive_us = Micros(absl::Now() - start_);
  DigestsReceived(streamed);
  return absl::OkStatus();
}

void TensorCallBase::DigestsReceived(const std::vector<InputSlot*>& streamed) {
  for (InputSlot* slot : streamed) {
    if (!slot->in.xxh3) slot->in.xxh3 = assembler_.ExpectedDigest(slot->in.name);
  }
}

bool PipelineOf(const google::protobuf::Message& header) {
  const google::protobuf::FieldDescriptor* f = header.GetDescriptor()->FindFieldByName("pipeline");
  return f != nullptr && f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL &&
         header.GetReflection()->GetBool(header, f);
}

bool DigestLastOf(const google::protobuf::Message& header) {
  const google::protobuf::FieldDescriptor* f =
      header.GetDescriptor()->FindFieldByName("digest_last");
  return f != nullptr && f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL &&
         header.GetReflection()->GetBool(header, f);
}

absl::Status TensorCallBase::FillFigures(const OpResult& result, bool timed,
                                         google::protobuf::Message* message) const {
  const google::protobuf::Descriptor* type = message->GetDescriptor();
  const google::protobuf::Reflection* fields = message->GetReflection();
  for (const auto& [name, value] : result.figures) {
    const google::protobuf::FieldDescriptor* f = type->FindFieldByName(name);
    if (f == nullptr || f->is_repeated() ||
        f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
      return absl::InternalError(absl::StrCat(type->full_name(), " has no int64 field '", name,
                                              "' for the call's figure"));
    }
    fields->SetInt64(message, f, value);
  }
  if (!timed) return absl::OkStatus();
  const google::protobuf::FieldDescriptor* f = type->FindFieldByName("timing");
  if (f == nullptr || f->message_type() != v1::Timing::descriptor()) {
    return absl::InternalError(absl::StrCat(type->full_name(), " has no Timing field 'timing'"));
  }
  Timed(result.timing,
        google::protobuf::DynamicCastToGenerated<v1::Timing>(fields->MutableMessage(message, f)));
  return absl::OkStatus();
}

void TensorCallBase::Timed(const kernels::Timing& t, v1::Timing* out) const {
  out->set_queue_us(std::max<std::int64_t>(stats_->queue_us, 0));
  out->set_receive_us(std::max<std::int64_t>(stats_->receive_us, 0));
  out->set_h2d_us(t.h2d_us);
  out->set_compute_us(t.compute_us);
  out->set_d2h_us(t.d2h_us);
}

std::uint64_t TensorCallBase::Digest(absl::string_view name, const void* data,
                                     std::uint64_t bytes) const {
  return SentDigest(name, Xxh3(data, static_cast<std::size_t>(bytes)));
}

std::uint64_t TensorCallBase::SentDigest(absl::string_view name, std::uint64_t digest) const {
#ifdef LOGITD_TEST_FAULTS
  return env_.faults != nullptr ? env_.faults->OutputDigest(method_, name, digest) : digest;
#else
  return digest;  // a production build carries no fault hook
#endif
}

absl::Status TensorCallBase::FillResult(google::protobuf::Message* result,
                                        const google::protobuf::Message& header, bool digest_last) {
  const google::protobuf::Descriptor* type = result->GetDescriptor();
  const google::protobuf::Reflection* fields = result->GetReflection();
  for (const OutputSlot& s : call_.outputs()) {
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
    if (!s.slice) {
      // Xxh3 0: the digest follows the chunks.
      spec->set_xxh3(digest_last ? 0 : Digest(s.name, s.data, s.bytes));
      continue;
    }
    // The slot as the header asked for it.
    const google::protobuf::FieldDescriptor* asked_field =
        header.GetDescriptor()->FindFieldByName(s.name + "_shm");
    const google::protobuf::FieldDescriptor* shm_field = type->FindFieldByName(s.name + "_shm");
    if (asked_field == nullptr || shm_field == nullptr ||
        asked_field->message_type() != v1::ShmRef::descriptor() ||
        shm_field->message_type() != v1::ShmRef::descriptor()) {
      return absl::InternalError(
          absl::StrCat(type->full_name(), " has no ShmRef field for output ", s.name));
    }
    const auto& asked =
        static_cast<const v1::ShmRef&>(header.GetReflection()->GetMessage(header, asked_field));
    // Xxh3 0 for a slot that asked for skip_digest: not computed at all.
    spec->set_xxh3(asked.skip_digest() ? 0 : Digest(s.name, s.data, s.bytes));
    auto* where = static_cast<v1::ShmRef*>(fields->MutableMessage(result, shm_field));
    where->set_region(asked.region());
    where->set_offset(s.slice->offset);
    where->set_bytes(s.bytes);
    where->set_skip_digest(asked.skip_digest());
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
  for (OutputSlot& s : call_.outputs()) {
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
  // A failed write means the call is over (the client cancelled, its
  // deadline passed or its connection went): recorded as cancelled, not as
  // the wire helper's UNAVAILABLE, whether or not gRPC's flag is set yet.
  if (!status.ok()) return absl::CancelledError(status.message());
  if (!digest_last) return absl::OkStatus();
  for (std::size_t i = 0; i < sent.size(); ++i) digests->emplace_back(sent[i].name, hashed[i]);
  return absl::OkStatus();
}

}  // namespace logitd::service

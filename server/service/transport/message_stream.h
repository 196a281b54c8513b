// The tensor calls (Logits, Backward, CrossEntropy) are served as raw gRPC
// streams of ByteBuffers: headers and results still travel as their message
// types, but an output tensor's chunks are sent from the host buffer the
// backend wrote, without being copied into chunk messages first (see
// logitd/wire/chunk_message.h).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "logitd/wire/chunk_message.h"
#include "server/kernels/backend.h"
#include "server/service/transport/raw_stream.h"
#include "server/service/transport/request_stream.h"

namespace logitd::service {

// A raw stream read and written as a call's message types, plus chunks
// written from host buffers. A request message over `max_message_bytes`
// ends the stream, and ReadError says why.
template <typename Response, typename Request>
class MessageStream {
 public:
  // `request_type` names the request's type in messages (default Request's;
  // a tensor call read as any names its method's own).
  MessageStream(RawStream* raw, std::size_t max_message_bytes,
                absl::string_view request_type = Request::descriptor()->full_name())
      : raw_(raw), max_message_bytes_(max_message_bytes), request_type_(request_type) {}

  // False at the end of the stream, or for a message that is not a Request
  // or is too large (then error() says which).
  bool Read(Request* message) {
    grpc::ByteBuffer buffer;
    return ReadBuffer(&buffer) && Read(&buffer, message);
  }
  // The next message: a chunk read straight from gRPC's slices, or any
  // other message parsed as a Request.
  RequestPart ReadPart(Request* message, wire::ChunkView* chunk) {
    grpc::ByteBuffer buffer;
    if (!ReadBuffer(&buffer)) return RequestPart::kEnd;
    if (wire::ReadChunkMessage(buffer, chunk)) return RequestPart::kChunk;
    if (Read(&buffer, message)) return RequestPart::kMessage;
    return RequestPart::kEnd;
  }
  bool Write(const Response& message) { return raw_->Write(wire::SerializeMessage(message)); }
  bool Write(const grpc::ByteBuffer& message) { return raw_->Write(message); }
  void StopReading() { raw_->StopReading(); }
  // Why the stream ended early: OK at its real end.
  const absl::Status& error() const { return error_; }

 private:
  bool ReadBuffer(grpc::ByteBuffer* buffer) {
    if (!raw_->Read(buffer)) return false;
    if (buffer->Length() <= max_message_bytes_) return true;
    error_ = absl::InvalidArgumentError(
        absl::StrCat("a request message of ", buffer->Length(),
                     " bytes is over this server's limit of ", max_message_bytes_,
                     " bytes (ServerInfo.max_receive_message_bytes): send tensor chunks of at most "
                     "ServerInfo.max_request_chunk_bytes"));
    return false;
  }
  bool Read(grpc::ByteBuffer* buffer, Request* message) {
    if (wire::ParseMessage(buffer, message)) return true;
    error_ = absl::InvalidArgumentError(
        absl::StrCat("a request message could not be parsed as ", request_type_));
    return false;
  }

  RawStream* raw_;
  const std::size_t max_message_bytes_;
  const std::string request_type_;
  absl::Status error_;
};

// Request chunks are copied from gRPC's slices into their tensors directly.
template <typename Response, typename Request>
RequestPart ReadRequest(MessageStream<Response, Request>* stream, Request* message,
                        wire::ChunkView* chunk) {
  return stream->ReadPart(message, chunk);
}

// Why Read() returned false, when it was not the end of the stream (see
// ReadError in request_stream.h).
template <typename Response, typename Request>
absl::Status ReadError(const MessageStream<Response, Request>& stream) {
  return stream.error();
}

// Host buffers that gRPC may still send from after their call has returned
// (it lets go of a slice once the bytes are on the socket). Their memory goes
// back to the backend's pool, so the service waits for them before the
// backend goes.
class SendingBuffers {
 public:
  SendingBuffers() : state_(std::make_shared<State>()) {}
  SendingBuffers(const SendingBuffers&) = delete;
  SendingBuffers& operator=(const SendingBuffers&) = delete;

  // Takes `buffer` over; it is freed when the last holder lets go.
  std::shared_ptr<const void> Hold(kernels::HostBuffer buffer) {
    auto* owned = new kernels::HostBuffer(std::move(buffer));
    {
      absl::MutexLock lock(&state_->mu);
      ++state_->count;
    }
    return std::shared_ptr<const void>(owned->data(), [state = state_, owned](const void*) {
      delete owned;
      absl::MutexLock lock(&state->mu);
      if (--state->count == 0) state->idle.SignalAll();
    });
  }

  // True when none is held any more; false when `timeout` passed first.
  bool WaitIdle(absl::Duration timeout) {
    absl::MutexLock lock(&state_->mu);
    const absl::Time deadline = absl::Now() + timeout;
    while (state_->count != 0) {
      // Timed out: idle only if the last holder let go just then.
      if (state_->idle.WaitWithDeadline(&state_->mu, deadline)) return state_->count == 0;
    }
    return true;
  }

  int held() const {
    absl::MutexLock lock(&state_->mu);
    return state_->count;
  }

 private:
  // Shared with the holders' deleters, which may run after this is gone.
  // mu guards the count of buffers held; idle is signalled when it
  // reaches 0.
  struct State {
    absl::Mutex mu;
    absl::CondVar idle;
    int count ABSL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<State> state_;
};

}  // namespace logitd::service

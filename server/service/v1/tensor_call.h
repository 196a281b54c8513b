// One logitd.v1 tensor call (Logits, Backward, FetchGradient, Cast,
// CrossEntropy, LogProbs) over its RPC's message stream: one header message,
// the inputs' chunks, then one result message, the outputs' chunks and (with
// digest_last) their digests. It owns the protocol-neutral Call (call/call.h:
// slots, admission, buffers) and is its Transport: it receives the chunks
// and streams the outputs back, with the result's specs filled by the
// outputs' names.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/wire.h"
#include "server/kernels/backend.h"
#include "server/service/call/call.h"
#include "server/service/faults/faults.h"
#include "server/service/transport/call_runner.h"
#include "server/service/transport/message_stream.h"
#include "server/service/transport/request_stream.h"

namespace logitd::service {

// What a tensor call uses of the service, which owns it all.
struct TensorCallEnv {
  CallEnv call;
  SendingBuffers* sending = nullptr;
  // Only its digest fault is asked here; the faults on output bytes sit in
  // front of the backend (fault_backend.h).
  const FaultInjector* faults = nullptr;
  std::uint64_t max_request_bytes = 0;
  std::size_t chunk_bytes = 0;
};

// The part of a tensor call that does not depend on its message types.
class TensorCallBase : public Transport {
 public:
  TensorCallBase(const TensorCallEnv& env, absl::string_view method,
                 grpc::ServerContextBase* context, CallStats* stats);
  TensorCallBase(const TensorCallBase&) = delete;
  TensorCallBase& operator=(const TensorCallBase&) = delete;

  // The protocol-neutral call this one carries.
  Call& call() { return call_; }
  CallStats* stats() const { return stats_; }
  const Tenant& tenant() const { return stats_->tenant; }

  // Transport: the streamed inputs announced to the assembler, then the
  // request's chunks received into their buffers.
  absl::Status ReceiveStreamed(std::vector<InputSlot*> streamed) override;

  // Whether the client went away.
  bool cancelled() const { return context_->IsCancelled(); }

  // The backend's timing, into the result's Timing.
  void Timed(const kernels::Timing& timing, v1::Timing* out) const;

 protected:
  // The rest of the request stream: chunks into the assembler.
  virtual absl::Status ReceiveChunks() = 0;
  wire::Assembler* assembler() { return &assembler_; }
  // Fills, in the result message, each output's spec (the TensorSpec field
  // named as the output) and, for one in shared memory, where it lies (the
  // ShmRef field "<name>_shm", after the header's field of that name). With
  // digest_last a streamed output's spec carries xxh3 0 (its digest follows
  // its chunks), as does a shared-memory output whose slot asked for
  // skip_digest.
  absl::Status FillResult(google::protobuf::Message* result,
                          const google::protobuf::Message& header, bool digest_last);
  // Streams the outputs not in shared memory, in declaration order, each
  // from its buffer; with digest_last returns their digests (hashed while
  // the chunks travel) for the caller to send after them.
  absl::Status SendStreamed(const std::function<bool(const grpc::ByteBuffer&)>& write,
                            bool digest_last,
                            std::vector<std::pair<std::string, std::uint64_t>>* digests);
  std::uint64_t Digest(absl::string_view name, const void* data, std::uint64_t bytes) const;

  const absl::Time start_;

 private:
  const TensorCallEnv env_;
  const std::string method_;
  grpc::ServerContextBase* const context_;
  CallStats* const stats_;
  wire::Assembler assembler_;
  Call call_;
};

// A tensor call over its RPC's message stream.
template <typename Request, typename Response>
class TensorCall final : public TensorCallBase {
 public:
  using Stream = MessageStream<Response, Request>;

  TensorCall(const TensorCallEnv& env, absl::string_view method, grpc::ServerContextBase* context,
             Stream* stream, CallStats* stats)
      : TensorCallBase(env, method, context, stats), stream_(stream) {}

  // Reads the header; header() is valid after it returns OK.
  absl::Status ReadHeader() { return service::ReadHeader(stream_, &first_, &stats()->bytes_in); }
  const auto& header() const { return first_.header(); }
  // For a call of one request message and no chunks (FetchGradient): reads
  // it; request() is valid after it returns OK. The client's half-close
  // after it is not waited for.
  absl::Status ReadRequest() {
    if (!stream_->Read(&first_)) {
      if (absl::Status s = ReadError(*stream_); !s.ok()) return s;
      return absl::InvalidArgumentError(
          absl::StrCat("expected a ", Request::descriptor()->name(), ", got an empty stream"));
    }
    stats()->bytes_in += first_.ByteSizeLong();
    return absl::OkStatus();
  }
  const Request& request() const { return first_; }

  // For a call that returns no tensors (Verify): writes `head` alone.
  absl::Status SendHead(const Response& head) {
    if (!stats()->send_start) stats()->send_start = absl::Now();
    return Write(head);
  }

  // Writes `head` (the outputs' specs filled into `result`, its result
  // message, first), then the streamed outputs and, with digest_last, their
  // digests.
  absl::Status Send(Response* head, google::protobuf::Message* result, bool digest_last) {
    if (absl::Status s = FillResult(result, SlotMessage(), digest_last); !s.ok()) return s;
    if (!stats()->send_start) stats()->send_start = absl::Now();
    if (absl::Status s = Write(*head); !s.ok()) return s;
    std::vector<std::pair<std::string, std::uint64_t>> digests;
    if (absl::Status s = SendStreamed(
            [this](const grpc::ByteBuffer& message) { return stream_->Write(message); },
            digest_last, &digests);
        !s.ok()) {
      return s;
    }
    for (const auto& [name, xxh3] : digests) {
      Response tail;
      tail.mutable_digest()->set_name(name);
      tail.mutable_digest()->set_xxh3(xxh3);
      if (absl::Status s = Write(tail); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // The message whose "<name>_shm" fields gave the outputs' slots.
  const google::protobuf::Message& SlotMessage() const {
    if constexpr (std::is_same_v<Request, v1::FetchGradientRequest>) {
      return first_;
    } else {
      return first_.header();
    }
  }
  absl::Status ReceiveChunks() override {
    if constexpr (std::is_same_v<Request, v1::FetchGradientRequest>) {
      return absl::InternalError("FetchGradient receives no tensors");
    } else {
      return service::ReceiveChunks<Request>(stream_, assembler(), stats(),
                                             [this] { return cancelled(); });
    }
  }
  absl::Status Write(const Response& message) {
    stats()->bytes_out += message.ByteSizeLong();
    if (!stream_->Write(message)) {
      return absl::UnavailableError("the client stopped reading the response");
    }
    return absl::OkStatus();
  }

  Stream* const stream_;
  Request first_;
};

}  // namespace logitd::service

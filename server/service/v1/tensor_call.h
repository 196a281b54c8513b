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
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "logitd/service/tensor_call.pb.h"
#include "logitd/status_macros.h"
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

  ~TensorCallBase() override;

  // Transport: the streamed inputs announced to the assembler, then the
  // request's chunks received into their buffers.
  absl::Status ReceiveStreamed(std::vector<InputSlot*> streamed) override;
  // Transport, for a header that asked for pipeline: the same on a thread
  // of the call's own, and the outputs streamed as rows are done.
  bool Pipelined() const override { return pipeline_; }
  bool ReceivesAside() const override { return true; }
  absl::Status StartReceive(std::vector<InputSlot*> streamed, InputProgress* progress) override;
  absl::Status FinishReceive() override;
  void RowsDone(std::int64_t rows) override;

  // Whether the client went away.
  bool cancelled() const { return context_->IsCancelled(); }

  // The backend's timing, into the result's Timing.
  void Timed(const kernels::Timing& timing, v1::Timing* out) const;
  // What the result carries besides its outputs: the operation's figures
  // (OpResult::figures) into the int64 fields of their names, and the
  // timing into its "timing" field (not for a call sent in row blocks,
  // whose trailer has it).
  absl::Status FillFigures(const OpResult& result, bool timed,
                           google::protobuf::Message* message) const;

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
  // An output's digest as sent: `digest`, or what a test's fault makes of it.
  std::uint64_t SentDigest(absl::string_view name, std::uint64_t digest) const;

  // Row blocks: starts streaming the outputs not in shared memory, in
  // declaration order, each as far as the rows done cover it, on a thread
  // of its own (after the caller wrote the result).
  void StartStreaming(std::function<bool(const grpc::ByteBuffer&)> write, std::int64_t m);
  // Waits for that thread: with `computed` OK, once every output has gone,
  // their digests; otherwise it stops it and returns `computed`.
  absl::Status FinishStreaming(absl::Status computed,
                               std::vector<std::pair<std::string, std::uint64_t>>* digests);

  const absl::Time start_;
  bool pipeline_ = false;

 private:
  const TensorCallEnv env_;
  const std::string method_;
  grpc::ServerContextBase* const context_;
  CallStats* const stats_;
  Call call_;
  // After call_, so that it goes first: its threads stop before the call's
  // buffers are let go.
  wire::Assembler assembler_;

  // The streamed inputs announced to the assembler, each into its buffer.
  absl::Status Announce(const std::vector<InputSlot*>& streamed);
  // Once every digest matched: those that followed their chunks (a spec
  // with xxh3 0) into their slots, for what reports an input's digest.
  void DigestsReceived(const std::vector<InputSlot*>& streamed);
  // Row blocks: the thread receiving the request's chunks, and its status.
  std::thread receiver_;
  absl::Status received_;
  // Row blocks: an output streamed as its rows are done.
  struct Streamed {
    std::string name;
    std::shared_ptr<const void> held;  // its buffer, held for gRPC's slices
    std::uint64_t bytes = 0;
    std::uint64_t row_bytes = 0;  // 0: goes out once every block is done
  };
  // The bytes of `out` ready to go, at least `want` (or all of it), once
  // they are; nullopt when the call stopped or the sender failed.
  std::optional<std::uint64_t> AwaitReady(const Streamed& out, std::uint64_t want);
  // The thread streaming the outputs, and the one hashing them beside it (a
  // large output's digest is not worked out in the sender's path).
  absl::Status StreamOutputs(const std::function<bool(const grpc::ByteBuffer&)>& write);
  void HashOutputs();
  std::vector<Streamed> streamed_;
  std::size_t chunk_bytes_ = 0;
  std::thread sender_;
  std::thread hasher_;
  // send_mu_ guards the rows done and how the sending stands; send_cv_ is
  // signalled when either moves.
  absl::Mutex send_mu_;
  absl::CondVar send_cv_;
  std::int64_t rows_done_ ABSL_GUARDED_BY(send_mu_) = 0;
  bool all_done_ ABSL_GUARDED_BY(send_mu_) = false;
  bool stop_sending_ ABSL_GUARDED_BY(send_mu_) = false;
  bool sender_failed_ ABSL_GUARDED_BY(send_mu_) = false;
  absl::Status sent_;  // the sender's, read after it is joined
  // The outputs' digests, by the sender or the hasher, read after both are
  // joined.
  std::vector<std::pair<std::string, std::uint64_t>> sent_digests_;
};

// The message types of a tensor call its row serves (tensor_methods.h):
// the header and result as bytes, parsed and serialised as the method's own
// types (`header` and `result` prototypes).
template <typename Request>
inline constexpr bool kAnyTensorCall = std::is_same_v<Request, AnyTensorRequest>;
struct AnyTypes {
  const google::protobuf::Message* header = nullptr;
  const google::protobuf::Message* result = nullptr;
  // The method's request type, for messages ("logitd.v1.LogitsRequest").
  absl::string_view request;
};

// Whether the header (any message) asks for row blocks: its bool field
// "pipeline".
bool PipelineOf(const google::protobuf::Message& header);
// The header's bool field "digest_last".
bool DigestLastOf(const google::protobuf::Message& header);

// A tensor call over its RPC's message stream.
template <typename Request, typename Response>
class TensorCall final : public TensorCallBase {
 public:
  using Stream = MessageStream<Response, Request>;

  TensorCall(const TensorCallEnv& env, absl::string_view method, grpc::ServerContextBase* context,
             Stream* stream, CallStats* stats, AnyTypes types = {})
      : TensorCallBase(env, method, context, stats), stream_(stream), types_(types) {}

  // Reads the header; header() is valid after it returns OK.
  absl::Status ReadHeader() {
    LOGITD_RETURN_IF_ERROR(service::ReadHeader(stream_, &first_, &stats()->bytes_in));
    if constexpr (kAnyTensorCall<Request>) {
      header_.reset(types_.header->New());
      if (!header_->ParseFromString(first_.header())) {
        return absl::InvalidArgumentError(absl::StrCat("the header could not be parsed as ",
                                                       header_->GetDescriptor()->full_name()));
      }
      pipeline_ = PipelineOf(*header_);
    }
    return absl::OkStatus();
  }
  const auto& header() const {
    if constexpr (kAnyTensorCall<Request>) {
      return *header_;
    } else {
      return first_.header();
    }
  }
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

  // The response to a call the operation ran: nothing left when it went out
  // in row blocks; otherwise the result (the operation's figures and the
  // timing) and the outputs, as Send.
  absl::Status Respond(const OpResult& result, bool digest_last) {
    static_assert(kAnyTensorCall<Request>, "a row's call (tensor_methods.h)");
    if (result.sent) return absl::OkStatus();
    std::unique_ptr<google::protobuf::Message> message(types_.result->New());
    LOGITD_RETURN_IF_ERROR(FillFigures(result, /*timed=*/true, message.get()));
    Response head;
    return Send(&head, message.get(), digest_last);
  }

  // Transport, for row blocks: the result (its timing left unset: the
  // trailer has it) with every streamed output's digest to follow it, then
  // the outputs as their rows are done.
  absl::Status StartSend(const OpResult& early, std::int64_t m) override {
    if constexpr (kAnyTensorCall<Request>) {
      early_ = early;
      // Outputs all in shared memory: the result carries their digests, so
      // it goes once they are written (FinishSend).
      if (!StreamsAny()) return absl::OkStatus();
      LOGITD_RETURN_IF_ERROR(SendHead(/*digest_last=*/true));
      StartStreaming([this](const grpc::ByteBuffer& message) { return stream_->Write(message); },
                     m);
      return absl::OkStatus();
    } else {
      return Transport::StartSend(early, m);
    }
  }
  absl::Status FinishSend(absl::Status computed) override {
    if constexpr (kAnyTensorCall<Request>) {
      if (!StreamsAny()) {
        LOGITD_RETURN_IF_ERROR(computed);
        return SendHead(/*digest_last=*/true);
      }
      std::vector<std::pair<std::string, std::uint64_t>> digests;
      LOGITD_RETURN_IF_ERROR(FinishStreaming(std::move(computed), &digests));
      for (const auto& [name, xxh3] : digests) {
        Response tail;
        tail.mutable_digest()->set_name(name);
        tail.mutable_digest()->set_xxh3(xxh3);
        LOGITD_RETURN_IF_ERROR(Write(tail));
      }
      return absl::OkStatus();
    } else {
      return computed;
    }
  }

  // Writes `head` (the outputs' specs filled into `result`, its result
  // message, first; for a row's call `head` carries it as bytes), then the
  // streamed outputs and, with digest_last, their digests.
  absl::Status Send(Response* head, google::protobuf::Message* result, bool digest_last) {
    if (absl::Status s = FillResult(result, SlotMessage(), digest_last); !s.ok()) return s;
    if constexpr (kAnyTensorCall<Request>) head->set_result(result->SerializeAsString());
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
  // Row blocks: the result, with what the operation said before its first
  // block and the outputs' specs, their timing left to the trailer.
  absl::Status SendHead(bool digest_last) {
    std::unique_ptr<google::protobuf::Message> message(types_.result->New());
    LOGITD_RETURN_IF_ERROR(FillFigures(early_, /*timed=*/false, message.get()));
    LOGITD_RETURN_IF_ERROR(FillResult(message.get(), SlotMessage(), digest_last));
    Response head;
    head.set_result(message->SerializeAsString());
    stats()->send_start = absl::Now();
    return Write(head);
  }
  bool StreamsAny() {
    for (const OutputSlot& s : call().outputs()) {
      if (!s.slice) return true;
    }
    return false;
  }

  // The message whose "<name>_shm" fields gave the outputs' slots.
  const google::protobuf::Message& SlotMessage() const {
    if constexpr (std::is_same_v<Request, v1::FetchGradientRequest>) {
      return first_;
    } else {
      return header();
    }
  }
  void StopReceiving() override { stream_->StopReading(); }
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
      // The call is over: recorded as cancelled (tensor_call.cc, SendOutputs).
      return absl::CancelledError("the client stopped reading the response");
    }
    return absl::OkStatus();
  }

  Stream* const stream_;
  const AnyTypes types_;
  Request first_;
  // A row's call: the header parsed as the method's own type.
  std::unique_ptr<google::protobuf::Message> header_;
  OpResult early_;
};

}  // namespace logitd::service

// One tensor call (Logits, Backward, FetchGradient, Cast, CrossEntropy), as
// every handler runs it: validate -> declare slots -> receive -> backend ->
// send. TensorCall owns what the call takes: its admission ticket, its input
// slots and output slots (each one streamed as chunks or a slice of a
// shared-memory region), the reception of the request's chunks, the output
// buffers, the result's specs and digests (digest_last included) and the
// timing. A handler names its tensors and their sizes; how they travel is
// decided here, once, for every RPC.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/wire.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "server/kernels/backend.h"
#include "server/service/admission.h"
#include "server/service/call.h"
#include "server/service/faults.h"
#include "server/service/message_stream.h"
#include "server/service/request_stream.h"
#include "server/service/shm.h"

namespace logitd::service {

// What a tensor call uses of the service, which owns it all.
struct TensorCallEnv {
  kernels::Backend* backend = nullptr;
  RequestAdmission* admission = nullptr;
  const ShmRegistry* shm = nullptr;
  SendingBuffers* sending = nullptr;
  // Only its digest fault is asked here; the faults on output bytes sit in
  // front of the backend (fault_backend.h).
  const FaultInjector* faults = nullptr;
  std::uint64_t max_request_bytes = 0;
  std::size_t chunk_bytes = 0;
};

// An optional shared-memory slot of a header: `ref` when `given`, else null.
inline const v1::ShmRef* ShmSlot(bool given, const v1::ShmRef& ref) {
  return given ? &ref : nullptr;
}

// The part of a tensor call that does not depend on its message types.
class TensorCallBase {
 public:
  TensorCallBase(const TensorCallEnv& env, absl::string_view method,
                 grpc::ServerContextBase* context, CallStats* stats);
  TensorCallBase(const TensorCallBase&) = delete;
  TensorCallBase& operator=(const TensorCallBase&) = delete;

  // Declaring the slots, after the request is validated and before any
  // work. An input of `bytes` (its spec validated to take exactly that),
  // read from the `shm` slice when given, else received as chunks; an
  // output written into the `shm` slice when given, else into a host buffer
  // streamed back after the result. A slice is checked (and its region held)
  // here.
  absl::Status Input(absl::string_view name, const v1::TensorSpec& spec, std::uint64_t bytes,
                     const v1::ShmRef* shm = nullptr);
  absl::Status Output(absl::string_view name, DType dtype, std::vector<std::int64_t> shape,
                      std::uint64_t bytes, const v1::ShmRef* shm = nullptr);
  // Request memory the call takes besides its slots (scratch of its own).
  void Scratch(std::uint64_t bytes) { scratch_bytes_ += bytes; }

  // Admits the call for all of its slots' bytes and its scratch (waiting at
  // most until its deadline; a wait is its queue time), then makes the input
  // buffers: a slice is copied in and checked against its spec, a streamed
  // input is announced for reception.
  absl::Status Admit(absl::string_view what);
  // Host buffers for the streamed outputs (the shared-memory ones write the
  // region itself).
  absl::Status AllocateOutputs();

  // The bytes of input or output `name` (declared, else null).
  template <typename T = std::byte>
  const T* in(absl::string_view name) const {
    return reinterpret_cast<const T*>(InData(name));
  }
  template <typename T = std::byte>
  T* out(absl::string_view name) const {
    return reinterpret_cast<T*>(OutData(name));
  }
  // Lets go of the input buffers: called once the backend is done with them,
  // so that they are not held while the response streams out.
  void ReleaseInputs();

  // The backend's timing, into the result's Timing and the call's trailer.
  void Timed(const kernels::Timing& timing, v1::Timing* out);

  CallStats* stats() const { return stats_; }
  const Tenant& tenant() const { return stats_->tenant; }

 protected:
  wire::Assembler* assembler() { return &assembler_; }
  bool cancelled() const { return context_->IsCancelled(); }
  // Fills, in the result message, each output's spec (the TensorSpec field
  // named as the output) and, for one in shared memory, where it lies (the
  // ShmRef field "<name>_shm", where the RPC has one). With digest_last a
  // streamed output's spec carries xxh3 0 (its digest follows its chunks),
  // as does a shared-memory output whose slot asked for skip_digest.
  absl::Status FillResult(google::protobuf::Message* result, bool digest_last);
  // Streams the outputs not in shared memory, in declaration order, each
  // from its buffer; with digest_last returns their digests (hashed while
  // the chunks travel) for the caller to send after them.
  absl::Status SendStreamed(const std::function<bool(const grpc::ByteBuffer&)>& write,
                            bool digest_last,
                            std::vector<std::pair<std::string, std::uint64_t>>* digests);
  std::uint64_t Digest(absl::string_view name, const void* data, std::uint64_t bytes) const;

 private:
  struct InputSlot {
    std::string name;
    v1::TensorSpec spec;
    std::uint64_t bytes = 0;
    std::optional<ShmSlice> slice;
    kernels::HostBuffer buffer;
  };
  struct OutputSlot {
    std::string name;
    DType dtype = DType::kFp32;
    std::vector<std::int64_t> shape;
    std::uint64_t bytes = 0;
    // The slot the header gave, and the slice it resolved to.
    std::optional<v1::ShmRef> asked;
    std::optional<ShmSlice> slice;
    kernels::HostBuffer buffer;
    std::byte* data = nullptr;
  };
  const std::byte* InData(absl::string_view name) const;
  std::byte* OutData(absl::string_view name) const;
  absl::Status FillInput(InputSlot* slot);

  const TensorCallEnv env_;
  const std::string method_;
  grpc::ServerContextBase* const context_;
  CallStats* const stats_;
  wire::Assembler assembler_;
  std::vector<InputSlot> inputs_;
  std::vector<OutputSlot> outputs_;
  std::uint64_t scratch_bytes_ = 0;
  std::optional<AdmissionTicket> ticket_;
};

// A tensor call over its RPC's message stream: one header message, the
// inputs' chunks, then one result message, the outputs' chunks and (with
// digest_last) their digests.
template <typename Request, typename Response>
class TensorCall : public TensorCallBase {
 public:
  using Stream = MessageStream<Response, Request>;

  TensorCall(const TensorCallEnv& env, absl::string_view method, grpc::ServerContextBase* context,
             Stream* stream, CallStats* stats)
      : TensorCallBase(env, method, context, stats), stream_(stream), start_(absl::Now()) {}

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

  // Admit(), then the inputs' chunks (none for an input in shared memory:
  // a chunk of one is refused), then AllocateOutputs().
  absl::Status Receive(absl::string_view what) {
    if (absl::Status s = Admit(what); !s.ok()) return s;
    if (absl::Status s = service::ReceiveChunks<Request>(stream_, assembler(), stats(),
                                                         [this] { return cancelled(); });
        !s.ok()) {
      return s;
    }
    stats()->receive_us = Micros(absl::Now() - start_);
    return AllocateOutputs();
  }

  // Writes `head` (the outputs' specs filled into `result`, its result
  // message, first), then the streamed outputs and, with digest_last, their
  // digests.
  absl::Status Send(Response* head, google::protobuf::Message* result, bool digest_last) {
    if (absl::Status s = FillResult(result, digest_last); !s.ok()) return s;
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
  absl::Status Write(const Response& message) {
    stats()->bytes_out += message.ByteSizeLong();
    if (!stream_->Write(message)) {
      return absl::UnavailableError("the client stopped reading the response");
    }
    return absl::OkStatus();
  }

  Stream* const stream_;
  const absl::Time start_;
  Request first_;
};

}  // namespace logitd::service

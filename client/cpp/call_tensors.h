// The tensor calls' machinery of the client (Logits, Backward, FetchGradient,
// Cast, CrossEntropy): each call names its inputs (a host tensor streamed, or
// a shared-memory slot) and its outputs (received into a new tensor or the
// caller's, or written by the server into a shared-memory slot); how they
// travel, and how what comes back is checked, is written here once.
// Internal to the client library.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/chunk_message.h"
#include "logitd/wire/raw_call.h"
#include "logitd/wire/wire.h"

namespace logitd::client {

// The single place where a gRPC status becomes an absl::Status. The two code
// enums share their numbering (both follow google.rpc.Code), so the code and
// the message travel unchanged.
absl::Status FromGrpc(const grpc::Status& status);

// The call's parsed timing trailer and GEMM trailer; empty when both are
// absent, the times empty when malformed (timing is an observation, never a
// reason to fail a call that succeeded).
std::optional<TimingTrailer> TrailerOf(const grpc::ClientContext& context);

// A result's Timing with the call's trailer.
Timing TimingOf(const v1::Timing& t, const grpc::ClientContext& context);

// A default-constructed or moved-from Tensor has no shape and no bytes; on the
// wire it would look like a rank-0 tensor, and the server's complaint about a
// rank would not point at the real mistake.
absl::Status CheckNotEmpty(absl::string_view what, const Tensor& t);

// Reassembles the tensors a result message announces. The buffer cap is the
// announced total, so the server decides the sizes but the client never
// accepts a byte beyond them.
class ResponseTensors {
 public:
  absl::Status Announce(const std::vector<const v1::TensorSpec*>& specs) {
    std::uint64_t total = 0;
    for (const v1::TensorSpec* spec : specs) {
      absl::StatusOr<DType> dtype = wire::FromProto(spec->dtype());
      if (!dtype.ok()) return Corrupt(dtype.status());
      const std::vector<std::int64_t> shape(spec->shape().begin(), spec->shape().end());
      absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, *dtype);
      if (!n.ok()) return Corrupt(n.status());
      if (static_cast<std::uint64_t>(*n) > std::numeric_limits<std::uint64_t>::max() - total) {
        return absl::DataLossError("response from server: announced tensors overflow 64 bits");
      }
      total += static_cast<std::uint64_t>(*n);
    }
    assembler_ = std::make_unique<wire::Assembler>(total);
    for (const v1::TensorSpec* spec : specs) {
      if (auto placed = places_.find(spec->name()); placed != places_.end()) {
        // Into the caller's memory, which must hold exactly this tensor
        // (dtype and byte count checked in the loop above).
        const std::vector<std::int64_t> shape(spec->shape().begin(), spec->shape().end());
        if (static_cast<std::uint64_t>(*CheckedByteCount(shape, *wire::FromProto(spec->dtype()))) !=
            placed->second.second) {
          return absl::DataLossError(
              absl::StrCat("response from server: '", spec->name(), "' is not the size asked for"));
        }
        absl::Status s = assembler_->ExpectInto(*spec, placed->second.first, placed->second.second);
        if (!s.ok()) return Corrupt(s);
        continue;
      }
      auto it = recycle_.find(spec->name());
      Tensor* recycle = it != recycle_.end() ? it->second : nullptr;
      if (absl::Status s = assembler_->Expect(*spec, recycle); !s.ok()) return Corrupt(s);
    }
    return absl::OkStatus();
  }

  // Receives the tensor called `name` into [into, into + bytes), which must
  // be its exact size (DataLoss otherwise); Take() then refuses it.
  void Place(const std::string& name, std::byte* into, std::uint64_t bytes) {
    places_[name] = {into, bytes};
  }

  // Offers `t`'s memory for the tensor called `name` (taken when the dtype
  // and shape match what the server announces).
  void Recycle(const std::string& name, Tensor* t) { recycle_[name] = t; }

  // A chunk, as a message or read straight from the received bytes (then
  // taken over).
  absl::Status Add(const v1::TensorChunk& chunk) { return AddChunk(chunk.name(), chunk); }
  absl::Status Add(wire::ChunkView&& chunk) {
    const std::string name = chunk.name;
    return AddChunk(name, std::move(chunk));
  }

  // DataLoss for a truncated tensor or a digest mismatch (from the Assembler).
  absl::Status Finish() {
    if (assembler_ == nullptr) {
      return absl::DataLossError("response from server: the call ended without a result");
    }
    if (absl::Status s = assembler_->Finish(); !s.ok()) return Corrupt(s);
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Take(const v1::TensorSpec& spec) { return assembler_->Take(spec.name()); }

  // The digest of a tensor announced without one, sent after its chunks.
  absl::Status SetDigest(const v1::TensorDigest& digest) {
    if (assembler_ == nullptr) {
      return absl::DataLossError(absl::StrCat("response from server: digest of '", digest.name(),
                                              "' arrived before the result that announces it"));
    }
    if (absl::Status s = assembler_->SetExpectedDigest(digest.name(), digest.xxh3()); !s.ok()) {
      return Corrupt(s);
    }
    return absl::OkStatus();
  }

 private:
  // Whatever the server sent that does not add up is data loss to the caller:
  // the request was fine, the answer cannot be trusted.
  static absl::Status Corrupt(const absl::Status& s) {
    return absl::DataLossError(absl::StrCat("response from server: ", s.message()));
  }

  template <typename Chunk>
  absl::Status AddChunk(const std::string& name, Chunk&& chunk) {
    if (assembler_ == nullptr) {
      return absl::DataLossError(absl::StrCat("response from server: chunk of '", name,
                                              "' arrived before the result that announces it"));
    }
    if (absl::Status s = assembler_->Add(std::forward<Chunk>(chunk)); !s.ok()) return Corrupt(s);
    return absl::OkStatus();
  }

  std::unique_ptr<wire::Assembler> assembler_;
  std::map<std::string, Tensor*> recycle_;
  std::map<std::string, std::pair<std::byte*, std::uint64_t>> places_;
};

// What reading a response stream produced.
enum class Next { kEnd, kMessage, kChunk, kMalformed };

// Whether a message type has a TensorDigest part (`digest`).
template <typename Message, typename = void>
struct CarriesDigest : std::false_type {};
template <typename Message>
struct CarriesDigest<Message, std::void_t<decltype(std::declval<Message&>().mutable_digest())>>
    : std::true_type {};

// A tensor call's stream as raw messages (see logitd/wire/chunk_message.h):
// requests and results travel as their message types, while a response
// chunk's bytes are read straight from gRPC's buffers into the tensor they
// belong to, without a copy into a message first.
template <typename Request, typename Response>
class RawCall {
 public:
  RawCall(grpc::GenericStub& stub, absl::string_view method, grpc::ClientContext* context)
      : context_(context), call_(stub, method, context) {}
  ~RawCall() {
    if (writer_.joinable()) {
      context_->TryCancel();
      writer_.join();
    }
  }
  RawCall(const RawCall&) = delete;
  RawCall& operator=(const RawCall&) = delete;

  bool Write(const Request& request) { return call_.Write(wire::SerializeMessage(request)); }
  bool Write(const grpc::ByteBuffer& message) { return call_.Write(message); }
  // The digest of tensor `name`, after its chunks (its spec said xxh3 0).
  // False for a request type that streams no tensors (FetchGradient's).
  bool WriteDigest(absl::string_view name, std::uint64_t xxh3) {
    if constexpr (CarriesDigest<Request>::value) {
      Request request;
      request.mutable_digest()->set_name(std::string(name));
      request.mutable_digest()->set_xxh3(xxh3);
      return Write(request);
    } else {
      return false;
    }
  }
  bool WritesDone() { return call_.WritesDone(); }
  // Runs `write` (the request's writes) on a thread of its own while the
  // caller reads the response: for a call whose server answers while it
  // receives. Finish waits for it.
  void StartWriting(std::function<void()> write) { writer_ = std::thread(std::move(write)); }
  grpc::Status Finish() {
    if (writer_.joinable()) writer_.join();
    return call_.Finish();
  }

  Next Read(Response* message, wire::ChunkView* chunk) {
    grpc::ByteBuffer buffer;
    if (!call_.Read(&buffer)) return Next::kEnd;
    if (wire::ReadChunkMessage(buffer, chunk)) return Next::kChunk;
    return wire::ParseMessage(&buffer, message) ? Next::kMessage : Next::kMalformed;
  }

 private:
  grpc::ClientContext* const context_;
  wire::RawClientCall call_;
  std::thread writer_;
};

// Whether a request's header asks the server to answer while it receives
// (LogitsHeader.pipeline): its inputs are then written on a thread of their
// own while the response is read.
template <typename Request, typename = void>
struct HasPipelineField : std::false_type {};
template <typename Request>
struct HasPipelineField<Request,
                        std::void_t<decltype(std::declval<const Request&>().header().pipeline())>>
    : std::true_type {};
template <typename Request>
bool AsksPipeline(const Request& request) {
  if constexpr (HasPipelineField<Request>::value) {
    return request.header().pipeline();
  } else {
    return false;
  }
}

// Into a raw stream, each chunk is copied once, into a buffer its message
// owns (gRPC sends from it and frees it once sent), instead of into a chunk
// message and again into gRPC's buffer when that is serialized.
template <typename Stream>
bool WriteRawBytes(Stream& stream, absl::string_view name, const std::byte* data, std::size_t size,
                   std::size_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = wire::kDefaultChunkBytes;
  for (std::size_t off = 0; off < size; off += chunk_bytes) {
    const std::size_t len = std::min(chunk_bytes, size - off);
    std::shared_ptr<std::byte> copy(new std::byte[len], std::default_delete<std::byte[]>());
    std::memcpy(copy.get(), data + off, len);
    if (!stream.Write(wire::ChunkMessage(name, off, copy.get(), len, copy))) return false;
  }
  return true;
}
template <typename Stream>
bool WriteRawTensor(Stream& stream, absl::string_view name, const Tensor& t,
                    std::size_t chunk_bytes) {
  return WriteRawBytes(stream, name, t.bytes(), t.nbytes(), chunk_bytes);
}

// The inputs and outputs of one tensor call. The proto names every slot
// after its tensor: the header has a TensorSpec field "<name>" per input and
// a ShmRef field "<name>_shm" per slot; the result a TensorSpec "<name>" per
// output and a ShmRef "<name>_shm" for one written to shared memory.
class CallTensors {
 public:
  // Streamed inputs of `digest_after_bytes` and more (0: none) send their
  // digest after their chunks (ClientOptions::digest_after_bytes).
  explicit CallTensors(std::uint64_t digest_after_bytes = 0)
      : digest_after_bytes_(digest_after_bytes) {}

  // An input streamed from `tensor`, or, with `slot`, read by the server from
  // shared memory (`dtype` and `shape` then say what is there; the digest is
  // computed here from the region's bytes). InvalidArgument for a slot
  // outside its region or neither tensor nor slot.
  absl::Status Input(absl::string_view name, const Tensor* tensor,
                     const std::optional<ShmSlot>& slot, DType dtype = DType::kBf16,
                     const std::vector<std::int64_t>& shape = {});
  absl::Status Input(absl::string_view name, const TensorInput& in) {
    return Input(name, in.tensor, in.slot, in.dtype, in.shape);
  }
  // An input streamed from bytes the caller keeps until the call returns
  // (rows of a larger tensor): `dtype` and `shape` say what they are.
  absl::Status InputBytes(absl::string_view name, const std::byte* data, DType dtype,
                          const std::vector<std::int64_t>& shape);
  // An output streamed back into [into, into + bytes), exactly its size.
  void OutputBytes(absl::string_view name, std::byte* into, std::uint64_t bytes) {
    outputs_.push_back(OutputSlot{std::string(name), std::nullopt, nullptr, into, bytes});
  }
  // An output the call may return: written by the server at `slot` when
  // given, else streamed back, into *into when given (its memory reused when
  // dtype and shape match).
  absl::Status Output(absl::string_view name, const std::optional<ShmSlot>& slot,
                      Tensor* into = nullptr);
  absl::Status Output(absl::string_view name, const TensorOutput& out) {
    return Output(name, out.slot, out.into);
  }

  // Each input's spec and, for one in shared memory, its slot, in
  // declaration order: for a header whose fields do not follow the
  // "<name>"/"<name>_shm" convention (Verify's).
  template <typename Fn>
  void ForEachInput(Fn fn) const {
    for (const InputSlot& in : inputs_) fn(in.name, in.spec, in.ref ? &*in.ref : nullptr);
  }
  // Sets the inputs' specs and every slot in the call's header message.
  void FillHeader(google::protobuf::Message* header) const;
  // Streams the inputs not in shared memory, in declaration order; false
  // when the server stopped reading (the call's status then says why).
  template <typename Stream>
  bool WriteInputs(Stream& stream, std::size_t chunk_bytes) const {
    for (const InputSlot& in : inputs_) {
      if (in.ref) continue;
      const std::byte* data = in.tensor != nullptr ? in.tensor->bytes() : in.data;
      const std::size_t size = in.tensor != nullptr ? in.tensor->nbytes() : in.nbytes;
      if (!in.digest_after) {
        if (!WriteRawBytes(stream, in.name, data, size, chunk_bytes)) return false;
        continue;
      }
      // Hashed beside the chunks, sent after them.
      std::uint64_t digest = 0;
      std::thread hasher([&] { digest = Xxh3(data, size); });
      const bool written = WriteRawBytes(stream, in.name, data, size, chunk_bytes);
      hasher.join();
      if (!written || !stream.WriteDigest(in.name, digest)) return false;
    }
    return true;
  }

  // The specs of the outputs `result` announces as streamed.
  std::vector<const v1::TensorSpec*> Streamed(const google::protobuf::Message& result) const;
  // Offers the callers' tensors to receive into.
  void OfferInto(ResponseTensors* tensors) const;

  // Output `name` as it came back: neither set when the result does not
  // carry it; `shm` when it was written to its slot (checked: where it was
  // asked, its digest against the region's bytes); `tensor` when it was
  // streamed (left empty when it went into the caller's tensor). DataLoss
  // when it was placed other than asked.
  struct Received {
    std::optional<Tensor> tensor;
    std::optional<ShmOutput> shm;
    bool present() const { return tensor.has_value() || shm.has_value(); }
  };
  absl::StatusOr<Received> Take(absl::string_view name, const google::protobuf::Message& result,
                                ResponseTensors* tensors) const;

 private:
  struct InputSlot {
    std::string name;
    const Tensor* tensor = nullptr;
    v1::TensorSpec spec;
    std::optional<v1::ShmRef> ref;
    // InputBytes: streamed from here instead of `tensor`.
    const std::byte* data = nullptr;
    std::size_t nbytes = 0;
    // Announced with xxh3 0; the digest follows the chunks.
    bool digest_after = false;
  };
  bool DigestAfter(std::uint64_t bytes) const {
    return digest_after_bytes_ != 0 && bytes >= digest_after_bytes_;
  }
  const std::uint64_t digest_after_bytes_;
  struct OutputSlot {
    std::string name;
    std::optional<ShmSlot> slot;
    Tensor* into = nullptr;
    // OutputBytes: received into here.
    std::byte* into_bytes = nullptr;
    std::uint64_t into_capacity = 0;
  };
  const OutputSlot* FindOutput(absl::string_view name) const;

  std::vector<InputSlot> inputs_;
  std::vector<OutputSlot> outputs_;
};

// Reads a response stream (one result message, then the chunks of the
// tensors it announces, and for a tensor announced without its digest the
// digest after its chunks) and finishes the call. A local error cancels the call first:
// Finish() would otherwise wait for chunks nobody reads.
// Whether a response message carries tensor parts (chunks and digests)
// besides its result: Verify's carries its result alone.
template <typename Response, typename = void>
struct CarriesTensors : std::false_type {};
template <typename Response>
struct CarriesTensors<Response, std::void_t<decltype(std::declval<const Response&>().chunk()),
                                            decltype(std::declval<const Response&>().digest())>>
    : std::true_type {};

// A response message other than the result: a chunk or a digest of an
// output, where the response has them.
template <typename Response>
absl::Status AddResponsePart(const Response& response, ResponseTensors* tensors) {
  if constexpr (CarriesTensors<Response>::value) {
    if (response.has_chunk()) return tensors->Add(response.chunk());
    if (response.has_digest()) return tensors->SetDigest(response.digest());
    return absl::DataLossError("response from server: a message with neither result nor chunk");
  } else {
    return absl::DataLossError(absl::StrCat("response from server: a ",
                                            Response::descriptor()->full_name(),
                                            " without its result, which is all it carries"));
  }
}

template <typename Response, typename Stream, typename Result>
absl::Status ReceiveResponse(Stream& stream, grpc::ClientContext& context, Result* result,
                             ResponseTensors* tensors, const CallTensors& slots) {
  Response response;
  wire::ChunkView chunk;
  bool have_result = false;
  absl::Status local;
  while (local.ok()) {
    const Next next = stream.Read(&response, &chunk);
    if (next == Next::kEnd) break;
    if (next == Next::kChunk) {
      local = tensors->Add(std::move(chunk));
    } else if (next == Next::kMalformed) {
      local = absl::DataLossError(absl::StrCat("response from server: a message that is not a ",
                                               Response::descriptor()->full_name()));
    } else if (response.has_result()) {
      if (have_result) {
        local = absl::DataLossError("response from server: a second result message");
        break;
      }
      *result = std::move(*response.mutable_result());
      have_result = true;
      local = tensors->Announce(slots.Streamed(*result));
    } else {
      local = AddResponsePart(response, tensors);
    }
  }
  if (!local.ok()) {
    context.TryCancel();
    stream.Finish();  // Cancelled on purpose: `local` is the reason, not this status.
    return local;
  }
  if (absl::Status s = FromGrpc(stream.Finish()); !s.ok()) return s;
  if (!have_result) {
    return absl::DataLossError("response from server: the call ended without a result");
  }
  return tensors->Finish();
}

// One attempt of a tensor call as a raw stream: `request` (its header filled
// from `slots` already), the streamed inputs, then the result into *result
// and the streamed outputs into *tensors.
template <typename Request, typename Response, typename Result>
absl::Status RunTensorCall(grpc::GenericStub& stub, absl::string_view method,
                           grpc::ClientContext& context, std::size_t chunk_bytes,
                           const Request& request, const CallTensors& slots, Result* result,
                           ResponseTensors* tensors) {
  RawCall<Request, Response> stream(stub, method, &context);
  const auto write = [&stream, &request, &slots, chunk_bytes] {
    if (stream.Write(request) && slots.WriteInputs(stream, chunk_bytes)) stream.WritesDone();
  };
  slots.OfferInto(tensors);
  if (AsksPipeline(request)) {
    stream.StartWriting(write);
  } else {
    write();
  }
  return ReceiveResponse<Response>(stream, context, result, tensors, slots);
}

}  // namespace logitd::client

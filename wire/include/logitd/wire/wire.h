// Chunked tensor transfer over the logitd.v1 protocol, the same on both ends:
// a TensorSpec announces a tensor (dtype, shape, xxh3-64), TensorChunks carry
// its bytes in order, and the receiver checks offsets, length and digest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/chunk_message.h"

namespace logitd::wire {

// An Assembler fills and hashes tensors from this size on on a thread of
// their own, following the receiving thread, instead of on it.
inline constexpr std::uint64_t kHashAsideBytes = 8u << 20;

absl::StatusOr<DType> FromProto(v1::DType dtype);
v1::DType ToProto(DType dtype);

// Spec of a whole tensor, digest included.
v1::TensorSpec MakeSpec(absl::string_view name, const Tensor& tensor);

// Reassembles the chunks of the tensors announced with Expect(). Each byte is
// checked against the announced size before it is stored; nothing larger
// than max_total_bytes (all tensors together) is ever allocated.
class Assembler {
 public:
  explicit Assembler(std::uint64_t max_total_bytes);
  ~Assembler();
  Assembler(const Assembler&) = delete;
  Assembler& operator=(const Assembler&) = delete;

  // Announces a tensor and allocates its buffer. InvalidArgument for an
  // unknown dtype, a bad shape or a duplicate name; ResourceExhausted when
  // the tensors together would exceed max_total_bytes. When `recycle` has the
  // announced dtype and shape, its buffer is taken over instead of a new one
  // (no allocation, no page faults); otherwise it is left alone.
  absl::Status Expect(const v1::TensorSpec& spec, Tensor* recycle = nullptr);
  // Like Expect, but the bytes go to [into, into + the tensor's size), memory
  // of at least `capacity` bytes that the caller owns and keeps until the
  // Assembler has finished (Finish) or is gone. Take() refuses such a tensor.
  absl::Status ExpectInto(const v1::TensorSpec& spec, std::byte* into, std::uint64_t capacity);
  // Stores one chunk. InvalidArgument for an unknown tensor, an offset other
  // than the next expected byte, or data past the tensor's end.
  absl::Status Add(const v1::TensorChunk& chunk);
  // The same for a chunk read straight from a raw message's slices. A large
  // tensor's chunk is taken over (its slices are copied from later, on the
  // tensor's own thread), so `chunk` is left empty.
  absl::Status Add(ChunkView&& chunk);
  // Sets the digest a tensor's bytes must have, for a sender that announces
  // it after the bytes (Expect() was given the spec without it). NotFound
  // when no tensor `name` was announced, FailedPrecondition when its digest
  // was given already (in its spec, or before).
  absl::Status SetExpectedDigest(absl::string_view name, std::uint64_t xxh3);
  // The digest tensor `name`'s bytes must have, once given; after an OK
  // Finish, the digest of its bytes.
  std::optional<std::uint64_t> ExpectedDigest(absl::string_view name) const;
  // Told each time bytes of a tensor are in place in its buffer: the
  // tensor's name and how many of its bytes, from offset 0, are. Called from
  // the thread that copied them (the receiving thread, or a large tensor's
  // own), so that a reader may start on a tensor's first bytes while the
  // rest arrive. Their digest is checked only by Finish. Set before Expect.
  using Landed = std::function<void(absl::string_view name, std::uint64_t bytes)>;
  void OnLanded(Landed landed) { landed_ = std::move(landed); }
  // DataLoss when any tensor is incomplete, its digest never came, or its
  // bytes do not have it.
  // Stops every tensor's thread first (StopWorkers), whatever it returns.
  absl::Status Finish();
  // Waits until each large tensor's own thread has copied and hashed every
  // chunk it was given, and ends it: from then on nothing of the Assembler's
  // writes into a buffer (chunks added later are copied on the caller's
  // thread). A receiver that gives up before Finish calls it before the
  // buffers go back to their owner.
  void StopWorkers();
  // Moves a finished tensor out. NotFound when it was never announced.
  absl::StatusOr<Tensor> Take(absl::string_view name);

  std::uint64_t total_bytes() const { return total_bytes_; }

 private:
  struct Pending;
  absl::Status Announce(const v1::TensorSpec& spec, Tensor* recycle, std::byte* into,
                        std::uint64_t capacity);
  absl::Status AddPieces(absl::string_view name, std::uint64_t offset, std::uint64_t size,
                         absl::Span<const absl::Span<const std::byte>> pieces, ChunkView* view);
  std::uint64_t max_total_bytes_;
  std::uint64_t total_bytes_ = 0;
  Landed landed_;
  std::map<std::string, std::unique_ptr<Pending>, std::less<>> pending_;
};

// The xxh3-64 (seed 0) of bytes given piece by piece, in order: the digest
// of their concatenation.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* data, std::size_t bytes);
  std::uint64_t Digest() const;

 private:
  void* state_;
};

// Splits bytes into chunks of at most chunk_bytes and hands each to `write`
// (which returns false when the peer is gone). A zero-length tensor sends no
// chunk. Unavailable when `write` fails (the peer is gone).
absl::Status SendChunks(absl::string_view name, const std::byte* data, std::size_t size,
                        std::size_t chunk_bytes,
                        const std::function<bool(v1::TensorChunk&&)>& write);

// The same split, filling one caller-owned `chunk` (typically the chunk field of
// a response message the caller reuses) and calling `write` after each fill.
// The chunk's data buffer is allocated once and overwritten in place, so a
// large tensor costs one copy per byte into the message instead of a fresh
// allocation (and its page faults) per chunk.
absl::Status SendChunksInPlace(absl::string_view name, const std::byte* data, std::size_t size,
                               std::size_t chunk_bytes, v1::TensorChunk* chunk,
                               const std::function<bool()>& write);

}  // namespace logitd::wire

// Tensor chunks as raw gRPC messages, without protobuf (de)serialization of
// their bytes.
//
// Every tensor-carrying stream of logitd.v1 has a oneof whose field 2 is a
// TensorChunk. Written the usual way, a chunk's bytes are copied into the
// message's string and again into gRPC's buffer on the sender, and out of
// gRPC's buffer into a string and again into the tensor on the receiver.
// These helpers write the message's few header bytes by hand and let gRPC
// send the tensor's bytes from where they lie (a slice over the caller's
// buffer), and read a received chunk's bytes straight out of gRPC's slices.
// Anything else on the stream (headers, results) still goes through the
// message types.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "logitd/protocol.h"

namespace logitd::wire {

using logitd::kDefaultChunkBytes;

// A TensorChunk read from a received message: its name and offset, and its
// data as pieces of the message's slices (kept alive by `slices`).
struct ChunkView {
  std::string name;
  std::uint64_t offset = 0;
  std::vector<absl::Span<const std::byte>> pieces;
  std::uint64_t size = 0;
  // The whole message's size, framing included.
  std::uint64_t message_bytes = 0;
  std::vector<grpc::Slice> slices;
};

// True when `message` is exactly a oneof-field-2 TensorChunk with each of its
// fields at most once, read into *view; false for anything else (a header or
// result message, unknown or repeated fields, a name that is not UTF-8,
// malformed bytes), which the caller then parses as its message type, so
// that every message either takes this path or gets protobuf's own
// treatment.
bool ReadChunkMessage(const grpc::ByteBuffer& message, ChunkView* view);

// The message `oneof { ... TensorChunk chunk = 2; }` carrying [data, data +
// size) as the chunk of `name` at `offset`. The bytes are not copied: gRPC
// sends them from `data`, and `owner` is held until gRPC lets go of the last
// reference to them, which can be after the call has ended.
grpc::ByteBuffer ChunkMessage(absl::string_view name, std::uint64_t offset, const std::byte* data,
                              std::size_t size, const std::shared_ptr<const void>& owner);

// Splits [data, data + size) into chunks of at most chunk_bytes and hands each
// ChunkMessage to `write` with the chunk's byte count (write returns false
// when the peer is gone: Unavailable).
template <typename Write>
absl::Status SendChunkMessages(absl::string_view name, const std::byte* data, std::size_t size,
                               std::size_t chunk_bytes, const std::shared_ptr<const void>& owner,
                               Write&& write);

// Parses a message of type M from a received buffer: false when the bytes
// are not an M.
template <typename M>
bool ParseMessage(grpc::ByteBuffer* buffer, M* message);

// Serializes a message into a buffer for a raw stream.
template <typename M>
grpc::ByteBuffer SerializeMessage(const M& message);

}  // namespace logitd::wire

// --- Implementation of the templates ------------------------------------------

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace logitd::wire {

template <typename Write>
absl::Status SendChunkMessages(absl::string_view name, const std::byte* data, std::size_t size,
                               std::size_t chunk_bytes, const std::shared_ptr<const void>& owner,
                               Write&& write) {
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  for (std::size_t off = 0; off < size; off += chunk_bytes) {
    const std::size_t len = std::min(chunk_bytes, size - off);
    if (!write(ChunkMessage(name, off, data + off, len, owner), len)) {
      return absl::UnavailableError(
          absl::StrFormat("%s: the peer stopped reading at byte %d of %d", name, off, size));
    }
  }
  return absl::OkStatus();
}

template <typename M>
bool ParseMessage(grpc::ByteBuffer* buffer, M* message) {
  grpc::ProtoBufferReader reader(buffer);
  return reader.status().ok() && message->ParseFromZeroCopyStream(&reader);
}

template <typename M>
grpc::ByteBuffer SerializeMessage(const M& message) {
  // Headers, results and digests: small messages (chunks go through
  // ChunkMessage), copied once into the slice gRPC sends.
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace logitd::wire

// Constants of the logitd.v1 wire protocol that both ends share (see
// docs/PROTOCOL.md): defined here once, for the server, the client library
// and the tools.
#pragma once

#include <cstddef>
#include <cstdint>

namespace logitd {

// The largest message a gRPC client or server accepts unless told otherwise:
// every message a logitd server sends with its default settings fits.
inline constexpr std::size_t kGrpcDefaultMaxMessageBytes = std::size_t{4} << 20;

// Tensor bytes per TensorChunk message, by default, both ways: 4 MiB less
// 4 KiB, so that a chunk with its framing (field tags, lengths, the
// tensor's name and offset) stays under kGrpcDefaultMaxMessageBytes.
inline constexpr std::size_t kDefaultChunkBytes = kGrpcDefaultMaxMessageBytes - 4096;

// Room a server allows for a chunk message's framing beyond its data: the
// largest request message it takes is its largest request chunk plus this.
inline constexpr std::size_t kChunkFramingBytes = 4096;

// The most entries LogProbs' top-k returns per token (LogProbsHeader.top_k).
inline constexpr std::int64_t kMaxTopK = 64;

}  // namespace logitd

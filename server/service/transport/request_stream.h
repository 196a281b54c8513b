// Reading a request stream: one header message, then the chunks of the
// tensors it announces (logitd.v1's client-streaming and bidi calls). Shared by
// the tensor calls (server/service/v1/tensor_call.h) and the request fuzzer, so that the
// fuzzer exercises the code that serves.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "logitd/wire/wire.h"

namespace logitd::service {

// Byte counts of what a call received; the handlers' CallStats has these.
struct StreamBytes {
  std::uint64_t bytes_in = 0;
  std::uint64_t tensor_bytes_in = 0;
};

// Why a stream's Read() returned false when that was not the end of the
// stream. A stream type that parses its messages itself overloads this to
// report the message it could not parse (see message_stream.h).
template <typename Reader>
absl::Status ReadError(const Reader& /*stream*/) {
  return absl::OkStatus();
}

// What ReadRequest found.
enum class RequestPart { kEnd, kMessage, kChunk };

// The next message of a request stream, parsed as a Request. A stream type
// that can hand over a chunk's bytes without parsing them into a message
// overloads this (message_stream.h) and returns kChunk with *chunk filled.
template <typename Reader, typename Request>
RequestPart ReadRequest(Reader* stream, Request* message, wire::ChunkView* /*chunk*/) {
  return stream->Read(message) ? RequestPart::kMessage : RequestPart::kEnd;
}

// Reads the call's first message, which must be its header.
template <typename Request, typename Reader>
absl::Status ReadHeader(Reader* stream, Request* first, std::uint64_t* bytes_in) {
  if (!stream->Read(first)) {
    if (absl::Status s = ReadError(*stream); !s.ok()) return s;
    return absl::InvalidArgumentError("expected a header first, got an empty request stream");
  }
  *bytes_in += first->ByteSizeLong();
  if (first->part_case() != Request::kHeader) {
    return absl::InvalidArgumentError(
        "expected a header first, got a chunk (or a message with neither) as the first message");
  }
  return absl::OkStatus();
}

// Feeds the rest of the request stream into `assembler` and checks that every
// announced tensor arrived whole and undamaged. `stop()` is asked between
// messages: a client gone mid-stream (or past its deadline) is noticed between
// chunks, not only when the stream ends.
template <typename Request, typename Reader, typename Stats, typename ShouldStop>
absl::Status ReceiveChunks(Reader* stream, wire::Assembler* assembler, Stats* stats,
                           ShouldStop stop) {
  // Whatever ends the reception (a refused chunk, a cancelled call), no
  // tensor's thread still copies into a buffer once it has: the caller may
  // let the buffers go as soon as this returns.
  struct StopWorkers {
    wire::Assembler* assembler;
    ~StopWorkers() { assembler->StopWorkers(); }
  } stop_workers{assembler};
  Request msg;
  wire::ChunkView chunk;
  for (;;) {
    const RequestPart part = ReadRequest(stream, &msg, &chunk);
    if (part == RequestPart::kEnd || stop()) break;
    if (part == RequestPart::kChunk) {
      stats->bytes_in += chunk.message_bytes;
      stats->tensor_bytes_in += chunk.size;
      if (absl::Status s = assembler->Add(std::move(chunk)); !s.ok()) return s;
      continue;
    }
    stats->bytes_in += msg.ByteSizeLong();
    switch (msg.part_case()) {
      case Request::kChunk: {
        stats->tensor_bytes_in += msg.chunk().data().size();
        if (absl::Status s = assembler->Add(msg.chunk()); !s.ok()) return s;
        break;
      }
      case Request::kDigest: {
        const absl::Status s =
            assembler->SetExpectedDigest(msg.digest().name(), msg.digest().xxh3());
        if (!s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "TensorDigest for '", msg.digest().name(), "': ", s.message(),
              "; a digest follows the chunks only of a streamed tensor whose spec carried xxh3 0"));
        }
        break;
      }
      case Request::kHeader:
        return absl::InvalidArgumentError(
            "expected chunks after the header, got a second header (one call carries one header)");
      default:
        return absl::InvalidArgumentError(
            "expected a chunk or a digest, got a request message with neither");
    }
  }
  if (stop()) {
    return absl::CancelledError("the client cancelled the call while sending its tensors");
  }
  if (absl::Status s = ReadError(*stream); !s.ok()) return s;
  return assembler->Finish();
}

}  // namespace logitd::service

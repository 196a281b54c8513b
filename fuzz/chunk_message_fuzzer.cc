// libFuzzer target over logitd/wire/chunk_message.h's reader, which takes apart
// the tensor chunks every client sends (untrusted bytes) without protobuf.
// It is checked against protobuf itself on the same bytes, cut into slices
// wherever the input says:
//  - whatever the reader accepts, protobuf parses as a LogitsResponse with a
//    chunk carrying the same name, offset and data, and nothing else;
//  - every message protobuf writes for a chunk (name, offset, data, nothing
//    else) is accepted by the reader, so the fast path is never skipped;
//  - the reader never reads outside the slices (the sanitizers' part).
//
// Input: byte 0 is the number of cuts (mod 8), the next that many bytes are
// cut positions (scaled to the message), the rest is the message.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/chunk_message.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "chunk_message_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Malformed names are part of the point; protobuf would log each one.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const std::size_t cuts_n = std::min<std::size_t>(data[0] % 8, size - 1);
  const std::string message(reinterpret_cast<const char*>(data + 1 + cuts_n), size - 1 - cuts_n);
  std::vector<std::size_t> cuts;
  for (std::size_t i = 0; i < cuts_n; ++i) {
    cuts.push_back(message.empty() ? 0 : data[1 + i] * message.size() / 256);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    slices.emplace_back(message.data() + at, cut - at);  // empty slices too
    at = cut;
  }
  slices.emplace_back(message.data() + at, message.size() - at);
  const grpc::ByteBuffer buffer(slices.data(), slices.size());

  logitd::wire::ChunkView view;
  const bool fast = logitd::wire::ReadChunkMessage(buffer, &view);
  logitd::v1::LogitsResponse parsed;
  const bool parsed_ok = parsed.ParseFromString(message);
  if (fast) {
    if (!parsed_ok || !parsed.has_chunk()) Fail("accepted bytes protobuf does not take as a chunk");
    std::string joined;
    for (const auto& piece : view.pieces) {
      joined.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    }
    if (view.name != parsed.chunk().name() || view.offset != parsed.chunk().offset() ||
        joined != parsed.chunk().data() || view.size != joined.size() ||
        view.message_bytes != message.size()) {
      Fail("the chunk read differs from protobuf's");
    }
  }
  if (parsed_ok && parsed.has_chunk() && !fast) {
    // What protobuf writes for this chunk alone (no unknown fields kept).
    logitd::v1::LogitsResponse canonical;
    canonical.mutable_chunk()->set_name(parsed.chunk().name());
    canonical.mutable_chunk()->set_offset(parsed.chunk().offset());
    canonical.mutable_chunk()->set_data(parsed.chunk().data());
    if (canonical.SerializeAsString() == message) {
      Fail("protobuf's own bytes for a chunk were not taken by the reader");
    }
  }
  return 0;
}

// Tests of logitd/wire/chunk_message.h: the hand-written chunk messages must be
// what protobuf writes and reads, whatever slices gRPC delivers them in, and
// everything the fast reader does not take apart must be left to protobuf.
#include "logitd/wire/chunk_message.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/wire.h"

namespace logitd::wire {
namespace {

std::vector<std::byte> RandomBytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// The bytes of a buffer, joined.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` as a buffer of slices cut at `cuts` (ascending offsets; those
// past the end are ignored).
grpc::ByteBuffer Cut(const std::string& bytes, const std::vector<std::size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    if (cut > bytes.size()) break;
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const ChunkView& view) {
  std::string out;
  for (const auto& piece : view.pieces) {
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  return out;
}

TEST(ChunkMessage, IsTheMessageProtobufParses) {
  const std::vector<std::byte> data = RandomBytes(300000, 1);
  for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{1} << 40}) {
    const grpc::ByteBuffer message = ChunkMessage("y", offset, data.data(), data.size(), nullptr);
    v1::LogitsResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(message)));
    ASSERT_TRUE(parsed.has_chunk());
    EXPECT_EQ(parsed.chunk().name(), "y");
    EXPECT_EQ(parsed.chunk().offset(), offset);
    ASSERT_EQ(parsed.chunk().data().size(), data.size());
    EXPECT_EQ(std::memcmp(parsed.chunk().data().data(), data.data(), data.size()), 0);
    // Byte for byte what protobuf itself writes for the same chunk.
    EXPECT_EQ(Flatten(message), parsed.SerializeAsString());
  }
}

TEST(ChunkMessage, SendsFromTheCallersBytesAndHoldsTheirOwnerUntilReleased) {
  auto owner = std::make_shared<std::vector<std::byte>>(RandomBytes(1 << 20, 2));
  {
    const grpc::ByteBuffer message = ChunkMessage("dw", 7, owner->data(), owner->size(), owner);
    EXPECT_EQ(owner.use_count(), 2);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    // The payload slice is the owner's memory itself, not a copy.
    EXPECT_EQ(static_cast<const void*>(slices[1].begin()), static_cast<const void*>(owner->data()));
    grpc::ByteBuffer copy = message;  // gRPC copies buffers by reference
    EXPECT_EQ(owner.use_count(), 2);
  }
  EXPECT_EQ(owner.use_count(), 1);
}

TEST(ChunkMessage, ReaderTakesProtobufsChunksApartAcrossAnySliceBoundaries) {
  v1::LogitsResponse response;
  response.mutable_chunk()->set_name("logits");
  response.mutable_chunk()->set_offset(300);
  const std::vector<std::byte> data = RandomBytes(200, 3);
  response.mutable_chunk()->set_data(reinterpret_cast<const char*>(data.data()), data.size());
  const std::string bytes = response.SerializeAsString();
  const std::string want(reinterpret_cast<const char*>(data.data()), data.size());

  // Every single cut, and every pair of cuts, of the serialized message.
  for (std::size_t a = 0; a <= bytes.size(); ++a) {
    for (std::size_t b = a; b <= bytes.size(); b += (a < 24 ? 1 : 37)) {
      ChunkView view;
      ASSERT_TRUE(ReadChunkMessage(Cut(bytes, {a, b}), &view)) << a << " " << b;
      EXPECT_EQ(view.name, "logits");
      EXPECT_EQ(view.offset, 300u);
      EXPECT_EQ(view.size, data.size());
      EXPECT_EQ(Joined(view), want);
    }
  }
  // One byte per slice.
  std::vector<std::size_t> every;
  for (std::size_t i = 1; i < bytes.size(); ++i) every.push_back(i);
  ChunkView view;
  ASSERT_TRUE(ReadChunkMessage(Cut(bytes, every), &view));
  EXPECT_EQ(Joined(view), want);
}

// Whether protobuf takes `bytes` as a LogitsResponse.
bool ProtobufParses(const std::string& bytes) {
  v1::LogitsResponse r;
  return r.ParseFromString(bytes);
}

TEST(ChunkMessage, ReaderLeavesEverythingElseToProtobuf) {
  ChunkView view;
  // A result message.
  v1::LogitsResponse result;
  result.mutable_result()->mutable_y()->set_name("y");
  EXPECT_FALSE(ReadChunkMessage(Cut(result.SerializeAsString(), {}), &view));
  // A digest message.
  v1::LogitsResponse digest;
  digest.mutable_digest()->set_name("y");
  digest.mutable_digest()->set_xxh3(42);
  EXPECT_FALSE(ReadChunkMessage(Cut(digest.SerializeAsString(), {}), &view));

  v1::LogitsResponse chunk;
  chunk.mutable_chunk()->set_name("y");
  chunk.mutable_chunk()->set_data("abcdef");
  const std::string good = chunk.SerializeAsString();
  ASSERT_TRUE(ReadChunkMessage(Cut(good, {}), &view));
  // Truncated anywhere.
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ReadChunkMessage(Cut(good.substr(0, n), {}), &view)) << n;
  }
  // A name that is not UTF-8: protobuf refuses the message, so does the reader.
  v1::LogitsResponse bad_name;
  bad_name.mutable_chunk()->set_name("y");
  bad_name.mutable_chunk()->set_data("abc");
  std::string bad = bad_name.SerializeAsString();
  bad[4] = '\xff';  // the name's one byte
  EXPECT_FALSE(ReadChunkMessage(Cut(bad, {}), &view));
  EXPECT_FALSE(ProtobufParses(bad));
  // Bytes after the chunk field (a second field of the outer message).
  EXPECT_FALSE(ReadChunkMessage(Cut(good + good, {}), &view));
  // A field TensorChunk does not have (number 9, varint), inside the chunk.
  std::string unknown = good;
  unknown[1] = static_cast<char>(unknown[1] + 2);
  unknown += std::string("\x48\x01", 2);
  EXPECT_FALSE(ReadChunkMessage(Cut(unknown, {}), &view));
  v1::LogitsResponse reparsed;
  EXPECT_TRUE(reparsed.ParseFromString(unknown));  // valid protobuf all the same
  // A field given twice: protobuf's last-one-wins is protobuf's to apply.
  std::string twice = good;
  twice[1] = static_cast<char>(twice[1] + 3);
  twice += std::string("\x0a\x01z", 3);
  EXPECT_FALSE(ReadChunkMessage(Cut(twice, {}), &view));
  ASSERT_TRUE(reparsed.ParseFromString(twice));
  EXPECT_EQ(reparsed.chunk().name(), "z");
}

TEST(ChunkMessage, AssemblerTakesViewsAndADigestGivenAfterTheBytes) {
  const std::vector<std::byte> data = RandomBytes(1 << 16, 4);
  Tensor t(DType::kFp32, {1 << 14});
  std::memcpy(t.bytes(), data.data(), data.size());
  v1::TensorSpec spec = MakeSpec("y", t);
  const std::uint64_t digest = spec.xxh3();
  spec.set_xxh3(0);  // announced without it

  for (const bool right_digest : {true, false}) {
    Assembler assembler(data.size());
    ASSERT_TRUE(assembler.Expect(spec).ok());
    for (std::size_t off = 0; off < data.size(); off += 5000) {
      const std::size_t n = std::min<std::size_t>(5000, data.size() - off);
      const grpc::ByteBuffer message = ChunkMessage("y", off, data.data() + off, n, nullptr);
      // Re-cut into 1000-byte slices, as a transport might deliver it.
      const std::string bytes = Flatten(message);
      std::vector<std::size_t> cuts;
      for (std::size_t c = 1000; c < bytes.size(); c += 1000) cuts.push_back(c);
      ChunkView view;
      ASSERT_TRUE(ReadChunkMessage(Cut(bytes, cuts), &view));
      ASSERT_TRUE(assembler.Add(std::move(view)).ok());
    }
    ASSERT_TRUE(assembler.SetExpectedDigest("y", right_digest ? digest : digest ^ 1).ok());
    const absl::Status finished = assembler.Finish();
    if (right_digest) {
      ASSERT_TRUE(finished.ok()) << finished;
      absl::StatusOr<Tensor> got = assembler.Take("y");
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(std::memcmp(got->bytes(), data.data(), data.size()), 0);
    } else {
      EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss);
    }
  }
  Assembler assembler(16);
  EXPECT_EQ(assembler.SetExpectedDigest("nope", 1).code(), absl::StatusCode::kNotFound);
}

// A large tensor's chunks are taken over with their slices and copied and
// hashed on the tensor's own thread: same bytes, same verdicts, and the
// slices outlive the messages they came in.
TEST(ChunkMessage, LargeTensorsAreFilledFromTheSlicesOnTheirOwnThread) {
  const std::size_t n = kHashAsideBytes + 4096;
  const std::vector<std::byte> data = RandomBytes(n, 6);
  Tensor t(DType::kBf16, {static_cast<std::int64_t>(n / 2)});
  std::memcpy(t.bytes(), data.data(), n);
  const v1::TensorSpec spec = MakeSpec("y", t);
  for (const bool damage : {false, true}) {
    Assembler assembler(n);
    ASSERT_TRUE(assembler.Expect(spec).ok());
    std::vector<std::byte> sent = data;
    if (damage) sent[n / 3] ^= std::byte{1};
    std::size_t messages = 0;
    ASSERT_TRUE(SendChunkMessages("y", sent.data(), n, 1 << 20, nullptr,
                                  [&](const grpc::ByteBuffer& m, std::size_t) {
                                    // A fresh copy per message, dropped at once:
                                    // the assembler must hold what it needs.
                                    const std::string bytes = Flatten(m);
                                    ChunkView view;
                                    EXPECT_TRUE(ReadChunkMessage(Cut(bytes, {7, 70000}), &view));
                                    ++messages;
                                    return assembler.Add(std::move(view)).ok();
                                  })
                    .ok());
    EXPECT_EQ(messages, (n + (1 << 20) - 1) / (1 << 20));
    // A chunk out of order is still refused at once.
    ChunkView late;
    ASSERT_TRUE(ReadChunkMessage(ChunkMessage("y", 0, data.data(), 16, nullptr), &late));
    EXPECT_EQ(assembler.Add(std::move(late)).code(), absl::StatusCode::kInvalidArgument);
    const absl::Status finished = assembler.Finish();
    if (damage) {
      EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss) << finished;
      continue;
    }
    ASSERT_TRUE(finished.ok()) << finished;
    absl::StatusOr<Tensor> got = assembler.Take("y");
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(std::memcmp(got->bytes(), data.data(), n), 0);
  }
}

TEST(ChunkMessage, SendChunkMessagesCoversTheTensorInOrderAndStopsWhenThePeerGoes) {
  const std::vector<std::byte> data = RandomBytes(10000, 5);
  std::vector<std::uint64_t> offsets;
  std::string joined;
  ASSERT_TRUE(SendChunkMessages("x", data.data(), data.size(), 4096, nullptr,
                                [&](const grpc::ByteBuffer& m, std::size_t payload) {
                                  ChunkView view;
                                  EXPECT_TRUE(ReadChunkMessage(m, &view));
                                  EXPECT_EQ(view.size, payload);
                                  offsets.push_back(view.offset);
                                  joined += Joined(view);
                                  return true;
                                })
                  .ok());
  EXPECT_EQ(offsets, (std::vector<std::uint64_t>{0, 4096, 8192}));
  EXPECT_EQ(joined, std::string(reinterpret_cast<const char*>(data.data()), data.size()));
  int writes = 0;
  const absl::Status gone =
      SendChunkMessages("x", data.data(), data.size(), 4096, nullptr,
                        [&](const grpc::ByteBuffer&, std::size_t) { return ++writes < 2; });
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(writes, 2);
}

}  // namespace
}  // namespace logitd::wire

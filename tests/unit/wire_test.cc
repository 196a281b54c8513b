// Tests of the chunked tensor transfer in logitd/wire/wire.h: reassembly, and
// every way a stream can be malformed, truncated, corrupted or too large.
#include "logitd/wire/wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "logitd/wire/chunk_message.h"
#include "tests/common/seeded_tensors.h"

namespace logitd::wire {
namespace {

using testing::NormalFp32;

std::vector<v1::TensorChunk> Split(absl::string_view name, const Tensor& t, std::size_t chunk) {
  std::vector<v1::TensorChunk> chunks;
  absl::Status s = SendChunks(name, t.bytes(), t.nbytes(), chunk, [&](v1::TensorChunk&& c) {
    chunks.push_back(std::move(c));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return chunks;
}

TEST(Wire, ChunkedTensorReassemblesAndFinishes) {
  const Tensor x = NormalFp32({3, 1000}, 1);  // 12000 bytes
  const Tensor w = NormalFp32({7, 11}, 2);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  ASSERT_TRUE(a.Expect(MakeSpec("w", w)).ok());
  EXPECT_EQ(a.total_bytes(), x.nbytes() + w.nbytes());
  const std::vector<v1::TensorChunk> xc = Split("x", x, 4096);
  const std::vector<v1::TensorChunk> wc = Split("w", w, 100);
  ASSERT_EQ(xc.size(), 3u);
  // Chunks of different tensors may interleave; each tensor's stay in order.
  for (std::size_t i = 0; i < std::max(xc.size(), wc.size()); ++i) {
    if (i < xc.size()) {
      ASSERT_TRUE(a.Add(xc[i]).ok());
    }
    if (i < wc.size()) {
      ASSERT_TRUE(a.Add(wc[i]).ok());
    }
  }
  absl::Status s = a.Finish();
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<Tensor> got = a.Take("x");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->shape(), x.shape());
  EXPECT_EQ(got->dtype(), DType::kFp32);
  ASSERT_EQ(got->nbytes(), x.nbytes());
  EXPECT_EQ(std::memcmp(got->bytes(), x.bytes(), x.nbytes()), 0);
  // A tensor is moved out once.
  EXPECT_EQ(a.Take("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.Take("never").status().code(), absl::StatusCode::kNotFound);
}

// OnLanded tells a reader how much of a tensor is in place while it arrives:
// from the receiving thread for a small tensor, from the tensor's own thread
// for a large one (8 MiB and more); never more than is in place, and all of
// it by Finish.
TEST(Wire, OnLandedReportsBytesInPlaceAsTheyArrive) {
  for (const std::int64_t rows : {3, 1100}) {  // 12 KB, and 8.8 MB (a thread of its own)
    SCOPED_TRACE(rows);
    const Tensor x = NormalFp32({rows, 2000}, 3);
    std::vector<std::byte> into(x.nbytes());
    Assembler a(x.nbytes());
    std::mutex mu;
    std::vector<std::uint64_t> reports;
    bool in_place = true;
    a.OnLanded([&](absl::string_view name, std::uint64_t bytes) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(name, "x");
      reports.push_back(bytes);
      in_place = in_place && std::memcmp(into.data(), x.bytes(), bytes) == 0;
    });
    ASSERT_TRUE(a.ExpectInto(MakeSpec("x", x), into.data(), into.size()).ok());
    for (const v1::TensorChunk& c : Split("x", x, 1 << 20)) ASSERT_TRUE(a.Add(c).ok());
    ASSERT_TRUE(a.Finish().ok());
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(reports.empty());
    EXPECT_TRUE(std::is_sorted(reports.begin(), reports.end()));
    EXPECT_EQ(reports.back(), x.nbytes());
    EXPECT_TRUE(in_place) << "a report ran ahead of the bytes";
  }
}

TEST(Wire, Xxh3StreamIsTheDigestOfTheWhole) {
  const Tensor x = NormalFp32({5, 999}, 4);
  Xxh3Stream h;
  for (std::size_t off = 0; off < x.nbytes(); off += 1234) {
    h.Update(x.bytes() + off, std::min<std::size_t>(1234, x.nbytes() - off));
  }
  EXPECT_EQ(h.Digest(), x.Digest());
}

TEST(Wire, OutOfOrderOffsetIsInvalidArgument) {
  const Tensor x = NormalFp32({4, 256}, 3);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  const std::vector<v1::TensorChunk> c = Split("x", x, 1024);
  ASSERT_EQ(c.size(), 4u);
  absl::Status s = a.Add(c[1]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected offset 0"), absl::string_view::npos) << s;
  ASSERT_TRUE(a.Add(c[0]).ok());
  // A repeated chunk is out of order too.
  EXPECT_EQ(a.Add(c[0]).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Wire, ChunkPastEndIsInvalidArgument) {
  const Tensor x = NormalFp32({10}, 4);  // 40 bytes
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  v1::TensorChunk c;
  c.set_name("x");
  c.set_offset(0);
  c.set_data(std::string(44, 'a'));
  absl::Status s = a.Add(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("past the tensor's end"), absl::string_view::npos) << s;
}

TEST(Wire, UnknownTensorNameIsInvalidArgument) {
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", NormalFp32({2}, 5))).ok());
  v1::TensorChunk c;
  c.set_name("y");
  c.set_offset(0);
  c.set_data(std::string(8, 'b'));
  absl::Status s = a.Add(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'y'"), absl::string_view::npos) << s;
}

TEST(Wire, DuplicateAnnounceIsInvalidArgument) {
  const Tensor x = NormalFp32({2, 2}, 6);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  absl::Status s = a.Expect(MakeSpec("x", x));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("twice"), absl::string_view::npos) << s;
}

TEST(Wire, MalformedSpecsAreInvalidArgument) {
  Assembler a(1u << 20);
  v1::TensorSpec spec;
  spec.set_dtype(v1::DTYPE_FP32);
  spec.add_shape(4);
  EXPECT_EQ(a.Expect(spec).code(), absl::StatusCode::kInvalidArgument);  // no name
  spec.set_name("x");
  spec.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(a.Expect(spec).code(), absl::StatusCode::kInvalidArgument);  // no dtype
  spec.set_dtype(v1::DTYPE_FP32);
  spec.clear_shape();
  EXPECT_EQ(a.Expect(spec).code(), absl::StatusCode::kInvalidArgument);  // no dims
  spec.add_shape(4);
  spec.add_shape(0);
  EXPECT_EQ(a.Expect(spec).code(), absl::StatusCode::kInvalidArgument);  // zero dim
}

TEST(Wire, ShapeProductOverflowingInt64IsInvalidArgument) {
  Assembler a(std::numeric_limits<std::uint64_t>::max());
  v1::TensorSpec spec;
  spec.set_name("x");
  spec.set_dtype(v1::DTYPE_BF16);
  spec.add_shape(std::int64_t{1} << 40);
  spec.add_shape(std::int64_t{1} << 40);
  absl::Status s = a.Expect(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflows"), absl::string_view::npos) << s;
  EXPECT_EQ(a.total_bytes(), 0u);
}

TEST(Wire, TruncatedStreamIsDataLoss) {
  const Tensor x = NormalFp32({4, 256}, 7);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  const std::vector<v1::TensorChunk> c = Split("x", x, 1024);
  for (std::size_t i = 0; i + 1 < c.size(); ++i) ASSERT_TRUE(a.Add(c[i]).ok());
  absl::Status s = a.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("received 3072 of 4096 bytes"), absl::string_view::npos) << s;
}

TEST(Wire, AnnouncedButNeverSentIsDataLoss) {
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", NormalFp32({8}, 8))).ok());
  EXPECT_EQ(a.Finish().code(), absl::StatusCode::kDataLoss);
}

TEST(Wire, DigestMismatchIsDataLoss) {
  const Tensor x = NormalFp32({4, 256}, 9);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  std::vector<v1::TensorChunk> c = Split("x", x, 1024);
  // One flipped bit in the middle of the stream.
  (*c[2].mutable_data())[17] ^= 0x10;
  for (const v1::TensorChunk& chunk : c) ASSERT_TRUE(a.Add(chunk).ok());
  absl::Status s = a.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("digest"), absl::string_view::npos) << s;
}

TEST(Wire, OverMaxTotalBytesIsResourceExhaustedNamingTheLimit) {
  Assembler a(10000);
  ASSERT_TRUE(a.Expect(MakeSpec("x", NormalFp32({1500}, 10))).ok());  // 6000 bytes
  // 6000 + 4004 > 10000 although each alone fits.
  absl::Status s = a.Expect(MakeSpec("w", NormalFp32({1001}, 11)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("10000"), absl::string_view::npos) << s;
  EXPECT_EQ(a.total_bytes(), 6000u);
  // Exactly at the limit is fine.
  EXPECT_TRUE(a.Expect(MakeSpec("v", NormalFp32({1000}, 12))).ok());
  EXPECT_EQ(a.total_bytes(), 10000u);
  // A single tensor past the limit.
  Assembler b(100);
  EXPECT_EQ(b.Expect(MakeSpec("x", NormalFp32({26}, 13))).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(Wire, SendChunksSplitsIntoCeilNOverChunkPieces) {
  struct Case {
    std::size_t size, chunk, expected;
  };
  std::vector<std::byte> data(10000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 31 + 7);
  for (const Case& c : {Case{10000, 4096, 3}, Case{8192, 4096, 2}, Case{8193, 4096, 3},
                        Case{1, 4096, 1}, Case{10000, 1, 10000}, Case{0, 4096, 0}}) {
    std::vector<v1::TensorChunk> chunks;
    absl::Status s = SendChunks("t", data.data(), c.size, c.chunk, [&](v1::TensorChunk&& ch) {
      chunks.push_back(std::move(ch));
      return true;
    });
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(chunks.size(), c.expected) << c.size << "/" << c.chunk;
    std::string joined;
    for (const v1::TensorChunk& ch : chunks) {
      EXPECT_EQ(ch.name(), "t");
      EXPECT_EQ(ch.offset(), joined.size());
      EXPECT_LE(ch.data().size(), c.chunk);
      joined += ch.data();
    }
    ASSERT_EQ(joined.size(), c.size);
    EXPECT_EQ(std::memcmp(joined.data(), data.data(), c.size), 0);
  }
}

TEST(Wire, ExpectTakesOverAMatchingRecycledTensorOnly) {
  const Tensor x = NormalFp32({3, 1000}, 1);
  Tensor recycle(DType::kFp32, {3, 1000});
  const std::byte* memory = recycle.bytes();
  Tensor other(DType::kFp32, {1000, 3});  // same bytes, other shape: not taken
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x), &recycle).ok());
  ASSERT_TRUE(a.Expect(MakeSpec("y", x), &other).ok());
  EXPECT_EQ(recycle.nbytes(), 0u);  // moved into the assembler
  EXPECT_EQ(other.nbytes(), x.nbytes());
  for (const v1::TensorChunk& c : Split("x", x, 4096)) ASSERT_TRUE(a.Add(c).ok());
  for (const v1::TensorChunk& c : Split("y", x, 4096)) ASSERT_TRUE(a.Add(c).ok());
  ASSERT_TRUE(a.Finish().ok());
  absl::StatusOr<Tensor> got = a.Take("x");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bytes(), memory);
  EXPECT_EQ(std::memcmp(got->bytes(), x.bytes(), x.nbytes()), 0);
}

TEST(Wire, TakeRefusesATensorNotFullyReceived) {
  const Tensor x = NormalFp32({3, 1000}, 1);
  Assembler a(1u << 20);
  ASSERT_TRUE(a.Expect(MakeSpec("x", x)).ok());
  const std::vector<v1::TensorChunk> xc = Split("x", x, 4096);
  ASSERT_TRUE(a.Add(xc[0]).ok());
  // Half a tensor is never handed out, Finish or not.
  EXPECT_EQ(a.Take("x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(Wire, SendChunksInPlaceFillsOneMessageAndReusesItsBuffer) {
  std::vector<std::byte> data(10000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 13 + 5);
  v1::TensorChunk chunk;
  std::string joined;
  std::vector<const char*> buffers;
  absl::Status s = SendChunksInPlace("y", data.data(), data.size(), 4096, &chunk, [&] {
    EXPECT_EQ(chunk.name(), "y");
    EXPECT_EQ(chunk.offset(), joined.size());
    joined += chunk.data();
    buffers.push_back(chunk.data().data());
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(buffers.size(), 3u);  // 4096 + 4096 + 1808
  ASSERT_EQ(joined.size(), data.size());
  EXPECT_EQ(std::memcmp(joined.data(), data.data(), data.size()), 0);
  // Every chunk was written into the storage the first one allocated.
  EXPECT_EQ(buffers[1], buffers[0]);
  EXPECT_EQ(buffers[2], buffers[0]);

  int calls = 0;
  s = SendChunksInPlace("y", data.data(), data.size(), 1000, &chunk, [&] { return ++calls < 2; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 2);
}

TEST(Wire, SendChunksStopsWhenThePeerIsGone) {
  std::vector<std::byte> data(10000, std::byte{1});
  int calls = 0;
  absl::Status s = SendChunks("t", data.data(), data.size(), 1000, [&](v1::TensorChunk&&) {
    ++calls;
    return calls < 3;
  });
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(calls, 3);
}

TEST(Wire, DTypeProtoRoundTripAndSpec) {
  for (DType d : {DType::kBf16, DType::kFp32, DType::kInt32, DType::kInt64}) {
    absl::StatusOr<DType> back = FromProto(ToProto(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(FromProto(v1::DTYPE_UNSPECIFIED).status().code(), absl::StatusCode::kInvalidArgument);
  Tensor t(DType::kBf16, {2, 3});
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    t.data<Bf16Bits>()[i] = FloatToBf16(static_cast<float>(i));
  }
  const v1::TensorSpec spec = MakeSpec("x", t);
  EXPECT_EQ(spec.name(), "x");
  EXPECT_EQ(spec.dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(spec.shape_size(), 2);
  EXPECT_EQ(spec.shape(0), 2);
  EXPECT_EQ(spec.shape(1), 3);
  EXPECT_EQ(spec.xxh3(), t.Digest());
}

// Tensors of kHashAsideBytes and more are hashed on a thread that follows
// the copies: the digest must be the same, a damaged byte must still be
// caught, and a tensor taken or dropped early must not leave the thread
// reading freed memory.
TEST(Wire, LargeTensorsAreHashedAsideWithTheSameVerdicts) {
  const Tensor y = NormalFp32({static_cast<std::int64_t>(kHashAsideBytes / 4) + 1000}, 7);
  ASSERT_GE(y.nbytes(), kHashAsideBytes);
  const std::vector<v1::TensorChunk> chunks = Split("y", y, 1 << 20);
  for (const bool damage : {false, true}) {
    Assembler a(y.nbytes());
    ASSERT_TRUE(a.Expect(MakeSpec("y", y)).ok());
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      v1::TensorChunk c = chunks[i];
      if (damage && i == chunks.size() / 2) (*c.mutable_data())[12345] ^= 1;
      ASSERT_TRUE(a.Add(c).ok());
    }
    const absl::Status s = a.Finish();
    if (!damage) {
      ASSERT_TRUE(s.ok()) << s;
      absl::StatusOr<Tensor> got = a.Take("y");
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(got->Digest(), y.Digest());
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    }
  }
  {
    // Taken before Finish, then the assembler goes; and one dropped half-way.
    Assembler a(2 * y.nbytes());
    ASSERT_TRUE(a.Expect(MakeSpec("y", y)).ok());
    ASSERT_TRUE(a.Expect(MakeSpec("z", y)).ok());
    for (const v1::TensorChunk& c : chunks) ASSERT_TRUE(a.Add(c).ok());
    v1::TensorChunk first = chunks[0];
    first.set_name("z");
    ASSERT_TRUE(a.Add(first).ok());
    absl::StatusOr<Tensor> got = a.Take("y");
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->Digest(), y.Digest());
  }
}

// ExpectInto: the bytes land in the caller's buffer, checked as usual; the
// tensor cannot be taken, and a buffer too small is refused up front.
TEST(Wire, ExpectIntoFillsTheCallersBufferSmallOrLarge) {
  for (const std::int64_t n :
       {std::int64_t{3000}, static_cast<std::int64_t>(kHashAsideBytes / 4)}) {
    SCOPED_TRACE(n);
    const Tensor t = NormalFp32({n}, 11);
    std::vector<std::byte> buffer(t.nbytes() + 7);
    for (const bool damage : {false, true}) {
      Assembler a(t.nbytes());
      ASSERT_TRUE(a.ExpectInto(MakeSpec("x", t), buffer.data(), buffer.size()).ok());
      std::vector<v1::TensorChunk> chunks = Split("x", t, 1 << 20);
      if (damage) (*chunks.back().mutable_data())[0] ^= 1;
      for (const v1::TensorChunk& c : chunks) ASSERT_TRUE(a.Add(c).ok());
      const absl::Status s = a.Finish();
      if (damage) {
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        continue;
      }
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(std::memcmp(buffer.data(), t.bytes(), t.nbytes()), 0);
      EXPECT_EQ(a.Take("x").status().code(), absl::StatusCode::kFailedPrecondition);
    }
    Assembler small(t.nbytes());
    EXPECT_EQ(small.ExpectInto(MakeSpec("x", t), buffer.data(), t.nbytes() - 1).code(),
              absl::StatusCode::kInternal);
  }
}

// A reception that ends early (a truncated tensor at Finish, or a receiver
// that gives up and calls StopWorkers) returns only once every chunk it was
// given is in the caller's buffer: a large tensor's own thread copies the
// chunks taken from gRPC's slices, and the buffer may go back to its owner
// (and to another call) the moment the reception ends.
TEST(Wire, AReceptionThatEndsEarlyLeavesNoCopyBehind) {
  const Tensor t = NormalFp32({static_cast<std::int64_t>(kHashAsideBytes / 4) * 8}, 13);
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  const std::size_t given = 6 * kChunk;  // of 8 · kHashAsideBytes
  ASSERT_LT(given, t.nbytes());
  for (const bool finish : {true, false}) {
    SCOPED_TRACE(finish ? "Finish on a truncated tensor" : "StopWorkers");
    std::vector<std::byte> buffer(t.nbytes());
    Assembler a(2 * t.nbytes());
    // "a" before "x": Finish meets the truncated "x" after a whole tensor.
    const Tensor small = NormalFp32({1000}, 14);
    ASSERT_TRUE(a.Expect(MakeSpec("a", small)).ok());
    ASSERT_TRUE(a.Add(Split("a", small, 1 << 20)[0]).ok());
    ASSERT_TRUE(a.ExpectInto(MakeSpec("x", t), buffer.data(), buffer.size()).ok());
    for (std::size_t offset = 0; offset < given; offset += kChunk) {
      ChunkView view;
      view.name = "x";
      view.offset = offset;
      view.size = kChunk;
      // In pieces, as gRPC's slices come: the tensor's own thread copies them.
      for (std::size_t p = 0; p < kChunk; p += kChunk / 4) {
        view.pieces.emplace_back(t.bytes() + offset + p, kChunk / 4);
      }
      ASSERT_TRUE(a.Add(std::move(view)).ok());
    }
    if (finish) {
      const absl::Status s = a.Finish();
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    } else {
      a.StopWorkers();
    }
    EXPECT_EQ(std::memcmp(buffer.data(), t.bytes(), given), 0);
  }
}

}  // namespace
}  // namespace logitd::wire

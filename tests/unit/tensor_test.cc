// Tests of logitd::Tensor and its helpers: checked shape arithmetic, dtype
// names, explicit copies and the xxh3 digest every tensor travels with.
#include "logitd/tensor.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"

namespace logitd {
namespace {

TEST(Tensor, CheckedByteCountMultipliesDimsAndElementSize) {
  absl::StatusOr<std::int64_t> n = CheckedByteCount({16, 4096}, DType::kBf16);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 16 * 4096 * 2);
  n = CheckedByteCount({3, 5, 7}, DType::kInt64);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3 * 5 * 7 * 8);
}

TEST(Tensor, CheckedElementCountOverflowIsInvalidArgument) {
  absl::StatusOr<std::int64_t> n =
      CheckedElementCount({std::int64_t{1} << 32, std::int64_t{1} << 32});
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("overflows"), absl::string_view::npos) << n.status();
}

TEST(Tensor, CheckedByteCountOverflowAfterElementSizeIsInvalidArgument) {
  // 2^62 elements fit in int64; 2^62 * 4 bytes do not.
  const std::vector<std::int64_t> shape = {std::int64_t{1} << 31, std::int64_t{1} << 31};
  ASSERT_TRUE(CheckedElementCount(shape).ok());
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, DType::kFp32);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("byte count"), absl::string_view::npos) << n.status();
}

TEST(Tensor, CheckedByteCountZeroOrNegativeDimIsInvalidArgument) {
  EXPECT_EQ(CheckedByteCount({16, 0}, DType::kFp32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedByteCount({-1, 8}, DType::kFp32).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = CheckedByteCount({4, -3}, DType::kBf16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[4, -3]"), absl::string_view::npos) << s;
}

TEST(Tensor, CreateRejectsBadShapeWithInvalidArgument) {
  EXPECT_EQ(Tensor::Create(DType::kFp32, {2, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Tensor::Create(DType::kFp32, {std::int64_t{1} << 40, std::int64_t{1} << 40}).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Tensor> t = Tensor::Create(DType::kBf16, {3, 4});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->numel(), 12);
  EXPECT_EQ(t->nbytes(), 24u);
  EXPECT_EQ(t->rank(), 2);
  EXPECT_EQ(t->dim(1), 4);
}

TEST(Tensor, ParseDTypeAcceptsNamesAndAliases) {
  struct Case {
    const char* name;
    DType dtype;
  };
  for (const Case& c :
       {Case{"bf16", DType::kBf16}, Case{"BF16", DType::kBf16}, Case{"bfloat16", DType::kBf16},
        Case{"fp32", DType::kFp32}, Case{"float32", DType::kFp32}, Case{"F32", DType::kFp32},
        Case{"float", DType::kFp32}, Case{"int32", DType::kInt32}, Case{"i32", DType::kInt32},
        Case{"int64", DType::kInt64}, Case{"I64", DType::kInt64}}) {
    absl::StatusOr<DType> d = ParseDType(c.name);
    ASSERT_TRUE(d.ok()) << c.name << ": " << d.status();
    EXPECT_EQ(*d, c.dtype) << c.name;
  }
  // Names round-trip through DTypeName.
  for (DType d : {DType::kBf16, DType::kFp32, DType::kInt32, DType::kInt64}) {
    absl::StatusOr<DType> back = ParseDType(DTypeName(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
}

TEST(Tensor, ParseDTypeUnknownIsInvalidArgumentNamingIt) {
  for (const char* name : {"fp16", "float64", "", "bf 16"}) {
    absl::Status s = ParseDType(name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(absl::StrCat("'", name, "'")), absl::string_view::npos) << s;
  }
}

TEST(Tensor, ElementSizesAndShapeString) {
  EXPECT_EQ(ElementSize(DType::kBf16), 2u);
  EXPECT_EQ(ElementSize(DType::kFp32), 4u);
  EXPECT_EQ(ElementSize(DType::kInt32), 4u);
  EXPECT_EQ(ElementSize(DType::kInt64), 8u);
  EXPECT_EQ(ShapeString({16, 4096}), "[16, 4096]");
  EXPECT_EQ(ShapeString({}), "[]");
}

TEST(Tensor, CloneIsADeepCopy) {
  Tensor a(DType::kFp32, {4, 5});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = normal(rng);
  Tensor b = a.Clone();
  EXPECT_EQ(b.dtype(), a.dtype());
  EXPECT_EQ(b.shape(), a.shape());
  ASSERT_EQ(b.nbytes(), a.nbytes());
  EXPECT_NE(b.bytes(), a.bytes());
  EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), a.nbytes()), 0);
  EXPECT_EQ(b.Digest(), a.Digest());
  const float before = a.data<float>()[7];
  b.data<float>()[7] += 1.0f;
  EXPECT_EQ(a.data<float>()[7], before);
  EXPECT_NE(b.Digest(), a.Digest());
}

TEST(Tensor, ZeroFilledAtEverySizeAndMovedFromIsEmpty) {
  // Small buffers and the huge-page-aligned ones (8 MiB and up).
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{3} << 20}) {
    Tensor t(DType::kFp32, {n});
    ASSERT_EQ(t.nbytes(), static_cast<std::size_t>(n) * 4);
    std::size_t nonzero = 0;
    for (std::int64_t i = 0; i < n; ++i) nonzero += t.data<float>()[i] != 0.0f;
    EXPECT_EQ(nonzero, 0u) << n;
    t.data<float>()[n - 1] = 7.0f;  // the whole size is writable

    Tensor moved = std::move(t);
    EXPECT_EQ(moved.nbytes(), static_cast<std::size_t>(n) * 4);
    EXPECT_EQ(moved.data<float>()[n - 1], 7.0f);
    EXPECT_EQ(t.nbytes(), 0u);  // NOLINT(bugprone-use-after-move): the documented state
    EXPECT_EQ(t.rank(), 0);
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.bytes(), nullptr);
  }
}

TEST(Tensor, CreateUninitializedHasTheShapeAndChecksItLikeCreate) {
  absl::StatusOr<Tensor> t = Tensor::CreateUninitialized(DType::kBf16, {4096, 1024});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes(), std::size_t{4096} * 1024 * 2);
  std::memset(t->bytes(), 0xab, t->nbytes());
  EXPECT_EQ(t->data<std::uint16_t>()[4096 * 1024 - 1], 0xabab);
  EXPECT_EQ(Tensor::CreateUninitialized(DType::kFp32, {3, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Tensor, DigestIsXxh3OfTheBytes) {
  Tensor t(DType::kBf16, {3, 333});
  std::mt19937 rng(99);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<Bf16Bits>()[i] = static_cast<Bf16Bits>(rng());
  EXPECT_EQ(t.Digest(), XXH3_64bits(t.bytes(), t.nbytes()));
  EXPECT_EQ(Xxh3(t.bytes(), t.nbytes()), XXH3_64bits_withSeed(t.bytes(), t.nbytes(), 0));
  // Changing one bit changes the digest.
  const std::uint64_t before = t.Digest();
  t.data<Bf16Bits>()[500] ^= 1u;
  EXPECT_NE(t.Digest(), before);
}

// CopyXxh3 copies every byte and returns the digest of the whole range, for
// sizes around and across its 256 KiB blocks.
TEST(Tensor, CopyXxh3CopiesAndHashesInOnePass) {
  constexpr std::size_t kBlock = std::size_t{256} << 10;
  std::vector<std::uint8_t> src(3 * kBlock + 777);
  std::mt19937 rng(7);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng());
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{240}, kBlock - 1, kBlock,
                        kBlock + 1, 2 * kBlock, src.size()}) {
    std::vector<std::uint8_t> dst(src.size(), 0xcd);
    EXPECT_EQ(CopyXxh3(dst.data(), src.data(), n), XXH3_64bits(src.data(), n)) << n;
    EXPECT_TRUE(std::equal(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(n), dst.begin()))
        << n;
    EXPECT_TRUE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(n), dst.end(),
                            [](std::uint8_t b) { return b == 0xcd; }))
        << n;
  }
}

TEST(Tensor, AtWidensEachDTypeExactly) {
  Tensor b(DType::kBf16, {2});
  b.data<Bf16Bits>()[0] = 0x3f81;  // 1 + 2^-7
  b.data<Bf16Bits>()[1] = 0xc2f7;  // -123.5
  EXPECT_EQ(b.At(0), 1.0 + 1.0 / 128);
  EXPECT_EQ(b.At(1), -123.5);
  Tensor i64(DType::kInt64, {1});
  i64.data<std::int64_t>()[0] = (std::int64_t{1} << 52) + 1;
  EXPECT_EQ(i64.At(0), 4503599627370497.0);
  Tensor i32(DType::kInt32, {1});
  i32.data<std::int32_t>()[0] = -2147483647;
  EXPECT_EQ(i32.At(0), -2147483647.0);
}

}  // namespace
}  // namespace logitd

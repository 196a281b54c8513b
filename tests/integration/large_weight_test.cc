// A weight past 2 GiB (V * K * 2 > 2^31 bytes): byte offsets into it overflow
// 32 bits, so every index on the path (client chunking, server reassembly,
// the backend's GEMM) must be 64-bit. W follows a formula that makes every
// logit cheap to verify exactly and tells rows apart across the 2 GiB mark.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

constexpr std::int64_t kV = 262400;
constexpr std::int64_t kK = 4096;
static_assert(kV * kK * 2 > (std::int64_t{1} << 31), "the weight must pass 2 GiB");

// W[v, k] = B(v mod 17, k) for k >= 1 and W[v, 0] = C(v) with
// B(r, k) = ((7r + 3k) mod 17) - 8 and C(v) = ((v / 17) mod 13) - 6: every
// value is a small integer, and rows repeat only every 17 * 13 = 221.
int Base(std::int64_t r, std::int64_t k) { return static_cast<int>((7 * r + 3 * k) % 17) - 8; }
int Column0(std::int64_t v) { return static_cast<int>((v / 17) % 13) - 6; }

TEST(LargeWeightTest, WeightPast2GiBServesExactLogits) {
  // The server holds one copy of W and the cpu backend works from it; the
  // client's copy is freed right after the upload.
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;

  std::string handle;
  {
    Tensor w(DType::kBf16, {kV, kK});
    Bf16Bits* p = w.data<Bf16Bits>();
    std::vector<Bf16Bits> row_pattern[17];
    for (int r = 0; r < 17; ++r) {
      row_pattern[r].resize(kK);
      for (std::int64_t k = 0; k < kK; ++k) {
        row_pattern[r][k] = FloatToBf16(static_cast<float>(Base(r, k)));
      }
    }
    for (std::int64_t v = 0; v < kV; ++v) {
      Bf16Bits* row = p + v * kK;
      const std::vector<Bf16Bits>& pattern = row_pattern[v % 17];
      std::copy(pattern.begin(), pattern.end(), row);
      row[0] = FloatToBf16(static_cast<float>(Column0(v)));
    }
    absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "lm_head_past_2GiB");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->shape, (std::vector<std::int64_t>{kV, kK}));
    EXPECT_EQ(info->xxh3, w.Digest());
    handle = info->handle;
  }

  const std::int64_t m = 3;
  Tensor x = IntBf16({m, kK}, 901);
  for (std::int64_t i = 0; i < m; ++i) {
    x.data<Bf16Bits>()[i * kK] = FloatToBf16(static_cast<float>(i + 1));  // X[i, 0] != 0
  }
  // partial[i][r] = sum_{k >= 1} X[i, k] * B(r, k).
  std::vector<std::int64_t> partial(static_cast<std::size_t>(m * 17), 0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (int r = 0; r < 17; ++r) {
      std::int64_t s = 0;
      for (std::int64_t k = 1; k < kK; ++k) {
        s += static_cast<std::int64_t>(x.At(i * kK + k)) * Base(r, k);
      }
      partial[i * 17 + r] = s;
    }
  }

  absl::StatusOr<Tensor> y = c.Logits(x, handle);
  ASSERT_TRUE(y.ok()) << y.status();
  std::vector<std::int64_t> exact(static_cast<std::size_t>(m * kV));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t v = 0; v < kV; ++v) {
      exact[i * kV + v] = partial[i * 17 + v % 17] + (i + 1) * Column0(v);
    }
  }
  EXPECT_TRUE(Fp32EqualsExact(*y, exact, {m, kV}));
  // The rows 2^31 bytes in (v >= 262144) are the ones a 32-bit offset loses.
  EXPECT_EQ(y->data<float>()[kV - 1], static_cast<float>(exact[kV - 1]));

  absl::StatusOr<std::uint64_t> freed = c.ReleaseWeight(handle);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, static_cast<std::uint64_t>(kV * kK * 2));
  EXPECT_TRUE(ServerAnswers(c));
}

}  // namespace
}  // namespace logitd::testing

// The harness's references and numerics: bounds, ULP distances, rounding,
// the IEEE predictor, the blocked dgemm references against plain loops, and
// the stability of the seeded data that golden baselines depend on.
#include "logitd/reference/numerics.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "client/validate/random.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(GammaTest, MatchesDefinitionAndSaturates) {
  EXPECT_DOUBLE_EQ(Gamma(1, 0.5), 1.0);
  const double u = kFp32UnitRoundoff;
  EXPECT_DOUBLE_EQ(Gamma(4096, u), 4096 * u / (1 - 4096 * u));
  EXPECT_TRUE(std::isinf(Gamma(std::int64_t{1} << 24, u)));
}

TEST(UlpDistanceTest, CountsRepresentableValues) {
  EXPECT_EQ(UlpDistanceFp32(FloatBits(1.0f), FloatBits(std::nextafter(1.0f, 2.0f))), 1);
  EXPECT_EQ(UlpDistanceFp32(FloatBits(0.0f), FloatBits(-0.0f)), 0);
  // Across zero: the smallest subnormals on both sides are 2 apart.
  EXPECT_EQ(UlpDistanceFp32(0x00000001u, 0x80000001u), 2);
  EXPECT_EQ(UlpDistanceFp32(FloatBits(std::numeric_limits<float>::max()), FloatBits(kInf)), 1);
  EXPECT_EQ(UlpDistanceFp32(FloatBits(kNan), 0x7fc00001u), 0);
  EXPECT_EQ(UlpDistanceFp32(FloatBits(kNan), FloatBits(1.0f)),
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(UlpDistanceBf16(0x3f80, 0x3f81), 1);
  EXPECT_EQ(UlpDistanceBf16(0x3f80, 0xbf80), 2 * 0x3f80);
}

TEST(RoundToFp32Test, OverflowsAtHalfAnUlpPastMax) {
  const double max = std::numeric_limits<float>::max();
  EXPECT_EQ(RoundToFp32(max), std::numeric_limits<float>::max());
  EXPECT_EQ(RoundToFp32(0x1p128 - 0x1p103 - 0x1p80), std::numeric_limits<float>::max());
  EXPECT_EQ(RoundToFp32(0x1p128 - 0x1p103), kInf);
  EXPECT_EQ(RoundToFp32(-0x1p129), -kInf);
  EXPECT_TRUE(std::isnan(RoundToFp32(std::nan(""))));
  EXPECT_EQ(RoundToFp32(0x1p-160), 0.0f);
}

TEST(PredictIeeeDotTest, PropagatesAsIeeeSays) {
  const float bf16_max = Bf16ToFloat(0x7f7f);
  {
    const float a[] = {kInf, 1, 2};
    const float b[] = {0, 3, 4};
    const IeeeDot d = PredictIeeeDot(a, 1, b, 1, 3);
    EXPECT_TRUE(std::isnan(d.value));  // Inf·0
    EXPECT_TRUE(d.order_independent);
  }
  {
    const float a[] = {bf16_max, 1};
    const float b[] = {2, 5};
    EXPECT_EQ(PredictIeeeDot(a, 1, b, 1, 2).value, kInf);  // the product overflows
  }
  {
    const float a[] = {bf16_max, 1, 1};
    const float b[] = {1, 3, -2};
    const IeeeDot d = PredictIeeeDot(a, 1, b, 1, 3);
    EXPECT_EQ(d.value, bf16_max);  // small terms are absorbed in any order
    EXPECT_TRUE(d.order_independent);
  }
  {
    const float a[] = {kInf, 1};
    const float b[] = {1, -kInf};
    EXPECT_TRUE(std::isnan(PredictIeeeDot(a, 1, b, 1, 2).value));  // Inf − Inf
  }
  {
    // max + max − max: Inf one way, max the other: not a usable test input.
    const float a[] = {bf16_max, bf16_max, bf16_max};
    const float b[] = {1, 1, -1};
    EXPECT_FALSE(PredictIeeeDot(a, 1, b, 1, 3).order_independent);
  }
  {
    const float a[] = {Bf16ToFloat(0x0001), 0};
    const float b[] = {3, 7};
    EXPECT_EQ(PredictIeeeDot(a, 1, b, 1, 2).value, 3 * Bf16ToFloat(0x0001));  // subnormal
  }
}

TEST(CompareTest, Bf16OutputsCompareWithRoundedWants) {
  Tensor t(DType::kBf16, {3});
  t.data<Bf16Bits>()[0] = FloatToBf16(1.0f);
  t.data<Bf16Bits>()[1] = FloatToBf16(-0.0f);
  t.data<Bf16Bits>()[2] = 0x7fc1;
  const float want[] = {1.0f + 0x1p-10f, 0.0f, kNan};
  EXPECT_EQ(CompareWith(t, want, 3, {true, true}).differing, 0);
  EXPECT_EQ(CompareWith(t, want, 3, {false, true}).differing, 1);  // -0 vs +0
  const BitwiseComparison strict = CompareWith(t, want, 3, {false, false});
  EXPECT_EQ(strict.differing, 2);
  EXPECT_EQ(strict.first_index, 1);
}

TEST(CompareTest, CountsAndDescribesDifferences) {
  Tensor a(DType::kFp32, {2, 2});
  Tensor b(DType::kFp32, {2, 2});
  for (int i = 0; i < 4; ++i) a.data<float>()[i] = b.data<float>()[i] = static_cast<float>(i);
  b.data<std::uint32_t>()[3] ^= 1;
  const BitwiseComparison c = CompareTensors(a, b);
  EXPECT_EQ(c.differing, 1);
  EXPECT_EQ(c.max_ulp, 1);
  EXPECT_EQ(IndexString(c.first_index, {2, 2}), "[1, 1]");
  EXPECT_NE(c.Describe({2, 2}).find("1 of 4 elements differ"), std::string::npos);
}

// Y = X·Wᵀ, dX = G·W and dW = Gᵀ·X from dgemm in blocks equal plain fp64
// loops; small integers make both exact, so they must agree exactly.
TEST(ReferenceTest, BlockedDgemmMatchesLoops) {
  const std::int64_t m = 3, n = 7, k = 5;
  Rng rng(42);
  const Tensor x = RandomIntegers(DType::kBf16, {m, k}, -8, 8, rng);
  const Tensor w = RandomIntegers(DType::kBf16, {n, k}, -8, 8, rng);
  const Tensor g = RandomIntegers(DType::kBf16, {m, n}, -8, 8, rng);
  const std::vector<double> xd = ToDouble(x), gd = ToDouble(g);
  for (std::int64_t block : {std::int64_t{1}, k * 2, kReferenceBlockElements}) {
    std::vector<double> y(m * n), y_abs(m * n);
    ReferenceXWt(xd, m, AsMatrix(w), y.data(), y_abs.data(), block);
    std::vector<double> dx(m * k), dx_abs(m * k);
    ReferenceGW(gd, m, AsMatrix(w), dx.data(), dx_abs.data(), block);
    std::vector<double> dw(n * k, -1), dw_abs(n * k, -1);
    ReferenceGtX(
        gd, xd, m, n, k, true,
        [&](std::int64_t row0, std::int64_t rows, const double* v, const double* a) {
          std::memcpy(dw.data() + row0 * k, v, sizeof(double) * rows * k);
          std::memcpy(dw_abs.data() + row0 * k, a, sizeof(double) * rows * k);
        },
        block);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0, sa = 0;
        for (std::int64_t t = 0; t < k; ++t) {
          s += x.At(i * k + t) * w.At(j * k + t);
          sa += std::fabs(x.At(i * k + t) * w.At(j * k + t));
        }
        EXPECT_EQ(y[i * n + j], s) << "block " << block;
        EXPECT_EQ(y_abs[i * n + j], sa);
      }
      for (std::int64_t j = 0; j < k; ++j) {
        double s = 0, sa = 0;
        for (std::int64_t t = 0; t < n; ++t) {
          s += g.At(i * n + t) * w.At(t * k + j);
          sa += std::fabs(g.At(i * n + t) * w.At(t * k + j));
        }
        EXPECT_EQ(dx[i * k + j], s) << "block " << block;
        EXPECT_EQ(dx_abs[i * k + j], sa);
      }
    }
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < k; ++j) {
        double s = 0, sa = 0;
        for (std::int64_t t = 0; t < m; ++t) {
          s += g.At(t * n + r) * x.At(t * k + j);
          sa += std::fabs(g.At(t * n + r) * x.At(t * k + j));
        }
        EXPECT_EQ(dw[r * k + j], s) << "block " << block;
        EXPECT_EQ(dw_abs[r * k + j], sa);
      }
    }
  }
}

TEST(RandomTest, SeedsNameTheSameData) {
  Rng a = Rng::Stream(1234, "x", 512);
  Rng b = Rng::Stream(1234, "x", 512);
  Rng c = Rng::Stream(1234, "x", 1024);
  const std::uint64_t first = a.Next();
  EXPECT_EQ(first, b.Next());
  EXPECT_NE(first, c.Next());
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t v = a.UniformInt(-8, 8);
    ASSERT_GE(v, -8);
    ASSERT_LE(v, 8);
  }
}

// The ziggurat must give a standard normal: moments and tail masses of a
// million draws within a few standard errors of N(0, 1)'s.
TEST(RandomTest, NormalIsStandardNormal) {
  Rng rng(1234);
  const int n = 1000000;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  int beyond_1 = 0, beyond_2 = 0, beyond_3 = 0, beyond_r = 0;
  for (int i = 0; i < n; ++i) {
    const double v = rng.Normal();
    sum += v;
    sum_sq += v * v;
    sum_4 += v * v * v * v;
    beyond_1 += std::fabs(v) > 1;
    beyond_2 += std::fabs(v) > 2;
    beyond_3 += std::fabs(v) > 3;
    beyond_r += std::fabs(v) > 3.6541528853610088;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.005);
  EXPECT_NEAR(sum_4 / n, 3.0, 0.05);
  EXPECT_NEAR(beyond_1 / double(n), 0.317311, 0.002);
  EXPECT_NEAR(beyond_2 / double(n), 0.0455003, 0.001);
  EXPECT_NEAR(beyond_3 / double(n), 0.0026998, 0.0003);
  EXPECT_NEAR(beyond_r / double(n), 0.000258, 0.0001);  // the tail beyond R is drawn
}

// Golden baselines store a digest of their inputs; these inputs must never
// change silently, so their bytes are pinned here.
TEST(RandomTest, PortableDataIsPinned) {
  Rng rng = Rng::Stream(0x676f6c64656e0001ull, "x1024");
  const Tensor t = PortableBell(DType::kBf16, {16, 1024}, rng);
  EXPECT_EQ(t.Digest(), 0xb53e6c58f63f469bull) << std::hex << t.Digest();
  double sum = 0, sum_sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    sum += t.At(i);
    sum_sq += t.At(i) * t.At(i);
  }
  EXPECT_NEAR(sum / t.numel(), 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sum_sq / t.numel()), 1.15, 0.05);
}

}  // namespace
}  // namespace logitd::validate

// Tests of the cpu backend against host references: integer-valued operands
// give exact answers (checked bitwise), random data is checked against an
// fp64 reference within the fp32 accumulation bound, and the backward
// contract G = bf16(dY) is checked bitwise.
#include "server/kernels/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "server/kernels/ops/cast.h"
#include "tests/common/row_block_cuts.h"

namespace logitd::kernels {
namespace {

constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // u = 2^-24 for fp32

// gamma_n = n u / (1 - n u): the classic bound on the relative error of an
// n-term fp32 dot product, |fl(x.w) - x.w| <= gamma_n sum |x_k w_k|.
double Gamma(std::int64_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1.0 - nu);
}

// Row-major integer matrix with entries in [lo, hi], kept as ints for exact
// references and as bf16 for the backend (every such integer is a bf16).
struct IntMatrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::int32_t> v;
  std::vector<Bf16Bits> bf16;
  std::vector<float> fp32;

  std::int32_t at(std::int64_t r, std::int64_t c) const {
    return v[static_cast<std::size_t>(r * cols + c)];
  }
};

IntMatrix RandomInts(std::int64_t rows, std::int64_t cols, int lo, int hi, std::uint32_t seed) {
  IntMatrix m;
  m.rows = rows;
  m.cols = cols;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  const auto n = static_cast<std::size_t>(rows * cols);
  m.v.resize(n);
  m.bf16.resize(n);
  m.fp32.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    m.v[i] = dist(rng);
    m.fp32[i] = static_cast<float>(m.v[i]);
    m.bf16[i] = FloatToBf16(m.fp32[i]);
  }
  return m;
}

// Standard-normal values rounded to bf16, widened back for references.
struct Bf16Matrix {
  std::vector<Bf16Bits> bits;
  std::vector<double> values;
};

Bf16Matrix RandomNormalBf16(std::int64_t n, std::uint32_t seed) {
  Bf16Matrix m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  m.bits.resize(static_cast<std::size_t>(n));
  m.values.resize(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < m.bits.size(); ++i) {
    m.bits[i] = FloatToBf16(normal(rng));
    m.values[i] = Bf16ToFloat(m.bits[i]);
  }
  return m;
}

std::vector<float> RandomNormalFp32(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& f : v) f = normal(rng);
  return v;
}

// Exact X[M, K] . W[V, K]^T in integers.
std::vector<std::int64_t> ExactXWt(const IntMatrix& x, const IntMatrix& w) {
  std::vector<std::int64_t> y(static_cast<std::size_t>(x.rows * w.rows));
  for (std::int64_t i = 0; i < x.rows; ++i) {
    for (std::int64_t j = 0; j < w.rows; ++j) {
      std::int64_t s = 0;
      for (std::int64_t k = 0; k < x.cols; ++k) s += std::int64_t{x.at(i, k)} * w.at(j, k);
      y[static_cast<std::size_t>(i * w.rows + j)] = s;
    }
  }
  return y;
}

// Exact A[M, N] . B[N, P] in integers.
std::vector<std::int64_t> ExactAB(const IntMatrix& a, const IntMatrix& b) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(a.rows * b.cols), 0);
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t n = 0; n < a.cols; ++n) {
      const std::int64_t an = a.at(i, n);
      for (std::int64_t p = 0; p < b.cols; ++p) {
        c[static_cast<std::size_t>(i * b.cols + p)] += an * b.at(n, p);
      }
    }
  }
  return c;
}

// Exact A[N, M]^T . B[N, P] in integers.
std::vector<std::int64_t> ExactAtB(const IntMatrix& a, const IntMatrix& b) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(a.cols * b.cols), 0);
  for (std::int64_t n = 0; n < a.rows; ++n) {
    for (std::int64_t i = 0; i < a.cols; ++i) {
      const std::int64_t an = a.at(n, i);
      for (std::int64_t p = 0; p < b.cols; ++p) {
        c[static_cast<std::size_t>(i * b.cols + p)] += an * b.at(n, p);
      }
    }
  }
  return c;
}

// The sums must be exactly representable for a bitwise check to mean anything.
void ExpectAllBelow2To24(const std::vector<std::int64_t>& v) {
  for (std::int64_t s : v) ASSERT_LT(std::llabs(s), std::int64_t{1} << 24);
}

class CpuBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = cpu::CreateCpuBackend(BackendOptions{});
    ASSERT_NE(backend_, nullptr);
  }

  std::shared_ptr<Weight> Load(const std::vector<Bf16Bits>& w, std::int64_t v, std::int64_t k) {
    absl::StatusOr<std::shared_ptr<Weight>> loaded = backend_->LoadWeight(w.data(), v, k);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : nullptr;
  }

  std::vector<float> LogitsF32(const Weight& w, const std::vector<Bf16Bits>& x, std::int64_t m,
                               float alpha = 1.0f) {
    std::vector<float> y(static_cast<std::size_t>(m * w.v()), -1.0f);
    LogitsArgs args;
    args.x = x.data();
    args.m = m;
    args.alpha = alpha;
    args.out_dtype = DType::kFp32;
    args.y = y.data();
    absl::Status s = backend_->Logits(w, args, nullptr);
    EXPECT_TRUE(s.ok()) << s;
    return y;
  }

  std::vector<Bf16Bits> LogitsBf16(const Weight& w, const std::vector<Bf16Bits>& x, std::int64_t m,
                                   float alpha = 1.0f) {
    std::vector<Bf16Bits> y(static_cast<std::size_t>(m * w.v()), 0xffff);
    LogitsArgs args;
    args.x = x.data();
    args.m = m;
    args.alpha = alpha;
    args.out_dtype = DType::kBf16;
    args.y = y.data();
    absl::Status s = backend_->Logits(w, args, nullptr);
    EXPECT_TRUE(s.ok()) << s;
    return y;
  }

  std::unique_ptr<Backend> backend_;
};

void CheckIntegerExactLogits(Backend& backend, std::int64_t m, std::int64_t v, std::int64_t k,
                             std::uint32_t seed) {
  const IntMatrix x = RandomInts(m, k, -8, 8, seed);
  const IntMatrix w = RandomInts(v, k, -8, 8, seed + 1);
  const std::vector<std::int64_t> exact = ExactXWt(x, w);
  ExpectAllBelow2To24(exact);
  absl::StatusOr<std::shared_ptr<Weight>> weight = backend.LoadWeight(w.bf16.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::vector<float> y(exact.size(), std::numeric_limits<float>::quiet_NaN());
  LogitsArgs args;
  args.x = x.bf16.data();
  args.m = m;
  args.y = y.data();
  ASSERT_TRUE(backend.Logits(**weight, args, nullptr).ok());
  for (std::size_t i = 0; i < exact.size(); ++i) {
    ASSERT_EQ(FloatBits(y[i]), FloatBits(static_cast<float>(exact[i]))) << "element " << i;
  }
}

TEST_F(CpuBackend, OffersNoEngineForTheReferences) {
  // Its references' products are OpenBLAS's on the host.
  std::shared_ptr<Weight> w = Load(std::vector<Bf16Bits>(8 * 4, FloatToBf16(1.0f)), 8, 4);
  ASSERT_NE(w, nullptr);
  absl::StatusOr<std::shared_ptr<Fp64Products>> engine = backend_->ReferenceProducts(*w);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(*engine, nullptr);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_IntegerExactK512) {
  CheckIntegerExactLogits(*backend_, 16, 1000, 512, 11);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_IntegerExactK4096) {
  CheckIntegerExactLogits(*backend_, 16, 512, 4096, 12);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_IntegerExactSingleRow) {
  CheckIntegerExactLogits(*backend_, 1, 300, 4096, 13);
}

// The service's row blocks (LogitsHeader.pipeline) cut a call at multiples
// of LogitsBlockRows, the last block taking the rest: every element keeps
// the bits of the whole call, random operands and all.
TEST_F(CpuBackend, LogitsCutAtItsBlockRowsIsTheWholeCall) {
  ::logitd::testing::ExpectLogitsCutIsTheWholeCall(
      *backend_, {/*v=*/300, /*k=*/512, /*ms=*/{7, 256, 700, 1029}, 0, /*seed=*/5},
      [](std::int64_t m, DType, std::int64_t rows) {
        EXPECT_EQ(rows, std::min<std::int64_t>(m, 256));
      });
}

// LogProbs cut at multiples of LogProbsBlockRows (the service's row blocks)
// gives every output the bits of the whole call, each block walking the
// vocabulary with its own chunk; and the cross-entropy's loss stays bitwise
// -logprob past one block (its first pass forms the same products).
TEST_F(CpuBackend, LogProbsCutAtItsBlockRowsIsTheWholeCall) {
  ::logitd::testing::ExpectLogProbsCutIsTheWholeCall(
      *backend_,
      {/*v=*/300, /*k=*/512, /*ms=*/{7, 256, 700, 1029}, /*block_rows=*/256, /*seed=*/6});
}

// CrossEntropy without dW cut at multiples of CrossEntropyBlockRows: loss,
// lse and dX (fp32 and bf16) keep the whole call's bits, z-loss, soft-cap,
// ignored tokens and a scale for a mean included.
TEST_F(CpuBackend, CrossEntropyCutAtItsBlockRowsIsTheWholeCall) {
  ::logitd::testing::ExpectCrossEntropyCutIsTheWholeCall(
      *backend_,
      {/*v=*/300, /*k=*/384, /*ms=*/{7, 256, 700, 1029}, /*block_rows=*/256, /*seed=*/8});
}

TEST_F(CpuBackend, LogitsBf16Bf16Bf16_IsRneOfExactSumK4096) {
  const std::int64_t m = 16, v = 512, k = 4096;
  const IntMatrix x = RandomInts(m, k, -8, 8, 21);
  const IntMatrix w = RandomInts(v, k, -8, 8, 22);
  const std::vector<std::int64_t> exact = ExactXWt(x, w);
  ExpectAllBelow2To24(exact);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  const std::vector<Bf16Bits> y = LogitsBf16(*weight, x.bf16, m);
  int rounded = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const float s = static_cast<float>(exact[i]);
    ASSERT_EQ(y[i], FloatToBf16(s)) << "element " << i << " exact " << exact[i];
    if (RoundToBf16(s) != s) ++rounded;
  }
  // The sums need more than bf16's 8 significant bits, so rounding happened.
  EXPECT_GT(rounded, static_cast<int>(exact.size() / 2));
}

void CheckRandomWithinBound(Backend& backend, std::int64_t m, std::int64_t v, std::int64_t k,
                            float alpha, std::uint32_t seed) {
  const Bf16Matrix x = RandomNormalBf16(m * k, seed);
  const Bf16Matrix w = RandomNormalBf16(v * k, seed + 1);
  absl::StatusOr<std::shared_ptr<Weight>> weight = backend.LoadWeight(w.bits.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::vector<float> y(static_cast<std::size_t>(m * v));
  LogitsArgs args;
  args.x = x.bits.data();
  args.m = m;
  args.alpha = alpha;
  args.y = y.data();
  ASSERT_TRUE(backend.Logits(**weight, args, nullptr).ok());
  // Scaling by alpha adds one rounding: gamma_{K+1}.
  const double gamma = alpha == 1.0f ? Gamma(k) : Gamma(k + 1);
  double worst_ratio = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      double ref = 0, abs_sum = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double p = x.values[static_cast<std::size_t>(i * k + kk)] *
                         w.values[static_cast<std::size_t>(j * k + kk)];
        ref += p;
        abs_sum += std::fabs(p);
      }
      ref *= alpha;
      const double bound = gamma * std::fabs(alpha) * abs_sum;
      const double err =
          std::fabs(static_cast<double>(y[static_cast<std::size_t>(i * v + j)]) - ref);
      ASSERT_LE(err, bound) << "Y[" << i << ", " << j << "] ref " << ref;
      worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  // fp32 accumulation errs at all: the reference is not just the fp32 result.
  EXPECT_GT(worst_ratio, 0.0);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_RandomNormalWithinFp32BoundK512) {
  CheckRandomWithinBound(*backend_, 16, 1024, 512, 1.0f, 31);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_RandomNormalWithinFp32BoundK4096) {
  CheckRandomWithinBound(*backend_, 16, 1024, 4096, 1.0f, 32);
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_AlphaWithinFp32BoundK4096) {
  CheckRandomWithinBound(*backend_, 8, 512, 4096, 0.1f, 33);
  CheckRandomWithinBound(*backend_, 8, 512, 4096, -3.7f, 34);
}

TEST_F(CpuBackend, LogitsAlphaScalesTheFp32AccumulatorOnce) {
  // Y(alpha) = fl(alpha * Y(1)), bitwise, for fp32 out; bf16 out rounds that.
  const std::int64_t m = 8, v = 512, k = 2048;
  const Bf16Matrix x = RandomNormalBf16(m * k, 35);
  const Bf16Matrix w = RandomNormalBf16(v * k, 36);
  std::shared_ptr<Weight> weight = Load(w.bits, v, k);
  ASSERT_NE(weight, nullptr);
  const std::vector<float> y1 = LogitsF32(*weight, x.bits, m);
  for (float alpha : {0.1f, -3.7f, 1.0f / 3.0f}) {
    const std::vector<float> y = LogitsF32(*weight, x.bits, m, alpha);
    const std::vector<Bf16Bits> yb = LogitsBf16(*weight, x.bits, m, alpha);
    for (std::size_t i = 0; i < y1.size(); ++i) {
      ASSERT_EQ(FloatBits(y[i]), FloatBits(alpha * y1[i])) << "alpha " << alpha << " " << i;
      ASSERT_EQ(yb[i], FloatToBf16(alpha * y1[i])) << "alpha " << alpha << " " << i;
    }
  }
}

TEST_F(CpuBackend, LogitsBf16Bf16F32_PowerOfTwoAlphaIntegerExact) {
  const std::int64_t m = 8, v = 256, k = 1024;
  const IntMatrix x = RandomInts(m, k, -8, 8, 41);
  const IntMatrix w = RandomInts(v, k, -8, 8, 42);
  const std::vector<std::int64_t> exact = ExactXWt(x, w);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  for (float alpha : {0.5f, -2.0f, 0.125f}) {
    const std::vector<float> y = LogitsF32(*weight, x.bf16, m, alpha);
    const std::vector<Bf16Bits> yb = LogitsBf16(*weight, x.bf16, m, alpha);
    for (std::size_t i = 0; i < exact.size(); ++i) {
      const float want = alpha * static_cast<float>(exact[i]);  // exact: power of two
      ASSERT_EQ(FloatBits(y[i]), FloatBits(want)) << "alpha " << alpha << " element " << i;
      ASSERT_EQ(yb[i], FloatToBf16(want)) << "alpha " << alpha << " element " << i;
    }
  }
}

TEST_F(CpuBackend, LogitsNonFiniteInputsPropagate) {
  const std::int64_t m = 4, v = 6, k = 64;
  IntMatrix x = RandomInts(m, k, 1, 8, 51);  // positive: no 0 * Inf
  IntMatrix w = RandomInts(v, k, 1, 8, 52);
  const std::vector<std::int64_t> exact = ExactXWt(x, w);
  x.bf16[5] = FloatToBf16(std::numeric_limits<float>::quiet_NaN());         // row 0 of X
  w.bf16[3 * k + 7] = FloatToBf16(std::numeric_limits<float>::infinity());  // row 3 of W
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  const std::vector<float> y = LogitsF32(*weight, x.bf16, m);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      const float got = y[static_cast<std::size_t>(i * v + j)];
      if (i == 0) {
        EXPECT_TRUE(std::isnan(got)) << i << "," << j;
      } else if (j == 3) {
        EXPECT_EQ(got, std::numeric_limits<float>::infinity()) << i << "," << j;
      } else {
        EXPECT_EQ(got, static_cast<float>(exact[static_cast<std::size_t>(i * v + j)]));
      }
    }
  }
  // alpha = 0 still multiplies: 0 * NaN and 0 * Inf are NaN, not 0.
  const std::vector<float> y0 = LogitsF32(*weight, x.bf16, m, 0.0f);
  EXPECT_TRUE(std::isnan(y0[0 * v + 2]));
  EXPECT_TRUE(std::isnan(y0[1 * v + 3]));
  EXPECT_EQ(FloatBits(y0[1 * v + 2]), 0u);
  // bf16 out keeps them too.
  const std::vector<Bf16Bits> yb = LogitsBf16(*weight, x.bf16, m);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(yb[0])));
  EXPECT_EQ(yb[1 * v + 3], 0x7f80);
}

struct BackwardOut {
  std::vector<float> dx_f32;
  std::vector<Bf16Bits> dx_bf16;
  std::vector<float> dw_f32;
  std::vector<Bf16Bits> dw_bf16;
};

// One Backward call per output dtype combination that is asked for.
BackwardOut RunBackward(Backend& backend, Weight& w, const void* dy, DType dy_dtype,
                        const std::vector<Bf16Bits>& x, std::int64_t m) {
  BackwardOut out;
  const auto mk = static_cast<std::size_t>(m * w.k());
  const auto vk = static_cast<std::size_t>(w.v() * w.k());
  out.dx_f32.assign(mk, -1.0f);
  out.dx_bf16.assign(mk, 0xffff);
  out.dw_f32.assign(vk, -1.0f);
  out.dw_bf16.assign(vk, 0xffff);
  BackwardArgs args;
  args.dy = dy;
  args.dy_dtype = dy_dtype;
  args.x = x.data();
  args.m = m;
  args.dx = out.dx_f32.data();
  args.dx_dtype = DType::kFp32;
  args.dw = out.dw_f32.data();
  args.dw_dtype = DType::kFp32;
  absl::Status s = backend.Backward(w, args, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  args.dx = out.dx_bf16.data();
  args.dx_dtype = DType::kBf16;
  args.dw = out.dw_bf16.data();
  args.dw_dtype = DType::kBf16;
  s = backend.Backward(w, args, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST_F(CpuBackend, BackwardBf16Bf16F32_IntegerExactDxDw) {
  const std::int64_t m = 16, v = 1024, k = 512;
  const IntMatrix x = RandomInts(m, k, -8, 8, 61);
  const IntMatrix w = RandomInts(v, k, -8, 8, 62);
  const IntMatrix dy = RandomInts(m, v, -8, 8, 63);
  const std::vector<std::int64_t> dx = ExactAB(dy, w);   // [m, K], width V
  const std::vector<std::int64_t> dw = ExactAtB(dy, x);  // [V, K], width m
  ExpectAllBelow2To24(dx);
  ExpectAllBelow2To24(dw);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  const BackwardOut out = RunBackward(*backend_, *weight, dy.fp32.data(), DType::kFp32, x.bf16, m);
  int dx_rounded = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) {
    const float want = static_cast<float>(dx[i]);
    ASSERT_EQ(FloatBits(out.dx_f32[i]), FloatBits(want)) << "dX " << i;
    ASSERT_EQ(out.dx_bf16[i], FloatToBf16(want)) << "dX " << i;
    if (RoundToBf16(want) != want) ++dx_rounded;
  }
  EXPECT_GT(dx_rounded, 0);
  for (std::size_t i = 0; i < dw.size(); ++i) {
    const float want = static_cast<float>(dw[i]);
    ASSERT_EQ(FloatBits(out.dw_f32[i]), FloatBits(want)) << "dW " << i;
    ASSERT_EQ(out.dw_bf16[i], FloatToBf16(want)) << "dW " << i;
  }
}

TEST_F(CpuBackend, BackwardRoundsFp32DyToBf16BeforeTheGemms) {
  // dY = n (1 + 2^-10): bf16 keeps 8 significant bits, so RNE gives back n
  // exactly and dX, dW are the integer sums; an unrounded dY would not be.
  const std::int64_t m = 8, v = 512, k = 256;
  const IntMatrix x = RandomInts(m, k, -8, 8, 71);
  const IntMatrix w = RandomInts(v, k, -8, 8, 72);
  const IntMatrix dy = RandomInts(m, v, -8, 8, 73);
  std::vector<float> dy_perturbed(dy.fp32.size());
  for (std::size_t i = 0; i < dy_perturbed.size(); ++i) {
    dy_perturbed[i] = dy.fp32[i] * (1.0f + std::ldexp(1.0f, -10));
    ASSERT_EQ(RoundToBf16(dy_perturbed[i]), dy.fp32[i]);
  }
  const std::vector<std::int64_t> dx = ExactAB(dy, w);
  const std::vector<std::int64_t> dw = ExactAtB(dy, x);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  const BackwardOut out =
      RunBackward(*backend_, *weight, dy_perturbed.data(), DType::kFp32, x.bf16, m);
  for (std::size_t i = 0; i < dx.size(); ++i) {
    ASSERT_EQ(FloatBits(out.dx_f32[i]), FloatBits(static_cast<float>(dx[i]))) << "dX " << i;
  }
  for (std::size_t i = 0; i < dw.size(); ++i) {
    ASSERT_EQ(FloatBits(out.dw_f32[i]), FloatBits(static_cast<float>(dw[i]))) << "dW " << i;
  }
}

TEST_F(CpuBackend, BackwardFromFp32DyEqualsBackwardFromBf16DyBitwise) {
  const std::int64_t m = 16, v = 2048, k = 1024;
  const Bf16Matrix x = RandomNormalBf16(m * k, 81);
  const Bf16Matrix w = RandomNormalBf16(v * k, 82);
  const std::vector<float> dy = RandomNormalFp32(m * v, 83);
  std::vector<Bf16Bits> g(dy.size());
  for (std::size_t i = 0; i < dy.size(); ++i) g[i] = FloatToBf16(dy[i]);
  std::shared_ptr<Weight> weight = Load(w.bits, v, k);
  ASSERT_NE(weight, nullptr);
  const BackwardOut from_fp32 = RunBackward(*backend_, *weight, dy.data(), DType::kFp32, x.bits, m);
  const BackwardOut from_bf16 = RunBackward(*backend_, *weight, g.data(), DType::kBf16, x.bits, m);
  ASSERT_EQ(std::memcmp(from_fp32.dx_f32.data(), from_bf16.dx_f32.data(),
                        from_fp32.dx_f32.size() * sizeof(float)),
            0);
  ASSERT_EQ(from_fp32.dx_bf16, from_bf16.dx_bf16);
  ASSERT_EQ(std::memcmp(from_fp32.dw_f32.data(), from_bf16.dw_f32.data(),
                        from_fp32.dw_f32.size() * sizeof(float)),
            0);
  ASSERT_EQ(from_fp32.dw_bf16, from_bf16.dw_bf16);
  // And the fp32 results sit within the fp32 bound of an fp64 reference
  // computed from G, for a sample of dX and dW entries.
  for (std::int64_t i = 0; i < m; i += 5) {
    for (std::int64_t kk = 0; kk < k; kk += 97) {
      double ref = 0, abs_sum = 0;
      for (std::int64_t j = 0; j < v; ++j) {
        const double p = Bf16ToFloat(g[static_cast<std::size_t>(i * v + j)]) *
                         w.values[static_cast<std::size_t>(j * k + kk)];
        ref += p;
        abs_sum += std::fabs(p);
      }
      EXPECT_LE(std::fabs(from_fp32.dx_f32[static_cast<std::size_t>(i * k + kk)] - ref),
                Gamma(v) * abs_sum);
    }
  }
  for (std::int64_t j = 0; j < v; j += 131) {
    for (std::int64_t kk = 0; kk < k; kk += 61) {
      double ref = 0, abs_sum = 0;
      for (std::int64_t i = 0; i < m; ++i) {
        const double p = Bf16ToFloat(g[static_cast<std::size_t>(i * v + j)]) *
                         x.values[static_cast<std::size_t>(i * k + kk)];
        ref += p;
        abs_sum += std::fabs(p);
      }
      EXPECT_LE(std::fabs(from_fp32.dw_f32[static_cast<std::size_t>(j * k + kk)] - ref),
                Gamma(m) * abs_sum);
    }
  }
}

TEST_F(CpuBackend, BackwardAccumulateThreeCallsEqualsSumAndCounts) {
  const std::int64_t m = 8, v = 300, k = 128;
  const IntMatrix w = RandomInts(v, k, -8, 8, 91);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->gradient_bytes(), 0u);
  const auto vk = static_cast<std::size_t>(v * k);

  // Never accumulated: zeros and a count of 0.
  std::vector<float> fetched(vk, std::numeric_limits<float>::quiet_NaN());
  absl::StatusOr<std::uint64_t> count = backend_->FetchGradient(*weight, fetched.data(), false);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0u);
  for (float f : fetched) ASSERT_EQ(FloatBits(f), 0u);

  std::vector<std::int64_t> expected(vk, 0);
  for (std::uint32_t call = 0; call < 3; ++call) {
    const IntMatrix x = RandomInts(m, k, -8, 8, 100 + call);
    const IntMatrix dy = RandomInts(m, v, -8, 8, 200 + call);
    const std::vector<std::int64_t> dw = ExactAtB(dy, x);
    for (std::size_t i = 0; i < vk; ++i) expected[i] += dw[i];
    std::vector<Bf16Bits> dx(static_cast<std::size_t>(m * k));
    BackwardArgs args;
    args.dy = dy.fp32.data();
    args.x = x.bf16.data();
    args.m = m;
    args.dx = dx.data();  // dX alongside the accumulation
    args.accumulate_dw = true;
    absl::Status s = backend_->Backward(*weight, args, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<std::int64_t> dx_exact = ExactAB(dy, w);
    for (std::size_t i = 0; i < dx.size(); ++i) {
      ASSERT_EQ(dx[i], FloatToBf16(static_cast<float>(dx_exact[i]))) << i;
    }
  }
  ExpectAllBelow2To24(expected);
  EXPECT_EQ(weight->gradient_bytes(), vk * sizeof(float));

  count = backend_->FetchGradient(*weight, fetched.data(), /*zero_after_fetch=*/false);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 3u);
  for (std::size_t i = 0; i < vk; ++i) {
    ASSERT_EQ(FloatBits(fetched[i]), FloatBits(static_cast<float>(expected[i]))) << i;
  }
  // Fetching without zeroing leaves it; zeroing after returns it one more time.
  std::vector<float> again(vk, -1.0f);
  count = backend_->FetchGradient(*weight, again.data(), /*zero_after_fetch=*/true);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 3u);
  EXPECT_EQ(again, fetched);
  count = backend_->FetchGradient(*weight, again.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0u);
  for (float f : again) ASSERT_EQ(FloatBits(f), 0u);
}

TEST_F(CpuBackend, ZeroGradientClearsBufferAndCount) {
  const std::int64_t m = 4, v = 64, k = 32;
  const IntMatrix w = RandomInts(v, k, -8, 8, 301);
  const IntMatrix x = RandomInts(m, k, -8, 8, 302);
  const IntMatrix dy = RandomInts(m, v, 1, 8, 303);
  std::shared_ptr<Weight> weight = Load(w.bf16, v, k);
  ASSERT_NE(weight, nullptr);
  BackwardArgs args;
  args.dy = dy.fp32.data();
  args.x = x.bf16.data();
  args.m = m;
  args.accumulate_dw = true;
  ASSERT_TRUE(backend_->Backward(*weight, args, nullptr).ok());
  ASSERT_TRUE(backend_->Backward(*weight, args, nullptr).ok());
  ASSERT_TRUE(backend_->ZeroGradient(*weight).ok());
  std::vector<float> fetched(static_cast<std::size_t>(v * k), 1.0f);
  absl::StatusOr<std::uint64_t> count = backend_->FetchGradient(*weight, fetched.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0u);
  for (float f : fetched) ASSERT_EQ(FloatBits(f), 0u);
  // Accumulation restarts from zero.
  ASSERT_TRUE(backend_->Backward(*weight, args, nullptr).ok());
  count = backend_->FetchGradient(*weight, fetched.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 1u);
  const std::vector<std::int64_t> dw = ExactAtB(dy, x);
  for (std::size_t i = 0; i < dw.size(); ++i) {
    ASSERT_EQ(fetched[i], static_cast<float>(dw[i])) << i;
  }
}

TEST_F(CpuBackend, CastToBf16MatchesFloatToBf16OnEdgeValues) {
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           BitsToFloat(0x3f808000u),  // ties
                           BitsToFloat(0x3f818000u),
                           BitsToFloat(0xbf818000u),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           BitsToFloat(0x7f800001u),  // signalling NaN
                           BitsToFloat(0xffffffffu),
                           std::numeric_limits<float>::max(),
                           BitsToFloat(0x7f7f7fffu),
                           BitsToFloat(0x7f7f8000u),
                           std::numeric_limits<float>::denorm_min(),
                           BitsToFloat(0x00018000u),
                           BitsToFloat(0x007fffffu),
                           std::numeric_limits<float>::min()};
  std::mt19937 rng(401);
  for (int i = 0; i < 10000; ++i) in.push_back(BitsToFloat(rng()));
  std::vector<Bf16Bits> out(in.size(), 0x1234);
  Timing timing;
  timing.compute_us = -1;
  absl::Status s = backend_->Kernel(
      kernels::CastArgs{in.data(), static_cast<std::int64_t>(in.size()), out.data()}, &timing);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE(timing.compute_us, 0);
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], FloatToBf16(in[i])) << "input bits " << std::hex << FloatBits(in[i]);
  }
  EXPECT_TRUE(backend_->Kernel(kernels::CastArgs{nullptr, 0, nullptr}, nullptr).ok());
  EXPECT_EQ(backend_->Kernel(kernels::CastArgs{in.data(), -1, out.data()}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Kernel(kernels::CastArgs{nullptr, 4, out.data()}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// A weight some other backend created.
class ForeignWeight final : public Weight {
 public:
  ForeignWeight() : Weight(4, 8) {}
  std::uint64_t weight_bytes() const override { return 64; }
  std::uint64_t gradient_bytes() const override { return 0; }
};

TEST_F(CpuBackend, BadArgumentsAreInvalidArgument) {
  const std::vector<Bf16Bits> w(64, FloatToBf16(1.0f));
  EXPECT_EQ(backend_->LoadWeight(w.data(), 0, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->LoadWeight(w.data(), 8, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->LoadWeight(nullptr, 8, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = backend_->LoadWeight(w.data(), std::int64_t{1} << 31, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2147483648, 1]"), absl::string_view::npos) << s;

  std::shared_ptr<Weight> weight = Load(w, 8, 8);
  ASSERT_NE(weight, nullptr);
  const std::vector<Bf16Bits> x(32, FloatToBf16(2.0f));
  std::vector<float> y(32);
  LogitsArgs la;
  la.x = x.data();
  la.m = 4;
  la.y = y.data();
  ASSERT_TRUE(backend_->Logits(*weight, la, nullptr).ok());
  EXPECT_EQ(y[0], 16.0f);

  LogitsArgs bad = la;
  bad.m = 0;
  s = backend_->Logits(*weight, bad, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got 0"), absl::string_view::npos) << s;
  bad = la;
  bad.x = nullptr;
  EXPECT_EQ(backend_->Logits(*weight, bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = la;
  bad.y = nullptr;
  EXPECT_EQ(backend_->Logits(*weight, bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = la;
  bad.out_dtype = DType::kInt32;
  s = backend_->Logits(*weight, bad, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int32"), absl::string_view::npos) << s;

  ForeignWeight foreign;
  s = backend_->Logits(foreign, la, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu backend"), absl::string_view::npos) << s;

  const std::vector<float> dy(32, 1.0f);
  std::vector<float> dx(32), dw(64);
  BackwardArgs ba;
  ba.dy = dy.data();
  ba.x = x.data();
  ba.m = 4;
  ba.dx = dx.data();
  ba.dx_dtype = DType::kFp32;
  ba.dw = dw.data();
  ASSERT_TRUE(backend_->Backward(*weight, ba, nullptr).ok());
  EXPECT_EQ(dx[0], 8.0f);
  EXPECT_EQ(dw[0], 8.0f);
  BackwardArgs bb = ba;
  bb.dy = nullptr;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bb = ba;
  bb.dy_dtype = DType::kInt64;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bb = ba;
  bb.m = -3;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bb = ba;
  bb.dx = nullptr;
  bb.dw = nullptr;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bb = ba;
  bb.dw_dtype = DType::kInt32;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bb = ba;
  bb.x = nullptr;
  EXPECT_EQ(backend_->Backward(*weight, bb, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Backward(foreign, ba, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->FetchGradient(*weight, nullptr, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->FetchGradient(foreign, dw.data(), false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ZeroGradient(foreign).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuBackend, WeightHeldAsFp32AndNoDeviceMemory) {
  const IntMatrix w = RandomInts(100, 70, -8, 8, 501);
  std::shared_ptr<Weight> weight = Load(w.bf16, 100, 70);
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->v(), 100);
  EXPECT_EQ(weight->k(), 70);
  EXPECT_EQ(weight->weight_bytes(), 100u * 70u * 4u);
  EXPECT_EQ(backend_->DeviceBytesInUse(), 0u);
}

TEST_F(CpuBackend, InfoReportsCpuAndOpenBlas) {
  const BackendInfo info = backend_->Info();
  EXPECT_EQ(info.backend, "cpu");
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_GE(info.multiprocessor_count, 1);
  EXPECT_NE(info.blas_version.find("OpenBLAS"), std::string::npos) << info.blas_version;
  const std::size_t at = info.blas_version.find("threads=");
  ASSERT_NE(at, std::string::npos) << info.blas_version;
  int threads = 0;
  ASSERT_TRUE(absl::SimpleAtoi(info.blas_version.substr(at + 8), &threads)) << info.blas_version;
  EXPECT_GE(threads, 1);
  EXPECT_TRUE(info.compute_capability.empty());

  // cpu_threads sets OpenBLAS's (process-wide) thread count; put it back after.
  BackendOptions one;
  one.cpu_threads = 1;
  const std::unique_ptr<Backend> single = cpu::CreateCpuBackend(one);
  EXPECT_NE(single->Info().blas_version.find("threads=1"), std::string::npos)
      << single->Info().blas_version;
  BackendOptions restore;
  restore.cpu_threads = threads;
  const std::unique_ptr<Backend> restored = cpu::CreateCpuBackend(restore);
  EXPECT_NE(restored->Info().blas_version.find(absl::StrCat("threads=", threads)),
            std::string::npos);
}

TEST_F(CpuBackend, AllocateHostIsAlignedAndWritable) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4097}}) {
    absl::StatusOr<HostBuffer> buf = backend_->AllocateHost(bytes);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(buf->size(), bytes);
    ASSERT_NE(buf->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf->data()) % 64, 0u);
    if (bytes > 0) std::memset(buf->data(), 0xab, bytes);
    HostBuffer moved = std::move(*buf);
    EXPECT_EQ(buf->data(), nullptr);
    EXPECT_EQ(moved.size(), bytes);
  }
}

TEST_F(CpuBackend, LargeHostBuffersAreReusedWithinTheCacheCap) {
  // 8 MiB and more come from the cache: the same memory again once freed
  // (no page faults for a repeated call), and still aligned and writable.
  const std::size_t bytes = (std::size_t{8} << 20) + 12345;
  std::byte* first = nullptr;
  {
    absl::StatusOr<HostBuffer> buf = backend_->AllocateHost(bytes);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(buf->size(), bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf->data()) % 64, 0u);
    std::memset(buf->data(), 0xcd, bytes);
    first = buf->data();
  }
  absl::StatusOr<HostBuffer> again = backend_->AllocateHost(bytes - 1000);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), first);
  // Two at once: the second is other memory.
  absl::StatusOr<HostBuffer> other = backend_->AllocateHost(bytes);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->data(), first);
  std::memset(other->data(), 0xef, bytes);
  EXPECT_EQ(again->data()[0], std::byte{0xcd}) << "buffers handed out at once overlap";
}

TEST_F(CpuBackend, LogitsTimingAndConcurrentCallsAreDeterministic) {
  const std::int64_t m = 16, v = 1024, k = 1024;
  const Bf16Matrix x = RandomNormalBf16(m * k, 601);
  const Bf16Matrix w = RandomNormalBf16(v * k, 602);
  std::shared_ptr<Weight> weight = Load(w.bits, v, k);
  ASSERT_NE(weight, nullptr);
  std::vector<float> first(static_cast<std::size_t>(m * v));
  LogitsArgs args;
  args.x = x.bits.data();
  args.m = m;
  args.y = first.data();
  Timing timing;
  timing.compute_us = -1;
  timing.h2d_us = 5;
  ASSERT_TRUE(backend_->Logits(*weight, args, &timing).ok());
  EXPECT_GE(timing.compute_us, 0);
  EXPECT_EQ(timing.h2d_us, 0);
  EXPECT_EQ(timing.d2h_us, 0);

  std::vector<std::vector<float>> results(4, std::vector<float>(first.size()));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      LogitsArgs a = args;
      a.y = results[t].data();
      EXPECT_TRUE(backend_->Logits(*weight, a, nullptr).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::vector<float>& r : results) {
    ASSERT_EQ(std::memcmp(r.data(), first.data(), first.size() * sizeof(float)), 0);
  }
}

// A bf16 weight past 2^31 bytes (V*K*2 > 2 GiB, 4.3 GB as fp32) exercises
// 64-bit sizes everywhere. It needs ~7 GB of memory and some seconds, so it
// runs only when LOGITD_LARGE_TESTS=1.
TEST_F(CpuBackend, LogitsBf16Bf16F32_WeightLargerThan2GiBIntegerExact) {
  const char* flag = std::getenv("LOGITD_LARGE_TESTS");
  if (flag == nullptr || std::string(flag) != "1") {
    GTEST_SKIP() << "needs ~7 GB of memory; set LOGITD_LARGE_TESTS=1 to run";
  }
  const std::int64_t v = (std::int64_t{1} << 18) + 64, k = 4096, m = 2;
  ASSERT_GT(v * k * 2, std::int64_t{1} << 31);
  // W[j, kk] from a cheap pattern in [-8, 8]; X from a seeded generator.
  std::vector<Bf16Bits> w(static_cast<std::size_t>(v * k));
  auto wval = [](std::int64_t j, std::int64_t kk) {
    return static_cast<int>((j * 7 + kk * 3 + (j >> 5)) % 17) - 8;
  };
  for (std::int64_t j = 0; j < v; ++j) {
    for (std::int64_t kk = 0; kk < k; ++kk) {
      w[static_cast<std::size_t>(j * k + kk)] = FloatToBf16(static_cast<float>(wval(j, kk)));
    }
  }
  const IntMatrix x = RandomInts(m, k, -8, 8, 701);
  std::shared_ptr<Weight> weight = Load(w, v, k);
  ASSERT_NE(weight, nullptr);
  w = std::vector<Bf16Bits>();  // the backend holds its own copy
  EXPECT_EQ(weight->weight_bytes(), static_cast<std::uint64_t>(v * k * 4));
  const std::vector<float> y = LogitsF32(*weight, x.bf16, m);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      std::int64_t s = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) s += std::int64_t{x.at(i, kk)} * wval(j, kk);
      ASSERT_EQ(y[static_cast<std::size_t>(i * v + j)], static_cast<float>(s)) << i << "," << j;
    }
  }
  // dX reduces over all V rows, reading W past 2^31 bytes; dY in {-1, 0, 1}
  // keeps the sums below 2^24.
  const IntMatrix dy = RandomInts(m, v, -1, 1, 702);
  std::vector<float> dx(static_cast<std::size_t>(m * k));
  BackwardArgs args;
  args.dy = dy.fp32.data();
  args.x = x.bf16.data();
  args.m = m;
  args.dx = dx.data();
  args.dx_dtype = DType::kFp32;
  ASSERT_TRUE(backend_->Backward(*weight, args, nullptr).ok());
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t kk = 0; kk < k; ++kk) {
      std::int64_t s = 0;
      for (std::int64_t j = 0; j < v; ++j) s += std::int64_t{dy.at(i, j)} * wval(j, kk);
      ASSERT_EQ(dx[static_cast<std::size_t>(i * k + kk)], static_cast<float>(s)) << i << "," << kk;
    }
  }
}

}  // namespace
}  // namespace logitd::kernels

// The cuda backend through the Backend interface: integer operands bitwise
// equal to exact sums, random operands inside the fp32 accumulation bound of
// an fp64 reference, the backward contract, accumulation, determinism under
// repetition and concurrency, and recovery from device out-of-memory.
#include "server/kernels/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/ops/cast.h"
#include "tests/common/row_block_cuts.h"

namespace logitd::kernels::testing {
namespace {

struct Shape {
  std::int64_t m;
  std::int64_t v;
  std::int64_t k;
};

std::string Name(const Shape& s) {
  return "M" + std::to_string(s.m) + "_V" + std::to_string(s.v) + "_K" + std::to_string(s.k);
}

constexpr std::uint32_t kPoison32 = 0xffffffffu;  // a NaN: unwritten outputs fail every check
constexpr Bf16Bits kPoison16 = 0xffffu;

std::vector<float> PoisonedFp32(std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& f : out) f = BitsToFloat(kPoison32);
  return out;
}

std::shared_ptr<Weight> Load(Backend* b, const std::vector<Bf16Bits>& w, std::int64_t v,
                             std::int64_t k) {
  auto loaded = b->LoadWeight(w.data(), v, k);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *loaded : nullptr;
}

// A logits problem of shape s: its operands, the weight loaded into the
// backend (null, a failure recorded, when it was refused), the fp64
// reference, and the arguments of a call into y.
struct LogitsProblem {
  Shape s;
  std::vector<Bf16Bits> x, w;
  std::shared_ptr<Weight> weight;
  Reference ref;

  LogitsArgs Args(void* y, DType out = DType::kFp32, float alpha = 1.0f) const {
    LogitsArgs args;
    args.x = x.data();
    args.m = s.m;
    args.alpha = alpha;
    args.out_dtype = out;
    args.y = y;
    return args;
  }
};

LogitsProblem MakeLogitsProblem(Backend* b, const Shape& s, std::vector<Bf16Bits> x,
                                std::vector<Bf16Bits> w) {
  LogitsProblem p{s, std::move(x), std::move(w), nullptr, {}};
  p.weight = Load(b, p.w, s.v, s.k);
  if (p.weight != nullptr) p.ref = LogitsReference(Widen(p.x), Widen(p.w), s.m, s.v, s.k);
  return p;
}

TEST(CudaBackendOptions, NoDeviceIsFailedPrecondition) {
  auto b = cuda::CreateCudaBackend(BackendOptions{});
  if (b.ok()) GTEST_SKIP() << "a device is visible";
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_FALSE(b.status().message().empty());
}

class CudaBackendTest : public CudaFixture {};

TEST_F(CudaBackendTest, InfoDescribesTheDevice) {
  const BackendInfo info = backend()->Info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_FALSE(info.compute_capability.empty());
  EXPECT_GT(info.multiprocessor_count, 0);
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_FALSE(info.cuda_runtime_version.empty());
  EXPECT_FALSE(info.cublaslt_version.empty());
  EXPECT_EQ(info.split_k, "fp32");
  std::cout << "device: " << info.device_name << " cc " << info.compute_capability << ", "
            << info.multiprocessor_count << " SMs, driver " << info.driver_version << ", runtime "
            << info.cuda_runtime_version << ", cuBLASLt " << info.cublaslt_version << "\n";
}

class IntegerLogitsTest : public CudaFixture, public ::testing::WithParamInterface<Shape> {};

// Integers in [-8, 8] with K * 64 < 2^24: every product and partial sum is
// exact in fp32, so the result must equal the exact sum whatever the
// algorithm, split or order.
TEST_P(IntegerLogitsTest, Bf16Bf16F32_TN_EqualsExactSums) {
  const Shape s = GetParam();
  const LogitsProblem p = MakeLogitsProblem(backend(), s, IntegerBf16(s.m * s.k, 11 + s.k),
                                            IntegerBf16(s.v * s.k, 12 + s.v));
  ASSERT_NE(p.weight, nullptr);

  std::vector<float> y = PoisonedFp32(s.m * s.v);
  LogitsArgs args = p.Args(y.data());
  Timing timing;
  ASSERT_TRUE(backend()->Logits(*p.weight, args, &timing).ok());
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float exact = static_cast<float>(p.ref.value[i]);
    if (FloatBits(y[i]) != FloatBits(exact) && ++bad <= 5) {
      ADD_FAILURE() << "fp32 y[" << i << "] = " << y[i] << ", exact " << exact;
    }
  }
  EXPECT_EQ(bad, 0);

  // bf16 out: the exact sum rounded once.
  std::vector<Bf16Bits> yb(static_cast<std::size_t>(s.m * s.v), kPoison16);
  args.out_dtype = DType::kBf16;
  args.y = yb.data();
  ASSERT_TRUE(backend()->Logits(*p.weight, args, nullptr).ok());
  bad = 0;
  for (std::size_t i = 0; i < yb.size(); ++i) {
    const Bf16Bits exact = FloatToBf16(static_cast<float>(p.ref.value[i]));
    if (yb[i] != exact && ++bad <= 5) {
      ADD_FAILURE() << "bf16 y[" << i << "] = 0x" << std::hex << yb[i] << ", expected 0x" << exact;
    }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, IntegerLogitsTest,
                         ::testing::Values(Shape{1, 7, 64}, Shape{16, 32768, 512},
                                           Shape{16, 8192, 16384}, Shape{16, 32768, 4096},
                                           Shape{37, 3001, 1000}, Shape{128, 4096, 16384},
                                           Shape{300, 2048, 2048},
                                           // Several row blocks (fp32 y > 128 MiB), the
                                           // last one short.
                                           Shape{2600, 32768, 32}),
                         [](const auto& info) { return Name(info.param); });

TEST_F(CudaBackendTest, LogitsIntoPinnedBuffersMatchPageable) {
  const Shape s{1100, 32768, 64};
  const auto x = IntegerBf16(s.m * s.k, 21);
  const auto w = IntegerBf16(s.v * s.k, 22);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);
  auto xh = backend()->AllocateHost(x.size() * 2);
  auto yh = backend()->AllocateHost(static_cast<std::size_t>(s.m * s.v) * 4);
  ASSERT_TRUE(xh.ok() && yh.ok());
  std::memcpy(xh->data(), x.data(), x.size() * 2);
  std::memset(yh->data(), 0xff, yh->size());
  LogitsArgs args;
  args.x = xh->as<Bf16Bits>();
  args.m = s.m;
  args.y = yh->data();
  Timing timing;
  ASSERT_TRUE(backend()->Logits(*weight, args, &timing).ok());
  EXPECT_GT(timing.h2d_us + timing.compute_us + timing.d2h_us, 0);
  std::vector<float> y = PoisonedFp32(s.m * s.v);
  args.x = x.data();
  args.y = y.data();
  ASSERT_TRUE(backend()->Logits(*weight, args, nullptr).ok());
  EXPECT_EQ(std::memcmp(y.data(), yh->data(), y.size() * 4), 0);
  const Reference ref = LogitsReference(Widen(x), Widen(w), s.m, s.v, s.k);
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < y.size(); ++i) bad += y[i] != static_cast<float>(ref.value[i]);
  EXPECT_EQ(bad, 0);
}

// The service's row blocks (LogitsHeader.pipeline) cut a call at multiples
// of LogitsBlockRows, the last block taking the rest: every element keeps
// the bits of the whole call (the same GEMM shapes on the same rows).
TEST_F(CudaBackendTest, LogitsCutAtItsBlockRowsIsTheWholeCall) {
  // Y rows of 128 KiB (fp32): GEMMs of 1,024 rows; 2,600 = 1,024 + 1,576.
  ::logitd::testing::ExpectLogitsCutIsTheWholeCall(
      *backend(), {/*v=*/32768, /*k=*/512, /*ms=*/{100, 1024, 2600, 3077}, 0, /*seed=*/31},
      [](std::int64_t m, DType out, std::int64_t rows) {
        if (m > 2 * 1024 && out == DType::kFp32) {
          EXPECT_LE(2 * rows, m) << "a call of " << m << " rows was not cut";
        }
      });
}

// LogProbs and CrossEntropy without dW walk in row blocks of 1,024 rows
// (kWalkBlockRows), each planned as a call of its own rows: a call cut at
// those multiples (the service's row blocks) keeps every output's bits.
// The service cuts 2,600 rows into 1,024 + 1,576 and 3,077 into 1,024 +
// 1,024 + 1,029; the whole call walks 1,024 + 1,024 + 552 and 3 × 1,024 + 5.
TEST_F(CudaBackendTest, LogProbsCutAtItsBlockRowsIsTheWholeCall) {
  ::logitd::testing::ExpectLogProbsCutIsTheWholeCall(
      *backend(),
      {/*v=*/32768, /*k=*/512, /*ms=*/{100, 1024, 2600, 3077}, /*block_rows=*/1024, /*seed=*/41});
}

TEST_F(CudaBackendTest, CrossEntropyCutAtItsBlockRowsIsTheWholeCall) {
  ::logitd::testing::ExpectCrossEntropyCutIsTheWholeCall(
      *backend(),
      {/*v=*/32768, /*k=*/512, /*ms=*/{100, 1024, 2600, 3077}, /*block_rows=*/1024, /*seed=*/42});
}

class RandomLogitsTest : public CudaFixture, public ::testing::WithParamInterface<Shape> {};

// Random operands: every element inside gamma_K * sum|x w| of the fp64
// value; bf16 out within one more rounding; fp32 out far more accurate.
TEST_P(RandomLogitsTest, WithinFp32AccumulationBound) {
  const Shape s = GetParam();
  const LogitsProblem p = MakeLogitsProblem(backend(), s, RandomBf16(s.m * s.k, 31 + s.k),
                                            RandomBf16(s.v * s.k, 32 + s.v));
  ASSERT_NE(p.weight, nullptr);
  for (float alpha : {1.0f, 0.37f}) {
    std::vector<float> y = PoisonedFp32(s.m * s.v);
    LogitsArgs args = p.Args(y.data(), DType::kFp32, alpha);
    ASSERT_TRUE(backend()->Logits(*p.weight, args, nullptr).ok());
    EXPECT_EQ(CheckWithinBound(
                  p.ref, s.k, alpha, false,
                  [&](std::int64_t i) { return y[static_cast<std::size_t>(i)]; }, "fp32 out"),
              0);
    std::vector<Bf16Bits> yb(static_cast<std::size_t>(s.m * s.v), kPoison16);
    args.out_dtype = DType::kBf16;
    args.y = yb.data();
    ASSERT_TRUE(backend()->Logits(*p.weight, args, nullptr).ok());
    EXPECT_EQ(CheckWithinBound(
                  p.ref, s.k, alpha, true,
                  [&](std::int64_t i) { return Bf16ToFloat(yb[static_cast<std::size_t>(i)]); },
                  "bf16 out"),
              0);
    double err32 = 0;
    double err16 = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double exact = static_cast<double>(alpha) * p.ref.value[i];
      err32 += std::fabs(y[i] - exact);
      err16 += std::fabs(Bf16ToFloat(yb[i]) - exact);
    }
    EXPECT_LT(err32 * 10, err16) << "fp32 out should be far below bf16 out (mean |err| over "
                                 << y.size() << " elements)";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RandomLogitsTest,
                         ::testing::Values(Shape{16, 32768, 1024}, Shape{16, 8192, 16384},
                                           Shape{37, 3001, 1000}, Shape{200, 4099, 4096}),
                         [](const auto& info) { return Name(info.param); });

TEST_F(CudaBackendTest, AlphaZeroKeepsIeeeProducts) {
  const Shape s{3, 64, 128};
  auto x = IntegerBf16(s.m * s.k, 41, /*nonzero=*/true);
  const auto w = IntegerBf16(s.v * s.k, 42, /*nonzero=*/true);
  x[0] = FloatToBf16(std::numeric_limits<float>::infinity());  // row 0 sums to +-Inf
  const LogitsProblem p = MakeLogitsProblem(backend(), s, x, w);
  ASSERT_NE(p.weight, nullptr);
  for (DType out : {DType::kFp32, DType::kBf16}) {
    std::vector<float> y = PoisonedFp32(s.m * s.v);
    const LogitsArgs args = p.Args(y.data(), out, 0.0f);
    ASSERT_TRUE(backend()->Logits(*p.weight, args, nullptr).ok());
    for (std::int64_t i = 0; i < s.m * s.v; ++i) {
      const float expected = 0.0f * static_cast<float>(p.ref.value[static_cast<std::size_t>(i)]);
      const float got = out == DType::kFp32
                            ? y[static_cast<std::size_t>(i)]
                            : Bf16ToFloat(reinterpret_cast<const Bf16Bits*>(y.data())[i]);
      if (i < s.v) {
        EXPECT_TRUE(std::isnan(got)) << "0 * Inf must be NaN at " << i;
      } else {
        EXPECT_EQ(FloatBits(got), FloatBits(expected)) << "at " << i;
      }
    }
  }
}

struct BackwardCase {
  Shape shape;
  DType dy;
  DType dx;
  DType dw;
};

class IntegerBackwardTest : public CudaFixture,
                            public ::testing::WithParamInterface<BackwardCase> {};

TEST_P(IntegerBackwardTest, GradientsEqualExactSums) {
  const auto [s, dy_type, dx_type, dw_type] = GetParam();
  const auto w = IntegerBf16(s.v * s.k, 51);
  const auto x = IntegerBf16(s.m * s.k, 52);
  const auto dy32 = IntegerFp32(s.m * s.v, 53);
  std::vector<Bf16Bits> dy16(dy32.size());
  for (std::size_t i = 0; i < dy32.size(); ++i) dy16[i] = FloatToBf16(dy32[i]);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);

  std::vector<std::byte> dx(static_cast<std::size_t>(s.m * s.k) * 4, std::byte{0xff});
  std::vector<std::byte> dw(static_cast<std::size_t>(s.v * s.k) * 4, std::byte{0xff});
  BackwardArgs args;
  args.dy = dy_type == DType::kFp32 ? static_cast<const void*>(dy32.data()) : dy16.data();
  args.dy_dtype = dy_type;
  args.x = x.data();
  args.m = s.m;
  args.dx = dx.data();
  args.dx_dtype = dx_type;
  args.dw = dw.data();
  args.dw_dtype = dw_type;
  Timing timing;
  ASSERT_TRUE(backend()->Backward(*weight, args, &timing).ok());

  const Reference rdx = GradInputReference(dy32, Widen(w), s.m, s.v, s.k);
  const Reference rdw = GradWeightReference(dy32, Widen(x), s.m, s.v, s.k);
  auto check = [](const Reference& ref, const std::vector<std::byte>& got, DType t,
                  const char* what) {
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < ref.value.size(); ++i) {
      const float exact = static_cast<float>(ref.value[i]);
      bool ok;
      if (t == DType::kFp32) {
        ok = FloatBits(reinterpret_cast<const float*>(got.data())[i]) == FloatBits(exact);
      } else {
        ok = reinterpret_cast<const Bf16Bits*>(got.data())[i] == FloatToBf16(exact);
      }
      if (!ok && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "] differs from " << exact;
    }
    return bad;
  };
  EXPECT_EQ(check(rdx, dx, dx_type, "dx"), 0);
  EXPECT_EQ(check(rdw, dw, dw_type, "dw"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, IntegerBackwardTest,
    ::testing::Values(BackwardCase{{64, 4096, 512}, DType::kFp32, DType::kBf16, DType::kFp32},
                      BackwardCase{{64, 4096, 512}, DType::kBf16, DType::kFp32, DType::kBf16},
                      BackwardCase{{37, 3001, 1000}, DType::kFp32, DType::kFp32, DType::kFp32},
                      BackwardCase{{300, 32768, 256}, DType::kFp32, DType::kBf16, DType::kFp32},
                      BackwardCase{{4096, 1000, 64}, DType::kBf16, DType::kBf16, DType::kFp32},
                      // A reduction of 1,729 rows: dW's shape that a split-in-three
                      // variant of algorithm 66 summed wrongly when the tuner timed it
                      // (docs/notes/cuda.md, "Split-K").
                      BackwardCase{{1729, 1000, 96}, DType::kFp32, DType::kFp32, DType::kFp32},
                      BackwardCase{{1729, 1000, 96}, DType::kBf16, DType::kBf16, DType::kBf16}),
    [](const auto& info) {
      const auto& c = info.param;
      return Name(c.shape) + "_dy" + std::string(DTypeName(c.dy)) + "_dx" +
             std::string(DTypeName(c.dx)) + "_dw" + std::string(DTypeName(c.dw));
    });

// Random fp32 dY (full mantissas, so the cast rounds): the fp32 path equals
// the path given bf16(dY) from the host bitwise, and both sit inside the
// fp32 bound of an fp64 reference over G = bf16(dY).
TEST_F(CudaBackendTest, BackwardContractAndBound) {
  const Shape s{48, 5000, 768};
  const auto w = RandomBf16(s.v * s.k, 61);
  const auto x = RandomBf16(s.m * s.k, 62);
  const auto dy = RandomFp32(s.m * s.v, 63, 0.01f);
  std::vector<Bf16Bits> g(dy.size());
  for (std::size_t i = 0; i < dy.size(); ++i) g[i] = FloatToBf16(dy[i]);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);

  std::vector<float> dx_a = PoisonedFp32(s.m * s.k);
  std::vector<float> dw_a = PoisonedFp32(s.v * s.k);
  BackwardArgs args;
  args.dy = dy.data();
  args.x = x.data();
  args.m = s.m;
  args.dx = dx_a.data();
  args.dx_dtype = DType::kFp32;
  args.dw = dw_a.data();
  ASSERT_TRUE(backend()->Backward(*weight, args, nullptr).ok());

  std::vector<float> dx_b = PoisonedFp32(s.m * s.k);
  std::vector<float> dw_b = PoisonedFp32(s.v * s.k);
  args.dy = g.data();
  args.dy_dtype = DType::kBf16;
  args.dx = dx_b.data();
  args.dw = dw_b.data();
  ASSERT_TRUE(backend()->Backward(*weight, args, nullptr).ok());
  EXPECT_EQ(std::memcmp(dx_a.data(), dx_b.data(), dx_a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(dw_a.data(), dw_b.data(), dw_a.size() * 4), 0);

  const auto gf = Widen(g);
  const Reference rdx = GradInputReference(gf, Widen(w), s.m, s.v, s.k);
  const Reference rdw = GradWeightReference(gf, Widen(x), s.m, s.v, s.k);
  EXPECT_EQ(CheckWithinBound(
                rdx, s.v, 1.0f, false,
                [&](std::int64_t i) { return dx_a[static_cast<std::size_t>(i)]; }, "dx"),
            0);
  EXPECT_EQ(CheckWithinBound(
                rdw, s.m, 1.0f, false,
                [&](std::int64_t i) { return dw_a[static_cast<std::size_t>(i)]; }, "dw"),
            0);

  // bf16 dX: the same accumulator rounded once.
  std::vector<Bf16Bits> dx16(static_cast<std::size_t>(s.m * s.k), kPoison16);
  args.dx = dx16.data();
  args.dx_dtype = DType::kBf16;
  args.dw = nullptr;
  ASSERT_TRUE(backend()->Backward(*weight, args, nullptr).ok());
  EXPECT_EQ(CheckWithinBound(
                rdx, s.v, 1.0f, true,
                [&](std::int64_t i) { return Bf16ToFloat(dx16[static_cast<std::size_t>(i)]); },
                "dx bf16"),
            0);
}

// A backward call that adds x's and dy's dW [V, K] into the weight's
// gradient.
absl::Status AccumulateDw(Backend* b, Weight& weight, const std::vector<Bf16Bits>& x,
                          const std::vector<float>& dy, std::int64_t m) {
  BackwardArgs args;
  args.dy = dy.data();
  args.x = x.data();
  args.m = m;
  args.accumulate_dw = true;
  return b->Backward(weight, args, nullptr);
}

TEST_F(CudaBackendTest, AccumulatesIntoTheWeightsGradient) {
  const Shape s{96, 2048, 384};
  const auto w = IntegerBf16(s.v * s.k, 71);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->gradient_bytes(), 0u);
  std::vector<double> expected(static_cast<std::size_t>(s.v * s.k), 0.0);
  constexpr int kCalls = 4;
  for (int call = 0; call < kCalls; ++call) {
    const auto x = IntegerBf16(s.m * s.k, 80 + call);
    const auto dy = IntegerFp32(s.m * s.v, 90 + call);
    ASSERT_TRUE(AccumulateDw(backend(), *weight, x, dy, s.m).ok());
    const Reference r = GradWeightReference(dy, Widen(x), s.m, s.v, s.k);
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += r.value[i];
  }
  EXPECT_EQ(weight->gradient_bytes(), static_cast<std::uint64_t>(s.v * s.k) * 4);
  std::vector<float> grad = PoisonedFp32(s.v * s.k);
  auto count = backend()->FetchGradient(*weight, grad.data(), /*zero_after_fetch=*/false);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, static_cast<std::uint64_t>(kCalls));
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < grad.size(); ++i) bad += grad[i] != static_cast<float>(expected[i]);
  EXPECT_EQ(bad, 0);

  count = backend()->FetchGradient(*weight, grad.data(), /*zero_after_fetch=*/true);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, static_cast<std::uint64_t>(kCalls));
  count = backend()->FetchGradient(*weight, grad.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0u);
  for (float f : grad) ASSERT_EQ(FloatBits(f), 0u);

  // Once more, then ZeroGradient.
  const auto x = IntegerBf16(s.m * s.k, 99);
  const auto dy = IntegerFp32(s.m * s.v, 98);
  ASSERT_TRUE(AccumulateDw(backend(), *weight, x, dy, s.m).ok());
  ASSERT_TRUE(backend()->ZeroGradient(*weight).ok());
  count = backend()->FetchGradient(*weight, grad.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0u);
  for (float f : grad) ASSERT_EQ(FloatBits(f), 0u);
}

TEST_F(CudaBackendTest, ConcurrentAccumulationsAllLand) {
  const Shape s{32, 1024, 256};
  const auto w = IntegerBf16(s.v * s.k, 101);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);
  const auto x = IntegerBf16(s.m * s.k, 102);
  const auto dy = IntegerFp32(s.m * s.v, 103);
  constexpr int kThreads = 8;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      BackwardArgs args;
      args.dy = dy.data();
      args.x = x.data();
      args.m = s.m;
      args.accumulate_dw = true;
      if (!backend()->Backward(*weight, args, nullptr).ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<float> grad = PoisonedFp32(s.v * s.k);
  auto count = backend()->FetchGradient(*weight, grad.data(), true);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, static_cast<std::uint64_t>(kThreads));
  const Reference r = GradWeightReference(dy, Widen(x), s.m, s.v, s.k);
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    bad += grad[i] != static_cast<float>(kThreads * r.value[i]);
  }
  EXPECT_EQ(bad, 0);
}

// The same request gives the same bits: repeated, and from many threads at
// once (each on its own stream context).
TEST_F(CudaBackendTest, DeterministicAcrossRepeatsAndThreads) {
  const Shape s{256, 32768, 2048};
  const auto x = RandomBf16(s.m * s.k, 111);
  const auto w = RandomBf16(s.v * s.k, 112);
  const auto dy = RandomFp32(s.m * s.v, 113, 0.01f);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);

  auto logits = [&](std::vector<float>* y) {
    y->assign(static_cast<std::size_t>(s.m * s.v), BitsToFloat(kPoison32));
    LogitsArgs args;
    args.x = x.data();
    args.m = s.m;
    args.y = y->data();
    return backend()->Logits(*weight, args, nullptr);
  };
  auto backward = [&](std::vector<Bf16Bits>* dx, std::vector<float>* dw) {
    dx->assign(static_cast<std::size_t>(s.m * s.k), kPoison16);
    dw->assign(static_cast<std::size_t>(s.v * s.k), BitsToFloat(kPoison32));
    BackwardArgs args;
    args.dy = dy.data();
    args.x = x.data();
    args.m = s.m;
    args.dx = dx->data();
    args.dw = dw->data();
    return backend()->Backward(*weight, args, nullptr);
  };
  std::vector<float> y0;
  std::vector<Bf16Bits> dx0;
  std::vector<float> dw0;
  ASSERT_TRUE(logits(&y0).ok());
  ASSERT_TRUE(backward(&dx0, &dw0).ok());
  for (int r = 0; r < 3; ++r) {
    std::vector<float> y;
    std::vector<Bf16Bits> dx;
    std::vector<float> dw;
    ASSERT_TRUE(logits(&y).ok());
    ASSERT_TRUE(backward(&dx, &dw).ok());
    EXPECT_EQ(std::memcmp(y.data(), y0.data(), y.size() * 4), 0) << "repeat " << r;
    EXPECT_EQ(std::memcmp(dx.data(), dx0.data(), dx.size() * 2), 0) << "repeat " << r;
    EXPECT_EQ(std::memcmp(dw.data(), dw0.data(), dw.size() * 4), 0) << "repeat " << r;
  }

  constexpr int kThreads = 8;
  std::vector<int> differs(kThreads, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int d = 0;
      for (int r = 0; r < 2; ++r) {
        std::vector<float> y;
        std::vector<Bf16Bits> dx;
        std::vector<float> dw;
        if (!logits(&y).ok() || !backward(&dx, &dw).ok()) {
          d = 100;
          break;
        }
        d += std::memcmp(y.data(), y0.data(), y.size() * 4) != 0;
        d += std::memcmp(dx.data(), dx0.data(), dx.size() * 2) != 0;
        d += std::memcmp(dw.data(), dw0.data(), dw.size() * 4) != 0;
      }
      differs[static_cast<std::size_t>(t)] = d;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(differs[static_cast<std::size_t>(t)], 0) << t;
}

TEST_F(CudaBackendTest, CastMatchesHostRoundingOnSpecials) {
  std::vector<float> in = RandomFp32(100003, 121, 1e4f);
  for (std::uint32_t bits : {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
                             0x7f7f8000u, 0x7f7f7fffu, 0xff7f8000u, 0x7f800000u, 0xff800000u,
                             0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x3f808000u, 0x3f818000u}) {
    in.push_back(BitsToFloat(bits));
  }
  std::vector<Bf16Bits> out(in.size(), kPoison16);
  Timing timing;
  ASSERT_TRUE(
      backend()
          ->Kernel(kernels::CastArgs{in.data(), static_cast<std::int64_t>(in.size()), out.data()},
                   &timing)
          .ok());
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], FloatToBf16(in[i])) << "input 0x" << std::hex << FloatBits(in[i]);
  }
}

TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhaustedAndTheBackendKeepsWorking) {
  const std::uint64_t before = backend()->DeviceBytesInUse();
  // 2 TiB: more than any device. The allocation is refused before the host
  // pointer is read, so a small buffer stands in for the data.
  const std::vector<Bf16Bits> tiny(16, 0x3f80);
  auto huge = backend()->LoadWeight(tiny.data(), std::int64_t{1} << 20, std::int64_t{1} << 20);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(backend()->DeviceBytesInUse(), before);

  const Shape s{8, 512, 256};
  const auto x = IntegerBf16(s.m * s.k, 131);
  const auto w = IntegerBf16(s.v * s.k, 132);
  auto weight = Load(backend(), w, s.v, s.k);
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(backend()->DeviceBytesInUse(), before + weight->weight_bytes());
  std::vector<float> y = PoisonedFp32(s.m * s.v);
  LogitsArgs args;
  args.x = x.data();
  args.m = s.m;
  args.y = y.data();
  ASSERT_TRUE(backend()->Logits(*weight, args, nullptr).ok());
  const Reference ref = LogitsReference(Widen(x), Widen(w), s.m, s.v, s.k);
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], static_cast<float>(ref.value[i]));
  // The call may have grown a context's scratch; releasing the weight gives
  // back exactly its bytes.
  const std::uint64_t with_weight = backend()->DeviceBytesInUse();
  const std::uint64_t weight_bytes = weight->weight_bytes();
  weight.reset();
  EXPECT_EQ(backend()->DeviceBytesInUse(), with_weight - weight_bytes);
}

TEST_F(CudaBackendTest, BudgetRefusesWhatDoesNotFit) {
  BackendOptions options;
  // The four workspaces take 128 MiB of it, leaving room for two 128 MiB
  // weights but not three.
  options.device_memory_budget = 448u << 20;
  auto created = cuda::CreateCudaBackend(options);
  ASSERT_TRUE(created.ok()) << created.status();
  auto& b = *created;
  const std::vector<Bf16Bits> w(std::size_t{64} << 20, 0x3f80);  // 128 MiB of ones
  auto first = b->LoadWeight(w.data(), 16384, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = b->LoadWeight(w.data(), 16384, 4096);
  ASSERT_TRUE(second.ok()) << second.status();
  auto third = b->LoadWeight(w.data(), 16384, 4096);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_LE(b->DeviceBytesInUse(), options.device_memory_budget);
  // Releasing one makes room again.
  first->reset();
  auto again = b->LoadWeight(w.data(), 16384, 4096);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(CudaBackendTest, RejectsArgumentsThatDoNotAgree) {
  const auto w = IntegerBf16(64 * 32, 151);
  auto weight = Load(backend(), w, 64, 32);
  ASSERT_NE(weight, nullptr);
  LogitsArgs args;
  args.m = 4;
  EXPECT_EQ(backend()->Logits(*weight, args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  const auto x = IntegerBf16(4 * 32, 152);
  std::vector<float> y(4 * 64);
  args.x = x.data();
  args.y = y.data();
  args.out_dtype = DType::kInt32;
  EXPECT_EQ(backend()->Logits(*weight, args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.out_dtype = DType::kFp32;
  args.m = 0;
  EXPECT_EQ(backend()->Logits(*weight, args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend()->Kernel(kernels::CastArgs{nullptr, -1, nullptr}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace logitd::kernels::testing

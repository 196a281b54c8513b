// The emulated implementations themselves: exact where the arithmetic is, a
// plain loop's bits where they claim to be one, truncation and narrow formats
// where they show, every conforming output within fp32's proven bound.
#include "tests/reference/emulated_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "logitd/bf16.h"

namespace logitd::emulated {
namespace {

double Gamma(std::int64_t n, double u) {
  return static_cast<double>(n) * u / (1.0 - static_cast<double>(n) * u);
}

// A copy: the lists are temporaries.
Implementation Find(const std::vector<Implementation>& list, const std::string& name) {
  for (const Implementation& impl : list) {
    if (impl.name == name) return impl;
  }
  ADD_FAILURE() << "no implementation '" << name << "'";
  return list.front();
}

// The fp64 sum of a dot's products and Σ|a·b|, the way Verify's reference
// forms them.
struct Reference {
  double sum = 0.0, abs_sum = 0.0;
};

Reference Dot(const float* a, std::int64_t sa, const float* b, std::int64_t sb, std::int64_t n) {
  Reference r;
  for (std::int64_t t = 0; t < n; ++t) {
    const double p = static_cast<double>(a[t * sa]) * static_cast<double>(b[t * sb]);
    r.sum += p;
    r.abs_sum += std::fabs(p);
  }
  return r;
}

// γ_n(2⁻²³): any fp32 accumulation whose additions err by under an ulp
// (nearest or truncated), plus the fp64 reference's own error.
double ProvenBound(const Reference& r, std::int64_t n) {
  return (Gamma(n, 0x1p-23) + Gamma(n, 0x1p-53)) * r.abs_sum;
}

std::vector<float> Widen(const std::vector<Bf16Bits>& v) {
  std::vector<float> out;
  for (Bf16Bits b : v) out.push_back(Bf16ToFloat(b));
  return out;
}

TEST(EmulatedKernels, NamesAreUniqueAndClassesRight) {
  std::set<std::string> names;
  for (const Implementation& impl : ConformingImplementations()) {
    EXPECT_TRUE(impl.conforming) << impl.name;
    EXPECT_TRUE(names.insert(impl.name).second) << impl.name;
  }
  for (const Implementation& impl : DefectiveImplementations()) {
    EXPECT_FALSE(impl.conforming) << impl.name;
    EXPECT_TRUE(names.insert(impl.name).second) << impl.name;
  }
  EXPECT_GE(ConformingImplementations().size(), 20u);
  EXPECT_GE(DefectiveImplementations().size(), 7u);
}

// Small integers: every partial sum is an integer below 2²⁴, so every fp32
// accumulation, in any order and with any adder, is exact.
TEST(EmulatedKernels, IntegerInputsGiveTheExactSumInEveryConformingImplementation) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> value(-16, 16);
  for (std::int64_t n : {0, 1, 2, 7, 33, 100, 1000, 4099}) {
    std::vector<float> a(static_cast<std::size_t>(3 * n)), b(static_cast<std::size_t>(n));
    for (float& f : a) f = static_cast<float>(value(rng));
    for (float& f : b) f = static_cast<float>(value(rng));
    std::int64_t exact = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      exact += static_cast<std::int64_t>(a[3 * t]) * static_cast<std::int64_t>(b[t]);
    }
    for (const Implementation& impl : ConformingImplementations()) {
      EXPECT_EQ(impl.dot(a.data(), 3, b.data(), 1, n), static_cast<float>(exact))
          << impl.name << ", n = " << n;
    }
  }
}

TEST(EmulatedKernels, SequentialIsAPlainFp32Loop) {
  const LmHeadCase c = MakeCase("normal", 3, 5, 1000, 1);
  const std::vector<float> y =
      Logits(Find(ConformingImplementations(), "sequential fp32"), c.x, c.w, c.m, c.v, c.k);
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.v; ++j) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t < c.k; ++t) {
        acc += Bf16ToFloat(c.x[i * c.k + t]) * Bf16ToFloat(c.w[j * c.k + t]);
      }
      EXPECT_EQ(FloatBits(y[i * c.v + j]), FloatBits(acc)) << i << ", " << j;
    }
  }
}

std::vector<Implementation> Truncating() {
  std::vector<Implementation> out;
  for (Implementation& impl : ConformingImplementations()) {
    if (impl.name.find("truncated") != std::string::npos) out.push_back(impl);
  }
  return out;
}

TEST(EmulatedKernels, TruncatingAddersNeverExceedTheExactSumOfPositiveTerms) {
  const LmHeadCase c = MakeCase("all positive", 4, 8, 1000, 2);
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  ASSERT_EQ(Truncating().size(), 8u);
  for (const Implementation& impl : Truncating()) {
    const std::vector<float> y = Logits(impl, c.x, c.w, c.m, c.v, c.k);
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.v; ++j) {
        ExactSum exact;
        for (std::int64_t t = 0; t < c.k; ++t) {
          exact.Add(static_cast<double>(x[i * c.k + t]) * static_cast<double>(w[j * c.k + t]));
        }
        EXPECT_GE(exact.SignMinus(y[i * c.v + j]), 0) << impl.name << ", " << i << ", " << j;
      }
    }
  }
}

// 1 + (B − 1)·t truncates to 1 + (B − 2) ulps, each later block's B·t to
// B − 1 ulps: every block loses an ulp less B/256 of one (t = (1 − 2⁻⁸) ulps).
TEST(EmulatedKernels, TruncatingAddersLoseAboutAnUlpPerBlockOnADominantTerm) {
  const std::int64_t k = 1024;
  const LmHeadCase c = MakeCase("dominant term", 2, 3, k, 0);
  const double t = std::ldexp(255.0, -31), ulp = 0x1p-23;
  const double exact = 1.0 + static_cast<double>(k - 1) * t;
  for (std::int64_t block : {4, 8, 16, 32}) {
    const std::string name = "tensor-core blocks of " + std::to_string(block) + ", truncated";
    const std::vector<float> y =
        Logits(Find(ConformingImplementations(), name), c.x, c.w, c.m, c.v, c.k);
    const double blocks = static_cast<double>(k / block), b = static_cast<double>(block);
    const double expected = (1.0 - (b - 1.0) / 256.0) + (blocks - 1.0) * (1.0 - b / 256.0);
    for (float f : y) {
      EXPECT_DOUBLE_EQ((exact - f) / ulp, expected) << name;
      EXPECT_GT((exact - f) / ulp, 0.85 * blocks) << name;
    }
  }
  for (float f :
       Logits(Find(ConformingImplementations(), "sequential fp32"), c.x, c.w, c.m, c.v, c.k)) {
    EXPECT_LE(std::fabs(exact - f) / ulp, static_cast<double>(k) / 256.0 + 1.0);
  }
}

TEST(EmulatedKernels, Bf16OutputIsABf16Value) {
  const LmHeadCase c = MakeCase("normal", 4, 16, 256, 3);
  const std::vector<float> y =
      Logits(Find(DefectiveImplementations(), "bf16 logits upcast"), c.x, c.w, c.m, c.v, c.k);
  const std::vector<float> fp32 =
      Logits(Find(ConformingImplementations(), "sequential fp32"), c.x, c.w, c.m, c.v, c.k);
  int differ = 0;
  for (std::size_t e = 0; e < y.size(); ++e) {
    EXPECT_EQ(RoundToBf16(y[e]), y[e]);
    EXPECT_EQ(y[e], RoundToBf16(fp32[e]));
    differ += y[e] != fp32[e];
  }
  EXPECT_GT(differ, 0);
}

TEST(EmulatedKernels, RoundToFp16) {
  EXPECT_EQ(RoundToFp16(65504.0f), 65504.0f);
  EXPECT_EQ(RoundToFp16(65519.0f), 65504.0f);
  EXPECT_EQ(RoundToFp16(65520.0f), INFINITY);
  EXPECT_EQ(RoundToFp16(-65520.0f), -INFINITY);
  EXPECT_EQ(RoundToFp16(1.0f + 0x1p-11f), 1.0f);                // a tie, to even
  EXPECT_EQ(RoundToFp16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);  // a tie, to even
  EXPECT_EQ(RoundToFp16(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(RoundToFp16(0x1p-25f), 0.0f);  // half the smallest subnormal, to even
  EXPECT_EQ(RoundToFp16(3 * 0x1p-26f), 0x1p-24f);
  EXPECT_EQ(RoundToFp16(1.0f / 3.0f), 0.333251953125f);
  EXPECT_TRUE(std::isnan(RoundToFp16(NAN)));
}

// A narrow accumulator rounds the exact sum once: 2⁻¹⁰⁰ then 1 + 2⁻⁸ (a
// bf16 tie, which double arithmetic alone would see) is 1 + 2⁻⁷.
TEST(EmulatedKernels, Bf16AccumulationRoundsTheExactSumOnce) {
  const std::vector<float> a = {0x1p-50f, 1.0f + 0x1p-8f}, b = {0x1p-50f, 1.0f};
  const Implementation bf16 = Find(DefectiveImplementations(), "bf16 accumulation, sequential");
  EXPECT_EQ(bf16.dot(a.data(), 1, b.data(), 1, 2), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16.dot(a.data() + 1, -1, b.data() + 1, -1, 2), 1.0f);  // the tie first, to even
}

TEST(EmulatedKernels, ExactSumKeepsWhatDoublesLose) {
  ExactSum s;
  EXPECT_EQ(s.Sign(), 0);
  EXPECT_EQ(s.TruncatedToFloat(), 0.0f);
  for (double x : {1e30, 1.0, 0x1p-100, -1e30}) s.Add(x);
  EXPECT_EQ(s.Sign(), 1);
  EXPECT_EQ(s.TruncatedToFloat(), 1.0f);
  EXPECT_EQ(s.SignMinus(1.0), 1);
  s.Add(-1.0);
  EXPECT_EQ(s.TruncatedToFloat(), 0x1p-100f);
  s.Clear();
  s.Add(1.0);
  s.Add(-0x1p-80);
  EXPECT_EQ(s.TruncatedToFloat(), 1.0f - 0x1p-24f);
  s.Clear();
  s.Add(-3.0 * 0x1p-150);  // between fp32's two smallest subnormals
  EXPECT_EQ(s.TruncatedToFloat(), -0x1p-149f);
  s.Clear();
  s.Add(0x1p127);
  s.Add(0x1p127);
  EXPECT_EQ(s.TruncatedToFloat(), FLT_MAX);
}

TEST(EmulatedKernels, Fp16AccumulationOverflowsPast65504) {
  const std::vector<float> a(300, 16.0f), b(300, 16.0f);  // products of 256
  for (const std::string name :
       {"fp16 accumulation, sequential", "fp16 accumulation across blocks of 32 (fp32 within)"}) {
    const Implementation impl = Find(DefectiveImplementations(), name);
    EXPECT_EQ(impl.dot(a.data(), 1, b.data(), 1, 255), 65280.0f) << name;
    EXPECT_EQ(impl.dot(a.data(), 1, b.data(), 1, 300), INFINITY) << name;
  }
  EXPECT_EQ(Find(ConformingImplementations(), "sequential fp32").dot(a.data(), 1, b.data(), 1, 300),
            76800.0f);
}

// Every element's |y − r| against γ_K(2⁻²³)·Σ|x·w|, plus `floor` (an
// absolute term for products that fp32 rounds below its normal range).
void ExpectLogitsWithinBound(const LmHeadCase& c, double floor) {
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  for (const Implementation& impl : ConformingImplementations()) {
    const std::vector<float> y = Logits(impl, c.x, c.w, c.m, c.v, c.k);
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.v; ++j) {
        const Reference r = Dot(x.data() + i * c.k, 1, w.data() + j * c.k, 1, c.k);
        EXPECT_LE(std::fabs(y[i * c.v + j] - r.sum), ProvenBound(r, c.k) + floor)
            << impl.name << " on '" << c.name << "' at " << i << ", " << j;
      }
    }
  }
}

TEST(EmulatedKernels, EveryConformingLogitIsWithinTheProvenBound) {
  std::uint64_t seed = 10;
  for (const std::string& kind : CaseKinds()) {
    if (kind == "tiny") continue;  // below
    for (std::int64_t k : {1, 31, 300, 1000})
      ExpectLogitsWithinBound(MakeCase(kind, 3, 5, k, ++seed), 0.0);
  }
}

// Products below 2⁻¹²⁶ are rounded by fp32 multiplication, by up to 2⁻¹⁵⁰
// each: an error the relative bound does not cover, and an absolute term
// of K·2⁻¹⁴⁹ does.
TEST(EmulatedKernels, UnderflowingProductsNeedAnAbsoluteTerm) {
  const LmHeadCase c = MakeCase("tiny", 3, 5, 300, 4);
  ExpectLogitsWithinBound(c, static_cast<double>(c.k) * 0x1p-149);
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  const std::vector<float> y =
      Logits(Find(ConformingImplementations(), "sequential fp32"), c.x, c.w, c.m, c.v, c.k);
  int outside = 0;
  for (std::int64_t e = 0; e < c.m * c.v; ++e) {
    const Reference r = Dot(x.data() + e / c.v * c.k, 1, w.data() + e % c.v * c.k, 1, c.k);
    outside += std::fabs(y[e] - r.sum) > ProvenBound(r, c.k);
  }
  EXPECT_GT(outside, 0);
}

TEST(EmulatedKernels, AlphaIsOneFp32MultiplyOfTheDot) {
  const LmHeadCase c = MakeCase("normal", 2, 7, 100, 5);
  for (const Implementation& impl : ConformingImplementations()) {
    const std::vector<float> y = Logits(impl, c.x, c.w, c.m, c.v, c.k);
    const std::vector<float> scaled = Logits(impl, c.x, c.w, c.m, c.v, c.k, 0.3f);
    for (std::size_t e = 0; e < y.size(); ++e) EXPECT_EQ(scaled[e], 0.3f * y[e]) << impl.name;
  }
}

struct Backward {
  LmHeadCase c;
  std::vector<float> dy;
};

Backward MakeBackward(std::uint64_t seed) {
  Backward b{MakeCase("unit normal", 6, 40, 24, seed), {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (std::int64_t e = 0; e < b.c.m * b.c.v; ++e) b.dy.push_back(normal(rng));
  return b;
}

TEST(EmulatedKernels, EveryConformingGradientIsWithinTheProvenBound) {
  const Backward b = MakeBackward(6);
  const LmHeadCase& c = b.c;
  std::vector<float> g;
  for (float f : b.dy) g.push_back(RoundToBf16(f));
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  for (const Implementation& impl : ConformingImplementations()) {
    const std::vector<float> dx = GradInput(impl, b.dy, c.w, c.m, c.v, c.k);
    const std::vector<float> dw = GradWeight(impl, b.dy, c.x, c.m, c.v, c.k);
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t col = 0; col < c.k; ++col) {
        const Reference r = Dot(g.data() + i * c.v, 1, w.data() + col, c.k, c.v);
        EXPECT_LE(std::fabs(dx[i * c.k + col] - r.sum), ProvenBound(r, c.v)) << impl.name;
      }
    }
    for (std::int64_t j = 0; j < c.v; ++j) {
      for (std::int64_t col = 0; col < c.k; ++col) {
        const Reference r = Dot(g.data() + j, c.v, x.data() + col, c.k, c.m);
        EXPECT_LE(std::fabs(dw[j * c.k + col] - r.sum), ProvenBound(r, c.m)) << impl.name;
      }
    }
  }
}

TEST(EmulatedKernels, AMissingGradientCastUsesDyAsItCame) {
  const Backward b = MakeBackward(8);
  const LmHeadCase& c = b.c;
  const Implementation seq = Find(ConformingImplementations(), "sequential fp32");
  const std::vector<float> cast = GradInput(seq, b.dy, c.w, c.m, c.v, c.k);
  const std::vector<float> uncast = GradInput(seq, b.dy, c.w, c.m, c.v, c.k, false);
  const std::vector<float> w = Widen(c.w);
  int differ = 0;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t col = 0; col < c.k; ++col) {
      float acc = 0.0f;
      for (std::int64_t j = 0; j < c.v; ++j) acc += b.dy[i * c.v + j] * w[j * c.k + col];
      EXPECT_EQ(uncast[i * c.k + col], acc);
      differ += cast[i * c.k + col] != acc;
    }
  }
  EXPECT_GT(differ, c.m * c.k / 2);
  const std::vector<float> dw = GradWeight(seq, b.dy, c.x, c.m, c.v, c.k, false);
  EXPECT_NE(dw, GradWeight(seq, b.dy, c.x, c.m, c.v, c.k));
}

// At K = 4,096 every defect's worst error is several times the worst of
// any conforming implementation, as a share of Σ|x·w|.
TEST(EmulatedKernels, DefectsErrFarMoreThanConformingImplementations) {
  const LmHeadCase c = MakeCase("unit normal", 2, 16, 4096, 9);
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  auto worst = [&](const Implementation& impl) {
    const std::vector<float> y = Logits(impl, c.x, c.w, c.m, c.v, c.k);
    double out = 0.0;
    for (std::int64_t e = 0; e < c.m * c.v; ++e) {
      const Reference r = Dot(x.data() + e / c.v * c.k, 1, w.data() + e % c.v * c.k, 1, c.k);
      out = std::max(out, std::fabs(y[e] - r.sum) / r.abs_sum);
    }
    return out;
  };
  double conforming = 0.0;
  for (const Implementation& impl : ConformingImplementations()) {
    conforming = std::max(conforming, worst(impl));
  }
  for (const Implementation& impl : DefectiveImplementations()) {
    EXPECT_GT(worst(impl), 4.0 * conforming) << impl.name;
  }
}

TEST(EmulatedKernels, EveryCaseKindIsSeededAndShaped) {
  EXPECT_EQ(CaseKinds().size(), 12u);
  for (const std::string& kind : CaseKinds()) {
    for (std::int64_t k : {0, 1, 5, 64}) {
      const LmHeadCase c = MakeCase(kind, 3, 4, k, 11);
      EXPECT_EQ(c.name, kind);
      EXPECT_EQ(c.x.size(), static_cast<std::size_t>(3 * k)) << kind;
      EXPECT_EQ(c.w.size(), static_cast<std::size_t>(4 * k)) << kind;
      EXPECT_EQ(c.x, MakeCase(kind, 3, 4, k, 11).x) << kind;
    }
  }
}

double Product(const LmHeadCase& c, std::int64_t i, std::int64_t j, std::int64_t t) {
  return static_cast<double>(Bf16ToFloat(c.x[i * c.k + t])) * Bf16ToFloat(c.w[j * c.k + t]);
}

TEST(EmulatedKernels, CasesHaveTheirStructure) {
  const std::int64_t m = 8, v = 6, k = 64;
  auto make = [&](const char* kind) { return MakeCase(kind, m, v, k, 12); };
  const LmHeadCase equal = make("equal products"), cancel = make("cancellation");
  const LmHeadCase halves = make("halves"), tiny = make("tiny"), positive = make("all positive");
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (std::int64_t t = 0; t < k; ++t) {
        EXPECT_EQ(Product(equal, i, j, t), Product(equal, i, j, 0));
        sum += Product(cancel, i, j, t);
        abs_sum += std::fabs(Product(cancel, i, j, t));
        EXPECT_EQ(Product(halves, i, j, t) >= 0.0, t < k / 2);
        EXPECT_LT(std::fabs(Product(tiny, i, j, t)), 0x1p-126);
        EXPECT_GE(Product(positive, i, j, t), 0.0);
      }
      EXPECT_LT(std::fabs(sum), 0.01 * abs_sum);
    }
  }
  const LmHeadCase dominant = make("dominant term"), rows = make("constant rows");
  EXPECT_EQ(Bf16ToFloat(dominant.x[k]), 1.0f);
  EXPECT_EQ(Bf16ToFloat(dominant.x[k + 1]), std::ldexp(255.0f, -31));
  for (std::int64_t t = 0; t < k; ++t) EXPECT_EQ(rows.x[t], rows.x[0]);
}

}  // namespace
}  // namespace logitd::emulated

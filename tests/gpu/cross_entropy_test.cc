// The cuda backend's fused cross-entropy through the Backend interface:
// per-token loss and lse against an fp64 reference inside the fp32 bound of
// the logits, dX and dW against the fp64 gradient, ignore_index, z-loss and
// soft-capping; chunk independence; the cpu backend; determinism;
// accumulation into the weight's buffer; and a device memory budget that only
// a chunked walk fits in. Reductions over tokens are the service's: the
// backend returns per-token losses, and that is what is checked. The choice
// of chunk and walk (the plan) is tested without a device.
#include "server/kernels/cuda/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/cuda/cuda_backend.h"
#include "server/kernels/ops/cross_entropy.h"

namespace logitd::kernels::testing {
namespace {

constexpr std::int64_t kIgnore = -100;
constexpr std::uint32_t kPoison32 = 0xffffffffu;  // a NaN: unwritten outputs fail every check
constexpr Bf16Bits kPoison16 = 0xffffu;

// Uniform in (-scale, scale) as bf16 for a power-of-two scale (exact), never
// zero.
std::vector<Bf16Bits> ScaledBf16(std::int64_t n, std::uint64_t seed, float scale) {
  std::vector<Bf16Bits> out = RandomBf16(n, seed);
  for (auto& b : out) b = FloatToBf16(Bf16ToFloat(b) * scale);
  return out;
}

// Multiples of 1/16 in [-1/2, 1/2]: every product is a multiple of 1/256 and
// every fp32 sum of up to 2^18 of them is exact, so the logits are exact
// whatever the GEMM's order.
std::vector<Bf16Bits> SixteenthsBf16(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (auto& v : out) v = FloatToBf16(static_cast<float>(dist(rng)) / 16.0f);
  return out;
}

std::vector<std::int64_t> Targets(std::int64_t m, std::int64_t v, double ignored,
                                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> token(0, v - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (auto& x : t) x = u(rng) < ignored ? kIgnore : token(rng);
  return t;
}

struct Options {
  float z_loss = 0.0f;
  float softcap = 0.0f;
  float grad_scale = 1.0f;
  DType dx_dtype = DType::kBf16;
  bool want_lse = true;
  bool want_dx = true;
  bool want_dw = true;
  bool accumulate = false;
  std::int64_t chunk = 0;
};

struct Outputs {
  std::vector<float> loss;
  std::vector<float> lse;
  std::vector<Bf16Bits> dx16;
  std::vector<float> dx32;
  std::vector<float> dw;
  Timing timing;

  double dx(std::size_t i) const { return dx16.empty() ? dx32[i] : Bf16ToFloat(dx16[i]); }
};

absl::Status RunCe(Backend* b, Weight& w, const std::vector<Bf16Bits>& x,
                   const std::vector<std::int64_t>& t, const Options& o, Outputs* out) {
  const std::int64_t m = static_cast<std::int64_t>(t.size());
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  out->loss.assign(static_cast<std::size_t>(m), BitsToFloat(kPoison32));
  out->lse.assign(static_cast<std::size_t>(m), BitsToFloat(kPoison32));
  out->dx16.clear();
  out->dx32.clear();
  out->dw.clear();
  CrossEntropyArgs args;
  args.x = x.data();
  args.m = m;
  args.targets = t.data();
  args.ignore_index = kIgnore;
  args.z_loss = o.z_loss;
  args.logit_softcap = o.softcap;
  args.grad_scale = o.grad_scale;
  args.loss = out->loss.data();
  args.lse = o.want_lse ? out->lse.data() : nullptr;
  args.dx_dtype = o.dx_dtype;
  if (o.want_dx) {
    if (o.dx_dtype == DType::kBf16) {
      out->dx16.assign(static_cast<std::size_t>(m * k), kPoison16);
      args.dx = out->dx16.data();
    } else {
      out->dx32.assign(static_cast<std::size_t>(m * k), BitsToFloat(kPoison32));
      args.dx = out->dx32.data();
    }
  }
  if (o.want_dw && !o.accumulate) {
    out->dw.assign(static_cast<std::size_t>(v * k), BitsToFloat(kPoison32));
    args.dw = out->dw.data();
  }
  args.accumulate_dw = o.want_dw && o.accumulate;
  args.vocab_chunk = o.chunk;
  args.weight = &w;
  return b->Kernel(args, &out->timing);
}

// The fp64 reference: z, lse and loss per token, the exact logit gradient
// (before any rounding) and the same rounded to bf16 once, and the bound on
// each row's fp32 logits (gamma_K * max_v sum |x w|).
struct CeReference {
  std::vector<double> loss;
  std::vector<double> lse;
  std::vector<double> z_target;
  std::vector<double> logit_bound;
  std::vector<float> g_exact;  // [m, v]
  std::vector<float> g_bf16;   // [m, v]
};

CeReference Reference(const std::vector<float>& xf, const std::vector<float>& wf,
                      const std::vector<std::int64_t>& t, std::int64_t v, std::int64_t k,
                      const Options& o) {
  const std::int64_t m = static_cast<std::int64_t>(t.size());
  const testing::Reference y = LogitsReference(xf, wf, m, v, k);
  CeReference r;
  r.loss.assign(static_cast<std::size_t>(m), 0.0);
  r.lse.assign(static_cast<std::size_t>(m), 0.0);
  r.z_target.assign(static_cast<std::size_t>(m), 0.0);
  r.logit_bound.assign(static_cast<std::size_t>(m), 0.0);
  r.g_exact.assign(static_cast<std::size_t>(m * v), 0.0f);
  r.g_bf16.assign(static_cast<std::size_t>(m * v), 0.0f);
  const double cap = o.softcap;
  const double zl = o.z_loss;
  ParallelFor(m, [&](std::int64_t begin, std::int64_t end) {
    std::vector<double> z(static_cast<std::size_t>(v));
    for (std::int64_t i = begin; i < end; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      double bound = 0;
      for (std::int64_t j = 0; j < v; ++j) {
        const std::size_t at = static_cast<std::size_t>(i * v + j);
        const double yv = y.value[at];
        z[static_cast<std::size_t>(j)] = cap > 0 ? cap * std::tanh(yv / cap) : yv;
        mx = std::max(mx, z[static_cast<std::size_t>(j)]);
        bound = std::max(bound, Gamma(k) * y.abs_sum[at]);
      }
      double s = 0;
      for (std::int64_t j = 0; j < v; ++j) s += std::exp(z[static_cast<std::size_t>(j)] - mx);
      const double lse = mx + std::log(s);
      const auto row = static_cast<std::size_t>(i);
      r.lse[row] = lse;
      r.logit_bound[row] = bound;
      const std::int64_t ti = t[row];
      if (ti == kIgnore) continue;
      r.z_target[row] = z[static_cast<std::size_t>(ti)];
      r.loss[row] = lse - r.z_target[row] + zl * lse * lse;
      for (std::int64_t j = 0; j < v; ++j) {
        const double zj = z[static_cast<std::size_t>(j)];
        double d = std::exp(zj - lse) * (1.0 + 2.0 * zl * lse) - (j == ti ? 1.0 : 0.0);
        if (cap > 0) {
          const double th = zj / cap;
          d *= 1.0 - th * th;
        }
        d *= o.grad_scale;
        const std::size_t at = static_cast<std::size_t>(i * v + j);
        r.g_exact[at] = static_cast<float>(d);
        r.g_bf16[at] = Bf16ToFloat(FloatToBf16(static_cast<float>(d)));
      }
    }
  });
  return r;
}

double RelativeFrobenius(const std::function<double(std::size_t)>& got,
                         const std::vector<double>& ref) {
  double num = 0;
  double den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = got(i) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Per-token loss and lse inside the bound: the logits' own fp32 error (and
// soft-capping's, a few ulps of the cap) carried through lse, z_t and the
// z-loss term, plus a few fp32 ulps for the reduction itself.
void ExpectLossAndLseWithinBounds(const CeReference& r, const std::vector<std::int64_t>& t,
                                  const Options& o, const Outputs& out, const std::string& what) {
  const double u = kFp32Unit;
  double worst_ratio = 0;
  double worst_lse_ulps = 0;
  int bad = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double ez = r.logit_bound[i] + (o.softcap > 0 ? 8 * u * o.softcap : 0.0);
    const double lse = r.lse[i];
    const double bound_lse = ez + 16 * u * (1 + std::fabs(lse));
    const double err_lse = std::fabs(out.lse[i] - lse);
    double err_loss = 0;
    double bound_loss = 1;
    if (t[i] == kIgnore) {
      if (out.loss[i] != 0.0f && ++bad <= 5) {
        ADD_FAILURE() << what << ": ignored token " << i << " has loss " << out.loss[i];
      }
    } else {
      bound_loss = bound_lse * (1 + 2 * o.z_loss * std::fabs(lse)) + ez +
                   16 * u * (1 + std::fabs(r.loss[i]));
      err_loss = std::fabs(out.loss[i] - r.loss[i]);
    }
    if (!(err_lse <= bound_lse) || !(err_loss <= bound_loss)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << ": token " << i << " lse " << out.lse[i] << " vs " << lse
                      << " (bound " << bound_lse << "), loss " << out.loss[i] << " vs " << r.loss[i]
                      << " (bound " << bound_loss << ")";
      }
    }
    worst_ratio = std::max({worst_ratio, err_lse / bound_lse, err_loss / bound_loss});
    worst_lse_ulps = std::max(worst_lse_ulps, err_lse / (u * std::max(1.0, std::fabs(lse))));
  }
  EXPECT_EQ(bad, 0) << what;
  std::cout << what << ": worst error / bound " << worst_ratio << ", worst lse error "
            << worst_lse_ulps << " u * max(1, |lse|)\n";
}

struct Case {
  std::string name;
  std::int64_t m, v, k;
  float x_scale;
  double ignored;
  Options o;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " M=" << c.m << " V=" << c.v << " K=" << c.k;
}

std::shared_ptr<Weight> Load(Backend* b, const std::vector<Bf16Bits>& w, std::int64_t v,
                             std::int64_t k) {
  auto loaded = b->LoadWeight(w.data(), v, k);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *loaded : nullptr;
}

// --- no device needed ------------------------------------------------------

TEST(CeChunkChoice, WholeQuantaWithinTheWorkspaceAndEvenedOut) {
  using cuda::ChooseCeChunk;
  using cuda::kCeChunkQuantum;
  // Everything fits: one chunk.
  EXPECT_EQ(ChooseCeChunk(16, 128256, true, 0, 256u << 20), 128256);
  EXPECT_EQ(ChooseCeChunk(4096, 700, true, 0, 1), 700);
  for (std::int64_t m : {1, 255, 4096, 8192, 65536}) {
    for (std::int64_t v : {1025, 32000, 128256, 256000}) {
      for (std::uint64_t extra : {std::uint64_t{0}, std::uint64_t{32768}}) {
        const std::uint64_t ws = 256u << 20;
        const std::int64_t c = ChooseCeChunk(m, v, true, extra, ws);
        SCOPED_TRACE(::testing::Message() << "m=" << m << " v=" << v << " extra=" << extra);
        ASSERT_GE(c, 1);
        ASSERT_LE(c, v);
        if (c < v) {
          EXPECT_EQ(c % kCeChunkQuantum, 0);
          const std::uint64_t per_row = static_cast<std::uint64_t>(m) * 6 + extra;
          if (c > kCeChunkQuantum) {
            EXPECT_LE(static_cast<std::uint64_t>(c) * per_row, ws);
          }
          // Evening out never adds a chunk.
          const std::uint64_t widest = ws / per_row / kCeChunkQuantum * kCeChunkQuantum;
          if (widest >= static_cast<std::uint64_t>(kCeChunkQuantum)) {
            EXPECT_EQ((v + c - 1) / c, (v + static_cast<std::int64_t>(widest) - 1) /
                                           static_cast<std::int64_t>(widest));
          }
        }
      }
    }
  }
  EXPECT_EQ(ChooseCeChunk(4096, 128256, true, 0, 256u << 20), 10240);
  EXPECT_EQ(cuda::RoundCeChunk(1, 5000), kCeChunkQuantum);
  EXPECT_EQ(cuda::RoundCeChunk(1500, 5000), 2 * kCeChunkQuantum);
  EXPECT_EQ(cuda::RoundCeChunk(4500, 5000), 5000);
  EXPECT_EQ(cuda::RoundCeChunk(9000, 5000), 5000);
}

// What the backend asks of the planner for [m, V, K] with every gradient:
// dX in bf16, dW accumulated on the device.
cuda::CePlanRequest GradientsRequest(std::int64_t m, std::int64_t v, std::int64_t k) {
  cuda::CePlanRequest r;
  r.m = m;
  r.v = v;
  r.k = k;
  r.want_dx = true;
  r.dx_bf16 = true;
  r.want_dw = true;
  r.accumulate_dw = true;
  return r;
}

TEST(CePlan, LossOnlyTakesTheVocabularyWalkInStatisticsSizedChunks) {
  cuda::CePlanRequest r;
  r.m = 4096;
  r.v = 128256;
  r.k = 4096;
  const cuda::CePlan plan = cuda::PlanCrossEntropy(r);
  EXPECT_EQ(plan.walk, cuda::CeWalk::kVocabulary);
  // 8,192 columns of 4,096 tokens' fp32 logits: more than 32 MiB.
  EXPECT_EQ(plan.workspace, 4096u * 4 * cuda::kCeStatsMinColumns);
  EXPECT_EQ(plan.token_workspace, 0u);
  EXPECT_EQ(plan.chunk, cuda::kCeStatsMinColumns);
  EXPECT_EQ(plan.sizes.total(), cuda::CeScratch(4096, 4096, plan.chunk, false, false).total());
  EXPECT_EQ(plan.sizes.g, 0u);

  // 1,024 tokens: 32 MiB chunks, 8,192 columns again; 16 tokens: all of V
  // in 32 MiB; 65,536 tokens: the usual 256 MiB, 1,024 columns.
  r.m = 1024;
  EXPECT_EQ(cuda::PlanCrossEntropy(r).workspace, cuda::kCeStatsChunkBytes);
  EXPECT_EQ(cuda::PlanCrossEntropy(r).chunk, 8192);
  r.m = 16;
  EXPECT_EQ(cuda::PlanCrossEntropy(r).chunk, 128256);
  r.m = 65536;
  EXPECT_EQ(cuda::PlanCrossEntropy(r).workspace, cuda::kCeWorkspaceBytes);
  EXPECT_EQ(cuda::PlanCrossEntropy(r).chunk, 1024);
  // A configured workspace is taken as it is.
  r.m = 1024;
  r.workspace_bytes = 256u << 20;
  EXPECT_EQ(cuda::PlanCrossEntropy(r).chunk,
            cuda::ChooseCeChunk(1024, 128256, false, 0, 256u << 20));
}

TEST(CePlan, GradientsTakeTheTokenWalkWhenEnoughTokensFit) {
  const cuda::CePlanRequest r = GradientsRequest(8192, 128256, 4096);
  const cuda::CePlan plan = cuda::PlanCrossEntropy(r);
  // 45% of dX (bf16) and dW (fp32): the peak stays within 1.5 times them.
  const std::uint64_t outputs = 8192ull * 4096 * 2 + 128256ull * 4096 * 4;
  EXPECT_EQ(plan.token_workspace, cuda::CeTokenWorkspace(outputs));
  EXPECT_EQ(plan.token_workspace, outputs / 100 * 45);
  EXPECT_LE(outputs + plan.sizes.total(), outputs / 100 * 146);
  ASSERT_EQ(plan.walk, cuda::CeWalk::kTokens);
  EXPECT_EQ(plan.chunk, cuda::ChooseCeTokenChunk(8192, 128256, 4096, true, plan.token_workspace));
  EXPECT_GE(plan.chunk, cuda::kCeMinTokenChunk);
  EXPECT_EQ(plan.chunk % cuda::kCeTokenQuantum, 0);
  EXPECT_EQ(plan.sizes.total(), cuda::CeTokenScratch(plan.chunk, 128256, 4096, true).total());
  // A pure function of the request.
  const cuda::CePlan again = cuda::PlanCrossEntropy(r);
  EXPECT_EQ(again.walk, plan.walk);
  EXPECT_EQ(again.chunk, plan.chunk);

  // A workspace that holds neither all the tokens nor kCeMinTokenChunk of
  // them: the vocabulary walk, with room for dW's two staging chunks when dW
  // goes to the host.
  cuda::CePlanRequest few = GradientsRequest(256, 128256, 4096);
  few.accumulate_dw = false;
  few.workspace_bytes = 64u << 20;
  const cuda::CePlan vocab = cuda::PlanCrossEntropy(few);
  EXPECT_EQ(vocab.walk, cuda::CeWalk::kVocabulary);
  EXPECT_EQ(vocab.chunk, cuda::ChooseCeChunk(256, 128256, true, 2 * 4096 * 4, 64u << 20));
}

TEST(CePlan, TheCallersChunkIsKeptAndNeverShrunk) {
  cuda::CePlanRequest r = GradientsRequest(8192, 128256, 4096);
  r.vocab_chunk = 1500;
  const cuda::CePlan plan = cuda::PlanCrossEntropy(r);
  EXPECT_EQ(plan.walk, cuda::CeWalk::kVocabulary);
  EXPECT_EQ(plan.chunk, 2 * cuda::kCeChunkQuantum);
  EXPECT_FALSE(cuda::ShrinkCePlan(r, plan).has_value());
}

TEST(CePlan, AQuarterOfTheDeviceBudgetCapsBothAllowances) {
  cuda::CePlanRequest r = GradientsRequest(8192, 128256, 4096);
  r.device_memory_budget = 64u << 20;
  const cuda::CePlan plan = cuda::PlanCrossEntropy(r);
  EXPECT_EQ(plan.workspace, 16u << 20);
  EXPECT_EQ(plan.token_workspace, 16u << 20);
  // 16 MiB holds 32 tokens of 128256 logits, too few for the token walk.
  EXPECT_EQ(plan.walk, cuda::CeWalk::kVocabulary);
  r.workspace_bytes = 8u << 20;  // a configured workspace below the cap
  EXPECT_EQ(cuda::PlanCrossEntropy(r).workspace, 8u << 20);
}

TEST(CePlan, ShrinkingHalvesTheTokenWalkThenTheVocabularyWalkDownToOneQuantum) {
  const cuda::CePlanRequest r = GradientsRequest(8192, 128256, 4096);
  const cuda::CePlan first = cuda::PlanCrossEntropy(r);
  ASSERT_EQ(first.walk, cuda::CeWalk::kTokens);
  cuda::CePlan plan = first;
  int steps = 0;
  for (std::optional<cuda::CePlan> next = cuda::ShrinkCePlan(r, plan); next.has_value();
       next = cuda::ShrinkCePlan(r, plan)) {
    ASSERT_LT(++steps, 100);
    if (plan.walk == cuda::CeWalk::kTokens) {
      EXPECT_EQ(next->token_workspace, plan.token_workspace / 2);
      // The vocabulary walk starts from its own allowance, not a halved one.
      EXPECT_EQ(next->workspace, first.workspace);
    } else {
      EXPECT_EQ(next->walk, cuda::CeWalk::kVocabulary);
      EXPECT_EQ(next->workspace, plan.workspace / 2);
      EXPECT_LE(next->chunk, plan.chunk);
    }
    plan = *next;
  }
  EXPECT_EQ(plan.walk, cuda::CeWalk::kVocabulary);
  EXPECT_EQ(plan.chunk, cuda::kCeChunkQuantum);
  EXPECT_GT(steps, 1);
}

// --- the backend -------------------------------------------------------------

class CrossEntropyTest : public CudaFixture {};
class CrossEntropyReferenceTest : public CudaFixture, public ::testing::WithParamInterface<Case> {};

TEST_P(CrossEntropyReferenceTest, MatchesFp64Reference) {
  const Case& c = GetParam();
  const auto x = ScaledBf16(c.m * c.k, 1 + c.m, c.x_scale);
  const auto w = RandomBf16(c.v * c.k, 2 + c.v);
  const auto t = Targets(c.m, c.v, c.ignored, 3 + c.k);
  auto weight = Load(backend(), w, c.v, c.k);
  ASSERT_NE(weight, nullptr);
  Outputs out;
  const absl::Status st = RunCe(backend(), *weight, x, t, c.o, &out);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GT(out.timing.compute_us, 0);

  const std::vector<float> xf = Widen(x);
  const std::vector<float> wf = Widen(w);
  const CeReference r = Reference(xf, wf, t, c.v, c.k, c.o);
  ExpectLossAndLseWithinBounds(r, t, c.o, out, c.name);

  // dX and dW against the exact gradient (bf16 G: ~2^-9 relative per
  // element) and against the gradient rounded to bf16 once, as the contract
  // says (only elements whose rounding the fp32 logits move can differ; a
  // bf16 dX adds its own rounding, ~1.1e-3 relative RMS).
  for (const bool rounded : {false, true}) {
    const std::vector<float>& g = rounded ? r.g_bf16 : r.g_exact;
    const double tolerance = rounded ? 1e-3 : 1e-2;
    const double dx_tolerance = rounded && c.o.dx_dtype == DType::kBf16 ? 3e-3 : tolerance;
    const char* which = rounded ? "bf16(G) reference" : "exact-G reference";
    if (c.o.want_dx) {
      const testing::Reference dx = GradInputReference(g, wf, c.m, c.v, c.k);
      const double e = RelativeFrobenius([&](std::size_t i) { return out.dx(i); }, dx.value);
      EXPECT_LE(e, dx_tolerance) << c.name << " dX vs " << which;
      std::cout << c.name << ": dX relative Frobenius error vs " << which << " " << e << "\n";
    }
    if (c.o.want_dw) {
      const testing::Reference dw = GradWeightReference(g, xf, c.m, c.v, c.k);
      const double e = RelativeFrobenius([&](std::size_t i) { return out.dw[i]; }, dw.value);
      EXPECT_LE(e, tolerance) << c.name << " dW vs " << which;
      std::cout << c.name << ": dW relative Frobenius error vs " << which << " " << e << "\n";
    }
  }
  // Ignored tokens: no loss (checked above) and a zero row of dX.
  if (c.o.want_dx) {
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i] != kIgnore) continue;
      for (std::int64_t j = 0; j < c.k; ++j) {
        ASSERT_EQ(out.dx(i * static_cast<std::size_t>(c.k) + static_cast<std::size_t>(j)), 0.0)
            << "token " << i;
      }
    }
  }
}

Options With(float z_loss, float softcap, float grad_scale, DType dx, std::int64_t chunk) {
  Options o;
  o.z_loss = z_loss;
  o.softcap = softcap;
  o.grad_scale = grad_scale;
  o.dx_dtype = dx;
  o.chunk = chunk;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CrossEntropyReferenceTest,
    ::testing::Values(
        Case{"Plain_OneChunk", 64, 5000, 256, 0.5f, 0.0, With(0, 0, 1, DType::kBf16, 0)},
        Case{"Plain_Chunks1024", 64, 5000, 256, 0.5f, 0.0, With(0, 0, 1, DType::kBf16, 1024)},
        Case{"Ignore_ZLoss", 96, 3001, 320, 0.5f, 0.25,
             With(1e-2f, 0, 1.0f / 72, DType::kBf16, 1024)},
        Case{"Softcap_Fp32Dx", 80, 4100, 256, 1.0f, 0.1, With(0, 2.0f, 0.5f, DType::kFp32, 2048)},
        Case{"Softcap_ZLoss_Chunked", 48, 6000, 200, 1.0f, 0.2,
             With(1e-3f, 5.0f, 1.0f, DType::kBf16, 1000)},
        Case{"OneToken", 1, 300, 64, 0.5f, 0.0, With(0, 0, 1, DType::kBf16, 0)},
        Case{"LongK", 32, 2048, 2048, 0.125f, 0.0, With(0, 0, 1, DType::kBf16, 0)}),
    [](const auto& info) { return info.param.name; });

// Exact logits: lse and loss then carry only the reduction's own error, a few
// fp32 ulps; and lse, loss and G are the same bits whatever the chunk.
TEST_F(CrossEntropyTest, ExactLogitsGiveUlpAccurateLossAndChunkIndependentBits) {
  const std::int64_t m = 40, v = 5000, k = 384;
  const auto x = SixteenthsBf16(m * k, 41);
  const auto w = SixteenthsBf16(v * k, 42);
  const auto t = Targets(m, v, 0.1, 43);
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  Options o = With(1e-3f, 0, 1, DType::kFp32, 0);
  Outputs whole;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &whole).ok());
  const CeReference r = Reference(Widen(x), Widen(w), t, v, k, o);
  double worst = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double scale = kFp32Unit * std::max(1.0, std::fabs(r.lse[i]));
    const double e_lse = std::fabs(whole.lse[i] - r.lse[i]) / scale;
    EXPECT_LE(e_lse, 4.0) << "token " << i;
    worst = std::max(worst, e_lse);
    if (t[i] != kIgnore) {
      const double e_loss =
          std::fabs(whole.loss[i] - r.loss[i]) /
          (kFp32Unit * std::max({1.0, std::fabs(r.lse[i]), std::fabs(r.loss[i])}));
      EXPECT_LE(e_loss, 8.0) << "token " << i;
      worst = std::max(worst, e_loss);
    }
  }
  std::cout << "exact logits: worst lse/loss error " << worst << " u * max(1, |value|)\n";
  for (std::int64_t chunk : {1024, 2048, 3072}) {
    o.chunk = chunk;
    Outputs chunked;
    ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &chunked).ok());
    EXPECT_EQ(std::memcmp(chunked.loss.data(), whole.loss.data(), m * 4), 0) << chunk;
    EXPECT_EQ(std::memcmp(chunked.lse.data(), whole.lse.data(), m * 4), 0) << chunk;
    // dW rows come from one chunk each: G and X are the same bits, and so is
    // the product where the GEMM's algorithm is; within rounding otherwise.
    std::vector<double> dw_ref(whole.dw.begin(), whole.dw.end());
    EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return chunked.dw[i]; }, dw_ref), 1e-5);
    std::vector<double> dx_ref(whole.dx32.begin(), whole.dx32.end());
    EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return chunked.dx32[i]; }, dx_ref), 1e-5);
  }
}

// Random data, several chunks against one: lse and loss agree to the GEMM's
// own rounding (the logits of a narrower product may come from another
// algorithm), gradients to well below bf16's resolution.
TEST_F(CrossEntropyTest, ChunkedAgreesWithOneChunk) {
  const std::int64_t m = 128, v = 8192 + 77, k = 512;
  const auto x = ScaledBf16(m * k, 51, 0.25f);
  const auto w = RandomBf16(v * k, 52);
  const auto t = Targets(m, v, 0.05, 53);
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  Options o = With(1e-4f, 0, 1.0f / m, DType::kBf16, v);
  Outputs whole;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &whole).ok());
  const CeReference r = Reference(Widen(x), Widen(w), t, v, k, o);
  for (std::int64_t chunk : {1024, 3000, 4096}) {
    o.chunk = chunk;
    Outputs chunked;
    ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &chunked).ok());
    for (std::size_t i = 0; i < t.size(); ++i) {
      // Both inside the fp64 reference's bound; and close to each other.
      const double tol = 2 * (r.logit_bound[i] + 16 * kFp32Unit * (1 + std::fabs(r.lse[i])));
      EXPECT_LE(std::fabs(chunked.lse[i] - whole.lse[i]), tol)
          << "chunk " << chunk << " token " << i;
      EXPECT_LE(std::fabs(chunked.loss[i] - whole.loss[i]), 2 * tol)
          << "chunk " << chunk << " token " << i;
    }
    std::vector<double> dx_ref(whole.dx16.size());
    for (std::size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] = Bf16ToFloat(whole.dx16[i]);
    std::vector<double> dw_ref(whole.dw.begin(), whole.dw.end());
    const double edx = RelativeFrobenius([&](std::size_t i) { return chunked.dx(i); }, dx_ref);
    const double edw = RelativeFrobenius([&](std::size_t i) { return chunked.dw[i]; }, dw_ref);
    EXPECT_LE(edx, 2e-3) << "chunk " << chunk;
    EXPECT_LE(edw, 1e-3) << "chunk " << chunk;
    std::cout << "chunk " << chunk << ": dX differs by " << edx << ", dW by " << edw
              << " (relative Frobenius)\n";
  }
}

TEST_F(CrossEntropyTest, SameCallGivesSameBitsRepeatedAndConcurrently) {
  const std::int64_t m = 200, v = 6000, k = 256;
  const auto x = ScaledBf16(m * k, 61, 0.5f);
  const auto w = RandomBf16(v * k, 62);
  const auto t = Targets(m, v, 0.1, 63);
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  const Options o = With(1e-3f, 10.0f, 1.0f / 180, DType::kBf16, 2048);
  Outputs first;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &first).ok());
  auto same = [&](const Outputs& a) {
    return std::memcmp(a.loss.data(), first.loss.data(), m * 4) == 0 &&
           std::memcmp(a.lse.data(), first.lse.data(), m * 4) == 0 &&
           std::memcmp(a.dx16.data(), first.dx16.data(), first.dx16.size() * 2) == 0 &&
           std::memcmp(a.dw.data(), first.dw.data(), first.dw.size() * 4) == 0;
  };
  Outputs again;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &again).ok());
  EXPECT_TRUE(same(again));
  constexpr int kThreads = 6;
  std::atomic<int> differ{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      Outputs mine;
      if (!RunCe(backend(), *weight, x, t, o, &mine).ok() || !same(mine)) ++differ;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(differ.load(), 0);
}

// W = 0: every logit is 0, softmax is 1/V = 2^-11 exactly after the bf16
// rounding, and G holds 2^-11 and -1 (the target), both exact; with integer X
// every dW sum is exact. So dW equals the exact product bit for bit, and two
// accumulations equal twice it whatever the GEMM's order.
TEST_F(CrossEntropyTest, AccumulateTwiceGivesTwiceTheExactGradientAndCountsTwo) {
  const std::int64_t m = 48, v = 2048, k = 160;
  const std::vector<Bf16Bits> w(static_cast<std::size_t>(v * k), 0);
  const auto x = IntegerBf16(m * k, 71);
  const auto t = Targets(m, v, 0.2, 72);
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  std::vector<float> g(static_cast<std::size_t>(m * v), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) {
    if (t[static_cast<std::size_t>(i)] == kIgnore) continue;
    for (std::int64_t j = 0; j < v; ++j) {
      g[static_cast<std::size_t>(i * v + j)] =
          j == t[static_cast<std::size_t>(i)] ? -1.0f : 1.0f / 2048;
    }
  }
  const testing::Reference exact = GradWeightReference(g, Widen(x), m, v, k);
  Options o = With(0, 0, 1, DType::kBf16, 1024);
  Outputs returned;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &returned).ok());
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < returned.dw.size(); ++i) {
    bad += FloatBits(returned.dw[i]) != FloatBits(static_cast<float>(exact.value[i]));
  }
  EXPECT_EQ(bad, 0);
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == kIgnore) continue;
    EXPECT_NEAR(returned.loss[i], std::log(2048.0), 4 * kFp32Unit * std::log(2048.0));
  }

  o.accumulate = true;
  Outputs acc;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &acc).ok());
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &acc).ok());
  std::vector<float> grad(static_cast<std::size_t>(v * k), BitsToFloat(kPoison32));
  auto count = backend()->FetchGradient(*weight, grad.data(), true);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 2u);
  bad = 0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    bad += FloatBits(grad[i]) != FloatBits(static_cast<float>(2 * exact.value[i]));
  }
  EXPECT_EQ(bad, 0);
  // The fetch zeroed the buffer and its count.
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &acc).ok());
  count = backend()->FetchGradient(*weight, grad.data(), false);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 1u);
}

TEST_F(CrossEntropyTest, NaNActivationsPoisonOnlyTheirToken) {
  const std::int64_t m = 8, v = 1500, k = 64;
  auto x = ScaledBf16(m * k, 81, 0.5f);
  x[3 * k + 5] = 0x7fc0;  // NaN in token 3
  const auto w = RandomBf16(v * k, 82);
  const std::vector<std::int64_t> t = {0, 1, 2, 3, 4, 5, 6, kIgnore};
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  Outputs out;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, With(0, 0, 1, DType::kBf16, 0), &out).ok());
  for (std::int64_t i = 0; i < m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    if (i == 3) {
      EXPECT_TRUE(std::isnan(out.loss[r]));
      EXPECT_TRUE(std::isnan(out.lse[r]));
    } else {
      EXPECT_TRUE(std::isfinite(out.loss[r])) << i;
      EXPECT_TRUE(std::isfinite(out.lse[r])) << i;
    }
  }
  EXPECT_EQ(out.loss[7], 0.0f);
}

TEST_F(CrossEntropyTest, RejectsArgumentsThatDoNotAgree) {
  const std::int64_t m = 4, v = 100, k = 32;
  const auto x = ScaledBf16(m * k, 91, 0.5f);
  const auto w = RandomBf16(v * k, 92);
  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  Outputs out;
  auto code = [&](std::vector<std::int64_t> t, Options o) {
    return RunCe(backend(), *weight, x, t, o, &out).code();
  };
  const Options ok = With(0, 0, 1, DType::kBf16, 0);
  EXPECT_EQ(code({1, 2, 3, 100}, ok), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, -1, 4}, ok), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4}, With(0, -1.0f, 1, DType::kBf16, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4}, With(-0.5f, 0, 1, DType::kBf16, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4}, With(std::nanf(""), 0, 1, DType::kBf16, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4}, With(0, 0, std::numeric_limits<float>::infinity(), DType::kBf16, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3, 4}, With(0, 0, 1, DType::kInt32, 0)),
            absl::StatusCode::kInvalidArgument);
  CrossEntropyArgs args;
  args.weight = weight.get();
  args.x = x.data();
  args.m = 0;
  std::vector<std::int64_t> t = {1, 2, 3, 4};
  std::vector<float> loss(4);
  args.targets = t.data();
  args.loss = loss.data();
  EXPECT_EQ(backend()->Kernel(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.m = 4;
  args.loss = nullptr;
  EXPECT_EQ(backend()->Kernel(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Still serving; loss only (no gradients) works too.
  Options loss_only = ok;
  loss_only.want_dx = false;
  loss_only.want_dw = false;
  loss_only.want_lse = false;
  EXPECT_TRUE(RunCe(backend(), *weight, x, {1, 2, 3, kIgnore}, loss_only, &out).ok());
  EXPECT_EQ(out.loss[3], 0.0f);
}

// The memory claim: with a budget that holds the weight, its fp32 gradient
// and 40 MiB more, a call whose [M, V] fp32 logits alone would take 128 MiB
// still runs (the automatic chunk shrinks to what fits), and gives the same
// loss and lse bits as one chunk on an unconstrained backend (exact logits).
TEST_F(CrossEntropyTest, LargeVocabularyRunsInAWorkspaceFarBelowMTimesV) {
  const std::int64_t m = 256, v = 131072, k = 1024;
  const std::uint64_t allowance = 40u << 20;
  ASSERT_GT(static_cast<std::uint64_t>(m * v) * 4, 3 * allowance);
  const auto x = SixteenthsBf16(m * k, 101);
  const auto w = SixteenthsBf16(v * k, 102);
  const auto t = Targets(m, v, 0.05, 103);

  BackendOptions options;
  // Four 32 MiB cuBLASLt workspaces, the weight, its fp32 gradient, and the
  // allowance for everything the call adds (x, dX, per-row state, chunks).
  options.device_memory_budget = (128u << 20) + static_cast<std::uint64_t>(v * k) * 2 +
                                 static_cast<std::uint64_t>(v * k) * 4 + allowance;
  auto created = cuda::CreateCudaBackend(options);
  ASSERT_TRUE(created.ok()) << created.status();
  Backend* tight = created->get();
  auto tight_weight = Load(tight, w, v, k);
  ASSERT_NE(tight_weight, nullptr);
  const std::uint64_t before = tight->DeviceBytesInUse();

  Options o = With(0, 0, 1.0f / m, DType::kBf16, 0);
  o.accumulate = true;
  Outputs small;
  const absl::Status st = RunCe(tight, *tight_weight, x, t, o, &small);
  ASSERT_TRUE(st.ok()) << st;
  const std::uint64_t after = tight->DeviceBytesInUse();
  EXPECT_LE(after, options.device_memory_budget);
  const std::uint64_t gradient = static_cast<std::uint64_t>(v * k) * 4;
  EXPECT_LE(after - before, gradient + allowance);
  std::cout << "held after the call beyond weight and workspaces: gradient + "
            << (after - before - gradient) / 1048576.0 << " MiB of retained scratch; [M, V] fp32 "
            << "would be " << (m * v * 4) / 1048576 << " MiB\n";

  auto wide_weight = Load(backend(), w, v, k);
  ASSERT_NE(wide_weight, nullptr);
  Outputs wide;
  ASSERT_TRUE(RunCe(backend(), *wide_weight, x, t, o, &wide).ok());
  EXPECT_EQ(std::memcmp(small.loss.data(), wide.loss.data(), m * 4), 0);
  EXPECT_EQ(std::memcmp(small.lse.data(), wide.lse.data(), m * 4), 0);
  std::vector<double> dx_ref(wide.dx16.size());
  for (std::size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] = Bf16ToFloat(wide.dx16[i]);
  EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return small.dx(i); }, dx_ref), 1e-3);
  std::vector<float> g_small(static_cast<std::size_t>(v * k));
  std::vector<float> g_wide(static_cast<std::size_t>(v * k));
  ASSERT_TRUE(tight->FetchGradient(*tight_weight, g_small.data(), true).ok());
  ASSERT_TRUE(backend()->FetchGradient(*wide_weight, g_wide.data(), true).ok());
  std::vector<double> dw_ref(g_wide.begin(), g_wide.end());
  EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return g_small[i]; }, dw_ref), 1e-6);
}

// The token walk in several chunks (a budget that holds about half the
// tokens' logits) against the vocabulary walk: exact logits give the same
// lse and loss bits, and dX and dW agree to their fp32 rounding (the
// vocabulary walk is held to the fp64 reference above).
TEST_F(CrossEntropyTest, TokenWalkInChunksAgreesWithTheVocabularyWalk) {
  const std::int64_t m = 2500, v = 8192, k = 256;
  BackendOptions options;
  options.device_memory_budget = 200u << 20;
  auto created = cuda::CreateCudaBackend(options);
  ASSERT_TRUE(created.ok()) << created.status();
  Backend* tight = created->get();

  const auto x = SixteenthsBf16(m * k, 201);
  const auto w = SixteenthsBf16(v * k, 202);
  const auto t = Targets(m, v, 0.05, 203);
  auto tight_weight = Load(tight, w, v, k);
  ASSERT_NE(tight_weight, nullptr);
  Options o = With(1e-3f, 0, 1.0f / m, DType::kFp32, 0);
  Outputs tokens;
  const absl::Status st = RunCe(tight, *tight_weight, x, t, o, &tokens);
  ASSERT_TRUE(st.ok()) << st;
  // Two or more chunks of whole quanta, fewer tokens each than m.
  ASSERT_EQ(tokens.timing.plan.rfind("tokens walk, chunk ", 0), 0u) << tokens.timing.plan;
  const std::int64_t chunk = std::stoll(tokens.timing.plan.substr(19));
  EXPECT_LT(chunk, m);
  EXPECT_EQ(chunk % cuda::kCeTokenQuantum, 0);

  auto weight = Load(backend(), w, v, k);
  ASSERT_NE(weight, nullptr);
  o.chunk = 1024;  // a vocabulary chunk: the vocabulary walk
  Outputs vocab;
  ASSERT_TRUE(RunCe(backend(), *weight, x, t, o, &vocab).ok());
  EXPECT_EQ(vocab.timing.plan.rfind("vocabulary walk", 0), 0u) << vocab.timing.plan;
  EXPECT_EQ(std::memcmp(tokens.loss.data(), vocab.loss.data(), m * 4), 0);
  EXPECT_EQ(std::memcmp(tokens.lse.data(), vocab.lse.data(), m * 4), 0);
  std::vector<double> dx_ref(vocab.dx32.begin(), vocab.dx32.end());
  EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return tokens.dx32[i]; }, dx_ref), 1e-5);
  std::vector<double> dw_ref(vocab.dw.begin(), vocab.dw.end());
  EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return tokens.dw[i]; }, dw_ref), 1e-5);

  // Accumulating into the weight's gradient buffer, with a bf16 dX: every
  // token chunk adds to the buffer, so it ends with the same values as the
  // staged dW, and dX is the fp32 one rounded once.
  o.chunk = 0;
  o.dx_dtype = DType::kBf16;
  o.accumulate = true;
  Outputs accumulated;
  ASSERT_TRUE(RunCe(tight, *tight_weight, x, t, o, &accumulated).ok());
  EXPECT_EQ(accumulated.timing.plan, tokens.timing.plan);
  std::vector<float> gradient(static_cast<std::size_t>(v * k));
  ASSERT_TRUE(tight->FetchGradient(*tight_weight, gradient.data(), true).ok());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < gradient.size(); ++i) differ += gradient[i] != tokens.dw[i];
  EXPECT_EQ(differ, 0u);
  for (std::size_t i = 0; i < accumulated.dx16.size(); ++i) {
    ASSERT_EQ(accumulated.dx16[i], FloatToBf16(tokens.dx32[i])) << i;
  }
}

// --- against the cpu backend ------------------------------------------------

// One weight in both backends and a call of each on it.
class CrossEntropyVsCpuTest : public CudaAndCpuTest {
 protected:
  // w [v, k] into both backends; false (a failure recorded) when either
  // refused it.
  bool LoadBoth(const std::vector<Bf16Bits>& w, std::int64_t v, std::int64_t k) {
    auto wg = cuda_->LoadWeight(w.data(), v, k);
    auto wc = cpu_->LoadWeight(w.data(), v, k);
    EXPECT_TRUE(wg.ok() && wc.ok());
    if (!wg.ok() || !wc.ok()) return false;
    wg_ = *std::move(wg);
    wc_ = *std::move(wc);
    return true;
  }
  // The cross-entropy of x and t under o in both backends, *g the cuda's and
  // *c the cpu's; false when one failed (recorded) or the cpu backend has
  // none (the test skipped).
  bool RunBoth(const std::vector<Bf16Bits>& x, const std::vector<std::int64_t>& t, const Options& o,
               Outputs* g, Outputs* c) {
    const absl::Status sg = RunCe(cuda_.get(), *wg_, x, t, o, g);
    EXPECT_TRUE(sg.ok()) << sg;
    const absl::Status sc = RunCe(cpu_.get(), *wc_, x, t, o, c);
    if (sc.code() == absl::StatusCode::kUnimplemented) {
      [&] { GTEST_SKIP() << "the cpu backend has no cross-entropy: " << sc.message(); }();
      return false;
    }
    EXPECT_TRUE(sc.ok()) << sc;
    return sg.ok() && sc.ok();
  }
  std::shared_ptr<Weight> wg_, wc_;
};

TEST_F(CrossEntropyVsCpuTest, AgreesWithinTheFp32Bounds) {
  const std::int64_t m = 72, v = 4500, k = 320;
  const auto x = ScaledBf16(m * k, 111, 0.5f);
  const auto w = RandomBf16(v * k, 112);
  const auto t = Targets(m, v, 0.15, 113);
  ASSERT_TRUE(LoadBoth(w, v, k));
  for (const Options& o :
       {With(0, 0, 1.0f / 60, DType::kBf16, 0), With(1e-2f, 3.0f, 1.0f, DType::kFp32, 2048)}) {
    Outputs g;
    Outputs c;
    if (!RunBoth(x, t, o, &g, &c)) return;
    const CeReference r = Reference(Widen(x), Widen(w), t, v, k, o);
    ExpectLossAndLseWithinBounds(r, t, o, g, "cuda");
    ExpectLossAndLseWithinBounds(r, t, o, c, "cpu");
    std::vector<double> dx_ref(static_cast<std::size_t>(m * k));
    for (std::size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] = c.dx(i);
    std::vector<double> dw_ref(c.dw.begin(), c.dw.end());
    EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return g.dx(i); }, dx_ref), 5e-3);
    EXPECT_LE(RelativeFrobenius([&](std::size_t i) { return g.dw[i]; }, dw_ref), 5e-3);
  }
}

// Exact logits and exact G (W = 0): both backends give the same dW bits.
TEST_F(CrossEntropyVsCpuTest, SameBitsWhereTheContractMakesThemUnique) {
  const std::int64_t m = 24, v = 2048, k = 96;
  const std::vector<Bf16Bits> w(static_cast<std::size_t>(v * k), 0);
  const auto x = IntegerBf16(m * k, 121);
  const auto t = Targets(m, v, 0.2, 122);
  ASSERT_TRUE(LoadBoth(w, v, k));
  Outputs g;
  Outputs c;
  if (!RunBoth(x, t, With(0, 0, 1, DType::kFp32, 1024), &g, &c)) return;
  EXPECT_EQ(std::memcmp(g.dw.data(), c.dw.data(), g.dw.size() * 4), 0);
  for (std::size_t i = 0; i < g.dx32.size(); ++i) {
    ASSERT_EQ(g.dx32[i], 0.0f) << i;  // G . 0
    ASSERT_EQ(c.dx32[i], 0.0f) << i;
  }
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_NEAR(g.lse[i], c.lse[i], 2 * kFp32Unit * 8) << i;
    EXPECT_NEAR(g.loss[i], c.loss[i], 2 * kFp32Unit * 8) << i;
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

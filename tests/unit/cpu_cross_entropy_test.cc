// Tests of the cpu backend's fused cross-entropy: loss, lse, dX and dW
// against an fp64 reference, the gradient-cast contract bitwise against
// Logits + Backward, results that do not depend on the vocabulary chunk,
// ignore_index, z-loss, soft-capping, accumulation into the gradient buffer,
// non-finite inputs, and bad arguments with their exact status codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "logitd/bf16.h"
#include "server/kernels/cpu/cpu_backend.h"
#include "server/kernels/ops/cross_entropy.h"

namespace logitd::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

double Gamma(std::int64_t n) {
  const double nu = static_cast<double>(n) * kU;
  return nu / (1.0 - nu);
}

// X [m, K] ~ N(0, 1) and W [V, K] ~ N(0, w_sigma^2), both rounded to bf16,
// with uniform targets. w_sigma ~ 1/sqrt(K) gives logits of order 1, a
// softmax neither flat nor one-hot.
struct Problem {
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::vector<Bf16Bits> x;
  std::vector<Bf16Bits> w;
  std::vector<double> xv;
  std::vector<double> wv;
  std::vector<std::int64_t> targets;
};

// Rounds n draws to bf16 into bits, with the exact value of each rounded
// element in values.
template <typename Draw>
void FillBf16(std::int64_t n, Draw draw, std::vector<Bf16Bits>* bits, std::vector<double>* values) {
  bits->resize(static_cast<std::size_t>(n));
  values->resize(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < bits->size(); ++i) {
    (*bits)[i] = FloatToBf16(draw());
    (*values)[i] = Bf16ToFloat((*bits)[i]);
  }
}

// A problem of the given shape: fill_operands draws X and W from one
// generator seeded with seed, then the targets are drawn uniformly from
// [0, V) by the same generator.
template <typename FillOperands>
Problem DrawProblem(std::int64_t m, std::int64_t v, std::int64_t k, std::uint32_t seed,
                    FillOperands fill_operands) {
  Problem p;
  p.m = m;
  p.v = v;
  p.k = k;
  std::mt19937 rng(seed);
  fill_operands(rng, p);
  std::uniform_int_distribution<std::int64_t> token(0, v - 1);
  p.targets.resize(static_cast<std::size_t>(m));
  for (std::int64_t& t : p.targets) t = token(rng);
  return p;
}

Problem RandomProblem(std::int64_t m, std::int64_t v, std::int64_t k, float w_sigma,
                      std::uint32_t seed) {
  return DrawProblem(m, v, k, seed, [&](std::mt19937& rng, Problem& p) {
    std::normal_distribution<float> normal;
    auto x_draw = [&] { return normal(rng); };
    auto w_draw = [&] { return w_sigma * normal(rng); };
    FillBf16(m * k, x_draw, &p.x, &p.xv);
    FillBf16(v * k, w_draw, &p.w, &p.wv);
  });
}

// Integers in [lo, hi] (exact in bf16): sums stay exact in fp32.
Problem IntegerProblem(std::int64_t m, std::int64_t v, std::int64_t k, int lo, int hi,
                       std::uint32_t seed) {
  return DrawProblem(m, v, k, seed, [&](std::mt19937& rng, Problem& p) {
    std::uniform_int_distribution<int> dist(lo, hi);
    auto draw = [&] { return static_cast<float>(dist(rng)); };
    FillBf16(m * k, draw, &p.x, &p.xv);
    FillBf16(v * k, draw, &p.w, &p.wv);
  });
}

struct CeOptions {
  std::int64_t ignore_index = -100;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  float grad_scale = 1.0f;
};

// The formulas of logitd.v1.CrossEntropyHeader in fp64 from the exact
// logits, with the gradients from the unrounded dL/dy (no bf16 cast).
struct Reference {
  std::vector<double> lse;
  std::vector<double> loss;
  // Per row: how far the loss may move when each fp32 logit is off by its
  // accumulation bound gamma_K sum_k |x w| (tanh has slope <= 1).
  std::vector<double> logit_bound;
  std::vector<double> max_abs_z;
  std::vector<double> dx;  // [m, K]
  std::vector<double> dw;  // [V, K]
};

Reference ComputeReference(const Problem& p, const CeOptions& o) {
  const std::int64_t m = p.m, v = p.v, k = p.k;
  Reference r;
  r.lse.assign(static_cast<std::size_t>(m), 0.0);
  r.loss.assign(static_cast<std::size_t>(m), 0.0);
  r.logit_bound.assign(static_cast<std::size_t>(m), 0.0);
  r.max_abs_z.assign(static_cast<std::size_t>(m), 0.0);
  r.dx.assign(static_cast<std::size_t>(m * k), 0.0);
  r.dw.assign(static_cast<std::size_t>(v * k), 0.0);
  std::vector<double> z(static_cast<std::size_t>(v));
  std::vector<double> slope(static_cast<std::size_t>(v));
  std::vector<double> bound(static_cast<std::size_t>(v));
  std::vector<double> d(static_cast<std::size_t>(v));
  for (std::int64_t i = 0; i < m; ++i) {
    const auto ri = static_cast<std::size_t>(i);
    for (std::int64_t j = 0; j < v; ++j) {
      double y = 0, a = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double prod =
            p.xv[static_cast<std::size_t>(i * k + kk)] * p.wv[static_cast<std::size_t>(j * k + kk)];
        y += prod;
        a += std::fabs(prod);
      }
      const auto rj = static_cast<std::size_t>(j);
      bound[rj] = Gamma(k) * a;
      if (o.softcap > 0) {
        const double th = std::tanh(y / o.softcap);
        z[rj] = o.softcap * th;
        slope[rj] = 1 - th * th;
      } else {
        z[rj] = y;
        slope[rj] = 1;
      }
      r.max_abs_z[ri] = std::max(r.max_abs_z[ri], std::fabs(z[rj]));
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (double zj : z) s += std::exp(zj - mx);
    const double lse = mx + std::log(s);
    r.lse[ri] = lse;
    const std::int64_t t = p.targets[ri];
    if (t == o.ignore_index) continue;
    const auto rt = static_cast<std::size_t>(t);
    r.loss[ri] = lse - z[rt] + o.z_loss * lse * lse;
    double spread = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const auto rj = static_cast<std::size_t>(j);
      const double prob = std::exp(z[rj] - lse);
      spread += prob * bound[rj];
      d[rj] = (prob * (1 + 2 * o.z_loss * lse) - (j == t ? 1.0 : 0.0)) * slope[rj] * o.grad_scale;
    }
    r.logit_bound[ri] = (1 + 2 * o.z_loss * std::fabs(lse)) * spread + bound[rt];
    for (std::int64_t j = 0; j < v; ++j) {
      const double dj = d[static_cast<std::size_t>(j)];
      for (std::int64_t kk = 0; kk < k; ++kk) {
        r.dx[static_cast<std::size_t>(i * k + kk)] +=
            dj * p.wv[static_cast<std::size_t>(j * k + kk)];
        r.dw[static_cast<std::size_t>(j * k + kk)] +=
            dj * p.xv[static_cast<std::size_t>(i * k + kk)];
      }
    }
  }
  return r;
}

struct CeCall {
  CeOptions options;
  std::int64_t vocab_chunk = 0;
  bool want_lse = true;
  bool want_dx = true;
  DType dx_dtype = DType::kFp32;
  bool want_dw = true;
  bool accumulate_dw = false;
};

struct CeOut {
  std::vector<float> loss;
  std::vector<float> lse;
  std::vector<float> dx_f32;
  std::vector<Bf16Bits> dx_bf16;
  std::vector<float> dw;
};

// Outputs start as NaN (0xffff for bf16) so that an unwritten element shows.
absl::Status RunCe(Backend& backend, Weight& w, const Problem& p, const CeCall& call, CeOut* out,
                   Timing* timing = nullptr) {
  out->loss.assign(static_cast<std::size_t>(p.m), kNaN);
  out->lse.assign(call.want_lse ? static_cast<std::size_t>(p.m) : 0, kNaN);
  out->dx_f32.assign(
      call.want_dx && call.dx_dtype == DType::kFp32 ? static_cast<std::size_t>(p.m * p.k) : 0,
      kNaN);
  out->dx_bf16.assign(
      call.want_dx && call.dx_dtype == DType::kBf16 ? static_cast<std::size_t>(p.m * p.k) : 0,
      0xffff);
  out->dw.assign(call.want_dw && !call.accumulate_dw ? static_cast<std::size_t>(p.v * p.k) : 0,
                 kNaN);
  CrossEntropyArgs args;
  args.weight = &w;
  args.x = p.x.data();
  args.m = p.m;
  args.targets = p.targets.data();
  args.ignore_index = call.options.ignore_index;
  args.z_loss = call.options.z_loss;
  args.logit_softcap = call.options.softcap;
  args.grad_scale = call.options.grad_scale;
  args.loss = out->loss.data();
  args.lse = call.want_lse ? out->lse.data() : nullptr;
  if (call.want_dx) {
    args.dx = call.dx_dtype == DType::kFp32 ? static_cast<void*>(out->dx_f32.data())
                                            : static_cast<void*>(out->dx_bf16.data());
    args.dx_dtype = call.dx_dtype;
  }
  args.dw = call.want_dw && !call.accumulate_dw ? out->dw.data() : nullptr;
  args.accumulate_dw = call.accumulate_dw;
  args.vocab_chunk = call.vocab_chunk;
  return backend.Kernel(args, timing);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ||got - want||_F / ||want||_F.
double RelativeFrobenius(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

double RelativeFrobenius(const std::vector<float>& got, const std::vector<float>& want) {
  return RelativeFrobenius(got, std::vector<double>(want.begin(), want.end()));
}

class CpuCrossEntropy : public testing::Test {
 protected:
  void SetUp() override {
    backend_ = cpu::CreateCpuBackend(BackendOptions{});
    ASSERT_NE(backend_, nullptr);
  }

  std::shared_ptr<Weight> Load(const Problem& p) {
    absl::StatusOr<std::shared_ptr<Weight>> w = backend_->LoadWeight(p.w.data(), p.v, p.k);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *w : nullptr;
  }

  std::unique_ptr<Backend> backend_;
};

// Loss and lse within the fp32 accumulation bound of their logits plus a few
// fp32 ulps of the fp64 reference; dX and dW within the bf16 rounding of G.
void CheckAgainstReference(Backend& backend, const Problem& p, const CeOptions& options,
                           std::int64_t vocab_chunk) {
  absl::StatusOr<std::shared_ptr<Weight>> w = backend.LoadWeight(p.w.data(), p.v, p.k);
  ASSERT_TRUE(w.ok()) << w.status();
  CeCall call;
  call.options = options;
  call.vocab_chunk = vocab_chunk;
  CeOut out;
  absl::Status s = RunCe(backend, **w, p, call, &out);
  ASSERT_TRUE(s.ok()) << s;
  const Reference ref = ComputeReference(p, options);
  double worst_ratio = 0, worst_rel = 0, worst_abs = 0, worst_lse_rel = 0;
  for (std::int64_t i = 0; i < p.m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    // Arithmetic after the logits: exp, the tile tree and the final
    // rounding (a few ulps of the lse and of the largest |z|), soft-capping's
    // tanh, and the z-loss term's own roundings.
    const double lse_mag = std::fabs(ref.lse[r]);
    const double arithmetic =
        16 * kU * (1 + lse_mag + 2 * ref.max_abs_z[r]) * (1 + 2 * options.z_loss * lse_mag) +
        2 * kU * std::fabs(ref.loss[r]);
    const double lse_err = std::fabs(out.lse[r] - ref.lse[r]);
    ASSERT_LE(lse_err, ref.logit_bound[r] + arithmetic) << "lse row " << i;
    worst_lse_rel = std::max(worst_lse_rel, lse_err / lse_mag);
    if (p.targets[r] == options.ignore_index) {
      ASSERT_EQ(FloatBits(out.loss[r]), 0u) << "ignored row " << i;
      continue;
    }
    const double err = std::fabs(out.loss[r] - ref.loss[r]);
    const double allowed = ref.logit_bound[r] + arithmetic;
    ASSERT_LE(err, allowed) << "loss row " << i << " got " << out.loss[r] << " want "
                            << ref.loss[r];
    worst_ratio = std::max(worst_ratio, err / allowed);
    worst_abs = std::max(worst_abs, err);
    worst_rel = std::max(worst_rel, err / std::fabs(ref.loss[r]));
  }
  // Far inside the worst-case bound in practice, as the issue asks to report.
  EXPECT_LT(worst_rel, 1e-5);
  EXPECT_LT(worst_lse_rel, 1e-5);
  const double dx_err = RelativeFrobenius(out.dx_f32, ref.dx);
  const double dw_err = RelativeFrobenius(out.dw, ref.dw);
  // G is rounded to bf16 (relative 2^-9 per element, independent signs), so
  // the gradients sit about 2^-9 / sqrt(3) from the unrounded fp64 product.
  EXPECT_LT(dx_err, 1e-2);
  EXPECT_LT(dw_err, 1e-2);
  std::printf(
      "    [z_loss %g softcap %g chunk %lld] loss max abs err %.3g (rel %.3g, %.3g of bound); "
      "lse max rel %.3g; dX rel Frobenius %.3g; dW rel Frobenius %.3g\n",
      options.z_loss, options.softcap, static_cast<long long>(vocab_chunk), worst_abs, worst_rel,
      worst_ratio, worst_lse_rel, dx_err, dw_err);
}

TEST_F(CpuCrossEntropy, Bf16Bf16F32_MatchesFp64Reference) {
  const Problem p = RandomProblem(24, 1000, 256, 0.0625f, 1001);
  CheckAgainstReference(*backend_, p, CeOptions{}, 0);
  CheckAgainstReference(*backend_, p, CeOptions{}, 128);
}

TEST_F(CpuCrossEntropy, Bf16Bf16F32_LargeLogitsMatchFp64Reference) {
  // Logits of order 10: a peaked softmax and terms far below the max.
  const Problem p = RandomProblem(16, 777, 512, 0.5f, 1002);
  CheckAgainstReference(*backend_, p, CeOptions{}, 64);
}

TEST_F(CpuCrossEntropy, ZLossMatchesFp64Reference) {
  const Problem p = RandomProblem(16, 640, 256, 0.0625f, 1003);
  CeOptions o;
  o.z_loss = 1e-2f;
  CheckAgainstReference(*backend_, p, o, 0);
  o.z_loss = 0.5f;
  CheckAgainstReference(*backend_, p, o, 192);
}

TEST_F(CpuCrossEntropy, SoftcapMatchesFp64Reference) {
  // Logits of order 10 so that a cap of 5 bends them hard.
  const Problem p = RandomProblem(16, 640, 256, 0.5f, 1004);
  CeOptions o;
  o.softcap = 5.0f;
  CheckAgainstReference(*backend_, p, o, 0);
  o.softcap = 30.0f;
  o.z_loss = 1e-3f;
  CheckAgainstReference(*backend_, p, o, 64);
}

TEST_F(CpuCrossEntropy, GradScaleAndIgnoreIndexMatchFp64Reference) {
  Problem p = RandomProblem(20, 500, 128, 0.125f, 1005);
  for (std::size_t i = 0; i < p.targets.size(); i += 3) p.targets[i] = -100;
  CeOptions o;
  o.grad_scale = -0.37f;
  CheckAgainstReference(*backend_, p, o, 100);
}

// The reduction alone: lse and loss against fp64 over the very fp32 logits
// the Logits RPC returns (one chunk is the same sgemm call). The backend
// documents (8 + mean |z - tile max|) u for the sum's relative error, then
// one rounding of lse and of the loss; a V of 32768 folds 512 tiles.
TEST_F(CpuCrossEntropy, ReductionIsWithinAFewUlpsOfFp64OverTheSameLogits) {
  for (const std::int64_t v : {std::int64_t{333}, std::int64_t{32768}}) {
    Problem p = RandomProblem(6, v, 32, 0.5f, static_cast<std::uint32_t>(1100 + v));
    std::shared_ptr<Weight> w = Load(p);
    ASSERT_NE(w, nullptr);
    std::vector<float> y(static_cast<std::size_t>(p.m * v));
    LogitsArgs la;
    la.x = p.x.data();
    la.m = p.m;
    la.y = y.data();
    ASSERT_TRUE(backend_->Logits(*w, la, nullptr).ok());
    CeCall call;
    call.vocab_chunk = v;
    call.want_dx = false;
    call.want_dw = false;
    CeOut out;
    ASSERT_TRUE(RunCe(*backend_, *w, p, call, &out).ok());
    double worst_lse_ulps = 0, worst_loss_ulps = 0;
    for (std::int64_t i = 0; i < p.m; ++i) {
      const auto r = static_cast<std::size_t>(i);
      const float* row = y.data() + i * v;
      const double mx = *std::max_element(row, row + v);
      const double mn = *std::min_element(row, row + v);
      double s = 0;
      for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
      const double lse = mx + std::log(s);
      const double loss = lse - row[p.targets[r]];
      const double ulp_lse = std::nextafter(static_cast<float>(std::fabs(lse)), kInf) -
                             static_cast<float>(std::fabs(lse));
      const double ulp_loss = std::nextafter(static_cast<float>(std::fabs(loss)), kInf) -
                              static_cast<float>(std::fabs(loss));
      const double sum_err = (8 + (mx - mn)) * kU;
      EXPECT_LE(std::fabs(out.lse[r] - lse), sum_err + ulp_lse / 2) << "v " << v << " row " << i;
      EXPECT_LE(std::fabs(out.loss[r] - loss), sum_err + ulp_loss / 2) << "v " << v << " row " << i;
      worst_lse_ulps = std::max(worst_lse_ulps, std::fabs(out.lse[r] - lse) / ulp_lse);
      worst_loss_ulps = std::max(worst_loss_ulps, std::fabs(out.loss[r] - loss) / ulp_loss);
    }
    std::printf(
        "    V %lld: lse within %.3g ulp, loss within %.3g ulp of fp64 over the fp32 logits\n",
        static_cast<long long>(v), worst_lse_ulps, worst_loss_ulps);
  }
}

// The gradient-cast contract: G = bf16(dL/dy * scale) computed from the very
// logits the Logits RPC returns and the returned lse, with the fp32
// operations the backend documents, then Backward of that dY, equals the
// fused call's dX and dW bit for bit.
void CheckEqualsLogitsThenBackward(Backend& backend, const Problem& p, const CeOptions& o,
                                   std::int64_t vocab_chunk) {
  absl::StatusOr<std::shared_ptr<Weight>> loaded = backend.LoadWeight(p.w.data(), p.v, p.k);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Weight& w = **loaded;
  const std::int64_t m = p.m, v = p.v, k = p.k;
  std::vector<float> y(static_cast<std::size_t>(m * v));
  LogitsArgs la;
  la.x = p.x.data();
  la.m = m;
  la.y = y.data();
  ASSERT_TRUE(backend.Logits(w, la, nullptr).ok());

  for (DType dx_dtype : {DType::kFp32, DType::kBf16}) {
    CeCall call;
    call.options = o;
    call.vocab_chunk = vocab_chunk;
    call.dx_dtype = dx_dtype;
    CeOut out;
    absl::Status s = RunCe(backend, w, p, call, &out);
    ASSERT_TRUE(s.ok()) << s;

    std::vector<float> dy(y.size(), 0.0f);
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t t = p.targets[static_cast<std::size_t>(i)];
      if (t == o.ignore_index) continue;
      const float lse = out.lse[static_cast<std::size_t>(i)];
      const float coef = o.z_loss != 0.0f ? 1.0f + (2.0f * o.z_loss) * lse : 1.0f;
      for (std::int64_t j = 0; j < v; ++j) {
        const float yv = y[static_cast<std::size_t>(i * v + j)];
        float z = yv, slope = 1.0f;
        if (o.softcap != 0.0f) {
          const float th = std::tanh(yv / o.softcap);
          z = o.softcap * th;
          slope = (1.0f - th) * (1.0f + th);
        }
        float d = std::exp(z - lse) * coef;
        if (j == t) d -= 1.0f;
        if (o.softcap != 0.0f) d *= slope;
        dy[static_cast<std::size_t>(i * v + j)] = d * o.grad_scale;
      }
    }
    std::vector<float> dx_f32(static_cast<std::size_t>(m * k));
    std::vector<Bf16Bits> dx_bf16(dx_f32.size());
    std::vector<float> dw(static_cast<std::size_t>(v * k));
    BackwardArgs ba;
    ba.dy = dy.data();
    ba.x = p.x.data();
    ba.m = m;
    ba.dx_dtype = dx_dtype;
    ba.dx = dx_dtype == DType::kFp32 ? static_cast<void*>(dx_f32.data())
                                     : static_cast<void*>(dx_bf16.data());
    ba.dw = dw.data();
    s = backend.Backward(w, ba, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameBits(out.dw, dw)) << "dW, chunk " << vocab_chunk;
    if (dx_dtype == DType::kFp32) {
      EXPECT_TRUE(SameBits(out.dx_f32, dx_f32)) << "dX, chunk " << vocab_chunk;
    } else {
      EXPECT_EQ(out.dx_bf16, dx_bf16) << "dX bf16, chunk " << vocab_chunk;
    }
  }
}

TEST_F(CpuCrossEntropy, OneChunkEqualsLogitsThenBackwardBitwise) {
  Problem p = RandomProblem(16, 1000, 256, 0.0625f, 2001);
  p.targets[3] = -100;
  CheckEqualsLogitsThenBackward(*backend_, p, CeOptions{}, 0);
  CeOptions o;
  o.z_loss = 1e-3f;
  o.softcap = 4.0f;
  o.grad_scale = 1.0f / 15.0f;
  CheckEqualsLogitsThenBackward(*backend_, p, o, 1000);
}

TEST_F(CpuCrossEntropy, GradScaleByPowerOfTwoScalesGradientsExactly) {
  // A mean over 8 tokens is scale 1/8: every G is the scale-1 G over 8
  // exactly, so dX and dW are too.
  const Problem p = RandomProblem(8, 700, 256, 0.0625f, 2101);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  call.vocab_chunk = 128;
  CeOut one, eighth;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &one).ok());
  call.options.grad_scale = 0.125f;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &eighth).ok());
  EXPECT_TRUE(SameBits(one.loss, eighth.loss));  // the scale is for gradients only
  for (std::size_t i = 0; i < one.dx_f32.size(); ++i) {
    ASSERT_EQ(FloatBits(eighth.dx_f32[i]), FloatBits(one.dx_f32[i] * 0.125f)) << "dX " << i;
  }
  for (std::size_t i = 0; i < one.dw.size(); ++i) {
    ASSERT_EQ(FloatBits(eighth.dw[i]), FloatBits(one.dw[i] * 0.125f)) << "dW " << i;
  }
}

// lse and loss are folded over fixed 64-entry tiles that every chunk size
// (rounded up to whole tiles) keeps intact, so given the same logits they do
// not depend on the chunk. Integer operands make the logits exact whatever
// path OpenBLAS takes for each chunk's width, so the check is bitwise. dW's
// rows reduce over the tokens only and dX sums the chunks' contributions in a
// different grouping; both agree to the fp32 accumulation bound.
void CheckChunkInvariance(Backend& backend, const Problem& p, const CeOptions& o,
                          bool exact_logits) {
  absl::StatusOr<std::shared_ptr<Weight>> loaded = backend.LoadWeight(p.w.data(), p.v, p.k);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Weight& w = **loaded;
  CeCall call;
  call.options = o;
  call.vocab_chunk = p.v;
  CeOut whole;
  ASSERT_TRUE(RunCe(backend, w, p, call, &whole).ok());
  int dw_identical = 0, dx_identical = 0, loss_identical = 0;
  // 1 and 100 are rounded up to whole tiles (64 and 128); 0 is the backend's choice.
  const std::vector<std::int64_t> chunks = {0, 1, 64, 100, 192, 512, p.v - 1, 4 * p.v};
  for (std::int64_t chunk : chunks) {
    call.vocab_chunk = chunk;
    CeOut out;
    absl::Status s = RunCe(backend, w, p, call, &out);
    ASSERT_TRUE(s.ok()) << s;
    if (exact_logits) {
      EXPECT_TRUE(SameBits(out.loss, whole.loss)) << "loss, chunk " << chunk;
      EXPECT_TRUE(SameBits(out.lse, whole.lse)) << "lse, chunk " << chunk;
    } else {
      EXPECT_LT(RelativeFrobenius(out.loss, whole.loss), 1e-6) << "loss, chunk " << chunk;
      EXPECT_LT(RelativeFrobenius(out.lse, whole.lse), 1e-6) << "lse, chunk " << chunk;
    }
    EXPECT_LT(RelativeFrobenius(out.dw, whole.dw), 1e-5) << "dW, chunk " << chunk;
    EXPECT_LT(RelativeFrobenius(out.dx_f32, whole.dx_f32), 1e-5) << "dX, chunk " << chunk;
    loss_identical += SameBits(out.loss, whole.loss) && SameBits(out.lse, whole.lse);
    dw_identical += SameBits(out.dw, whole.dw);
    dx_identical += SameBits(out.dx_f32, whole.dx_f32);
  }
  std::printf("    bitwise equal to one chunk, of %zu chunk sizes: loss+lse %d, dW %d, dX %d\n",
              chunks.size(), loss_identical, dw_identical, dx_identical);
}

TEST_F(CpuCrossEntropy, ChunkSizeDoesNotChangeLossOrLseIntegerLogits) {
  Problem p = IntegerProblem(12, 1000, 32, -1, 1, 3001);  // V not a multiple of 64
  p.targets[5] = -100;
  CeOptions o;
  o.z_loss = 1e-4f;
  CheckChunkInvariance(*backend_, p, o, /*exact_logits=*/true);
  o.softcap = 8.0f;
  CheckChunkInvariance(*backend_, p, o, /*exact_logits=*/true);
}

TEST_F(CpuCrossEntropy, ChunkSizeChangesRandomResultsWithinFp32) {
  Problem p = RandomProblem(12, 1000, 256, 0.125f, 3002);
  p.targets[5] = -100;
  CheckChunkInvariance(*backend_, p, CeOptions{}, /*exact_logits=*/false);
}

TEST_F(CpuCrossEntropy, SameCallTwiceGivesSameBits) {
  const Problem p = RandomProblem(10, 900, 256, 0.125f, 3101);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  call.vocab_chunk = 256;
  call.options.softcap = 10.0f;
  CeOut a, b;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &a).ok());
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &b).ok());
  EXPECT_TRUE(SameBits(a.loss, b.loss));
  EXPECT_TRUE(SameBits(a.lse, b.lse));
  EXPECT_TRUE(SameBits(a.dx_f32, b.dx_f32));
  EXPECT_TRUE(SameBits(a.dw, b.dw));
}

TEST_F(CpuCrossEntropy, Bf16DxIsTheFp32AccumulatorRoundedOnce) {
  const Problem p = RandomProblem(8, 600, 256, 0.125f, 3201);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  call.vocab_chunk = 128;
  CeOut f32, bf16;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &f32).ok());
  call.dx_dtype = DType::kBf16;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &bf16).ok());
  ASSERT_EQ(bf16.dx_bf16.size(), f32.dx_f32.size());
  for (std::size_t i = 0; i < f32.dx_f32.size(); ++i) {
    ASSERT_EQ(bf16.dx_bf16[i], FloatToBf16(f32.dx_f32[i])) << i;
  }
  EXPECT_TRUE(SameBits(bf16.dw, f32.dw));
}

TEST_F(CpuCrossEntropy, IgnoredTokensHaveZeroLossAndGradientRows) {
  // Integer operands: the logits of a row are exact whichever other rows
  // share the call, so the counted rows' loss and lse compare bitwise.
  Problem p = IntegerProblem(12, 500, 32, -1, 1, 4001);
  // A custom ignore_index may be a real token id; -100 then is an error.
  const std::int64_t ignore = 7;
  std::vector<std::int64_t> kept;
  for (std::int64_t i = 0; i < p.m; ++i) {
    if (i % 4 == 1) {
      p.targets[static_cast<std::size_t>(i)] = ignore;
    } else {
      if (p.targets[static_cast<std::size_t>(i)] == ignore)
        p.targets[static_cast<std::size_t>(i)] = 8;
      kept.push_back(i);
    }
  }
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  call.options.ignore_index = ignore;
  call.vocab_chunk = 128;
  CeOut out;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &out).ok());

  // The same rows without the ignored ones.
  Problem q = p;
  q.m = static_cast<std::int64_t>(kept.size());
  q.x.clear();
  q.targets.clear();
  for (std::int64_t i : kept) {
    q.x.insert(q.x.end(), p.x.begin() + i * p.k, p.x.begin() + (i + 1) * p.k);
    q.targets.push_back(p.targets[static_cast<std::size_t>(i)]);
  }
  CeOut sub;
  ASSERT_TRUE(RunCe(*backend_, *w, q, call, &sub).ok());

  std::size_t next = 0;
  std::vector<float> counted_dx;
  for (std::int64_t i = 0; i < p.m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    if (p.targets[r] == ignore) {
      EXPECT_EQ(FloatBits(out.loss[r]), 0u) << i;
      EXPECT_TRUE(std::isfinite(out.lse[r])) << "lse is reported for ignored rows too";
      for (std::int64_t kk = 0; kk < p.k; ++kk) {
        ASSERT_EQ(out.dx_f32[static_cast<std::size_t>(i * p.k + kk)], 0.0f) << i;
      }
    } else {
      EXPECT_EQ(FloatBits(out.loss[r]), FloatBits(sub.loss[next])) << i;
      EXPECT_EQ(FloatBits(out.lse[r]), FloatBits(sub.lse[next])) << i;
      for (std::int64_t kk = 0; kk < p.k; ++kk) {
        counted_dx.push_back(out.dx_f32[static_cast<std::size_t>(i * p.k + kk)]);
      }
      ++next;
    }
  }
  // Zero rows of G add nothing to dW; the counted rows' dX is the same up to
  // the grouping OpenBLAS picks for a different number of rows.
  EXPECT_LT(RelativeFrobenius(out.dw, sub.dw), 1e-6);
  EXPECT_LT(RelativeFrobenius(counted_dx, sub.dx_f32), 1e-6);

  // Every token ignored: zero loss and zero gradients.
  Problem all = p;
  std::fill(all.targets.begin(), all.targets.end(), ignore);
  CeOut none;
  ASSERT_TRUE(RunCe(*backend_, *w, all, call, &none).ok());
  for (float f : none.loss) ASSERT_EQ(FloatBits(f), 0u);
  for (float f : none.dx_f32) ASSERT_EQ(FloatBits(f), 0u);
  for (float f : none.dw) ASSERT_EQ(FloatBits(f), 0u);
}

TEST_F(CpuCrossEntropy, AccumulateTwiceDoublesTheBufferAndCountsTwo) {
  const Problem p = IntegerProblem(8, 300, 64, -2, 2, 5001);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  call.vocab_chunk = 128;
  CeOut returned;
  ASSERT_TRUE(RunCe(*backend_, *w, p, call, &returned).ok());
  // A loss-only call leaves the buffer alone.
  CeCall loss_only;
  loss_only.want_dx = false;
  loss_only.want_dw = false;
  CeOut ignored_out;
  ASSERT_TRUE(RunCe(*backend_, *w, p, loss_only, &ignored_out).ok());
  EXPECT_EQ(w->gradient_bytes(), 0u);

  call.accumulate_dw = true;
  for (int n = 1; n <= 2; ++n) {
    CeOut out;
    ASSERT_TRUE(RunCe(*backend_, *w, p, call, &out).ok());
    EXPECT_TRUE(SameBits(out.loss, returned.loss));
    EXPECT_TRUE(SameBits(out.dx_f32, returned.dx_f32));
    std::vector<float> fetched(static_cast<std::size_t>(p.v * p.k), kNaN);
    absl::StatusOr<std::uint64_t> count = backend_->FetchGradient(*w, fetched.data(), false);
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_EQ(*count, static_cast<std::uint64_t>(n));
    for (std::size_t i = 0; i < fetched.size(); ++i) {
      ASSERT_EQ(FloatBits(fetched[i]), FloatBits(static_cast<float>(n) * returned.dw[i]))
          << "call " << n << " element " << i;
    }
  }
  EXPECT_EQ(w->gradient_bytes(), static_cast<std::uint64_t>(p.v * p.k) * sizeof(float));
  // Backward's accumulation shares the buffer and the count.
  std::vector<float> dy(static_cast<std::size_t>(p.m * p.v), 0.0f);
  BackwardArgs ba;
  ba.dy = dy.data();
  ba.x = p.x.data();
  ba.m = p.m;
  ba.accumulate_dw = true;
  ASSERT_TRUE(backend_->Backward(*w, ba, nullptr).ok());
  std::vector<float> fetched(static_cast<std::size_t>(p.v * p.k));
  absl::StatusOr<std::uint64_t> count = backend_->FetchGradient(*w, fetched.data(), true);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 3u);
}

TEST_F(CpuCrossEntropy, LossOnlyCallGivesTheSameLossAndTiming) {
  const Problem p = RandomProblem(6, 333, 64, 0.125f, 5101);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall full;
  CeOut a;
  ASSERT_TRUE(RunCe(*backend_, *w, p, full, &a).ok());
  CeCall loss_only;
  loss_only.want_lse = false;
  loss_only.want_dx = false;
  loss_only.want_dw = false;
  CeOut b;
  Timing timing;
  timing.compute_us = -1;
  timing.h2d_us = 7;
  ASSERT_TRUE(RunCe(*backend_, *w, p, loss_only, &b, &timing).ok());
  EXPECT_TRUE(SameBits(a.loss, b.loss));
  EXPECT_GE(timing.compute_us, 0);
  EXPECT_EQ(timing.h2d_us, 0);
}

TEST_F(CpuCrossEntropy, NonFiniteLogitsPropagate) {
  const std::int64_t m = 6, v = 200, k = 32;
  Problem p = IntegerProblem(m, v, k, 1, 3, 6001);  // positive: no 0 * Inf
  p.targets = {0, 5, 100, 150, 199, 42};
  std::shared_ptr<Weight> clean = Load(p);
  ASSERT_NE(clean, nullptr);
  CeCall call;
  call.vocab_chunk = 64;
  call.want_dw = false;
  CeOut base;
  ASSERT_TRUE(RunCe(*backend_, *clean, p, call, &base).ok());
  for (float f : base.loss) ASSERT_TRUE(std::isfinite(f));

  // A NaN in row 1 of X: that row's logits, lse, loss and dX row are NaN;
  // the other rows are untouched, bit for bit.
  Problem with_nan = p;
  with_nan.x[1 * k + 3] = FloatToBf16(kNaN);
  CeOut out;
  ASSERT_TRUE(RunCe(*backend_, *clean, with_nan, call, &out).ok());
  for (std::int64_t i = 0; i < m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    if (i == 1) {
      EXPECT_TRUE(std::isnan(out.loss[r]));
      EXPECT_TRUE(std::isnan(out.lse[r]));
      EXPECT_TRUE(std::isnan(out.dx_f32[r * k]));
    } else {
      EXPECT_EQ(FloatBits(out.loss[r]), FloatBits(base.loss[r])) << i;
      EXPECT_EQ(FloatBits(out.lse[r]), FloatBits(base.lse[r])) << i;
    }
  }

  // +Inf in row 150 of W: every logit 150 is +Inf, so lse = +Inf (as
  // torch.logsumexp), loss = +Inf, and NaN (Inf - Inf) where 150 is the target.
  Problem with_inf = p;
  with_inf.w[150 * k + 9] = FloatToBf16(kInf);
  std::shared_ptr<Weight> inf_w = Load(with_inf);
  ASSERT_NE(inf_w, nullptr);
  ASSERT_TRUE(RunCe(*backend_, *inf_w, with_inf, call, &out).ok());
  for (std::int64_t i = 0; i < m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    EXPECT_EQ(out.lse[r], kInf) << i;
    if (p.targets[r] == 150) {
      EXPECT_TRUE(std::isnan(out.loss[r])) << i;
    } else {
      EXPECT_EQ(out.loss[r], kInf) << i;
    }
  }

  // -Inf in row 7 of W: logit 7 is -Inf and contributes exp(-Inf) = 0; a
  // -Inf target logit gives an infinite loss.
  Problem with_minus_inf = p;
  with_minus_inf.w[7 * k + 1] = FloatToBf16(-kInf);
  with_minus_inf.targets[0] = 7;
  std::shared_ptr<Weight> minus_w = Load(with_minus_inf);
  ASSERT_NE(minus_w, nullptr);
  ASSERT_TRUE(RunCe(*backend_, *minus_w, with_minus_inf, call, &out).ok());
  EXPECT_EQ(out.loss[0], kInf);
  for (std::int64_t i = 1; i < m; ++i) {
    EXPECT_TRUE(std::isfinite(out.loss[static_cast<std::size_t>(i)])) << i;
    EXPECT_LE(out.lse[static_cast<std::size_t>(i)], base.lse[static_cast<std::size_t>(i)]) << i;
  }
}

TEST_F(CpuCrossEntropy, InvalidTargetsAreInvalidArgumentNamingTheFirst) {
  Problem p = RandomProblem(20, 1000, 64, 0.125f, 7001);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  CeCall call;
  CeOut out;
  p.targets[17] = 50000;
  p.targets[18] = -1;
  absl::Status s = RunCe(*backend_, *w, p, call, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("targets[17] = 50000: expected a token id in [0, 1000) or "
                             "ignore_index -100"),
            absl::string_view::npos)
      << s;
  p.targets[17] = 1000;  // V itself
  s = RunCe(*backend_, *w, p, call, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("targets[17] = 1000"), absl::string_view::npos) << s;
  p.targets[17] = 999;
  s = RunCe(*backend_, *w, p, call, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("targets[18] = -1"), absl::string_view::npos) << s;
  p.targets[18] = -100;
  call.options.ignore_index = -1;  // now -100 is out of range and -1 is fine
  s = RunCe(*backend_, *w, p, call, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("targets[18] = -100: expected a token id in [0, 1000) or "
                             "ignore_index -1"),
            absl::string_view::npos)
      << s;
  call.options.ignore_index = -100;
  EXPECT_TRUE(RunCe(*backend_, *w, p, call, &out).ok());
}

// A weight some other backend created.
class ForeignWeight final : public Weight {
 public:
  ForeignWeight(std::int64_t v, std::int64_t k) : Weight(v, k) {}
  std::uint64_t weight_bytes() const override { return static_cast<std::uint64_t>(v() * k()) * 2; }
  std::uint64_t gradient_bytes() const override { return 0; }
};

TEST_F(CpuCrossEntropy, BadArgumentsAreInvalidArgument) {
  const Problem p = RandomProblem(4, 100, 16, 0.25f, 8001);
  std::shared_ptr<Weight> w = Load(p);
  ASSERT_NE(w, nullptr);
  std::vector<float> loss(4), dx(64);
  CrossEntropyArgs good;
  good.weight = w.get();
  good.x = p.x.data();
  good.m = 4;
  good.targets = p.targets.data();
  good.loss = loss.data();
  good.dx = dx.data();
  good.dx_dtype = DType::kFp32;
  ASSERT_TRUE(backend_->Kernel(good, nullptr).ok());

  auto expect_invalid = [&](const CrossEntropyArgs& args, const std::string& needle) {
    absl::Status s = backend_->Kernel(args, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle << ": " << s;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
  };
  CrossEntropyArgs a = good;
  a.x = nullptr;
  expect_invalid(a, "x is null");
  a = good;
  a.targets = nullptr;
  expect_invalid(a, "targets is null");
  a = good;
  a.loss = nullptr;
  expect_invalid(a, "loss is null");
  a = good;
  a.m = 0;
  expect_invalid(a, "got 0");
  a = good;
  a.dx_dtype = DType::kInt64;
  expect_invalid(a, "dx_dtype");
  a = good;
  a.z_loss = -1e-4f;
  expect_invalid(a, "z_loss finite and >= 0, got -0.0001");
  a = good;
  a.z_loss = kNaN;
  expect_invalid(a, "z_loss");
  a = good;
  a.logit_softcap = -30.0f;
  expect_invalid(a, "logit_softcap finite and >= 0");
  a = good;
  a.logit_softcap = kInf;
  expect_invalid(a, "logit_softcap");
  a = good;
  a.grad_scale = kNaN;
  expect_invalid(a, "grad_scale finite");
  a = good;
  a.grad_scale = -2.0f;  // an incoming gradient may be negative
  EXPECT_TRUE(backend_->Kernel(a, nullptr).ok());

  // A weight of the right shape from another backend: the arguments pass
  // the shared checks, and the backend refuses the weight.
  ForeignWeight foreign(w->v(), w->k());
  CrossEntropyArgs from_another = good;
  from_another.weight = &foreign;
  absl::Status s = backend_->Kernel(from_another, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu backend"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace logitd::kernels

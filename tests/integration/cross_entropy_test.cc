// The fused cross-entropy through the real server (cpu backend), the client
// library and logitctl: loss, lse, dX and dW against an fp64 reference
// written here (independent of the harness's), the reductions, ignore_index,
// z-loss, soft-capping, the gradient scale, int32 and int64 targets,
// accumulation into the server-held gradient buffer, and the refusal of
// invalid targets and options with exact status codes.
//
// Tolerances. The reference's logits are exact up to fp64 rounding; the
// server's fp32 logits are within e_v = (K + 2)·u·Σ_k|x·w_v| (u = 2^-24, the
// fp32 accumulation bound for any order). lse and loss are then within
// about max_v e_v plus the fp32 evaluation of a V-term sum of exponentials,
// (2V + 64)·u·(1 + |lse| + max|z|); a softmax-weighted perturbation cannot
// exceed the largest one. G = bf16(g) is within 2^-8 of g relatively plus
// the same fp32 errors, so dX and dW are within that times Σ|g|·|w| (resp.
// Σ|g|·|x|) plus their own fp32 accumulation. Where the data makes G exact
// (a uniform softmax over integer logits), dX and dW are compared bit for bit.
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "tests/common/targets.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using client::CrossEntropyOptions;
using client::CrossEntropyResult;
using client::Reduction;
using ::testing::HasSubstr;

constexpr double kU = 0x1p-24;
constexpr double kBf16U = 0x1p-8;

// bf16 [rows, cols] of N(0, scale²) samples.
Tensor ScaledNormalBf16(std::vector<std::int64_t> shape, std::uint32_t seed, float scale) {
  Tensor t(DType::kBf16, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<Bf16Bits>()[i] = FloatToBf16(dist(rng));
  return t;
}

Tensor Targets(const std::vector<std::int64_t>& t, DType dtype = DType::kInt64) {
  return TargetsTensor(dtype, t);
}

// Random ids in [0, v), every `ignore_every`-th one ignored.
std::vector<std::int64_t> RandomTargets(std::int64_t m, std::int64_t v, std::uint32_t seed,
                                        int ignore_every = 5, std::int64_t ignore_index = -100) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, v - 1);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) {
    t[static_cast<std::size_t>(i)] =
        (i % ignore_every == ignore_every - 1) ? ignore_index : dist(rng);
  }
  return t;
}

struct Problem {
  const Tensor* x;
  const Tensor* w;
  std::vector<std::int64_t> targets;
  CrossEntropyOptions options;
};

// The fp64 reference with tolerances (see the top of the file).
struct Reference {
  std::int64_t counted = 0;
  std::vector<double> loss, loss_tol, lse, lse_tol;  // [M]
  double sum = 0, sum_tol = 0;
  std::vector<double> dx, dx_tol;  // [M, K]
  std::vector<double> dw, dw_tol;  // [V, K]
};

Reference ComputeReference(const Problem& p) {
  const Tensor& x = *p.x;
  const Tensor& w = *p.w;
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  const CrossEntropyOptions& o = p.options;
  const double cap = o.logit_softcap, zl = o.z_loss;
  Reference r;
  for (std::int64_t t : p.targets) r.counted += t == o.ignore_index ? 0 : 1;
  double scale = o.grad_scale;
  if (o.reduction == Reduction::kMean && r.counted > 0) scale /= static_cast<double>(r.counted);
  r.loss.assign(static_cast<std::size_t>(m), 0);
  r.loss_tol = r.lse = r.lse_tol = r.loss;
  std::vector<double> g(static_cast<std::size_t>(m * v)), g_rel(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) {
    std::vector<double> z(static_cast<std::size_t>(v)), f(z.size()), e(z.size());
    double mx = -INFINITY, max_e = 0, max_z = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      double y = 0, a = 0;
      for (std::int64_t c = 0; c < k; ++c) {
        const double xw = x.At(i * k + c) * w.At(j * k + c);
        y += xw;
        a += std::fabs(xw);
      }
      const std::size_t s = static_cast<std::size_t>(j);
      e[s] = static_cast<double>(k + 2) * kU * a + 8 * kU * std::fabs(y);
      z[s] = cap > 0 ? cap * std::tanh(y / cap) : y;
      f[s] = cap > 0 ? 1 - (z[s] / cap) * (z[s] / cap) : 1;
      mx = std::max(mx, z[s]);
      max_e = std::max(max_e, e[s]);
      max_z = std::max(max_z, std::fabs(z[s]));
    }
    double sum = 0;
    for (double zj : z) sum += std::exp(zj - mx);
    const double lse = mx + std::log(sum);
    const std::size_t si = static_cast<std::size_t>(i);
    const double eval = static_cast<double>(2 * v + 64) * kU * (1 + std::fabs(lse) + max_z);
    r.lse[si] = lse;
    r.lse_tol[si] = 2 * max_e + eval;
    g_rel[si] = 4 * (2 * max_e + eval) * (1 + 2 * zl * std::fabs(lse));
    const std::int64_t t = p.targets[si];
    if (t == o.ignore_index) continue;
    const double zt = z[static_cast<std::size_t>(t)];
    r.loss[si] = lse - zt + zl * lse * lse;
    r.loss_tol[si] = r.lse_tol[si] * (1 + 2 * zl * std::fabs(lse)) +
                     2 * e[static_cast<std::size_t>(t)] +
                     8 * kU * (std::fabs(lse) + std::fabs(zt) + zl * lse * lse);
    r.sum += r.loss[si];
    r.sum_tol += r.loss_tol[si] + static_cast<double>(m + 2) * kU * std::fabs(r.loss[si]);
    for (std::int64_t j = 0; j < v; ++j) {
      const std::size_t s = static_cast<std::size_t>(j);
      const double d = std::exp(z[s] - lse) * (1 + 2 * zl * lse) - (j == t ? 1.0 : 0.0);
      g[static_cast<std::size_t>(i * v + j)] = d * f[s] * scale;
    }
  }
  // dX = G·W, dW = Gᵀ·X with Σ|g|·|w| and Σ|g|·|x| for the tolerances.
  r.dx.assign(static_cast<std::size_t>(m * k), 0);
  r.dx_tol = r.dx;
  r.dw.assign(static_cast<std::size_t>(v * k), 0);
  r.dw_tol = r.dw;
  for (std::int64_t i = 0; i < m; ++i) {
    const double rel = kBf16U + g_rel[static_cast<std::size_t>(i)];
    for (std::int64_t j = 0; j < v; ++j) {
      const double gij = g[static_cast<std::size_t>(i * v + j)];
      if (gij == 0) continue;
      for (std::int64_t c = 0; c < k; ++c) {
        const double wv = w.At(j * k + c), xv = x.At(i * k + c);
        r.dx[static_cast<std::size_t>(i * k + c)] += gij * wv;
        r.dx_tol[static_cast<std::size_t>(i * k + c)] +=
            (rel + static_cast<double>(v + 2) * kU) * std::fabs(gij * wv);
        r.dw[static_cast<std::size_t>(j * k + c)] += gij * xv;
        r.dw_tol[static_cast<std::size_t>(j * k + c)] +=
            (rel + static_cast<double>(m + 2) * kU) * std::fabs(gij * xv);
      }
    }
  }
  return r;
}

// Every element of `got` within its tolerance of `want`.
::testing::AssertionResult Within(const Tensor& got, const std::vector<double>& want,
                                  const std::vector<double>& tol, double extra_rel = 0) {
  if (got.numel() != static_cast<std::int64_t>(want.size())) {
    return ::testing::AssertionFailure() << got.numel() << " elements, expected " << want.size();
  }
  std::int64_t bad = 0;
  std::string first;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    const double bound = tol[s] + extra_rel * std::fabs(want[s]) + 1e-30;
    if (std::fabs(got.At(i) - want[s]) <= bound) continue;
    if (bad++ == 0) {
      first = absl::StrCat("[", i, "]: got ", got.At(i), ", fp64 ", want[s], ", tolerance ", bound);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.numel() << " outside; first " << first;
}

class CrossEntropyTest : public SharedServerTest {
 protected:
  static absl::StatusOr<CrossEntropyResult> Call(const Problem& p, const std::string& handle,
                                                 DType targets_dtype = DType::kInt64) {
    return client().CrossEntropy(*p.x, Targets(p.targets, targets_dtype), handle, p.options);
  }

  // Loss, lse, dX and dW of a response against the reference.
  static void ExpectMatchesReference(const Problem& p, const CrossEntropyResult& got) {
    const Reference ref = ComputeReference(p);
    const std::int64_t m = p.x->dim(0), k = p.x->dim(1), v = p.w->dim(0);
    EXPECT_EQ(got.counted_tokens, ref.counted);
    ASSERT_EQ(got.loss.dtype(), DType::kFp32);
    if (p.options.reduction == Reduction::kNone) {
      ASSERT_EQ(got.loss.shape(), (std::vector<std::int64_t>{m}));
      EXPECT_TRUE(Within(got.loss, ref.loss, ref.loss_tol));
      for (std::int64_t i = 0; i < m; ++i) {
        if (p.targets[static_cast<std::size_t>(i)] == p.options.ignore_index) {
          EXPECT_EQ(got.loss.At(i), 0.0) << "ignored token " << i;
        }
      }
    } else {
      ASSERT_EQ(got.loss.shape(), (std::vector<std::int64_t>{1}));
      if (p.options.reduction == Reduction::kSum) {
        EXPECT_TRUE(Within(got.loss, {ref.sum}, {ref.sum_tol}));
      } else if (ref.counted == 0) {
        EXPECT_TRUE(std::isnan(got.loss.At(0))) << got.loss.At(0);
      } else {
        const double n = static_cast<double>(ref.counted);
        EXPECT_TRUE(Within(got.loss, {ref.sum / n}, {ref.sum_tol / n}, 4 * kU));
      }
    }
    EXPECT_EQ(got.lse.has_value(), p.options.want_lse);
    if (got.lse) {
      ASSERT_EQ(got.lse->shape(), (std::vector<std::int64_t>{m}));
      EXPECT_TRUE(Within(*got.lse, ref.lse, ref.lse_tol));
    }
    EXPECT_EQ(got.dx.has_value(), p.options.want_dx);
    if (got.dx) {
      ASSERT_EQ(got.dx->dtype(), p.options.dx_dtype);
      ASSERT_EQ(got.dx->shape(), (std::vector<std::int64_t>{m, k}));
      EXPECT_TRUE(
          Within(*got.dx, ref.dx, ref.dx_tol, got.dx->dtype() == DType::kBf16 ? kBf16U : 0.0));
      for (std::int64_t i = 0; i < m; ++i) {
        if (p.targets[static_cast<std::size_t>(i)] != p.options.ignore_index) continue;
        for (std::int64_t c = 0; c < k; ++c) {
          ASSERT_EQ(got.dx->At(i * k + c), 0.0) << "dX row of ignored token " << i;
        }
      }
    }
    EXPECT_EQ(got.dw.has_value(), p.options.want_dw && !p.options.accumulate_dw);
    if (got.dw) {
      ASSERT_EQ(got.dw->dtype(), DType::kFp32);
      ASSERT_EQ(got.dw->shape(), (std::vector<std::int64_t>{v, k}));
      EXPECT_TRUE(Within(*got.dw, ref.dw, ref.dw_tol));
    }
  }
};

constexpr std::int64_t kM = 24, kK = 64, kV = 320;  // V not a multiple of 64

TEST_F(CrossEntropyTest, LossLseAndGradientsMatchAnFp64Reference) {
  const Tensor x = NormalBf16({kM, kK}, 101);
  const Tensor w = ScaledNormalBf16({kV, kK}, 102, 0.25f);  // logits ~ N(0, 2²)
  const std::string handle = Register(w, "ce_reference");
  Problem p{&x, &w, RandomTargets(kM, kV, 103), {}};
  p.options.reduction = Reduction::kNone;
  p.options.want_lse = p.options.want_dx = p.options.want_dw = true;
  for (DType dx_dtype : {DType::kFp32, DType::kBf16}) {
    p.options.dx_dtype = dx_dtype;
    absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectMatchesReference(p, *r);
  }
  // Only the loss unless asked.
  p.options.want_lse = p.options.want_dx = p.options.want_dw = false;
  absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesReference(p, *r);
  EXPECT_GE(r->timing.compute_us, 0);
}

TEST_F(CrossEntropyTest, SumAndMeanAgreeWithThePerTokenLosses) {
  const Tensor x = NormalBf16({kM, kK}, 111);
  const Tensor w = ScaledNormalBf16({kV, kK}, 112, 0.3f);
  const std::string handle = Register(w, "ce_reductions");
  Problem p{&x, &w, RandomTargets(kM, kV, 113, 4), {}};
  p.options.reduction = Reduction::kNone;
  absl::StatusOr<CrossEntropyResult> none = Call(p, handle);
  ASSERT_TRUE(none.ok()) << none.status();
  double sum = 0, sum_abs = 0;
  for (std::int64_t i = 0; i < kM; ++i) {
    sum += none->loss.At(i);
    sum_abs += std::fabs(none->loss.At(i));
  }
  const double n = static_cast<double>(none->counted_tokens);
  EXPECT_EQ(none->counted_tokens, kM - kM / 4);

  p.options.want_dx = p.options.want_dw = true;
  p.options.reduction = Reduction::kSum;
  absl::StatusOr<CrossEntropyResult> s = Call(p, handle);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectMatchesReference(p, *s);
  EXPECT_NEAR(s->loss.At(0), sum, (kM + 2) * kU * sum_abs);

  for (Reduction mean : {Reduction::kMean}) {
    p.options.reduction = mean;
    absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectMatchesReference(p, *r);
    EXPECT_EQ(r->counted_tokens, none->counted_tokens);
    EXPECT_NEAR(r->loss.At(0), sum / n, (kM + 4) * kU * sum_abs / n);
  }
  // The default reduction is the mean.
  CrossEntropyOptions defaults;
  EXPECT_EQ(defaults.reduction, Reduction::kMean);
  EXPECT_EQ(defaults.ignore_index, -100);
}

TEST_F(CrossEntropyTest, IgnoreIndexExcludesTokensFromLossCountAndGradient) {
  const Tensor x = NormalBf16({kM, kK}, 121);
  const Tensor w = ScaledNormalBf16({kV, kK}, 122, 0.25f);
  const std::string handle = Register(w, "ce_ignore");
  // A real token id as ignore_index: every target 0 is ignored.
  Problem p{&x, &w, RandomTargets(kM, kV, 123, 3, /*ignore_index=*/0), {}};
  p.options.ignore_index = 0;
  p.options.reduction = Reduction::kNone;
  p.options.want_lse = p.options.want_dx = p.options.want_dw = true;
  p.options.dx_dtype = DType::kFp32;
  absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->counted_tokens, kM - kM / 3);
  ExpectMatchesReference(p, *r);

  // The same targets with the default ignore_index: 0 is a token again.
  p.options.ignore_index = -100;
  r = Call(p, handle);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->counted_tokens, kM);
  ExpectMatchesReference(p, *r);

  // Nothing counted: the mean is NaN, the sum 0, and no gradient flows.
  p.targets.assign(kM, -100);
  for (Reduction red : {Reduction::kMean, Reduction::kSum}) {
    p.options.reduction = red;
    r = Call(p, handle);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->counted_tokens, 0);
    if (red == Reduction::kMean) {
      EXPECT_TRUE(std::isnan(r->loss.At(0))) << r->loss.At(0);
    } else {
      EXPECT_EQ(r->loss.At(0), 0.0);
    }
    ASSERT_TRUE(r->dx && r->dw);
    for (std::int64_t i = 0; i < r->dx->numel(); ++i) ASSERT_EQ(r->dx->At(i), 0.0) << i;
    for (std::int64_t i = 0; i < r->dw->numel(); ++i) ASSERT_EQ(r->dw->At(i), 0.0) << i;
  }
}

TEST_F(CrossEntropyTest, ZLossAndSoftcapFollowTheFormulas) {
  const Tensor x = NormalBf16({kM, kK}, 131);
  const Tensor w = ScaledNormalBf16({kV, kK}, 132, 0.5f);  // logits ~ N(0, 4²)
  const std::string handle = Register(w, "ce_options");
  Problem p{&x, &w, RandomTargets(kM, kV, 133), {}};
  p.options.want_lse = p.options.want_dx = p.options.want_dw = true;
  for (const auto& [zl, cap] :
       {std::pair{1e-2f, 0.0f}, std::pair{0.0f, 3.0f}, std::pair{1e-3f, 5.0f}}) {
    for (Reduction red : {Reduction::kNone, Reduction::kMean}) {
      SCOPED_TRACE(
          absl::StrCat("z_loss ", zl, ", softcap ", cap, ", reduction ", static_cast<int>(red)));
      p.options.z_loss = zl;
      p.options.logit_softcap = cap;
      p.options.reduction = red;
      absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
      ASSERT_TRUE(r.ok()) << r.status();
      ExpectMatchesReference(p, *r);
      if (cap > 0 && r->lse) {
        // lse of capped logits is at most cap + log V.
        for (std::int64_t i = 0; i < kM; ++i) {
          EXPECT_LE(r->lse->At(i), cap + std::log(static_cast<double>(kV)) + 1e-4);
        }
      }
    }
  }
}

TEST_F(CrossEntropyTest, GradScaleScalesTheGradientExactly) {
  const Tensor x = NormalBf16({kM, kK}, 141);
  const Tensor w = ScaledNormalBf16({kV, kK}, 142, 0.25f);
  const std::string handle = Register(w, "ce_scale");
  Problem p{&x, &w, RandomTargets(kM, kV, 143), {}};
  p.options.reduction = Reduction::kSum;
  p.options.want_dx = p.options.want_dw = true;
  p.options.dx_dtype = DType::kFp32;
  absl::StatusOr<CrossEntropyResult> one = Call(p, handle);
  ASSERT_TRUE(one.ok()) << one.status();
  // A power of two commutes with the bf16 rounding and with fp32 sums.
  p.options.grad_scale = 0.5f;
  absl::StatusOr<CrossEntropyResult> half = Call(p, handle);
  ASSERT_TRUE(half.ok()) << half.status();
  ExpectMatchesReference(p, *half);
  EXPECT_EQ(half->loss.At(0), one->loss.At(0)) << "the scale is the loss's incoming gradient";
  for (std::int64_t i = 0; i < one->dx->numel(); ++i) {
    ASSERT_EQ(half->dx->data<float>()[i], 0.5f * one->dx->data<float>()[i]) << i;
  }
  for (std::int64_t i = 0; i < one->dw->numel(); ++i) {
    ASSERT_EQ(half->dw->data<float>()[i], 0.5f * one->dw->data<float>()[i]) << i;
  }
  p.options.grad_scale = -3.0f;
  absl::StatusOr<CrossEntropyResult> neg = Call(p, handle);
  ASSERT_TRUE(neg.ok()) << neg.status();
  ExpectMatchesReference(p, *neg);

  // 0 would read as 1 on the wire: refused before any call.
  p.options.grad_scale = 0.0f;
  absl::StatusOr<CrossEntropyResult> zero = Call(p, handle);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("grad_scale"));
}

TEST_F(CrossEntropyTest, Int32AndInt64TargetsGiveTheSameBits) {
  const Tensor x = NormalBf16({kM, kK}, 151);
  const Tensor w = ScaledNormalBf16({kV, kK}, 152, 0.25f);
  const std::string handle = Register(w, "ce_int32");
  Problem p{&x, &w, RandomTargets(kM, kV, 153), {}};
  p.options.reduction = Reduction::kNone;
  p.options.want_lse = p.options.want_dx = p.options.want_dw = true;
  absl::StatusOr<CrossEntropyResult> a = Call(p, handle, DType::kInt64);
  absl::StatusOr<CrossEntropyResult> b = Call(p, handle, DType::kInt32);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectMatchesReference(p, *b);
  EXPECT_EQ(a->counted_tokens, b->counted_tokens);
  EXPECT_TRUE(BitwiseEqual(b->loss, a->loss));
  EXPECT_TRUE(BitwiseEqual(*b->lse, *a->lse));
  EXPECT_TRUE(BitwiseEqual(*b->dx, *a->dx));
  EXPECT_TRUE(BitwiseEqual(*b->dw, *a->dw));
}

// Integer data whose logits are equal along each row: the softmax is
// exactly uniform, 2^-8 over V = 256, so G is known exactly,
// scale·(2^-8 − onehot) (representable in bf16), and so are dX and dW (every
// partial sum is a multiple of 2^-8·scale far below 2^24 of it).
struct UniformData {
  Tensor x, w;
  std::vector<std::int64_t> targets;
  Tensor g;                          // bf16 [M, V]: the exact G for `scale`
  std::vector<std::int64_t> dx, dw;  // in units of 2^-8·scale

  static constexpr std::int64_t kM = 20, kV = 256, kK = 48;

  explicit UniformData(std::uint32_t seed) : x(DType::kBf16, {kM, kK}), w(DType::kBf16, {kV, kK}) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-8, 8), offset(-12, 12);
    std::uniform_int_distribution<std::int64_t> id(0, kV - 1);
    // Column 0: W all ones, X an offset per row (the row's common logit).
    // Columns [1, 24): W's own, X zero. Columns [24, 48): X's own, W zero.
    for (std::int64_t j = 0; j < kV; ++j) {
      for (std::int64_t c = 0; c < kK; ++c) {
        const float v = c == 0 ? 1.0f : (c < 24 ? static_cast<float>(small(rng)) : 0.0f);
        w.data<Bf16Bits>()[j * kK + c] = FloatToBf16(v);
      }
    }
    for (std::int64_t i = 0; i < kM; ++i) {
      for (std::int64_t c = 0; c < kK; ++c) {
        const float v = c == 0 ? static_cast<float>(offset(rng))
                               : (c < 24 ? 0.0f : static_cast<float>(small(rng)));
        x.data<Bf16Bits>()[i * kK + c] = FloatToBf16(v);
      }
      targets.push_back(i % 5 == 2 ? -100 : id(rng));
    }
  }

  // G, dX and dW for a gradient scale that is a power of two.
  void Predict(double scale) {
    g = Tensor(DType::kBf16, {kM, kV});
    std::vector<std::int64_t> units(static_cast<std::size_t>(kM * kV), 0);  // of 2^-8
    for (std::int64_t i = 0; i < kM; ++i) {
      const std::int64_t t = targets[static_cast<std::size_t>(i)];
      for (std::int64_t j = 0; j < kV; ++j) {
        const std::int64_t u = t == -100 ? 0 : (j == t ? 1 - 256 : 1);
        units[static_cast<std::size_t>(i * kV + j)] = u;
        g.data<Bf16Bits>()[i * kV + j] =
            FloatToBf16(static_cast<float>(std::ldexp(static_cast<double>(u), -8) * scale));
      }
    }
    dx.assign(static_cast<std::size_t>(kM * kK), 0);
    dw.assign(static_cast<std::size_t>(kV * kK), 0);
    for (std::int64_t i = 0; i < kM; ++i) {
      for (std::int64_t j = 0; j < kV; ++j) {
        const std::int64_t u = units[static_cast<std::size_t>(i * kV + j)];
        if (u == 0) continue;
        for (std::int64_t c = 0; c < kK; ++c) {
          dx[static_cast<std::size_t>(i * kK + c)] +=
              u * static_cast<std::int64_t>(w.At(j * kK + c));
          dw[static_cast<std::size_t>(j * kK + c)] +=
              u * static_cast<std::int64_t>(x.At(i * kK + c));
        }
      }
    }
  }
};

::testing::AssertionResult EqualsUnits(const Tensor& got, const std::vector<std::int64_t>& units,
                                       double scale) {
  if (got.numel() != static_cast<std::int64_t>(units.size())) {
    return ::testing::AssertionFailure() << "size " << got.numel();
  }
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const float want = static_cast<float>(
        std::ldexp(static_cast<double>(units[static_cast<std::size_t>(i)]), -8) * scale);
    const float expect = got.dtype() == DType::kBf16 ? RoundToBf16(want) : want;
    if (static_cast<float>(got.At(i)) != expect) {
      return ::testing::AssertionFailure()
             << "[" << i << "]: got " << got.At(i) << ", exact " << expect;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CrossEntropyTest, UniformSoftmaxGivesExactGradientsAndTheSameBitsAsBackward) {
  UniformData d(161);
  const std::string handle = Register(d.w, "ce_uniform");
  Problem p{&d.x, &d.w, d.targets, {}};
  p.options.want_lse = p.options.want_dx = p.options.want_dw = true;
  p.options.dx_dtype = DType::kFp32;
  // Sum with scale 1, and a mean over 16 counted tokens times 2: scale 1/8.
  for (const auto& [red, grad_scale, scale] :
       {std::tuple{Reduction::kSum, 1.0f, 1.0}, std::tuple{Reduction::kMean, 2.0f, 0.125}}) {
    p.options.reduction = red;
    p.options.grad_scale = grad_scale;
    d.Predict(scale);
    absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->counted_tokens, 16);
    EXPECT_TRUE(EqualsUnits(*r->dx, d.dx, scale));
    EXPECT_TRUE(EqualsUnits(*r->dw, d.dw, scale));
    // Every counted loss is log V exactly in real arithmetic.
    const double per_token = std::log(256.0);
    const double want = red == Reduction::kSum ? 16 * per_token : per_token;
    EXPECT_NEAR(r->loss.At(0), want, 64 * kU * want);
    for (std::int64_t i = 0; i < UniformData::kM; ++i) {
      const double lse = d.x.At(i * UniformData::kK) + per_token;
      EXPECT_NEAR(r->lse->At(i), lse, 8 * kU * (std::fabs(lse) + 8)) << i;
    }
    // bf16 dX: the exact sum rounded once.
    CrossEntropyOptions bf16 = p.options;
    bf16.dx_dtype = DType::kBf16;
    bf16.want_dw = false;
    absl::StatusOr<CrossEntropyResult> r16 =
        client().CrossEntropy(d.x, Targets(d.targets, DType::kInt32), handle, bf16);
    ASSERT_TRUE(r16.ok()) << r16.status();
    EXPECT_TRUE(EqualsUnits(*r16->dx, d.dx, scale));
    // The server's Backward given the same G returns the same bits.
    client::BackwardOptions bo;
    bo.dx_dtype = DType::kFp32;
    absl::StatusOr<client::BackwardResult> back = client().Backward(d.g, d.x, handle, bo);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(BitwiseEqual(*r->dx, *back->dx));
    EXPECT_TRUE(BitwiseEqual(*r->dw, *back->dw));
  }
}

TEST_F(CrossEntropyTest, AccumulateIntoTheGradientBufferThenFetch) {
  UniformData d(171);
  d.Predict(1.0);
  const std::string handle = Register(d.w, "ce_accumulate");
  Problem p{&d.x, &d.w, d.targets, {}};
  p.options.reduction = Reduction::kSum;
  p.options.want_dx = p.options.want_dw = true;
  p.options.accumulate_dw = true;
  p.options.dx_dtype = DType::kFp32;
  absl::Status zero = client().ZeroGradient(handle);
  ASSERT_TRUE(zero.ok() || zero.code() == absl::StatusCode::kNotFound ||
              zero.code() == absl::StatusCode::kFailedPrecondition)
      << zero;
  absl::StatusOr<CrossEntropyResult> r = Call(p, handle);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->dw.has_value()) << "an accumulated dW is not returned";
  ASSERT_TRUE(r->dx.has_value());
  EXPECT_TRUE(EqualsUnits(*r->dx, d.dx, 1.0));
  // Backward of the same G accumulates into the same buffer.
  client::BackwardOptions bo;
  bo.want_dx = false;
  bo.accumulate_dw = true;
  ASSERT_TRUE(client().Backward(d.g, d.x, handle, bo).ok());
  r = Call(p, handle);
  ASSERT_TRUE(r.ok()) << r.status();

  absl::StatusOr<client::GradientResult> fetched = client().FetchGradient(handle, true);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->accumulated_calls, 3u);
  EXPECT_TRUE(EqualsUnits(fetched->dw, d.dw, 3.0));
  fetched = client().FetchGradient(handle, false);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->accumulated_calls, 0u);
  EXPECT_TRUE(EqualsUnits(fetched->dw, std::vector<std::int64_t>(d.dw.size(), 0), 1.0));

  // Accumulating asks for dW.
  p.options.want_dw = false;
  EXPECT_EQ(Call(p, handle).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CrossEntropyTest, InvalidTargetsAndOptionsAreRefused) {
  const Tensor x = NormalBf16({8, 32}, 181);
  const Tensor w = ScaledNormalBf16({64, 32}, 182, 0.2f);
  const std::string handle = Register(w, "ce_invalid");
  std::vector<std::int64_t> good = {0, 1, 2, 3, 4, 5, 6, 63};
  const auto call = [&](const std::vector<std::int64_t>& t, DType dtype,
                        CrossEntropyOptions o = {}) {
    return client().CrossEntropy(x, Targets(t, dtype), handle, o).status();
  };
  struct Bad {
    const char* what;
    std::size_t index;
    std::int64_t value;
    DType dtype;
  };
  for (const Bad& b :
       {Bad{"V", 3, 64, DType::kInt64}, Bad{"-1", 0, -1, DType::kInt64},
        Bad{"V+100 int32", 7, 164, DType::kInt32},
        Bad{"INT32_MIN", 2, std::numeric_limits<std::int32_t>::min(), DType::kInt32},
        Bad{"INT64_MAX", 5, std::numeric_limits<std::int64_t>::max(), DType::kInt64}}) {
    std::vector<std::int64_t> t = good;
    t[b.index] = b.value;
    const absl::Status s = call(t, b.dtype);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("targets[", b.index, "]")))
        << b.what;
    EXPECT_TRUE(ServerAnswers(client()));
  }
  // -100 is only ignored while it is the ignore_index.
  std::vector<std::int64_t> t = good;
  t[1] = -100;
  EXPECT_TRUE(call(t, DType::kInt64).ok());
  CrossEntropyOptions other_ignore;
  other_ignore.ignore_index = -1;
  EXPECT_EQ(call(t, DType::kInt64, other_ignore).code(), absl::StatusCode::kInvalidArgument);

  // Shapes and dtypes of the targets.
  EXPECT_EQ(call({0, 1, 2}, DType::kInt64).code(), absl::StatusCode::kInvalidArgument);
  Tensor two_d(DType::kInt64, {2, 4});
  EXPECT_EQ(client().CrossEntropy(x, two_d, handle, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  Tensor floats(DType::kFp32, {8});
  EXPECT_EQ(client().CrossEntropy(x, floats, handle, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().CrossEntropy(x, Tensor(), handle, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // X of the wrong width, an unknown weight.
  EXPECT_EQ(
      client().CrossEntropy(NormalBf16({8, 16}, 1), Targets(good), handle, {}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().CrossEntropy(x, Targets(good), "no-such-handle", {}).status().code(),
            absl::StatusCode::kNotFound);
  // Options the proto rules out.
  CrossEntropyOptions o;
  o.logit_softcap = -1.0f;
  EXPECT_EQ(call(good, DType::kInt64, o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.z_loss = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(call(good, DType::kInt64, o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.grad_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(call(good, DType::kInt64, o).code(), absl::StatusCode::kInvalidArgument);
  // And the server still computes.
  absl::StatusOr<CrossEntropyResult> r =
      client().CrossEntropy(x, Targets(good), handle, CrossEntropyOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->counted_tokens, 8);
}

// --- logitctl cross-entropy ---------------------------------------------------

class LogitctlCrossEntropyTest : public CrossEntropyTest {
 protected:
  void SetUp() override {
    CrossEntropyTest::SetUp();
    char tmpl[] = "/tmp/logitctl-ce-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    CrossEntropyTest::TearDown();
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  LogitctlRun Run(const std::vector<std::string>& args) const {
    std::vector<std::string> all = {"--server=" + server_->process.address()};
    all.insert(all.end(), args.begin(), args.end());
    return RunLogitctl(all);
  }

  static std::string Field(const std::string& out, const std::string& key) {
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && parts[0] == key) return parts[1];
    }
    return "";
  }

  static Tensor Read(const std::string& path, const std::string& name) {
    absl::StatusOr<Tensor> t = ReadSafetensorsTensor(path, name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : Tensor();
  }

  std::string dir_;
};

TEST_F(LogitctlCrossEntropyTest, EndToEnd) {
  UniformData d(191);
  d.Predict(1.0);
  const Tensor t64 = Targets(d.targets, DType::kInt64);
  const Tensor t32 = Targets(d.targets, DType::kInt32);
  Tensor bad = t64.Clone();
  bad.data<std::int64_t>()[4] = UniformData::kV;
  Tensor floats(DType::kFp32, {UniformData::kM});
  ASSERT_TRUE(WriteSafetensors(Path("w.safetensors"), {{"lm_head.weight", &d.w}}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("x.safetensors"), {{"x", &d.x}}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"),
                               {{"t64", &t64}, {"t32", &t32}, {"bad", &bad}, {"floats", &floats}})
                  .ok());
  LogitctlRun reg = Run({"weights", "register", Path("w.safetensors")});
  ASSERT_EQ(reg.exit_code, 0) << reg.err;
  const std::string handle = Field(reg.out, "handle");
  ASSERT_FALSE(handle.empty()) << reg.out;
  const std::string x = "--x=" + Path("x.safetensors");
  const std::string weight = "--weight=" + handle;

  LogitctlRun help = Run({"help"});
  EXPECT_THAT(help.out, HasSubstr("cross-entropy --x=FILE[:TENSOR] --targets=FILE[:TENSOR]"));

  // Per-token losses with every output: the same bits as the library call.
  LogitctlRun r = Run({"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
                       "--out=" + Path("none.safetensors"), "--reduction=none", "--lse", "--dx",
                       "--dw", "--dx_dtype=fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "counted_tokens"), "16");
  EXPECT_EQ(Field(r.out, "loss"), "fp32");  // a shape follows, not a value
  EXPECT_THAT(r.out, HasSubstr("[20]"));
  EXPECT_FALSE(Field(r.out, "compute_us").empty());
  CrossEntropyOptions o;
  o.reduction = Reduction::kNone;
  o.want_lse = o.want_dx = o.want_dw = true;
  o.dx_dtype = DType::kFp32;
  absl::StatusOr<CrossEntropyResult> lib = client().CrossEntropy(d.x, t64, handle, o);
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_TRUE(BitwiseEqual(Read(Path("none.safetensors"), "loss"), lib->loss));
  EXPECT_TRUE(BitwiseEqual(Read(Path("none.safetensors"), "lse"), *lib->lse));
  EXPECT_TRUE(BitwiseEqual(Read(Path("none.safetensors"), "dx"), *lib->dx));
  EXPECT_TRUE(EqualsUnits(Read(Path("none.safetensors"), "dx"), d.dx, 1.0));
  EXPECT_TRUE(EqualsUnits(Read(Path("none.safetensors"), "dw"), d.dw, 1.0));
  absl::StatusOr<std::map<std::string, std::string>> meta =
      ReadSafetensorsMetadata(Path("none.safetensors"));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->at("reduction"), "none");
  EXPECT_EQ(meta->at("counted_tokens"), "16");
  EXPECT_EQ(meta->at("weight_handle"), handle);

  // The default mean, printed as a value, from int32 targets; only "loss".
  r = Run({"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t32", weight,
           "--out=" + Path("mean.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  o = {};
  lib = client().CrossEntropy(d.x, t64, handle, o);
  ASSERT_TRUE(lib.ok()) << lib.status();
  float printed = 0;
  ASSERT_TRUE(absl::SimpleAtof(Field(r.out, "loss"), &printed)) << r.out;
  EXPECT_EQ(printed, lib->loss.data<float>()[0]);
  EXPECT_EQ(Field(r.out, "reduction"), "mean");
  absl::StatusOr<std::vector<std::string>> names = ListSafetensors(Path("mean.safetensors"));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"loss"});
  EXPECT_TRUE(BitwiseEqual(Read(Path("mean.safetensors"), "loss"), lib->loss));

  // Options travel: z-loss, soft-capping, scale, a real id as ignore_index.
  Tensor t3 = t64.Clone();
  for (std::int64_t i = 0; i < t3.numel(); ++i) {
    if (t3.data<std::int64_t>()[i] == -100) t3.data<std::int64_t>()[i] = 3;
  }
  ASSERT_TRUE(WriteSafetensors(Path("t3.safetensors"), {{"t3", &t3}}).ok());
  const std::vector<std::string> options = {"--reduction=sum",     "--z_loss=0.01",
                                            "--logit_softcap=7.5", "--grad_scale=0.25",
                                            "--ignore_index=3",    "--dx"};
  std::vector<std::string> args = {"cross-entropy", x, "--targets=" + Path("t3.safetensors"),
                                   weight, "--out=" + Path("opts.safetensors")};
  args.insert(args.end(), options.begin(), options.end());
  r = Run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  o = {};
  o.reduction = Reduction::kSum;
  o.z_loss = 0.01f;
  o.logit_softcap = 7.5f;
  o.grad_scale = 0.25f;
  o.ignore_index = 3;
  o.want_dx = true;
  lib = client().CrossEntropy(d.x, t3, handle, o);
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ(Field(r.out, "counted_tokens"), absl::StrCat(lib->counted_tokens));
  EXPECT_LE(lib->counted_tokens, 16);
  EXPECT_TRUE(BitwiseEqual(Read(Path("opts.safetensors"), "loss"), lib->loss));
  EXPECT_TRUE(BitwiseEqual(Read(Path("opts.safetensors"), "dx"), *lib->dx));
  // With ignore_index 3, the -100s of t64 are invalid targets: refused (exit 2).
  args[2] = "--targets=" + Path("t.safetensors") + ":t64";
  r = Run(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;  // an input the server refuses
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));

  // Accumulate, then fetch with `grad fetch`.
  const absl::Status zero = client().ZeroGradient(handle);
  ASSERT_TRUE(zero.ok() || zero.code() == absl::StatusCode::kNotFound ||
              zero.code() == absl::StatusCode::kFailedPrecondition)
      << zero;
  for (int i = 0; i < 2; ++i) {
    r = Run({"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
             "--out=" + Path("acc.safetensors"), "--reduction=sum", "--dw", "--accumulate"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("accumulated on the server"));
  }
  r = Run({"grad", "fetch", handle, "--out=" + Path("g.safetensors"), "--zero"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "accumulated_calls"), "2");
  EXPECT_TRUE(EqualsUnits(Read(Path("g.safetensors"), "dw"), d.dw, 2.0));

  // Exit codes: 1 for the server's refusal, 2 for usage and input errors.
  r = Run({"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":bad", weight,
           "--out=" + Path("o.safetensors")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("targets[4]"));
  r = Run({"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64",
           "--weight=no-such-handle", "--out=" + Path("o.safetensors")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"cross-entropy", x, weight, "--out=" + Path("o.safetensors")},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":floats", weight,
            "--out=" + Path("o.safetensors")},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
            "--out=" + Path("o.safetensors"), "--reduction=avg"},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
            "--out=" + Path("o.safetensors"), "--grad_scale=0"},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
            "--out=" + Path("o.safetensors"), "--accumulate"},
           {"cross-entropy", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
            "--out=" + Path("o.safetensors"), "--dx_dtype=int32"},
           {"cross-entropy", "extra", x, "--targets=" + Path("t.safetensors") + ":t64", weight,
            "--out=" + Path("o.safetensors")},
       }) {
    r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
  }
}

}  // namespace
}  // namespace logitd::testing

// The cross-entropy reference (logitd/reference/cross_entropy.h): closed
// forms on small integer logits, the same bits whatever the block of rows,
// ignored tokens, the reductions and their scales, a NaN confined to its
// row, and a random case against a plain long-double evaluation written
// here, every value of which must lie inside the reference's bounds.
#include "logitd/reference/cross_entropy.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "tests/reference/random_lm_head.h"

namespace logitd {
namespace {

using Random = RandomLmHead;

std::vector<Bf16Bits> Bf16Of(const std::vector<float>& values) {
  std::vector<Bf16Bits> out;
  for (float f : values) out.push_back(FloatToBf16(f));
  return out;
}

LmHeadInputs Inputs(const std::vector<Bf16Bits>& x, const std::vector<Bf16Bits>& w, std::int64_t m,
                    std::int64_t v, std::int64_t k) {
  return LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
}

// The reference with g and its bound gathered whole.
struct Gathered {
  CrossEntropyReference ref;
  std::vector<double> g, g_pre_err;
  std::vector<std::int64_t> block_starts;
};

Gathered Gather(const LmHeadInputs& in, const std::vector<std::int64_t>& targets,
                const CeReferenceOptions& o, LogitModel logits, std::int64_t block_rows = 0) {
  Gathered out;
  out.g.assign(static_cast<std::size_t>(in.m * in.v), -1.0);
  out.g_pre_err.assign(out.g.size(), -1.0);
  EXPECT_TRUE(ReferenceCrossEntropy(
      in, targets.data(), o, logits, &out.ref,
      [&](std::int64_t row0, std::int64_t rows, const double* g, const double* e, const double*,
          const double*) {
        out.block_starts.push_back(row0);
        for (std::int64_t i = 0; i < rows * in.v; ++i) {
          out.g[static_cast<std::size_t>(row0 * in.v + i)] = g[i];
          out.g_pre_err[static_cast<std::size_t>(row0 * in.v + i)] = e[i];
        }
      },
      {}, block_rows));
  return out;
}

// Rows of logits y_ij = a_i·j + c_i: x_i = [a_i, c_i], w_j = [j, 1].
struct Linear {
  std::vector<Bf16Bits> x, w;
  std::int64_t m, v;
};

Linear MakeLinear(const std::vector<std::pair<int, int>>& rows, std::int64_t v) {
  Linear l;
  l.m = static_cast<std::int64_t>(rows.size());
  l.v = v;
  std::vector<float> x, w;
  for (const auto& [a, c] : rows) {
    x.push_back(static_cast<float>(a));
    x.push_back(static_cast<float>(c));
  }
  for (std::int64_t j = 0; j < v; ++j) {
    w.push_back(static_cast<float>(j));
    w.push_back(1.0f);
  }
  l.x = Bf16Of(x);
  l.w = Bf16Of(w);
  return l;
}

TEST(CrossEntropyReferenceTest, ClosedFormsOnIntegerLogits) {
  // Row 0: four equal logits 3, so lse = 3 + log 4 and every p = 1/4.
  // Row 1: logits 0, 1, 2, 3, so lse = log(1 + e + e² + e³).
  const Linear l = MakeLinear({{0, 3}, {1, 0}}, 4);
  const std::vector<std::int64_t> targets = {2, 1};
  CeReferenceOptions o;
  o.reduction = CeReduction::kSum;
  o.grad_scale = 0.5f;
  const Gathered r = Gather(Inputs(l.x, l.w, 2, 4, 2), targets, o, LogitModel::kExact);
  const double e = std::exp(1.0);
  const double lse0 = 3 + std::log(4.0), lse1 = std::log(1 + e + e * e + e * e * e);
  EXPECT_NEAR(r.ref.lse[0], lse0, 1e-14 * lse0);
  EXPECT_NEAR(r.ref.lse[1], lse1, 1e-14 * lse1);
  EXPECT_NEAR(r.ref.loss[0], std::log(4.0), 1e-14);
  EXPECT_NEAR(r.ref.loss[1], lse1 - 1, 1e-14);
  EXPECT_EQ(r.ref.counted, 2);
  EXPECT_EQ(r.ref.scale, 0.5);
  EXPECT_NEAR(r.ref.sum, std::log(4.0) + lse1 - 1, 1e-14);
  EXPECT_NEAR(r.ref.mean, r.ref.sum / 2, 1e-14);
  // g = (p − onehot)·scale.
  for (std::int64_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(r.g[static_cast<std::size_t>(j)], (0.25 - (j == 2 ? 1 : 0)) * 0.5, 1e-14);
    const double p1 = std::exp(static_cast<double>(j) - lse1);
    EXPECT_NEAR(r.g[static_cast<std::size_t>(4 + j)], (p1 - (j == 1 ? 1 : 0)) * 0.5, 1e-14);
  }
  // Exact logits leave only the evaluation's bounds: small, not zero.
  for (double b : {r.ref.lse_bound[0], r.ref.lse_bound[1], r.ref.loss_bound[0]}) {
    EXPECT_GT(b, 0);
    EXPECT_LT(b, 1e-5);
  }
  for (double b : r.g_pre_err) {
    EXPECT_GT(b, 0);
    EXPECT_LT(b, 1e-5);
  }
}

TEST(CrossEntropyReferenceTest, ZLossAndSoftcapClosedForms) {
  // Equal logits 4 capped at 8: z = 8·tanh(1/2) for all, lse = z + log 3,
  // loss = log 3 + z_loss·lse²; g = (p·(1 + 2·z_loss·lse) − onehot)·(1 −
  // tanh²)·scale.
  const Linear l = MakeLinear({{0, 4}}, 3);
  CeReferenceOptions o;
  o.reduction = CeReduction::kMean;
  o.z_loss = 1e-2f;
  o.logit_softcap = 8.0f;
  const Gathered r = Gather(Inputs(l.x, l.w, 1, 3, 2), {0}, o, LogitModel::kExact);
  const double t = std::tanh(0.5), z = 8 * t, lse = z + std::log(3.0);
  const double zl = static_cast<double>(1e-2f);
  EXPECT_NEAR(r.ref.lse[0], lse, 1e-14 * lse);
  EXPECT_NEAR(r.ref.loss[0], std::log(3.0) + zl * lse * lse, 1e-14);
  EXPECT_EQ(r.ref.scale, 1.0);
  for (std::int64_t j = 0; j < 3; ++j) {
    const double want = ((1.0 / 3) * (1 + 2 * zl * lse) - (j == 0 ? 1 : 0)) * (1 - t * t);
    EXPECT_NEAR(r.g[static_cast<std::size_t>(j)], want, 1e-14);
  }
}

TEST(CrossEntropyReferenceTest, IgnoredTokensAndReductions) {
  const Linear l = MakeLinear({{1, 0}, {0, 2}, {-1, 1}, {2, -3}}, 5);
  const LmHeadInputs in = Inputs(l.x, l.w, 4, 5, 2);
  const std::vector<std::int64_t> targets = {4, 7, 0, 7};  // ignore_index 7
  CeReferenceOptions o;
  o.ignore_index = 7;
  o.grad_scale = 3.0f;
  o.reduction = CeReduction::kSum;
  const Gathered sum = Gather(in, targets, o, LogitModel::kExact);
  o.reduction = CeReduction::kMean;
  const Gathered mean = Gather(in, targets, o, LogitModel::kExact);
  o.reduction = CeReduction::kNone;
  const Gathered none = Gather(in, targets, o, LogitModel::kExact);
  for (const Gathered* r : {&sum, &mean, &none}) {
    EXPECT_EQ(r->ref.counted, 2);
    for (std::size_t i : {1u, 3u}) {
      EXPECT_EQ(r->ref.loss[i], 0.0);
      EXPECT_EQ(r->ref.loss_bound[i], 0.0);
      EXPECT_GT(r->ref.lse[i], 0.0);  // an ignored token's lse is its row's
      for (std::int64_t j = 0; j < 5; ++j) {
        EXPECT_EQ(r->g[i * 5 + static_cast<std::size_t>(j)], 0.0);
        EXPECT_EQ(r->g_pre_err[i * 5 + static_cast<std::size_t>(j)], 0.0);
      }
    }
    EXPECT_EQ(r->ref.sum, r->ref.loss[0] + r->ref.loss[2]);
    EXPECT_EQ(r->ref.mean, r->ref.sum / 2);
    EXPECT_GE(r->ref.sum_bound, r->ref.loss_bound[0] + r->ref.loss_bound[2]);
  }
  // The mean divides dL/dz by the counted tokens, not by M.
  EXPECT_EQ(sum.ref.scale, 3.0);
  EXPECT_EQ(mean.ref.scale, 1.5);
  EXPECT_EQ(none.ref.scale, 3.0);
  for (std::size_t i = 0; i < sum.g.size(); ++i) {
    EXPECT_NEAR(mean.g[i] * 2, sum.g[i], 1e-14) << i;
    EXPECT_EQ(none.g[i], sum.g[i]) << i;
  }
  // Every token ignored: the sum 0, the mean NaN, g all zero.
  const std::vector<std::int64_t> all_ignored(4, 7);
  o.reduction = CeReduction::kMean;
  const Gathered nothing = Gather(in, all_ignored, o, LogitModel::kExact);
  EXPECT_EQ(nothing.ref.counted, 0);
  EXPECT_EQ(nothing.ref.sum, 0.0);
  EXPECT_TRUE(std::isnan(nothing.ref.mean));
  for (double g : nothing.g) EXPECT_EQ(g, 0.0);
}

Random MakeRandom(std::int64_t m, std::int64_t v, std::int64_t k, std::uint64_t seed) {
  return MakeRandomLmHead(m, v, k, 2.0f / std::sqrt(static_cast<float>(k)), 4, 3, seed);
}

void ExpectSameBits(const Gathered& a, const Gathered& b) {
  EXPECT_EQ(a.ref.lse, b.ref.lse);
  EXPECT_EQ(a.ref.lse_bound, b.ref.lse_bound);
  EXPECT_EQ(a.ref.loss, b.ref.loss);
  EXPECT_EQ(a.ref.loss_bound, b.ref.loss_bound);
  EXPECT_EQ(a.ref.sum, b.ref.sum);
  EXPECT_EQ(a.ref.sum_bound, b.ref.sum_bound);
  EXPECT_EQ(a.ref.mean, b.ref.mean);
  EXPECT_EQ(a.ref.mean_bound, b.ref.mean_bound);
  EXPECT_EQ(a.g, b.g);
  EXPECT_EQ(a.g_pre_err, b.g_pre_err);
}

TEST(CrossEntropyReferenceTest, BlocksOfRowsGiveTheSameBits) {
  const Random d = MakeRandom(23, 300, 40, 7);
  const LmHeadInputs in = d.in();
  CeReferenceOptions o;
  o.z_loss = 1e-3f;
  o.logit_softcap = 15.0f;
  o.grad_scale = 0.75f;
  for (LogitModel logits : {LogitModel::kFp32Sum, LogitModel::kExact, LogitModel::kBf16Rounded}) {
    const Gathered whole = Gather(in, d.targets, o, logits);
    ASSERT_EQ(whole.block_starts, std::vector<std::int64_t>{0});
    for (std::int64_t rows : {1, 2, 5, 22, 23, 64}) {
      SCOPED_TRACE(rows);
      const Gathered blocked = Gather(in, d.targets, o, logits, rows);
      EXPECT_EQ(blocked.block_starts.size(), static_cast<std::size_t>((d.m + rows - 1) / rows));
      ExpectSameBits(whole, blocked);
    }
  }
}

TEST(CrossEntropyReferenceTest, WithoutAGradientSinkTheTokensAreTheSame) {
  const Random d = MakeRandom(9, 128, 16, 3);
  const LmHeadInputs in = d.in();
  const CeReferenceOptions o;
  const Gathered with = Gather(in, d.targets, o, LogitModel::kFp32Sum);
  CrossEntropyReference without;
  ASSERT_TRUE(ReferenceCrossEntropy(in, d.targets.data(), o, LogitModel::kFp32Sum, &without));
  EXPECT_EQ(with.ref.lse, without.lse);
  EXPECT_EQ(with.ref.loss_bound, without.loss_bound);
  EXPECT_EQ(with.ref.mean_bound, without.mean_bound);
}

TEST(CrossEntropyReferenceTest, StopEndsBetweenBlocks) {
  const Random d = MakeRandom(8, 64, 16, 5);
  const LmHeadInputs in = d.in();
  int blocks = 0;
  CrossEntropyReference ref;
  EXPECT_FALSE(ReferenceCrossEntropy(
      in, d.targets.data(), {}, LogitModel::kFp32Sum, &ref,
      [&](std::int64_t, std::int64_t, const double*, const double*, const double*, const double*) {
        ++blocks;
      },
      [&] { return blocks == 2; }, 3));
  EXPECT_EQ(blocks, 2);
}

TEST(CrossEntropyReferenceTest, ANaNStaysInItsRow) {
  Random d = MakeRandom(6, 50, 12, 11);
  const LmHeadInputs in = d.in();
  CeReferenceOptions o;
  o.reduction = CeReduction::kNone;
  const Gathered clean = Gather(in, d.targets, o, LogitModel::kFp32Sum);
  d.x[static_cast<std::size_t>(2 * d.k + 5)] = FloatToBf16(NAN);
  const Gathered nan = Gather(in, d.targets, o, LogitModel::kFp32Sum);
  for (std::size_t i = 0; i < 6; ++i) {
    if (i == 2) {
      EXPECT_TRUE(std::isnan(nan.ref.lse[i]));
      continue;
    }
    EXPECT_EQ(nan.ref.lse[i], clean.ref.lse[i]) << i;
    EXPECT_EQ(nan.ref.loss[i], clean.ref.loss[i]) << i;
  }
}

// The cross-entropy in long double, written out plainly.
struct Naive {
  std::vector<long double> lse, loss, g;
  long double sum = 0;
};

Naive NaiveCrossEntropy(const Random& d, const CeReferenceOptions& o) {
  Naive n;
  std::int64_t counted = 0;
  for (std::int64_t t : d.targets) counted += t == o.ignore_index ? 0 : 1;
  const long double scale = o.reduction == CeReduction::kMean
                                ? static_cast<long double>(o.grad_scale) / counted
                                : static_cast<long double>(o.grad_scale);
  const long double cap = o.logit_softcap, zl = o.z_loss;
  for (std::int64_t i = 0; i < d.m; ++i) {
    std::vector<long double> z(static_cast<std::size_t>(d.v)), f(z.size());
    for (std::int64_t j = 0; j < d.v; ++j) {
      long double y = 0;
      for (std::int64_t c = 0; c < d.k; ++c) {
        y += static_cast<long double>(Bf16ToFloat(d.x[static_cast<std::size_t>(i * d.k + c)])) *
             Bf16ToFloat(d.w[static_cast<std::size_t>(j * d.k + c)]);
      }
      const long double t = cap > 0 ? std::tanh(y / cap) : 0;
      z[static_cast<std::size_t>(j)] = cap > 0 ? cap * t : y;
      f[static_cast<std::size_t>(j)] = cap > 0 ? 1 - t * t : 1;
    }
    long double s = 0;
    for (long double zj : z) s += std::exp(zj);
    const long double lse = std::log(s);
    n.lse.push_back(lse);
    const std::int64_t target = d.targets[static_cast<std::size_t>(i)];
    const bool counts = target != o.ignore_index;
    const long double loss =
        counts ? lse - z[static_cast<std::size_t>(target)] + zl * lse * lse : 0.0L;
    n.loss.push_back(loss);
    n.sum += loss;
    for (std::int64_t j = 0; j < d.v; ++j) {
      const long double p = std::exp(z[static_cast<std::size_t>(j)] - lse);
      n.g.push_back(counts ? (p * (1 + 2 * zl * lse) - (j == target ? 1 : 0)) *
                                 f[static_cast<std::size_t>(j)] * scale
                           : 0.0L);
    }
  }
  return n;
}

TEST(CrossEntropyReferenceTest, RandomCaseAgreesWithLongDouble) {
  const Random d = MakeRandom(17, 211, 64, 21);
  const LmHeadInputs in = d.in();
  for (const auto& [zl, cap, reduction] :
       {std::tuple{0.0f, 0.0f, CeReduction::kSum}, std::tuple{1e-3f, 20.0f, CeReduction::kMean}}) {
    CeReferenceOptions o;
    o.z_loss = zl;
    o.logit_softcap = cap;
    o.reduction = reduction;
    o.grad_scale = 1.25f;
    const Gathered r = Gather(in, d.targets, o, LogitModel::kFp32Sum);
    const Naive n = NaiveCrossEntropy(d, o);
    const auto close = [](double got, long double want, double bound, const char* what,
                          std::size_t i) {
      const long double err = std::fabs(static_cast<long double>(got) - want);
      EXPECT_LE(err, 1e-12L * (1 + std::fabs(want))) << what << " [" << i << "]";
      EXPECT_LE(err, static_cast<long double>(bound)) << what << " [" << i << "]";
    };
    for (std::size_t i = 0; i < static_cast<std::size_t>(d.m); ++i) {
      close(r.ref.lse[i], n.lse[i], r.ref.lse_bound[i], "lse", i);
      if (d.targets[i] != o.ignore_index)
        close(r.ref.loss[i], n.loss[i], r.ref.loss_bound[i], "loss", i);
    }
    close(r.ref.sum, n.sum, r.ref.sum_bound, "sum", 0);
    for (std::size_t i = 0; i < r.g.size(); ++i) {
      const long double err = std::fabs(static_cast<long double>(r.g[i]) - n.g[i]);
      EXPECT_LE(err, 1e-13L) << "g [" << i << "]";
      EXPECT_LE(err, static_cast<long double>(r.g_pre_err[i])) << "g [" << i << "]";
      // The bf16 cast's bounds hold the rounded value.
      const double cast = Bf16ToFloat(FloatToBf16(static_cast<float>(r.g[i])));
      EXPECT_LE(std::fabs(cast - r.g[i]), CastGradientError(r.g[i], r.g_pre_err[i]));
      EXPECT_LE(std::fabs(cast), CastGradientMagnitude(r.g[i], r.g_pre_err[i]));
    }
  }
}

TEST(CrossEntropyReferenceTest, MemoryEstimate) {
  // One block of 64 rows of V = 32768: logits, their bounds, X rows; with
  // gradients g, its bound and the two flip weights of the class test.
  const std::uint64_t tokens = CrossEntropyReferenceBytes(64, 32768, 1024, false);
  const std::uint64_t grads = CrossEntropyReferenceBytes(64, 32768, 1024, true);
  EXPECT_GE(tokens, 64ull * 32768 * 2 * 8);
  EXPECT_EQ(grads - tokens, 64ull * 32768 * 4 * 8);
  // Blocks bound it whatever M is.
  EXPECT_EQ(CrossEntropyReferenceBytes(1 << 20, 32768, 1024, true),
            CrossEntropyReferenceBytes(256, 32768, 1024, true));
  EXPECT_LT(CrossEntropyReferenceBytes(64, 32768, 1024, true, 8), grads);
}

// dX = G·W and dW = Gᵀ·X from g: the products of g in fp64 (against a
// long-double sum), blocks in order covering every row, bounds at least the
// cast's share |G − g|·|w| and larger for a bf16 dX.
TEST(CrossEntropyGradientReference, ProductsOfGWithTheirBounds) {
  const Random d = MakeRandom(7, 90, 24, 29);
  CeReferenceOptions o;
  o.reduction = CeReduction::kMean;
  const Gathered r = Gather(d.in(), d.targets, o, LogitModel::kFp32Sum);
  const std::int64_t m = d.m, v = d.v, k = d.k;
  const auto w_at = [&](std::int64_t j, std::int64_t c) {
    return static_cast<long double>(Bf16ToFloat(d.w[static_cast<std::size_t>(j * k + c)]));
  };
  const auto x_at = [&](std::int64_t i, std::int64_t c) {
    return static_cast<long double>(Bf16ToFloat(d.x[static_cast<std::size_t>(i * k + c)]));
  };
  const auto g_at = [&](std::int64_t i, std::int64_t j) {
    return static_cast<long double>(r.g[static_cast<std::size_t>(i * v + j)]);
  };
  for (bool bf16 : {false, true}) {
    std::int64_t next = 0;
    ASSERT_TRUE(CrossEntropyGradInputReference(
        r.g.data(), r.g_pre_err.data(), m, Bf16Matrix{d.w.data(), v, k}, bf16,
        [&](std::int64_t row0, std::int64_t rows, const double* value, const double* bound) {
          EXPECT_EQ(row0, next);
          next = row0 + rows;
          for (std::int64_t i = row0; i < row0 + rows; ++i) {
            for (std::int64_t c = 0; c < k; ++c) {
              long double want = 0, abs = 0;
              for (std::int64_t j = 0; j < v; ++j) {
                want += g_at(i, j) * w_at(j, c);
                abs += std::fabs(g_at(i, j) * w_at(j, c));
              }
              const std::size_t e = static_cast<std::size_t>((i - row0) * k + c);
              EXPECT_NEAR(value[e], static_cast<double>(want), 1e-14 * static_cast<double>(abs));
              // At least 2^-9 of Σ|g·w|: a G rounded to bf16 is within it.
              EXPECT_GE(bound[e], 0x1p-9 * static_cast<double>(abs));
            }
          }
        }));
    EXPECT_EQ(next, m);
  }
  std::int64_t next = 0;
  ASSERT_TRUE(CrossEntropyGradWeightReference(
      r.g.data(), r.g_pre_err.data(), d.x.data(), m, v, k,
      [&](std::int64_t row0, std::int64_t rows, const double* value, const double* bound) {
        EXPECT_EQ(row0, next);
        next = row0 + rows;
        for (std::int64_t j = row0; j < row0 + rows; ++j) {
          for (std::int64_t c = 0; c < k; ++c) {
            long double want = 0, abs = 0;
            for (std::int64_t i = 0; i < m; ++i) {
              want += g_at(i, j) * x_at(i, c);
              abs += std::fabs(g_at(i, j) * x_at(i, c));
            }
            const std::size_t e = static_cast<std::size_t>((j - row0) * k + c);
            EXPECT_NEAR(value[e], static_cast<double>(want), 1e-14 * static_cast<double>(abs));
            EXPECT_GE(bound[e], 0x1p-9 * static_cast<double>(abs));
          }
        }
      }));
  EXPECT_EQ(next, v);
  // A stop asked before the first block ends the walk.
  EXPECT_FALSE(CrossEntropyGradWeightReference(
      r.g.data(), r.g_pre_err.data(), d.x.data(), m, v, k,
      [](std::int64_t, std::int64_t, const double*, const double*) {}, [] { return true; }));
}

}  // namespace
}  // namespace logitd

namespace logitd {
namespace {

// Row 0 of a call whose logits' proven bounds are wide: vocabulary entry 0
// sums K = 4096 products of ±a that cancel (y_0 = 0, Σ|x·w| = K·a, a bound
// of about 2a), entry 1 is one product b (y_1 = b, a bound near 0).
struct WideBounds {
  std::vector<Bf16Bits> x, w;
  std::int64_t k = 4096;
  double e0 = 0;  // the proven bound of logit 0
  double b = 0;
};

WideBounds MakeWideBounds(float a, float b) {
  WideBounds c;
  c.b = b;
  for (std::int64_t t = 0; t < c.k; ++t) c.x.push_back(FloatToBf16(1.0f));
  for (std::int64_t t = 0; t < c.k; ++t) c.w.push_back(FloatToBf16(t % 2 == 0 ? a : -a));
  for (std::int64_t t = 0; t < c.k; ++t) c.w.push_back(FloatToBf16(t == 0 ? b : 0.0f));
  c.e0 = Gamma(c.k, kFp32StepError) * static_cast<double>(c.k) * a;
  return c;
}

TEST(CrossEntropyReferenceTest, TheLseBoundHoldsForLargeLogitErrors) {
  // Logits within their proven bounds can move lse by log Σ p·e^{e_v}: with
  // z = [0, 20] and e = [≈2a, ≈0.01], p_0 = e^-20, that is about
  // log(e^-20·e^{2a} + e^{0.01}), 0.028 nats at a = 8 where the first-order
  // Σ p·e is 0.0098. The bound holds the exact shift, every sign of it.
  for (const float a : {1.0f, 8.0f, 12.0f}) {
    const WideBounds c = MakeWideBounds(a, 20.0f);
    CeReferenceOptions o;
    o.reduction = CeReduction::kNone;
    const Gathered g = Gather(Inputs(c.x, c.w, 1, 2, c.k), {1}, o, LogitModel::kFp32Sum);
    // Entry 1's bound is that of a sum of K products too (K − 1 of them 0).
    const long double e1 = Gamma(c.k, kFp32StepError) * c.b;
    const long double p0 = 1 / (1 + std::exp(static_cast<long double>(c.b)));
    const long double up =
        std::log(p0 * std::exp(static_cast<long double>(c.e0)) + (1 - p0) * std::exp(e1));
    const long double down =
        -std::log(p0 * std::exp(static_cast<long double>(-c.e0)) + (1 - p0) * std::exp(-e1));
    SCOPED_TRACE(::testing::Message() << "a " << a << " e0 " << c.e0);
    EXPECT_GE(g.ref.lse_bound[0], static_cast<double>(up));
    EXPECT_GE(g.ref.lse_bound[0], static_cast<double>(down));
    // And it is not much more: the propagation is exact, the rest is fp32
    // evaluation (a few 2^-21 of lse and of the shift).
    EXPECT_LT(g.ref.lse_bound[0], static_cast<double>(up) * (1 + 1e-5) + 1e-4);
    // The loss of target 1 (z = 20, bound ~0) moves with lse.
    EXPECT_GE(g.ref.loss_bound[0], static_cast<double>(up));
  }
}

}  // namespace
}  // namespace logitd

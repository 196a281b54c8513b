// The LogProbs reference (logitd/reference/logprobs.h): closed forms on
// small integer logits, top-k ties going to the lower id, the same bits
// whatever the block of rows, ignored tokens, a shorter vocabulary, and a
// random case against a plain long-double evaluation written here, every
// value of which must lie inside the reference's bounds.
#include "logitd/reference/logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "tests/reference/random_lm_head.h"

namespace logitd {
namespace {

using Random = RandomLmHead;

LmHeadInputs Inputs(const std::vector<Bf16Bits>& x, const std::vector<Bf16Bits>& w, std::int64_t m,
                    std::int64_t v, std::int64_t k) {
  return LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
}

// Logits given row by row: x_i = e_i (one-hot over M), w_j = the column j
// of the logits, so y = the given [M, V] integers exactly.
struct Given {
  std::vector<Bf16Bits> x, w;
  std::int64_t m, v;
  LmHeadInputs in() const { return Inputs(x, w, m, v, m); }
};

Given MakeGiven(const std::vector<std::vector<int>>& y) {
  Given g;
  g.m = static_cast<std::int64_t>(y.size());
  g.v = static_cast<std::int64_t>(y[0].size());
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t c = 0; c < g.m; ++c) g.x.push_back(FloatToBf16(i == c ? 1.0f : 0.0f));
  }
  for (std::int64_t j = 0; j < g.v; ++j) {
    for (std::int64_t c = 0; c < g.m; ++c) {
      g.w.push_back(FloatToBf16(static_cast<float>(y[static_cast<std::size_t>(c)][j])));
    }
  }
  return g;
}

// The reference with z gathered whole.
struct Gathered {
  LogProbsReference ref;
  std::vector<double> z;
  std::int64_t blocks = 0;
};

Gathered Gather(const LmHeadInputs& in, const std::vector<std::int64_t>& targets,
                const LpReferenceOptions& o, LogitModel logits, std::int64_t block_rows = 0) {
  Gathered out;
  EXPECT_TRUE(ReferenceLogProbs(
      in, targets.empty() ? nullptr : targets.data(), o, logits, &out.ref,
      [&](std::int64_t row0, std::int64_t rows, const double* z) {
        ++out.blocks;
        out.z.resize(static_cast<std::size_t>(in.m * out.ref.v));
        std::copy(z, z + rows * out.ref.v, out.z.begin() + row0 * out.ref.v);
      },
      {}, block_rows));
  return out;
}

TEST(LogProbsReferenceTest, ClosedFormsOnIntegerLogits) {
  // Temperature 2 halves the logits exactly: row 0's z are 0, 0.5, 1, 1.5.
  const Given g = MakeGiven({{0, 1, 2, 3}, {2, 2, 2, 2}});
  LpReferenceOptions o;
  o.temperature = 2.0f;
  o.top_k = 2;
  const Gathered r = Gather(g.in(), {1, 3}, o, LogitModel::kExact);
  EXPECT_TRUE(r.ref.exact);
  const double s0 = 1 + std::exp(0.5) + std::exp(1.0) + std::exp(1.5);
  const double lse0 = std::log(s0);
  EXPECT_NEAR(r.ref.lse[0], lse0, 1e-14);
  EXPECT_NEAR(r.ref.logprob[0], 0.5 - lse0, 1e-14);
  double h0 = 0;
  for (double z : {0.0, 0.5, 1.0, 1.5}) h0 -= std::exp(z - lse0) * (z - lse0);
  EXPECT_NEAR(r.ref.entropy[0], h0, 1e-14);
  // Row 1: uniform over 4, so lse = 1 + log 4, logprob = −log 4, H = log 4.
  EXPECT_NEAR(r.ref.lse[1], 1 + std::log(4.0), 1e-14);
  EXPECT_NEAR(r.ref.logprob[1], -std::log(4.0), 1e-14);
  EXPECT_NEAR(r.ref.entropy[1], std::log(4.0), 1e-14);
  // Exact z: B is 0, the bounds only the evaluation's.
  EXPECT_EQ(r.ref.z_bound[0], 0.0);
  for (double b : {r.ref.lse_bound[0], r.ref.logprob_bound[1], r.ref.entropy_bound[0]}) {
    EXPECT_GT(b, 0);
    EXPECT_LT(b, 1e-5);
  }
  EXPECT_EQ(r.z, (std::vector<double>{0, 0.5, 1, 1.5, 1, 1, 1, 1}));
  // The order and the ranks: row 0 by z, row 1 all tied, so by id.
  EXPECT_EQ(r.ref.order_cols, 3);
  EXPECT_EQ(r.ref.order, (std::vector<std::int64_t>{3, 2, 1, 0, 1, 2}));
  EXPECT_EQ(r.ref.order_z, (std::vector<double>{1.5, 1, 0.5, 1, 1, 1}));
  EXPECT_EQ(r.ref.rank, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(r.ref.rank_low, r.ref.rank);
  EXPECT_EQ(r.ref.rank_high, r.ref.rank);
  EXPECT_TRUE(TopKPlaceDecided(r.ref, 1, 1));
  EXPECT_NEAR(TopKLogProbBound(r.ref, 0, 1.5), r.ref.lse_bound[0], 4e-6);
}

TEST(LogProbsReferenceTest, TopKTiesGoToTheLowerId) {
  const Given g = MakeGiven({{1, 3, 3, 2, 3, 0, 3}});
  LpReferenceOptions o;
  o.top_k = 4;
  const Gathered r = Gather(g.in(), {4}, o, LogitModel::kExact);
  EXPECT_EQ(r.ref.order, (std::vector<std::int64_t>{1, 2, 4, 6, 3}));
  EXPECT_EQ(r.ref.rank[0], 2);  // ids 1 and 2 tie with 4 and come first
  // Not exact (a temperature that is no power of two): ties undecided.
  o.temperature = 0.75f;
  const Gathered t = Gather(g.in(), {4}, o, LogitModel::kExact);
  EXPECT_FALSE(t.ref.exact);
  EXPECT_EQ(t.ref.order, r.ref.order);
  EXPECT_EQ(t.ref.rank_low[0], 0);   // none surely above
  EXPECT_EQ(t.ref.rank_high[0], 3);  // 1, 2 and 6 possibly above
  EXPECT_FALSE(TopKPlaceDecided(t.ref, 0, 0));
}

TEST(LogProbsReferenceTest, IgnoredTokensNoTargetsAndAShorterVocabulary) {
  const Given g = MakeGiven({{5, 1, 2, 9}, {0, 4, 1, 1}, {3, 3, 0, 2}});
  LpReferenceOptions o;
  o.ignore_index = -1;
  o.vocab_size = 3;
  o.top_k = 5;  // more than the vocabulary: order_cols is 3
  const Gathered r = Gather(g.in(), {2, -1, 0}, o, LogitModel::kExact);
  EXPECT_EQ(r.ref.v, 3);
  EXPECT_EQ(r.ref.order_cols, 3);
  EXPECT_EQ(r.z.size(), 9u);
  EXPECT_EQ(r.ref.order[0], 0);  // the 9 past vocab_size does not count
  EXPECT_NEAR(r.ref.lse[0], std::log(std::exp(5.0) + std::exp(1.0) + std::exp(2.0)), 1e-14);
  EXPECT_EQ(r.ref.logprob[1], 0.0);
  EXPECT_EQ(r.ref.logprob_bound[1], 0.0);
  EXPECT_EQ(r.ref.rank[1], -1);
  EXPECT_EQ(r.ref.rank, (std::vector<std::int64_t>{1, -1, 0}));
  const Gathered none = Gather(g.in(), {}, o, LogitModel::kExact);
  EXPECT_EQ(none.ref.rank, (std::vector<std::int64_t>{-1, -1, -1}));
  EXPECT_EQ(none.ref.logprob, (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(none.ref.lse, r.ref.lse);
}

Random MakeRandom(std::int64_t m, std::int64_t v, std::int64_t k, std::uint64_t seed) {
  return MakeRandomLmHead(m, v, k, 3.0f / std::sqrt(static_cast<float>(k)), 5, 2, seed);
}

void ExpectSameBits(const Gathered& a, const Gathered& b) {
  EXPECT_EQ(a.ref.lse, b.ref.lse);
  EXPECT_EQ(a.ref.lse_bound, b.ref.lse_bound);
  EXPECT_EQ(a.ref.logprob, b.ref.logprob);
  EXPECT_EQ(a.ref.logprob_bound, b.ref.logprob_bound);
  EXPECT_EQ(a.ref.entropy, b.ref.entropy);
  EXPECT_EQ(a.ref.entropy_bound, b.ref.entropy_bound);
  EXPECT_EQ(a.ref.z_bound, b.ref.z_bound);
  EXPECT_EQ(a.ref.order, b.ref.order);
  EXPECT_EQ(a.ref.order_z, b.ref.order_z);
  EXPECT_EQ(a.ref.rank, b.ref.rank);
  EXPECT_EQ(a.ref.rank_low, b.ref.rank_low);
  EXPECT_EQ(a.ref.rank_high, b.ref.rank_high);
  EXPECT_EQ(a.z, b.z);
}

TEST(LogProbsReferenceTest, BlocksOfRowsGiveTheSameBits) {
  const Random d = MakeRandom(19, 257, 48, 13);
  const LmHeadInputs in = d.in();
  LpReferenceOptions o;
  o.temperature = 0.7f;
  o.logit_softcap = 30.0f;
  o.top_k = 8;
  o.vocab_size = 250;
  for (LogitModel logits : {LogitModel::kFp32Sum, LogitModel::kExact}) {
    const Gathered whole = Gather(in, d.targets, o, logits);
    ASSERT_EQ(whole.blocks, 1);
    for (std::int64_t rows : {1, 3, 4, 18, 19, 40}) {
      SCOPED_TRACE(rows);
      const Gathered blocked = Gather(in, d.targets, o, logits, rows);
      EXPECT_EQ(blocked.blocks, (d.m + rows - 1) / rows);
      ExpectSameBits(whole, blocked);
    }
  }
}

TEST(LogProbsReferenceTest, RandomCaseAgreesWithLongDouble) {
  const Random d = MakeRandom(15, 301, 64, 17);
  const LmHeadInputs in = d.in();
  LpReferenceOptions o;
  o.temperature = 0.7f;
  o.logit_softcap = 20.0f;
  o.top_k = 6;
  const Gathered r = Gather(in, d.targets, o, LogitModel::kFp32Sum);
  EXPECT_FALSE(r.ref.exact);
  const long double cap = o.logit_softcap, temperature = o.temperature;
  for (std::int64_t i = 0; i < d.m; ++i) {
    SCOPED_TRACE(i);
    const std::size_t s = static_cast<std::size_t>(i);
    std::vector<long double> z(static_cast<std::size_t>(d.v));
    for (std::int64_t j = 0; j < d.v; ++j) {
      long double y = 0;
      for (std::int64_t c = 0; c < d.k; ++c) {
        y += static_cast<long double>(Bf16ToFloat(d.x[static_cast<std::size_t>(i * d.k + c)])) *
             Bf16ToFloat(d.w[static_cast<std::size_t>(j * d.k + c)]);
      }
      z[static_cast<std::size_t>(j)] = cap * std::tanh(y / cap) / temperature;
    }
    long double sum = 0;
    for (long double zj : z) sum += std::exp(zj);
    const long double lse = std::log(sum);
    long double h = 0;
    for (long double zj : z) h -= std::exp(zj - lse) * (zj - lse);
    const auto close = [](double got, long double want, double bound, const char* what) {
      const long double err = std::fabs(static_cast<long double>(got) - want);
      EXPECT_LE(err, 1e-12L * (1 + std::fabs(want))) << what;
      EXPECT_LE(err, static_cast<long double>(bound)) << what;
    };
    close(r.ref.lse[s], lse, r.ref.lse_bound[s], "lse");
    close(r.ref.entropy[s], h, r.ref.entropy_bound[s], "entropy");
    for (std::int64_t j = 0; j < d.v; ++j) {
      close(r.z[s * static_cast<std::size_t>(d.v) + static_cast<std::size_t>(j)],
            z[static_cast<std::size_t>(j)], r.ref.z_bound[s], "z");
    }
    // The order by the long-double z, ties to the lower id.
    std::vector<std::int64_t> ids(static_cast<std::size_t>(d.v));
    for (std::int64_t j = 0; j < d.v; ++j) ids[static_cast<std::size_t>(j)] = j;
    std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) {
      return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)];
    });
    for (std::int64_t p = 0; p < r.ref.order_cols; ++p) {
      if (TopKPlaceDecided(r.ref, i, p)) {
        EXPECT_EQ(r.ref.order[s * 7 + static_cast<std::size_t>(p)],
                  ids[static_cast<std::size_t>(p)])
            << p;
      }
    }
    const std::int64_t t = d.targets[s];
    if (t == o.ignore_index) {
      EXPECT_EQ(r.ref.rank[s], -1);
      continue;
    }
    close(r.ref.logprob[s], z[static_cast<std::size_t>(t)] - lse, r.ref.logprob_bound[s],
          "logprob");
    const std::int64_t rank = std::find(ids.begin(), ids.end(), t) - ids.begin();
    EXPECT_EQ(r.ref.rank[s], rank);
    EXPECT_LE(r.ref.rank_low[s], rank);
    EXPECT_GE(r.ref.rank_high[s], rank);
  }
}

TEST(LogProbsReferenceTest, MemoryEstimate) {
  const std::uint64_t bytes = LogProbsReferenceBytes(128, 32003, 2047);
  EXPECT_GE(bytes, 128ull * 32003 * 3 * 8);
  EXPECT_EQ(LogProbsReferenceBytes(1 << 20, 32003, 2047), LogProbsReferenceBytes(262, 32003, 2047));
}

}  // namespace
}  // namespace logitd

namespace logitd {
namespace {

TEST(LogProbsReferenceTest, TheEntropyAndLseBoundsHoldForLargeLogitErrors) {
  // Entry 0 of 3 sums 4,096 products of ±a that cancel (z = 0, a proven
  // bound of about 2a); entries 1 and 2 are one product each (z = 1 and 0.5,
  // bounds near 0). The entropy of any z within the bounds, probed on a grid
  // of entry 0's value, stays inside the entropy bound, and lse inside its.
  const std::int64_t k = 4096, v = 3;
  for (const float a : {0.5f, 2.0f, 4.0f}) {
    std::vector<Bf16Bits> x(k, FloatToBf16(1.0f)), w;
    for (std::int64_t t = 0; t < k; ++t) w.push_back(FloatToBf16(t % 2 == 0 ? a : -a));
    for (const float b : {1.0f, 0.5f}) {
      for (std::int64_t t = 0; t < k; ++t) w.push_back(FloatToBf16(t == 0 ? b : 0.0f));
    }
    const double e0 = Gamma(k, kFp32StepError) * static_cast<double>(k) * a;
    LpReferenceOptions o;
    o.vocab_size = v;
    const LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), 1, v, k);
    const Gathered g = Gather(in, {}, o, LogitModel::kFp32Sum);
    const auto entropy_and_lse = [](long double z0) {
      const long double z[3] = {z0, 1.0L, 0.5L};
      long double s = 0;
      for (long double zj : z) s += std::exp(zj);
      const long double lse = std::log(s);
      long double h = 0;
      for (long double zj : z) h += std::exp(zj - lse) * (lse - zj);
      return std::pair<long double, long double>{h, lse};
    };
    const auto [h0, lse0] = entropy_and_lse(0);
    SCOPED_TRACE(::testing::Message() << "a " << a << " e0 " << e0);
    for (int step = -20; step <= 20; ++step) {
      const auto [h, lse] = entropy_and_lse(e0 * step / 20.0L);
      EXPECT_GE(g.ref.entropy_bound[0], static_cast<double>(std::fabs(h - h0))) << step;
      EXPECT_GE(g.ref.lse_bound[0], static_cast<double>(std::fabs(lse - lse0))) << step;
    }
  }
}

}  // namespace
}  // namespace logitd

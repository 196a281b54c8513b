// LogProbs on the cuda backend, against an fp64 reference on fresh inputs:
// exact on integer operands (exact logits, many ties: the tie rule is
// tested), within the logits' gamma_K bound on random ones; bitwise
// CrossEntropy's lse and -loss; chunk-independent; and equal to the cpu
// backend wherever the logits are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"

namespace logitd::kernels::testing {
namespace {

// A LogProbs call's outputs, every one asked for.
struct Result {
  std::vector<float> logprob, lse, entropy, topk_logprobs;
  std::vector<std::int32_t> topk_ids;
  std::vector<std::int64_t> rank;
};

struct Call {
  std::int64_t m = 0;
  const std::vector<Bf16Bits>* x = nullptr;
  const std::vector<std::int64_t>* targets = nullptr;
  std::int64_t vocab = 0;
  std::int64_t top_k = 0;
  float temperature = 1.0f;
  float cap = 0.0f;
  std::int64_t chunk = 0;
};

absl::Status CallLogProbs(Backend& backend, const Weight& w, const Call& call, Result* r) {
  const auto m = static_cast<std::size_t>(call.m);
  const auto mk = m * static_cast<std::size_t>(call.top_k);
  // Sentinels: an output left unwritten shows.
  r->logprob.assign(m, -7.0f);
  r->lse.assign(m, -7.0f);
  r->entropy.assign(m, -7.0f);
  r->rank.assign(m, -7);
  r->topk_ids.assign(mk, -7);
  r->topk_logprobs.assign(mk, -7.0f);
  LogProbsArgs args;
  args.weight = &w;
  args.x = call.x->data();
  args.m = call.m;
  args.targets = call.targets != nullptr ? call.targets->data() : nullptr;
  args.temperature = call.temperature;
  args.logit_softcap = call.cap;
  args.vocab = call.vocab;
  args.top_k = call.top_k;
  args.vocab_chunk = call.chunk;
  args.lse = r->lse.data();
  args.entropy = r->entropy.data();
  if (args.targets != nullptr) {
    args.logprob = r->logprob.data();
    args.rank = r->rank.data();
  }
  args.topk_ids = r->topk_ids.data();
  args.topk_logprobs = r->topk_logprobs.data();
  return backend.Kernel(args, nullptr);
}

// The fp64 reference of one row from its z (already capped and scaled).
struct RowRef {
  double lse = 0, entropy = 0;
  std::vector<std::int64_t> order;  // ids, best first (ties by lower id)
};

RowRef RowReference(const std::vector<double>& z) {
  RowRef r;
  const double mx = *std::max_element(z.begin(), z.end());
  double s = 0, zs = 0;
  for (double v : z) {
    const double e = std::exp(v - mx);
    s += e;
    zs += e * (v - mx);
  }
  r.lse = mx + std::log(s);
  r.entropy = std::log(s) - zs / s;
  r.order.resize(z.size());
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [&](std::int64_t a, std::int64_t b) { return z[a] > z[b]; });
  return r;
}

std::vector<std::int64_t> Targets(std::int64_t m, std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, vocab - 1);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (auto& v : t) v = dist(rng);
  t[1] = -100;  // one ignored
  return t;
}

using LogProbsTest = CudaFixture;

// Integer operands: the logits are exact, so lse, logprob and entropy are
// the fp64 reference's within the final roundings and the fp64 sums' error,
// and the top-k ids and ranks are exact, ties (there are many) by lower id.
TEST_F(LogProbsTest, ExactOnIntegersWithTiesAcrossChunks) {
  const std::int64_t m = 37, v = 5000, k = 64;
  const auto x = IntegerBf16(m * k, 11);
  const auto wb = IntegerBf16(v * k, 12);
  const auto targets = Targets(m, v, 13);
  auto w = backend()->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(w.ok()) << w.status();
  const Reference y = LogitsReference(Widen(x), Widen(wb), m, v, k);
  // top_k 5 is picked by rounds of a block max, 64 by a sort of each segment.
  for (std::int64_t top_k : {5, 64}) {
    Result first;
    for (std::int64_t chunk : {0, 1024, 3072}) {
      Call call{m, &x, &targets, v, top_k, 1.0f, 0.0f, chunk};
      Result r;
      ASSERT_TRUE(CallLogProbs(*backend(), **w, call, &r).ok());
      for (std::int64_t i = 0; i < m; ++i) {
        std::vector<double> z(y.value.begin() + i * v, y.value.begin() + (i + 1) * v);
        const RowRef ref = RowReference(z);
        const auto row = static_cast<std::size_t>(i);
        EXPECT_NEAR(r.lse[row], ref.lse, 4e-7 * std::fabs(ref.lse) + 1e-6) << "row " << i;
        EXPECT_NEAR(r.entropy[row], ref.entropy, 1e-6 * ref.entropy + 1e-6) << "row " << i;
        const std::int64_t t = targets[row];
        if (t == -100) {
          EXPECT_EQ(r.logprob[row], 0.0f);
          EXPECT_EQ(r.rank[row], -1);
        } else {
          EXPECT_NEAR(r.logprob[row], z[t] - ref.lse, 4e-7 * std::fabs(z[t] - ref.lse) + 1e-6);
          const auto at = std::find(ref.order.begin(), ref.order.end(), t) - ref.order.begin();
          EXPECT_EQ(r.rank[row], at) << "row " << i;
        }
        for (std::int64_t j = 0; j < top_k; ++j) {
          const auto o = static_cast<std::size_t>(i * top_k + j);
          ASSERT_EQ(r.topk_ids[o], ref.order[static_cast<std::size_t>(j)])
              << "row " << i << " place " << j << " chunk " << chunk;
          const double lp = z[ref.order[j]] - ref.lse;
          EXPECT_NEAR(r.topk_logprobs[o], lp, 4e-7 * std::fabs(lp) + 1e-6);
        }
      }
      // Exact logits: every chunk gives the same bits.
      if (chunk == 0) {
        first = r;
      } else {
        EXPECT_EQ(r.lse, first.lse) << "chunk " << chunk;
        EXPECT_EQ(r.logprob, first.logprob) << "chunk " << chunk;
        EXPECT_EQ(std::memcmp(r.entropy.data(), first.entropy.data(), r.entropy.size() * 4), 0)
            << "chunk " << chunk;
        EXPECT_EQ(r.topk_ids, first.topk_ids) << "chunk " << chunk;
      }
    }
  }
}

// A chunk of 70 segments: the top-k lists are merged over two levels.
TEST_F(LogProbsTest, TopKOverManySegmentsAndFewRows) {
  const std::int64_t m = 5, v = 70000, k = 32;
  const auto x = IntegerBf16(m * k, 21);
  const auto wb = IntegerBf16(v * k, 22);
  auto w = backend()->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(w.ok()) << w.status();
  const Reference y = LogitsReference(Widen(x), Widen(wb), m, v, k);
  for (std::int64_t top_k : {1, 7, 64}) {
    Call call{m, &x, nullptr, v, top_k, 1.0f, 0.0f, 0};
    Result r;
    ASSERT_TRUE(CallLogProbs(*backend(), **w, call, &r).ok());
    for (std::int64_t i = 0; i < m; ++i) {
      std::vector<double> z(y.value.begin() + i * v, y.value.begin() + (i + 1) * v);
      const RowRef ref = RowReference(z);
      for (std::int64_t j = 0; j < top_k; ++j) {
        ASSERT_EQ(r.topk_ids[static_cast<std::size_t>(i * top_k + j)], ref.order[j])
            << "top_k " << top_k << " row " << i << " place " << j;
      }
    }
    EXPECT_EQ(r.logprob[0], -7.0f) << "logprob is not asked for without targets";
  }
}

// With temperature 1, no cap and the whole vocabulary, lse and logprob are
// CrossEntropy's lse and -loss, bit for bit (the same chunk, GEMMs and fold).
TEST_F(LogProbsTest, BitwiseCrossEntropyOnRandomInputs) {
  const std::int64_t m = 96, v = 40000, k = 512;
  const auto x = RandomBf16(m * k, 31);
  const auto wb = RandomBf16(v * k, 32);
  const auto targets = Targets(m, v, 33);
  auto w = backend()->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(w.ok()) << w.status();
  for (std::int64_t chunk : {0, 8192}) {
    Call call{m, &x, &targets, v, 5, 1.0f, 0.0f, chunk};
    Result r;
    ASSERT_TRUE(CallLogProbs(*backend(), **w, call, &r).ok());
    std::vector<float> loss(static_cast<std::size_t>(m), -7.0f), lse(loss.size(), -7.0f);
    CrossEntropyArgs ce;
    ce.weight = w->get();
    ce.x = x.data();
    ce.m = m;
    ce.targets = targets.data();
    ce.loss = loss.data();
    ce.lse = lse.data();
    ce.vocab_chunk = chunk;
    ASSERT_TRUE(backend()->Kernel(ce, nullptr).ok());
    for (std::size_t i = 0; i < loss.size(); ++i) {
      EXPECT_EQ(FloatBits(r.lse[i]), FloatBits(lse[i])) << "row " << i << " chunk " << chunk;
      if (targets[i] == -100) {
        // An ignored token: loss 0 and logprob 0 (not -0).
        EXPECT_EQ(FloatBits(r.logprob[i]), 0u) << "row " << i;
        continue;
      }
      EXPECT_EQ(FloatBits(r.logprob[i]), FloatBits(-loss[i])) << "row " << i << " chunk " << chunk;
    }
  }
}

// Random operands, temperature, soft-capping and a masked vocabulary tail:
// within the bound the logits' gamma_K error gives each result. With B the
// largest error of a row's z (gamma_K sum|x||w| through the cap, which is
// 1-Lipschitz, over T, plus a few ulp for tanh and the division): |lse err|
// <= B, |logprob err| <= 2B, |entropy err| <= 2 H B to first order (dH/dz_j
// = -p_j (log p_j + H)), each plus the final rounding.
TEST_F(LogProbsTest, WithinBoundsWithTemperatureCapAndMask) {
  const std::int64_t m = 41, v = 9000, k = 1536, vocab = 8500, top_k = 8;
  const float temperature = 0.7f, cap = 3.0f;
  const auto x = RandomBf16(m * k, 41);
  const auto wb = RandomBf16(v * k, 42);
  const auto targets = Targets(m, vocab, 43);
  auto w = backend()->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(w.ok()) << w.status();
  const Reference y = LogitsReference(Widen(x), Widen(wb), m, v, k);
  Call call{m, &x, &targets, vocab, top_k, temperature, cap, 0};
  Result r;
  ASSERT_TRUE(CallLogProbs(*backend(), **w, call, &r).ok());
  for (std::int64_t i = 0; i < m; ++i) {
    std::vector<double> z(static_cast<std::size_t>(vocab));
    double b = 0;
    for (std::int64_t j = 0; j < vocab; ++j) {
      const auto at = static_cast<std::size_t>(i * v + j);
      z[j] = cap * std::tanh(y.value[at] / cap) / temperature;
      b = std::max(b, Gamma(k) * y.abs_sum[at] / temperature + 8 * kFp32Unit * std::fabs(z[j]));
    }
    const RowRef ref = RowReference(z);
    const auto row = static_cast<std::size_t>(i);
    const double ulp = kFp32Unit * 4;
    EXPECT_LE(std::fabs(r.lse[row] - ref.lse), b + ulp * std::fabs(ref.lse)) << "row " << i;
    EXPECT_LE(std::fabs(r.entropy[row] - ref.entropy), 2 * ref.entropy * b * 1.01 + 1e-6)
        << "row " << i;
    const std::int64_t t = targets[row];
    if (t != -100) {
      const double lp = z[t] - ref.lse;
      EXPECT_LE(std::fabs(r.logprob[row] - lp), 2 * b + ulp * std::fabs(lp)) << "row " << i;
      // The rank is exact up to entries within 2B of the target.
      std::int64_t surely_above = 0, maybe_above = 0;
      for (std::int64_t j = 0; j < vocab; ++j) {
        if (j == t) continue;
        surely_above += z[j] > z[t] + 2 * b ? 1 : 0;
        maybe_above += z[j] >= z[t] - 2 * b ? 1 : 0;
      }
      EXPECT_GE(r.rank[row], surely_above) << "row " << i;
      EXPECT_LE(r.rank[row], maybe_above) << "row " << i;
    }
    for (std::int64_t j = 0; j < top_k; ++j) {
      const auto o = static_cast<std::size_t>(i * top_k + j);
      const std::int32_t id = r.topk_ids[o];
      ASSERT_TRUE(id >= 0 && id < vocab) << "row " << i << ": id " << id << " outside the vocab";
      // Separated from both neighbours by more than 2B: the id is certain.
      const double zj = z[ref.order[j]];
      const bool apart =
          (j == 0 || z[ref.order[j - 1]] - zj > 2 * b) && zj - z[ref.order[j + 1]] > 2 * b;
      if (apart) {
        EXPECT_EQ(id, ref.order[j]) << "row " << i << " place " << j;
      }
      EXPECT_LE(std::fabs(r.topk_logprobs[o] - (z[id] - ref.lse)), 2 * b + 1e-6);
    }
  }
}

using LogProbsCudaVsCpu = CudaAndCpuTest;

TEST_F(LogProbsCudaVsCpu, AgreeOnIntegers) {
  const std::int64_t m = 19, v = 3001, k = 128, top_k = 10;
  const auto x = IntegerBf16(m * k, 51);
  const auto wb = IntegerBf16(v * k, 52);
  const auto targets = Targets(m, v, 53);
  auto wg = cuda_->LoadWeight(wb.data(), v, k);
  auto wc = cpu_->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(wg.ok() && wc.ok());
  Call call{m, &x, &targets, v, top_k, 1.0f, 0.0f, 0};
  Result rg, rc;
  ASSERT_TRUE(CallLogProbs(*cuda_, **wg, call, &rg).ok());
  ASSERT_TRUE(CallLogProbs(*cpu_, **wc, call, &rc).ok());
  EXPECT_EQ(rg.topk_ids, rc.topk_ids);
  EXPECT_EQ(rg.rank, rc.rank);
  for (std::size_t i = 0; i < rg.lse.size(); ++i) {
    EXPECT_NEAR(rg.lse[i], rc.lse[i], 4 * kFp32Unit * std::fabs(rc.lse[i])) << i;
    EXPECT_NEAR(rg.logprob[i], rc.logprob[i], 4 * kFp32Unit * std::fabs(rc.lse[i]) + 1e-7) << i;
    EXPECT_NEAR(rg.entropy[i], rc.entropy[i], 1e-6 * rc.entropy[i] + 1e-6) << i;
  }
}

TEST_F(LogProbsTest, RejectsBadArgumentsWithoutTouchingTheDevice) {
  const std::int64_t v = 2048, k = 64;
  const auto wb = IntegerBf16(v * k, 61);
  auto w = backend()->LoadWeight(wb.data(), v, k);
  ASSERT_TRUE(w.ok());
  const auto x = IntegerBf16(4 * k, 62);
  Call call{4, &x, nullptr, v, 65, 1.0f, 0.0f, 0};
  Result r;
  absl::Status s = CallLogProbs(*backend(), **w, call, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  call.top_k = 4;
  call.vocab = v + 1;
  s = CallLogProbs(*backend(), **w, call, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(backend()->Health().ok());
}

}  // namespace
}  // namespace logitd::kernels::testing

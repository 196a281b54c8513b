// The service's row blocks cut a LogProbs or CrossEntropy call at multiples
// of the backend's LogProbsBlockRows / CrossEntropyBlockRows, the last block
// taking the rest (BlockRowsAt). These checks run a call whole and cut, on
// any backend, and require every output's bits to match. Header-only; the
// including test links GoogleTest and the backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/tensor.h"
#include "server/kernels/backend.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"

namespace logitd::testing {

// What a cut check is run on: a weight of v rows and k columns (normal
// samples rounded to bf16, from `seed`), calls of each of `ms` rows, and the
// most rows the backend may answer for a block (its block size).
struct CutCase {
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::vector<std::int64_t> ms;
  std::int64_t block_rows = 0;
  std::uint32_t seed = 1;
};

namespace cut_detail {

inline std::vector<Bf16Bits> Normal(std::int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (Bf16Bits& e : out) e = FloatToBf16(normal(rng));
  return out;
}

// Targets in [0, v), every `ignore_every`-th (from `ignore_at`) ignored.
inline std::vector<std::int64_t> Targets(std::int64_t m, std::int64_t v, std::int64_t ignore_every,
                                         std::int64_t ignore_at, std::mt19937& rng) {
  std::uniform_int_distribution<std::int64_t> token(0, v - 1);
  std::vector<std::int64_t> out(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) {
    out[static_cast<std::size_t>(i)] = i % ignore_every == ignore_at ? -100 : token(rng);
  }
  return out;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs `block(r0, rows)` over the cut of m rows at `rows`; returns the
// number of blocks.
template <typename Block>
std::int64_t ForEachBlock(std::int64_t m, std::int64_t rows, Block block) {
  std::int64_t blocks = 0;
  for (std::int64_t r0 = 0; r0 < m; ++blocks) {
    const std::int64_t mb = kernels::BlockRowsAt(m, r0, rows);
    block(r0, mb);
    r0 += mb;
  }
  return blocks;
}

}  // namespace cut_detail

// Logits (alpha 0.75, fp32 and bf16 out): the cut call's bits are the whole
// call's. `check_rows(m, out, rows)` judges the backend's LogitsBlockRows.
template <typename CheckRows>
void ExpectLogitsCutIsTheWholeCall(kernels::Backend& backend, const CutCase& c,
                                   CheckRows check_rows) {
  std::mt19937 rng(c.seed);
  const std::vector<Bf16Bits> w = cut_detail::Normal(c.v * c.k, rng);
  auto loaded = backend.LoadWeight(w.data(), c.v, c.k);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  kernels::Weight& weight = **loaded;
  for (const DType out : {DType::kFp32, DType::kBf16}) {
    for (const std::int64_t m : c.ms) {
      SCOPED_TRACE(::testing::Message() << "M=" << m << " " << DTypeName(out));
      const std::vector<Bf16Bits> x = cut_detail::Normal(m * c.k, rng);
      const std::size_t row = static_cast<std::size_t>(c.v) * ElementSize(out);
      std::vector<std::byte> whole(static_cast<std::size_t>(m) * row);
      std::vector<std::byte> cut(whole.size(), std::byte{0xff});
      kernels::LogitsArgs args;
      args.x = x.data();
      args.m = m;
      args.out_dtype = out;
      args.alpha = 0.75f;
      args.y = whole.data();
      ASSERT_TRUE(backend.Logits(weight, args, nullptr).ok());
      const std::int64_t rows = backend.LogitsBlockRows(weight, m, out);
      ASSERT_GE(rows, 1);
      check_rows(m, out, rows);
      cut_detail::ForEachBlock(m, rows, [&](std::int64_t r0, std::int64_t mb) {
        args.x = x.data() + r0 * c.k;
        args.m = mb;
        args.y = cut.data() + static_cast<std::size_t>(r0) * row;
        EXPECT_TRUE(backend.Logits(weight, args, nullptr).ok()) << "rows from " << r0;
      });
      EXPECT_TRUE(cut_detail::SameBits(whole, cut));
    }
  }
}

// LogProbs with every output (top-k, rank, entropy), soft-cap off and on, a
// temperature: the cut call's bits are the whole call's. At temperature 1,
// lse and logprob are bitwise the loss-only CrossEntropy's lse and -loss
// (its first pass walks the same blocks).
inline void ExpectLogProbsCutIsTheWholeCall(kernels::Backend& backend, const CutCase& c) {
  const std::int64_t v = c.v, k = c.k, top_k = 3;
  std::mt19937 rng(c.seed);
  const std::vector<Bf16Bits> w = cut_detail::Normal(v * k, rng);
  auto loaded = backend.LoadWeight(w.data(), v, k);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  kernels::Weight& weight = **loaded;
  struct Outputs {
    std::vector<float> logprob, lse, entropy, topk_logprobs;
    std::vector<std::int32_t> topk_ids;
    std::vector<std::int64_t> rank;
    Outputs(std::int64_t m, std::int64_t top_k)
        : logprob(static_cast<std::size_t>(m), -1.0f),
          lse(logprob),
          entropy(logprob),
          topk_logprobs(static_cast<std::size_t>(m * top_k), -1.0f),
          topk_ids(static_cast<std::size_t>(m * top_k), -1),
          rank(static_cast<std::size_t>(m), -2) {}
    bool operator==(const Outputs& o) const {
      using cut_detail::SameBits;
      return SameBits(logprob, o.logprob) && SameBits(lse, o.lse) && SameBits(entropy, o.entropy) &&
             SameBits(topk_logprobs, o.topk_logprobs) && SameBits(topk_ids, o.topk_ids) &&
             SameBits(rank, o.rank);
    }
  };
  for (const float cap : {0.0f, 30.0f}) {
    for (const std::int64_t m : c.ms) {
      SCOPED_TRACE(::testing::Message() << "LogProbs M=" << m << " softcap=" << cap);
      const std::vector<Bf16Bits> x = cut_detail::Normal(m * k, rng);
      const std::vector<std::int64_t> targets = cut_detail::Targets(m, v, 11, 5, rng);
      const auto args_into = [&](Outputs* o, float temperature) {
        kernels::LogProbsArgs a;
        a.weight = &weight;
        a.x = x.data();
        a.m = m;
        a.targets = targets.data();
        a.temperature = temperature;
        a.logit_softcap = cap;
        a.vocab = v;
        a.logprob = o->logprob.data();
        a.lse = o->lse.data();
        a.entropy = o->entropy.data();
        a.top_k = top_k;
        a.topk_ids = o->topk_ids.data();
        a.topk_logprobs = o->topk_logprobs.data();
        a.rank = o->rank.data();
        return a;
      };
      Outputs whole(m, top_k), cut(m, top_k);
      const absl::Status all = backend.Kernel(args_into(&whole, 0.7f), nullptr);
      ASSERT_TRUE(all.ok()) << all;
      const std::int64_t rows = backend.LogProbsBlockRows(weight, m);
      EXPECT_EQ(rows, std::min(m, c.block_rows));
      const kernels::LogProbsArgs into_cut = args_into(&cut, 0.7f);
      const std::int64_t blocks =
          cut_detail::ForEachBlock(m, rows, [&](std::int64_t r0, std::int64_t mb) {
            const absl::Status s =
                backend.Kernel(kernels::LogProbsRowsOf(into_cut, k, r0, mb), nullptr);
            EXPECT_TRUE(s.ok()) << s;
          });
      if (m >= 2 * c.block_rows) {
        EXPECT_GT(blocks, 1) << "a call of " << m << " rows was not cut";
      }
      EXPECT_TRUE(whole == cut) << "a cut call's outputs differ from the whole call's";

      Outputs plain(m, top_k);
      const absl::Status at_one = backend.Kernel(args_into(&plain, 1.0f), nullptr);
      ASSERT_TRUE(at_one.ok()) << at_one;
      std::vector<float> loss(static_cast<std::size_t>(m)), lse(loss.size());
      kernels::CrossEntropyArgs ce;
      ce.weight = &weight;
      ce.x = x.data();
      ce.m = m;
      ce.targets = targets.data();
      ce.logit_softcap = cap;
      ce.loss = loss.data();
      ce.lse = lse.data();
      const absl::Status ce_done = backend.Kernel(ce, nullptr);
      ASSERT_TRUE(ce_done.ok()) << ce_done;
      for (std::int64_t i = 0; i < m; ++i) {
        const auto u = static_cast<std::size_t>(i);
        ASSERT_EQ(FloatBits(lse[u]), FloatBits(plain.lse[u])) << "lse, row " << i;
        if (targets[u] == -100) continue;  // loss and logprob both 0
        ASSERT_EQ(FloatBits(-loss[u]), FloatBits(plain.logprob[u])) << "loss, row " << i;
      }
    }
  }
}

// CrossEntropy without dW: loss, lse and dX (fp32 and bf16) with z-loss,
// soft-cap, ignored tokens and a mean's scale keep the whole call's bits.
inline void ExpectCrossEntropyCutIsTheWholeCall(kernels::Backend& backend, const CutCase& c) {
  const std::int64_t v = c.v, k = c.k;
  std::mt19937 rng(c.seed);
  const std::vector<Bf16Bits> w = cut_detail::Normal(v * k, rng);
  auto loaded = backend.LoadWeight(w.data(), v, k);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  kernels::Weight& weight = **loaded;
  for (const DType dx_dtype : {DType::kFp32, DType::kBf16}) {
    for (const std::int64_t m : c.ms) {
      SCOPED_TRACE(::testing::Message() << "CrossEntropy M=" << m << " dX " << DTypeName(dx_dtype));
      const std::vector<Bf16Bits> x = cut_detail::Normal(m * k, rng);
      const std::vector<std::int64_t> targets = cut_detail::Targets(m, v, 13, 4, rng);
      const std::size_t dx_row = static_cast<std::size_t>(k) * ElementSize(dx_dtype);
      struct Outputs {
        std::vector<float> loss, lse;
        std::vector<std::byte> dx;
      };
      const auto outputs = [&] {
        return Outputs{std::vector<float>(static_cast<std::size_t>(m), -1.0f),
                       std::vector<float>(static_cast<std::size_t>(m), -1.0f),
                       std::vector<std::byte>(static_cast<std::size_t>(m) * dx_row, std::byte{7})};
      };
      Outputs whole = outputs(), cut = outputs();
      kernels::CrossEntropyArgs args;
      args.weight = &weight;
      args.x = x.data();
      args.m = m;
      args.targets = targets.data();
      args.z_loss = 1e-3f;
      args.logit_softcap = 20.0f;
      args.grad_scale = 1.0f / 613.0f;
      args.dx_dtype = dx_dtype;
      args.loss = whole.loss.data();
      args.lse = whole.lse.data();
      args.dx = whole.dx.data();
      const absl::Status all = backend.Kernel(args, nullptr);
      ASSERT_TRUE(all.ok()) << all;
      const std::int64_t rows = backend.CrossEntropyBlockRows(weight, m);
      EXPECT_EQ(rows, std::min(m, c.block_rows));
      args.loss = cut.loss.data();
      args.lse = cut.lse.data();
      args.dx = cut.dx.data();
      const std::int64_t blocks =
          cut_detail::ForEachBlock(m, rows, [&](std::int64_t r0, std::int64_t mb) {
            const absl::Status s =
                backend.Kernel(kernels::CrossEntropyRowsOf(args, k, r0, mb), nullptr);
            EXPECT_TRUE(s.ok()) << s;
          });
      if (m >= 2 * c.block_rows) {
        EXPECT_GT(blocks, 1) << "a call of " << m << " rows was not cut";
      }
      EXPECT_TRUE(cut_detail::SameBits(whole.loss, cut.loss)) << "loss differs";
      EXPECT_TRUE(cut_detail::SameBits(whole.lse, cut.lse)) << "lse differs";
      EXPECT_TRUE(cut_detail::SameBits(whole.dx, cut.dx)) << "dX differs";
    }
  }
}

}  // namespace logitd::testing

// The cpu backend's row statistics for the fused cross-entropy and LogProbs:
// the chunking of the vocabulary, the tiles of the log-sum-exp, the losses,
// G for a chunk, and LogProbs' entropy and top-k. What they compute, and why
// in this order, is said below; cpu_backend.cc walks the vocabulary with them.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "server/kernels/backend.h"
#include "server/kernels/ops/cross_entropy.h"

namespace logitd::kernels::cpu {

// --- Fused cross-entropy -----------------------------------------------------
//
// Numerics, and why:
// - Logits come from the same sgemm call as Logits (alpha 1, beta 0, X by
//   Wᵀ) applied to a block of W's rows. With one chunk it is the very call
//   Logits makes, so the logits (and, with Backward's dX and dW calls, the
//   gradients) equal Logits + Backward bitwise. With several chunks the
//   narrower products may be split differently among OpenBLAS's threads, and
//   elements where a split falls can differ in the last bit; integer-valued
//   logits are exact either way.
// - Soft-capping, exp and the per-tile sums are fp32, as a GPU computes them:
//   t = tanh(y / cap), z = cap * t; e = exp(z - tile max).
// - The log-sum-exp is taken over fixed tiles of kCeTile vocabulary entries
//   aligned at 0, not over chunks: a tile's (max, sum of exp(z - max)) uses a
//   fixed pairwise tree (a warp reduction's order), and tiles are folded into
//   the row's running (max, sum) in vocabulary order with the sum in fp64.
//   Chunks are whole numbers of tiles, so for the same logits lse and loss do
//   not depend on the chunk size (which depends on M); the fp64 fold
//   keeps V/kCeTile rescalings from adding fp32 roundings. What is left is
//   the tree's log2(kCeTile) = 6 roundings, exp's own error (under an ulp)
//   and the rounding of z - max (relative u |z - max| for that term), so the
//   sum is within about (8 + mean |z - max|) u of the exact sum over the fp32
//   logits, and lse = max + log(sum) in fp64 is rounded to fp32 once. Summing
//   all of V sequentially in fp32 would instead allow up to V u (0.8% at
//   V = 128k).
// - loss = lse - z_t + z_loss * lse^2 is formed in fp64 from the unrounded lse
//   and rounded once.
// - The backward pass recomputes each chunk's logits and forms, in fp32 and in
//   this order, d = exp(z - lse) * c - onehot with c = 1 + (2 z_loss) lse
//   (lse the fp32 value returned), d *= (1 - t)(1 + t) under soft-capping
//   (that is 1 - (z/cap)^2 without the cancellation of 1 - t*t), d *= scale,
//   then G = bf16(d) by RNE once. A client can rebuild G from the Logits output
//   and the returned lse with these operations.
// - Non-finite logits follow torch.logsumexp: a NaN gives NaN, a +Inf gives
//   lse = +Inf, a row of -Inf gives -Inf.

// Vocabulary entries per tile of the log-sum-exp; chunks are multiples of it.
inline constexpr std::int64_t kCeTile = 64;

// Bytes of one chunk's fp32 logits [m, chunk] when the caller leaves the
// chunk to the backend: large enough for sgemm to run at full speed, small
// next to the [M, V] tensor the fused path exists to avoid.
inline constexpr std::int64_t kCeChunkBytes = std::int64_t{64} << 20;

// Vocabulary rows per chunk: `requested` (> 0) rounded up to whole tiles, or
// about kCeChunkBytes of logits; never more than v.
std::int64_t CeChunkRows(std::int64_t requested, std::int64_t m, std::int64_t v);

// One tile of capped logits (n <= kCeTile): its max (NaN if any is NaN) and
// the sum of exp(z - max) when the max is finite (0 otherwise; the max alone
// then decides the row's lse).
void CeTileMaxSum(const float* z, std::int64_t n, float* tile_max, float* tile_sum);

// A row's running log-sum-exp: sum of exp(z - max) over the tiles so far.
struct CeRow {
  float max = -std::numeric_limits<float>::infinity();
  double sum = 0.0;

  void Fold(float tile_max, float tile_sum) {
    if (std::isnan(max)) return;
    if (std::isnan(tile_max)) {
      max = tile_max;
    } else if (tile_max > max) {
      sum = (std::isfinite(max) ? sum * std::exp(static_cast<double>(max) - tile_max) : 0.0) +
            tile_sum;
      max = tile_max;
    } else if (std::isfinite(tile_max) && std::isfinite(max)) {
      sum += tile_sum * std::exp(static_cast<double>(tile_max) - max);
    }
  }

  double Lse() const {
    if (!std::isfinite(max)) return max;  // NaN, +Inf, or -Inf for a row of -Inf
    return static_cast<double>(max) + std::log(sum);
  }
};

// z = cap * tanh(y / cap) in place; the identity when cap is 0.
void CeSoftcap(float cap, float* y, std::int64_t n);

// The per-token losses into args.loss (and lse into args.lse when asked),
// from each row's log-sum-exp and its target's logit; returns lse in fp32.
std::vector<float> CeLosses(const CrossEntropyArgs& args, const std::vector<CeRow>& rows,
                            const std::vector<float>& z_target);

// G for one chunk of the vocabulary [v0, v0 + c), in place over its fp32
// logits g [m, c]: per counted token, d = exp(z - lse) * (1 + 2 z_loss lse) -
// onehot, times dz/dy under soft-capping, times grad_scale, rounded to bf16
// once (zeros for an ignored token), in that order (see the contract above).
void CeGradChunk(const CrossEntropyArgs& args, const std::vector<float>& lse, std::int64_t v0,
                 std::int64_t c, float* g);

// LogProbs (see logitd.v1.LogProbsHeader), on top of the cross-entropy's
// log-sum-exp (the same tiles, folded in the same order, so that lse and
// logprob = z_t - lse are bitwise CrossEntropy's lse and -loss when the
// temperature is 1 and nothing is capped or masked). Besides:
// - the entropy H = log(S) - Z/S with S = sum exp(z - max) (the lse's sum)
//   and Z = sum exp(z - max) (z - max), both in fp64 and rescaled together
//   when the running max moves; each term is <= 0 and the two are formed
//   from the same exponentials, so H >= 0 up to rounding and H is exact to
//   a few ulp of log(S) plus the fp64 sums' error, far below the fp32
//   logits' own bound;
// - top-k with a heap of k per row over the whole vocabulary, ordered by z
//   (NaN above everything, as torch.topk), ties by the lower id; its
//   log-probs z - lse in fp64 rounded once;
// - the target's rank, counted in a second pass once z_t is known.

// Whether (za, a) ranks before (zb, b).
bool LpBefore(float za, std::int64_t a, float zb, std::int64_t b);

// sum exp(z - tile_max) (z - tile_max) over one tile, in fp64.
double LpTileZSum(const float* z, std::int64_t n, float tile_max);

// A row of LogProbs: the cross-entropy's running lse plus the entropy's Z.
struct LpRow {
  CeRow lse;
  double zsum = 0.0;

  void Fold(float tile_max, float tile_sum, double tile_zsum) {
    const float m = lse.max;
    if (!std::isnan(m) && !std::isnan(tile_max)) {
      if (tile_max > m) {
        const double scale = std::isfinite(m) ? std::exp(static_cast<double>(m) - tile_max) : 0.0;
        zsum = std::isfinite(m)
                   ? scale * (zsum + (static_cast<double>(m) - tile_max) * lse.sum) + tile_zsum
                   : tile_zsum;
      } else if (std::isfinite(tile_max) && std::isfinite(m)) {
        const double d = static_cast<double>(tile_max) - m;
        zsum += std::exp(d) * (tile_zsum + d * tile_sum);
      }
    }
    lse.Fold(tile_max, tile_sum);
  }

  double Entropy() const {
    if (!std::isfinite(lse.max)) return std::numeric_limits<double>::quiet_NaN();
    return std::log(lse.sum) - zsum / lse.sum;
  }
};

// A row's k best entries so far: a heap whose front is its worst entry, which
// a candidate replaces when it ranks before it.
class LpTopK {
 public:
  explicit LpTopK(std::int64_t k) : k_(static_cast<std::size_t>(k)) {}

  void Offer(float z, std::int64_t id) {
    const Entry e{z, id};
    if (heap_.size() < k_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), WorseFirst);
    } else if (WorseFirst(e, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), WorseFirst);
      heap_.back() = e;
      std::push_heap(heap_.begin(), heap_.end(), WorseFirst);
    }
  }

  // The entries from the best, as ids and z - lse rounded once.
  void Write(double lse, std::int32_t* ids, float* logprobs) {
    std::sort_heap(heap_.begin(), heap_.end(), WorseFirst);
    for (std::size_t j = 0; j < heap_.size(); ++j) {
      ids[j] = static_cast<std::int32_t>(heap_[j].second);
      logprobs[j] = static_cast<float>(static_cast<double>(heap_[j].first) - lse);
    }
  }

 private:
  using Entry = std::pair<float, std::int64_t>;
  static bool WorseFirst(const Entry& a, const Entry& b) {
    return LpBefore(a.first, a.second, b.first, b.second);
  }
  std::size_t k_;
  std::vector<Entry> heap_;
};

}  // namespace logitd::kernels::cpu

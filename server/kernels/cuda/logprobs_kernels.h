// LogProbs' own kernels, behind a plain C++ interface: per vocabulary chunk
// of fp32 logits, the cross-entropy's row statistics (the same segments,
// folded by the same expressions, so lse is bitwise CrossEntropy's) plus the
// entropy's sum and the top-k candidates; after the last chunk, the per-row
// results; and, for the target's rank, a count over the recomputed logits.
//
// Top-k entries travel as 64-bit keys that order as LogProbs ranks them: z
// first (NaN above everything, -0 and +0 equal), then the lower id. A row's
// candidates are lists of top_k keys, best first, padded with key 0 (below
// every real entry).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "server/kernels/cuda/cross_entropy_kernels.h"

namespace logitd::kernels::cuda {

// Per-row state of one LogProbs call, device pointers, [m] unless said.
struct LpRowState {
  // run_max, run_sum, target_z, seg_max and seg_sum as the cross-entropy
  // keeps them (lse and coef are not used).
  CeRowState ce;
  double* run_zsum = nullptr;           // sum exp(z - run_max) (z - run_max)
  double* seg_zsum = nullptr;           // [m, segments of the widest chunk]
  unsigned long long* above = nullptr;  // entries ranked before the target
};

struct LpRowParams {
  const std::int64_t* targets = nullptr;  // [m] device, or null for none
  std::int64_t ignore_index = -100;
  float logit_softcap = 0.0f;  // z = cap * tanh(y / cap) when > 0
  float temperature = 1.0f;    // then z /= temperature
  bool entropy = false;        // keep the entropy's sums
  int top_k = 0;               // 0..64
};

// Top-k candidate lists of a call: row i's list j is
// keys[i * row_lists * top_k + j * top_k, + top_k). List 0 holds the best
// entries of the chunks folded so far; a chunk's segments write lists 1.. .
// `merge` is scratch of LpMergeKeys(m, row_lists, top_k) keys.
struct LpTopKLists {
  std::uint64_t* keys = nullptr;
  std::int64_t row_lists = 0;  // segments of the widest chunk + 1
  std::uint64_t* merge = nullptr;
};
std::int64_t LpMergeKeys(std::int64_t m, std::int64_t row_lists, int top_k);

// run_max = -Inf, sums, target_z and counts 0, list 0 empty.
cudaError_t LaunchLpInit(std::int64_t m, const LpRowParams& params, const LpRowState& state,
                         const LpTopKLists& lists, cudaStream_t stream);

// On the logits y [m, n] (row stride n) of vocabulary columns [c0, c0 + n):
// per row and segment the max of z, the sum of exp(z - max) (as the
// cross-entropy), the entropy's sum and the segment's top-k; z at the target
// where it falls in the chunk. Then folds the segments into the running
// values in segment order, and the segments' lists into list 0.
// `launch` as for the cross-entropy's LaunchCeChunkStats (the same bits).
cudaError_t LaunchLpChunkStats(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                               const LpRowParams& params, const LpRowState& state,
                               const LpTopKLists& lists, cudaStream_t stream,
                               CeLaunch launch = CeLaunch::kWarps);

// After the last chunk, each output may be null: lse in fp32; logprob = z_t -
// lse in fp64 rounded once (0 for an ignored target); entropy = log(S) - Z/S
// (NaN when the row's max is not finite); the top-k ids and z - lse.
cudaError_t LaunchLpFinalize(std::int64_t m, const LpRowParams& params, const LpRowState& state,
                             const LpTopKLists& lists, float* logprob, float* lse, float* entropy,
                             std::int32_t* topk_ids, float* topk_logprobs, cudaStream_t stream);

// For the target's rank, on the same logits as the statistics pass (given
// target_z from it): adds to `above` the entries of columns [c0, c0 + n) that
// rank before the target. Rows with an ignored target are left alone.
cudaError_t LaunchLpRank(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                         const LpRowParams& params, const LpRowState& state, cudaStream_t stream);

}  // namespace logitd::kernels::cuda

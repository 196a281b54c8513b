// The fused cross-entropy's own kernels, behind a plain C++ interface: per
// vocabulary chunk, the row statistics of the (soft-capped) fp32 logits and
// the target-logit gather (pass 1), the per-token loss and lse, and the bf16
// logit gradient G (pass 2). The GEMMs around them are cuBLASLt's.
//
// Every reduction has a fixed order (fixed block shape and tree, chunks and
// segments folded in index order), so a result depends only on the inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace logitd::kernels::cuda {

// A chunk's columns are reduced in segments of this many per block, and the
// segments' partials are folded into the running row state in vocabulary
// order. Chunks that start at multiples of it give segments at fixed
// vocabulary positions, so lse and loss do not depend on the chunk size
// (given the same logits).
inline constexpr std::int64_t kCeSegmentColumns = 1024;

inline std::int64_t CeSegments(std::int64_t columns) {
  return (columns + kCeSegmentColumns - 1) / kCeSegmentColumns;
}

// How the chunk kernels are launched. kWarps (the default): a warp reduces
// a segment, the folds take a warp per row, and the in-place gradient keeps
// a batch of a row in flight per block. kBlocks: a block per segment, a
// thread per row, one segment per barrier, as the kernels started. Both
// give the same bits (the tests compare them).
enum class CeLaunch { kWarps, kBlocks };

// Per-row state of one call, device pointers, [m] unless said otherwise.
struct CeRowState {
  float* run_max = nullptr;   // running max of z over the chunks so far
  double* run_sum = nullptr;  // running sum of exp(z - run_max)
  float* target_z = nullptr;  // z at the target column (capped)
  float* lse = nullptr;       // lse rounded to fp32, for pass 2
  float* coef = nullptr;      // 1 + 2 * z_loss * lse, for pass 2
  float* seg_max = nullptr;   // [m, segments of the widest chunk]
  double* seg_sum = nullptr;  // [m, segments of the widest chunk]
};

struct CeRowParams {
  const std::int64_t* targets = nullptr;  // [m] device
  std::int64_t ignore_index = -100;
  float logit_softcap = 0.0f;  // z = cap * tanh(y / cap) when > 0
  float z_loss = 0.0f;
  float grad_scale = 1.0f;
};

// run_max = -Inf, run_sum = 0, target_z = 0.
cudaError_t LaunchCeInit(const CeRowState& state, std::int64_t m, cudaStream_t stream);

// Pass 1 on the logits y [m, n] (row stride n) of vocabulary columns
// [c0, c0 + n): per row and segment the max of z and the sum of exp(z - max);
// z at the target where it falls in the chunk. Then folds the segments into
// run_max/run_sum in segment order.
cudaError_t LaunchCeChunkStats(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                               const CeRowParams& params, const CeRowState& state,
                               cudaStream_t stream, CeLaunch launch = CeLaunch::kWarps);

// After the last chunk: lse = run_max + log(run_sum) in fp64, loss = lse - z_t
// + z_loss * lse^2 rounded once to fp32 (0 for ignored rows); lse_out (may be
// null) gets lse in fp32. For pass 2, state.lse = fp32 lse and state.coef =
// 1 + (2 z_loss) * lse in fp32 from it (1 when z_loss is 0).
cudaError_t LaunchCeFinalize(std::int64_t m, const CeRowParams& params, const CeRowState& state,
                             float* loss, float* lse_out, cudaStream_t stream);

// Pass 2 on the logits y [m, n] of columns [c0, c0 + n), in fp32 and in this
// order: d = exp(z - lse) * coef - onehot; d *= (1 - t) * (1 + t) under
// soft-capping (t = tanh(y / cap): 1 - (z / cap)^2 without the cancellation);
// d *= grad_scale; g = bf16(d), rounded to nearest even once. Rows of ignored
// tokens are zero. g is [m, n] with row stride n.
cudaError_t LaunchCeGradient(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                             const CeRowParams& params, const CeRowState& state, std::uint16_t* g,
                             cudaStream_t stream);

// LaunchCeGradient over whole rows (columns [0, n)), written in place: row
// i's G goes to the first 2n bytes of its own fp32 row, that is to g =
// (uint16_t*)y with row stride 2n. One block walks a row's segments in order
// and stores a segment's G only after every thread has read that segment, so
// no store reaches a value not yet read. Same arithmetic as LaunchCeGradient.
cudaError_t LaunchCeGradientInPlace(float* y, std::int64_t m, std::int64_t n,
                                    const CeRowParams& params, const CeRowState& state,
                                    cudaStream_t stream, CeLaunch launch = CeLaunch::kWarps);

}  // namespace logitd::kernels::cuda

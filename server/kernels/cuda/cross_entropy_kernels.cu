// Device side of cross_entropy_kernels.h. The chunk kernels are
// memory-bound: one block per (row, segment of 1024 columns), each thread
// holding four of the segment's values in registers between the max and the
// sum, with coalesced accesses. Arithmetic that both passes share uses
// explicitly rounded operations, so no contraction differs between them.
#include <cstdint>

#include "server/kernels/cuda/bf16_device.cuh"
#include "server/kernels/cuda/cross_entropy_kernels.h"
#include "server/kernels/cuda/row_reduce.cuh"

namespace logitd::kernels::cuda {
namespace {

using row_reduce::BlockSum;
using row_reduce::Capped;
using row_reduce::ChunkGrid;
using row_reduce::kPerThread;
using row_reduce::kRowThreads;
using row_reduce::kThreads;
using row_reduce::kWarps;
using row_reduce::NegativeInfinity;
using row_reduce::RowBlocks;

__global__ void InitKernel(CeRowState s, std::int64_t m) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  s.run_max[row] = NegativeInfinity();
  s.run_sum[row] = 0.0;
  s.target_z[row] = 0.0f;
}

__global__ void __launch_bounds__(kThreads)
    ChunkStatsKernel(const float* __restrict__ y, std::int64_t n, int segments, std::int64_t c0,
                     CeRowParams p, CeRowState s) {
  __shared__ float shared_max[kWarps];
  __shared__ double shared_sum[kWarps];
  const std::int64_t row = blockIdx.x / segments;
  const int seg = static_cast<int>(blockIdx.x % segments);
  const std::int64_t first = static_cast<std::int64_t>(seg) * kCeSegmentColumns + threadIdx.x;
  const row_reduce::Segment z =
      row_reduce::LoadSegment(y + row * n, n, first, p.logit_softcap, 1.0f, shared_max, shared_sum);
  const std::int64_t target = p.targets[row];
  if (target != p.ignore_index) {
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const std::int64_t col = row_reduce::SegmentColumn(first, r);
      // Exactly one thread of one chunk sees the target column.
      if (col < n && c0 + col == target) s.target_z[row] = z.z[r];
    }
  }
  if (threadIdx.x == 0) {
    const std::int64_t at = row * segments + seg;
    s.seg_max[at] = z.max;
    s.seg_sum[at] = z.sum;
  }
}

// One thread per row folds the chunk's segments in order.
__global__ void CombineKernel(std::int64_t m, int segments, CeRowState s) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  float run_max = s.run_max[row];
  double run_sum = s.run_sum[row];
  for (int seg = 0; seg < segments; ++seg) {
    const std::int64_t at = row * segments + seg;
    const float seg_max = s.seg_max[at];
    const float next = fmaxf(run_max, seg_max);
    run_sum = row_reduce::FoldSum(run_sum, run_max, s.seg_sum[at], seg_max, next);
    run_max = next;
  }
  s.run_max[row] = run_max;
  s.run_sum[row] = run_sum;
}

__global__ void FinalizeKernel(std::int64_t m, CeRowParams p, CeRowState s, float* loss,
                               float* lse_out) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  const double lse = row_reduce::RowLse(s.run_max[row], s.run_sum[row]);
  const double z_loss = static_cast<double>(p.z_loss);
  double value = 0.0;
  if (p.targets[row] != p.ignore_index) {
    value = lse - static_cast<double>(s.target_z[row]);
    // Only when asked: 0 * Inf would turn an infinite lse into NaN.
    if (p.z_loss != 0.0f) value += z_loss * lse * lse;
  }
  loss[row] = static_cast<float>(value);
  if (lse_out != nullptr) lse_out[row] = static_cast<float>(lse);
  const float lse_f = static_cast<float>(lse);
  s.lse[row] = lse_f;
  s.coef[row] = p.z_loss != 0.0f ? __fadd_rn(1.0f, __fmul_rn(2.0f * p.z_loss, lse_f)) : 1.0f;
}

// The gradient of one capped logit, in this order: d = exp(z - lse) * coef
// - onehot; d *= (1 - t) * (1 + t) under soft-capping; d *= scale.
__device__ __forceinline__ std::uint16_t GradientBits(float y, bool is_target, float lse,
                                                      float coef, float cap, float scale) {
  float th;
  const float z = Capped(y, cap, &th);
  const float prob = expf(__fsub_rn(z, lse));
  float d = __fsub_rn(__fmul_rn(prob, coef), is_target ? 1.0f : 0.0f);
  if (cap > 0.0f) d = __fmul_rn(d, __fmul_rn(__fsub_rn(1.0f, th), __fadd_rn(1.0f, th)));
  return static_cast<std::uint16_t>(ToBf16Bits(__fmul_rn(d, scale)));
}

__global__ void __launch_bounds__(kThreads)
    GradientKernel(const float* __restrict__ y, std::int64_t n, int segments, std::int64_t c0,
                   CeRowParams p, CeRowState s, std::uint16_t* __restrict__ g) {
  const std::int64_t row = blockIdx.x / segments;
  const int seg = static_cast<int>(blockIdx.x % segments);
  const float* yr = y + row * n;
  std::uint16_t* gr = g + row * n;
  const std::int64_t first = static_cast<std::int64_t>(seg) * kCeSegmentColumns + threadIdx.x;
  const std::int64_t target = p.targets[row];
  if (target == p.ignore_index) {
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const std::int64_t col = first + static_cast<std::int64_t>(r) * kThreads;
      if (col < n) gr[col] = 0;
    }
    return;
  }
  const float lse = s.lse[row];
  const float coef = s.coef[row];
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const std::int64_t col = first + static_cast<std::int64_t>(r) * kThreads;
    if (col < n) {
      gr[col] = GradientBits(yr[col], c0 + col == target, lse, coef, p.logit_softcap, p.grad_scale);
    }
  }
}

// One block per row. Segment j's G lands on fp32 elements [512 j, 512 j +
// 512) of the row, which belong to segment j / 2 <= j: read before the
// barrier of iteration j.
__global__ void __launch_bounds__(kThreads)
    GradientInPlaceKernel(float* y, std::int64_t n, CeRowParams p, CeRowState s) {
  const std::int64_t row = blockIdx.x;
  float* yr = y + row * n;
  std::uint16_t* gr = reinterpret_cast<std::uint16_t*>(yr);
  const std::int64_t target = p.targets[row];
  const int segments = static_cast<int>((n + kCeSegmentColumns - 1) / kCeSegmentColumns);
  if (target == p.ignore_index) {
    // Nothing is read: zeros can go anywhere in the row's first half.
    for (std::int64_t col = threadIdx.x; col < n; col += kThreads) gr[col] = 0;
    return;
  }
  const float lse = s.lse[row];
  const float coef = s.coef[row];
  for (int seg = 0; seg < segments; ++seg) {
    const std::int64_t first = static_cast<std::int64_t>(seg) * kCeSegmentColumns + threadIdx.x;
    float v[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const std::int64_t col = first + static_cast<std::int64_t>(r) * kThreads;
      v[r] = col < n ? yr[col] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const std::int64_t col = first + static_cast<std::int64_t>(r) * kThreads;
      if (col < n) {
        gr[col] = GradientBits(v[r], col == target, lse, coef, p.logit_softcap, p.grad_scale);
      }
    }
  }
}

}  // namespace

cudaError_t LaunchCeInit(const CeRowState& state, std::int64_t m, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  InitKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(state, m);
  return cudaGetLastError();
}

cudaError_t LaunchCeChunkStats(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                               const CeRowParams& params, const CeRowState& state,
                               cudaStream_t stream) {
  int segments = 0;
  unsigned int blocks = 0;
  if (!ChunkGrid(m, n, &segments, &blocks)) return cudaErrorInvalidConfiguration;
  ChunkStatsKernel<<<blocks, kThreads, 0, stream>>>(y, n, segments, c0, params, state);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  CombineKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(m, segments, state);
  return cudaGetLastError();
}

cudaError_t LaunchCeFinalize(std::int64_t m, const CeRowParams& params, const CeRowState& state,
                             float* loss, float* lse_out, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  FinalizeKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(m, params, state, loss, lse_out);
  return cudaGetLastError();
}

cudaError_t LaunchCeGradient(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                             const CeRowParams& params, const CeRowState& state, std::uint16_t* g,
                             cudaStream_t stream) {
  int segments = 0;
  unsigned int blocks = 0;
  if (!ChunkGrid(m, n, &segments, &blocks)) return cudaErrorInvalidConfiguration;
  GradientKernel<<<blocks, kThreads, 0, stream>>>(y, n, segments, c0, params, state, g);
  return cudaGetLastError();
}

cudaError_t LaunchCeGradientInPlace(float* y, std::int64_t m, std::int64_t n,
                                    const CeRowParams& params, const CeRowState& state,
                                    cudaStream_t stream) {
  if (m <= 0 || n <= 0 || m > 0x7fffffff) return cudaErrorInvalidConfiguration;
  GradientInPlaceKernel<<<static_cast<unsigned int>(m), kThreads, 0, stream>>>(y, n, params, state);
  return cudaGetLastError();
}

}  // namespace logitd::kernels::cuda

// Device side of cross_entropy_kernels.h. The chunk kernels are
// memory-bound: the statistics a warp per segment of 1024 columns
// (row_reduce.cuh's warp launch), each lane holding 32 of the segment's
// values in registers between the max and the sum, with coalesced accesses
// and no block barrier; G four columns at a time where rows allow it. The
// block-per-segment layout they replaced is kept behind CeLaunch::kBlocks.
// Arithmetic that both passes share uses explicitly rounded operations, so no
// contraction differs between them.
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

// One segment of WarpStatsKernel: its partials, and z at the target when
// the target falls in it.
template <bool kFull, bool kPlain>
__device__ __forceinline__ void CeWarpSegment(const float* __restrict__ yr, std::int64_t n,
                                              int segments, int seg, std::int64_t row,
                                              std::int64_t c0, std::int64_t target,
                                              const CeRowParams& p, const CeRowState& s) {
  const std::int64_t start = static_cast<std::int64_t>(seg) * kCeSegmentColumns;
  row_reduce::WarpSegment z;
  row_reduce::LoadWarpSegment<kFull>(yr, n, start, z);
  row_reduce::ReduceWarpSegment<kFull, kPlain, false>(n, start, p.logit_softcap, 1.0f, z);
  if (target != p.ignore_index && target >= c0 + start && target < c0 + start + kCeSegmentColumns) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        const std::int64_t col = start + row_reduce::WarpColumn(w, r);
        if (col < n && c0 + col == target) s.target_z[row] = z.z[w][r];
      }
    }
  }
  if (row_reduce::Lane() == 0) {
    s.seg_max[row * segments + seg] = z.max;
    s.seg_sum[row * segments + seg] = z.sum;
  }
}

// ChunkStatsKernel's values under the warp launch (row_reduce.cuh): warp
// (row, run) walks segments [run * kSegmentsPerWarp, + kSegmentsPerWarp) of
// the row. Whole segments below n skip the column checks, and without
// soft-capping z is the logit itself.
// Three blocks of eight warps per SM (80 registers, a few spilled) ran as fast as two
// (110 registers) on the H200.
__global__ void __launch_bounds__(kThreads, 3)
    WarpStatsKernel(const float* __restrict__ y, std::int64_t m, std::int64_t n, int segments,
                    int runs, std::int64_t c0, CeRowParams p, CeRowState s) {
  const auto [row, begin, end] = row_reduce::ThisWarpRun(segments, runs);
  if (row >= m) return;  // the whole warp
  const float* yr = y + row * n;
  const std::int64_t target = p.targets[row];
  const bool plain = p.logit_softcap == 0.0f;
  for (int seg = begin; seg < end; ++seg) {
    const bool full = static_cast<std::int64_t>(seg + 1) * kCeSegmentColumns <= n;
    if (full && plain) {
      CeWarpSegment<true, true>(yr, n, segments, seg, row, c0, target, p, s);
    } else if (full) {
      CeWarpSegment<true, false>(yr, n, segments, seg, row, c0, target, p, s);
    } else {
      CeWarpSegment<false, false>(yr, n, segments, seg, row, c0, target, p, s);
    }
  }
}

// CombineKernel's fold with a warp per row (row_reduce::kFullWarp's note).
__global__ void WarpCombineKernel(std::int64_t m, int segments, CeRowState s) {
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= m) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x & 31);
  float run_max = s.run_max[row];
  double run_sum = s.run_sum[row];
  for (int base = 0; base < segments; base += 32) {
    float lane_max = 0.0f;
    double lane_sum = 0.0;
    if (base + lane < segments) {
      lane_max = s.seg_max[row * segments + base + lane];
      lane_sum = s.seg_sum[row * segments + base + lane];
    }
    const int count = segments - base < 32 ? segments - base : 32;
    for (int i = 0; i < count; ++i) {
      const float seg_max = __shfl_sync(row_reduce::kFullWarp, lane_max, i);
      const double seg_sum = __shfl_sync(row_reduce::kFullWarp, lane_sum, i);
      const float next = fmaxf(run_max, seg_max);
      run_sum = row_reduce::FoldSum(run_sum, run_max, seg_sum, seg_max, next);
      run_max = next;
    }
  }
  if (lane == 0) {
    s.run_max[row] = run_max;
    s.run_sum[row] = run_sum;
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

// The gradient of one capped logit before its rounding, in this order: d =
// exp(z - lse) * coef - onehot; d *= (1 - t) * (1 + t) under soft-capping;
// d *= scale. kPlain: no soft-capping (cap is 0), the same value without
// the test.
template <bool kPlain = false>
__device__ __forceinline__ float GradientValue(float y, bool is_target, float lse, float coef,
                                               float cap, float scale) {
  float th = 0.0f;
  const float z = kPlain ? y : Capped(y, cap, &th);
  const float prob = expf(__fsub_rn(z, lse));
  float d = __fsub_rn(__fmul_rn(prob, coef), is_target ? 1.0f : 0.0f);
  if (!kPlain && cap > 0.0f) {
    d = __fmul_rn(d, __fmul_rn(__fsub_rn(1.0f, th), __fadd_rn(1.0f, th)));
  }
  return __fmul_rn(d, scale);
}

// GradientValue rounded once to bf16.
__device__ __forceinline__ std::uint16_t GradientBits(float y, bool is_target, float lse,
                                                      float coef, float cap, float scale) {
  return static_cast<std::uint16_t>(ToBf16Bits(GradientValue(y, is_target, lse, coef, cap, scale)));
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

// GradientInPlaceKernel with more of the row in flight: a block of
// kGradThreads threads per row reads kGradBatch columns per thread (a batch
// of kGradThreads * kGradBatch columns), then, after a barrier, writes their
// G. The batch starting at column b writes fp32 elements [b / 2, b / 2 +
// batch / 2), all below b + batch and so read by now; the next batch's
// columns start at b + batch, above everything written. G is per element,
// so its bits do not depend on the launch shape.
constexpr int kGradThreads = 512;
constexpr int kGradBatch = 16;

__global__ void __launch_bounds__(kGradThreads)
    GradientInPlaceBatchKernel(float* y, std::int64_t n, CeRowParams p, CeRowState s) {
  const std::int64_t row = blockIdx.x;
  float* yr = y + row * n;
  std::uint16_t* gr = reinterpret_cast<std::uint16_t*>(yr);
  const std::int64_t target = p.targets[row];
  if (target == p.ignore_index) {
    for (std::int64_t col = threadIdx.x; col < n; col += kGradThreads) gr[col] = 0;
    return;
  }
  const float lse = s.lse[row];
  const float coef = s.coef[row];
  constexpr std::int64_t kBatch = static_cast<std::int64_t>(kGradThreads) * kGradBatch;
  for (std::int64_t base = 0; base < n; base += kBatch) {
    float v[kGradBatch];
#pragma unroll
    for (int r = 0; r < kGradBatch; ++r) {
      const std::int64_t col = base + threadIdx.x + static_cast<std::int64_t>(r) * kGradThreads;
      v[r] = col < n ? yr[col] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kGradBatch; ++r) {
      const std::int64_t col = base + threadIdx.x + static_cast<std::int64_t>(r) * kGradThreads;
      if (col < n) {
        gr[col] = GradientBits(v[r], col == target, lse, coef, p.logit_softcap, p.grad_scale);
      }
    }
  }
}

// The gradient four columns at a time, for rows of a multiple of 4 columns
// on 16-byte aligned rows: each thread reads four float4 (columns 4t + 4 *
// kGradThreads * r of a batch of kGradThreads * kGradBatch columns) and
// writes four bf16 per store, a quarter of the memory instructions of the
// scalar kernels. kInPlace: a block walks its row's batches in order and G
// goes over the row's own first half (GradientInPlaceBatchKernel's batches
// and barrier, so its in-place order holds). Otherwise block (row, b) writes
// batch b of the row to g [m, n] (row stride n), columns c0 + col of the
// vocabulary. Each G is computed as in the scalar kernels and rounded in
// pairs by ToBf16x2Bits (ToBf16Bits' bits: the cast kernel's test checks it
// on all 2^32 inputs). kPlain: no soft-capping.
constexpr int kGradVectors = kGradBatch / 4;

template <bool kInPlace, bool kPlain>
__global__ void __launch_bounds__(kGradThreads)
    GradientVec4Kernel(float* y, std::int64_t n, std::int64_t c0, CeRowParams p, CeRowState s,
                       std::uint16_t* g) {
  const std::int64_t row = blockIdx.x;
  float* yr = y + row * n;
  std::uint16_t* gr = kInPlace ? reinterpret_cast<std::uint16_t*>(yr) : g + row * n;
  const std::int64_t target = p.targets[row];
  constexpr std::int64_t kBatch = static_cast<std::int64_t>(kGradThreads) * kGradBatch;
  constexpr std::int64_t kStride = 4 * static_cast<std::int64_t>(kGradThreads);
  const std::int64_t begin = kInPlace ? 0 : blockIdx.y * kBatch;
  const std::int64_t end = kInPlace ? n : min(n, begin + kBatch);
  if (target == p.ignore_index) {
    for (std::int64_t col = begin + 4 * static_cast<std::int64_t>(threadIdx.x); col < end;
         col += kStride) {
      *reinterpret_cast<uint2*>(gr + col) = make_uint2(0u, 0u);
    }
    return;
  }
  const std::int64_t t = target - c0;  // the target's column in this chunk, if there
  const float lse = s.lse[row];
  const float coef = s.coef[row];
  const float cap = p.logit_softcap;
  const float scale = p.grad_scale;
  for (std::int64_t base = begin; base < end; base += kBatch) {
    const std::int64_t first = base + 4 * static_cast<std::int64_t>(threadIdx.x);
    float4 v[kGradVectors];
#pragma unroll
    for (int r = 0; r < kGradVectors; ++r) {
      const std::int64_t col = first + r * kStride;
      v[r] = col < n ? *reinterpret_cast<const float4*>(yr + col) : make_float4(0, 0, 0, 0);
    }
    if (kInPlace) __syncthreads();
#pragma unroll
    for (int r = 0; r < kGradVectors; ++r) {
      const std::int64_t col = first + r * kStride;
      if (col < n) {
        const unsigned lo =
            ToBf16x2Bits(GradientValue<kPlain>(v[r].x, col == t, lse, coef, cap, scale),
                         GradientValue<kPlain>(v[r].y, col + 1 == t, lse, coef, cap, scale));
        const unsigned hi =
            ToBf16x2Bits(GradientValue<kPlain>(v[r].z, col + 2 == t, lse, coef, cap, scale),
                         GradientValue<kPlain>(v[r].w, col + 3 == t, lse, coef, cap, scale));
        *reinterpret_cast<uint2*>(gr + col) = make_uint2(lo, hi);
      }
    }
  }
}

bool Vec4Rows(const void* p, std::int64_t n) {
  return n % 4 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace

cudaError_t LaunchCeInit(const CeRowState& state, std::int64_t m, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  InitKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(state, m);
  return cudaGetLastError();
}

cudaError_t LaunchCeChunkStats(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                               const CeRowParams& params, const CeRowState& state,
                               cudaStream_t stream, CeLaunch launch) {
  int segments = 0;
  unsigned int blocks = 0;
  if (launch == CeLaunch::kWarps) {
    int runs = 0;
    if (!row_reduce::WarpGrid(m, n, &segments, &runs, &blocks)) {
      return cudaErrorInvalidConfiguration;
    }
    WarpStatsKernel<<<blocks, kThreads, 0, stream>>>(y, m, n, segments, runs, c0, params, state);
    cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
    WarpCombineKernel<<<row_reduce::WarpRowBlocks(m), kRowThreads, 0, stream>>>(m, segments, state);
    return cudaGetLastError();
  }
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
  constexpr std::int64_t kBatch = static_cast<std::int64_t>(kGradThreads) * kGradBatch;
  const std::int64_t batches = (n + kBatch - 1) / kBatch;
  if (Vec4Rows(y, n) && Vec4Rows(g, n) && m > 0 && m <= 0x7fffffff && batches <= 65535) {
    const dim3 grid(static_cast<unsigned int>(m), static_cast<unsigned int>(batches));
    float* rows = const_cast<float*>(y);  // read only: G goes to g
    if (params.logit_softcap == 0.0f) {
      GradientVec4Kernel<false, true>
          <<<grid, kGradThreads, 0, stream>>>(rows, n, c0, params, state, g);
    } else {
      GradientVec4Kernel<false, false>
          <<<grid, kGradThreads, 0, stream>>>(rows, n, c0, params, state, g);
    }
    return cudaGetLastError();
  }
  if (!ChunkGrid(m, n, &segments, &blocks)) return cudaErrorInvalidConfiguration;
  GradientKernel<<<blocks, kThreads, 0, stream>>>(y, n, segments, c0, params, state, g);
  return cudaGetLastError();
}

cudaError_t LaunchCeGradientInPlace(float* y, std::int64_t m, std::int64_t n,
                                    const CeRowParams& params, const CeRowState& state,
                                    cudaStream_t stream, CeLaunch launch) {
  if (m <= 0 || n <= 0 || m > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const auto rows = static_cast<unsigned int>(m);
  if (launch == CeLaunch::kWarps) {
    if (Vec4Rows(y, n)) {
      if (params.logit_softcap == 0.0f) {
        GradientVec4Kernel<true, true>
            <<<rows, kGradThreads, 0, stream>>>(y, n, 0, params, state, nullptr);
      } else {
        GradientVec4Kernel<true, false>
            <<<rows, kGradThreads, 0, stream>>>(y, n, 0, params, state, nullptr);
      }
    } else {
      GradientInPlaceBatchKernel<<<rows, kGradThreads, 0, stream>>>(y, n, params, state);
    }
  } else {
    GradientInPlaceKernel<<<rows, kThreads, 0, stream>>>(y, n, params, state);
  }
  return cudaGetLastError();
}

}  // namespace logitd::kernels::cuda

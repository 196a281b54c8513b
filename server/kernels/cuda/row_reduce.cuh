// Device pieces the row kernels share (the fused cross-entropy's and
// LogProbs'): one block of 256 threads per (row, segment of
// kCeSegmentColumns columns), each thread holding four of the segment's
// values in registers, and block reductions with a fixed order, so the same
// inputs give the same bits in every kernel that uses them.
#pragma once

#include <cstdint>

#include "server/kernels/cuda/cross_entropy_kernels.h"

namespace logitd::kernels::cuda {
namespace row_reduce {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = static_cast<int>(kCeSegmentColumns / kThreads);
static_assert(kPerThread * kThreads == kCeSegmentColumns, "a segment is a whole block's worth");

__device__ __forceinline__ float NegativeInfinity() { return __uint_as_float(0xff800000u); }

// z = cap * tanh(y / cap) under soft-capping (th = tanh(y / cap)), else y.
__device__ __forceinline__ float Capped(float y, float cap, float* th) {
  if (cap > 0.0f) {
    const float t = tanhf(__fdiv_rn(y, cap));
    *th = t;
    return __fmul_rn(cap, t);
  }
  *th = 0.0f;
  return y;
}

// z of one logit: capped, then divided by the temperature unless it is 1.
__device__ __forceinline__ float LogitZ(float y, float cap, float temperature) {
  float th;
  const float z = Capped(y, cap, &th);
  return temperature != 1.0f ? __fdiv_rn(z, temperature) : z;
}

// exp(from - to) for from <= to, with equal values (both infinite included)
// giving 1: a segment whose every z is -Inf then sums to its count and weighs
// nothing once a finite max appears, and an all -Inf row gets lse = -Inf.
__device__ __forceinline__ double Rescale(float from, float to) {
  return from == to ? 1.0 : exp(static_cast<double>(from) - static_cast<double>(to));
}

// The running sum of exp(z - run_max) once a segment (seg_max, seg_sum) is
// folded in, next = fmaxf(run_max, seg_max) being the new running max. One
// expression for every kernel that folds, so their sums agree bitwise.
__device__ __forceinline__ double FoldSum(double run_sum, float run_max, double seg_sum,
                                          float seg_max, float next) {
  return run_sum * Rescale(run_max, next) + seg_sum * Rescale(seg_max, next);
}

// log-sum-exp of a row from its running max and sum, in fp64.
__device__ __forceinline__ double RowLse(float run_max, double run_sum) {
  return static_cast<double>(run_max) + log(run_sum);
}

// fmaxf drops NaN, so a NaN logit never becomes the max; it reaches the sum
// (exp(NaN) = NaN) and from there lse, loss and G. The result is valid in
// every thread.
__device__ __forceinline__ float BlockMax(float v, float* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = shared[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) r = fmaxf(r, shared[i]);
  return r;
}

// A fixed tree within each warp, then the warps in index order: the same
// inputs give the same bits. The result is valid in thread 0. Callers that
// reduce twice with the same `shared` must separate the calls with a barrier.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = 0;
  if (threadIdx.x == 0) {
    r = shared[0];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) r += shared[i];
  }
  return r;
}

// One segment of a row's logits: this thread's z values (capped, then
// divided by the temperature unless it is 1), the segment's max and its sum
// of exp(z - max), the sum valid in thread 0. Columns past n hold z = 0 and
// count in neither.
struct Segment {
  float z[kPerThread];
  float max;
  double sum;
};

__device__ __forceinline__ std::int64_t SegmentColumn(std::int64_t first, int r) {
  return first + static_cast<std::int64_t>(r) * kThreads;
}

__device__ __forceinline__ Segment LoadSegment(const float* __restrict__ yr, std::int64_t n,
                                               std::int64_t first, float cap, float temperature,
                                               float* shared_max, double* shared_sum) {
  Segment s;
  float mx = NegativeInfinity();
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const std::int64_t col = SegmentColumn(first, r);
    s.z[r] = 0.0f;
    if (col < n) {
      s.z[r] = LogitZ(yr[col], cap, temperature);
      mx = fmaxf(mx, s.z[r]);
    }
  }
  mx = BlockMax(mx, shared_max);
  float local = 0.0f;
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    if (SegmentColumn(first, r) < n) local += s.z[r] == mx ? 1.0f : expf(__fsub_rn(s.z[r], mx));
  }
  s.max = mx;
  s.sum = BlockSum(static_cast<double>(local), shared_sum);
  return s;
}

// The warp launch: one warp reduces a whole segment, with no block
// barrier. Lane l holds what threads l, l + 32, ..., l + 224 of the block
// launch hold (values[w][r] is column 32 w + l + 256 r of the segment), sums
// each of them in the same order, and runs the same shuffle tree for each
// warp w of the block launch; lane 0 then adds the eight results in warp
// order, as thread 0 does there. So a segment's max, sum and entropy sum
// have the block launch's bits. kSegmentsPerWarp segments of a row are
// walked in turn by one warp.
constexpr int kSegmentsPerWarp = 4;

struct WarpSegment {
  float z[kWarps][kPerThread];  // the values, then z
  float max = 0.0f;             // in every lane
  double sum = 0.0;             // in lane 0
  double zsum = 0.0;            // the entropy's, in lane 0 when asked for
};

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x & 31); }

// Column of values[w][r] within its segment, for this lane.
__device__ __forceinline__ int WarpColumn(int w, int r) { return 32 * w + Lane() + kThreads * r; }

// The segment's raw logits starting at column `start` of the row (0 past n).
// kFull: the whole segment lies below n.
template <bool kFull>
__device__ __forceinline__ void LoadWarpSegment(const float* __restrict__ yr, std::int64_t n,
                                                std::int64_t start, WarpSegment& seg) {
  const float* at = yr + start;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int col = WarpColumn(w, r);
      seg.z[w][r] = kFull || start + col < n ? at[col] : 0.0f;
    }
  }
}

// z, max, sum (and with kEntropy the sum of exp(z - max) (z - max) over the z
// below a finite max) of a loaded segment, computed as LoadSegment and the
// LogProbs statistics compute them. kPlain: no soft-capping and a
// temperature of 1 (z is the logit).
template <bool kFull, bool kPlain, bool kEntropy>
__device__ __forceinline__ void ReduceWarpSegment(std::int64_t n, std::int64_t start, float cap,
                                                  float temperature, WarpSegment& seg) {
  float mx = NegativeInfinity();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      if (kFull || start + WarpColumn(w, r) < n) {
        if (!kPlain) seg.z[w][r] = LogitZ(seg.z[w][r], cap, temperature);
        mx = fmaxf(mx, seg.z[w][r]);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
  }
  seg.max = mx;
  const bool finite = isfinite(mx);
  // Warp w's tree, then the running total in warp order (lane 0's values).
  double sum = 0.0;
  double zsum = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    float local = 0.0f;
    double zlocal = 0.0;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      if (kFull || start + WarpColumn(w, r) < n) {
        const float d = __fsub_rn(seg.z[w][r], mx);
        const float e = expf(d);
        const bool top = seg.z[w][r] == mx;
        local += top ? 1.0f : e;
        if (kEntropy && finite && !top) zlocal += static_cast<double>(e) * static_cast<double>(d);
      }
    }
    double part = static_cast<double>(local);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      part += __shfl_down_sync(0xffffffffu, part, offset);
      if (kEntropy) zlocal += __shfl_down_sync(0xffffffffu, zlocal, offset);
    }
    sum = w == 0 ? part : sum + part;
    if (kEntropy) zsum = w == 0 ? zlocal : zsum + zlocal;
  }
  seg.sum = sum;
  seg.zsum = zsum;
}

// The row and the segments [begin, end) this warp walks.
struct WarpRun {
  std::int64_t row;
  int begin;
  int end;
};
__device__ __forceinline__ WarpRun ThisWarpRun(int segments, int runs) {
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int begin = static_cast<int>(warp % runs) * kSegmentsPerWarp;
  return {warp / runs, begin, min(segments, begin + kSegmentsPerWarp)};
}

// Warp-launch shapes: warps of (row, run of kSegmentsPerWarp segments), in
// blocks of kThreads; false when a dimension is not positive or the grid
// would exceed 2^31 - 1 blocks.
inline bool WarpGrid(std::int64_t m, std::int64_t n, int* segments, int* runs,
                     unsigned int* blocks) {
  const std::int64_t segs = CeSegments(n);
  const std::int64_t r = (segs + kSegmentsPerWarp - 1) / kSegmentsPerWarp;
  const std::int64_t warps = m * r;
  const std::int64_t b = (warps + kWarps - 1) / kWarps;
  if (m <= 0 || n <= 0 || b > 0x7fffffff) return false;
  *segments = static_cast<int>(segs);
  *runs = static_cast<int>(r);
  *blocks = static_cast<unsigned int>(b);
  return true;
}

// Folds (the Combine kernels) take a warp per row: the lanes load 32 of
// the row's segment partials at a time, coalesced, and every lane runs the
// one-thread fold over them in segment order, each value broadcast from its
// lane, so every lane ends with the one-thread fold's bits.
constexpr unsigned int kFullWarp = 0xffffffffu;

// Launch shapes. Row kernels: a thread per row, in blocks of kRowThreads;
// fold kernels: a warp per row, in blocks of kRowThreads.
// Segment kernels: a block per (row, segment), in a one-dimensional grid
// (rows may exceed the 65535 of gridDim.y); false when m * segments of n
// columns exceeds 2^31 - 1 blocks or a dimension is not positive.
constexpr int kRowThreads = 256;

inline unsigned int RowBlocks(std::int64_t m) {
  return static_cast<unsigned int>((m + kRowThreads - 1) / kRowThreads);
}

inline unsigned int WarpRowBlocks(std::int64_t m) {
  constexpr std::int64_t kRowsPerBlock = kRowThreads / 32;
  return static_cast<unsigned int>((m + kRowsPerBlock - 1) / kRowsPerBlock);
}

inline bool ChunkGrid(std::int64_t m, std::int64_t n, int* segments, unsigned int* blocks) {
  const std::int64_t segs = CeSegments(n);
  const std::int64_t total = m * segs;
  if (m <= 0 || n <= 0 || total > 0x7fffffff) return false;
  *segments = static_cast<int>(segs);
  *blocks = static_cast<unsigned int>(total);
  return true;
}

}  // namespace row_reduce
}  // namespace logitd::kernels::cuda

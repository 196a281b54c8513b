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

// Launch shapes. Row kernels: a thread per row, in blocks of kRowThreads.
// Segment kernels: a block per (row, segment), in a one-dimensional grid
// (rows may exceed the 65535 of gridDim.y); false when m * segments of n
// columns exceeds 2^31 - 1 blocks or a dimension is not positive.
constexpr int kRowThreads = 256;

inline unsigned int RowBlocks(std::int64_t m) {
  return static_cast<unsigned int>((m + kRowThreads - 1) / kRowThreads);
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

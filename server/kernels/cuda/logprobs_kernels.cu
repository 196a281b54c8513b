// Device side of logprobs_kernels.h. The statistics kernel is the
// cross-entropy's (row_reduce.cuh's warp launch, the same fold) plus the
// entropy's sum and each segment's top-k list, picked by warp rounds (a
// segment with nothing at or above the row's k-th best so far gets an empty
// list at once). Lists are then merged, up to kSortKeys keys per block, until
// one list per row is left. The block launch (CeLaunch::kBlocks) keeps the
// kernels this started with: a block per segment, its list by rounds of
// block maxima or a bitonic sort of its 1,024 keys in shared memory.
#include <algorithm>
#include <cstdint>

#include "server/kernels/cuda/logprobs_kernels.h"
#include "server/kernels/cuda/row_reduce.cuh"

namespace logitd::kernels::cuda {
namespace {

using row_reduce::BlockSum;
using row_reduce::ChunkGrid;
using row_reduce::kPerThread;
using row_reduce::kRowThreads;
using row_reduce::kThreads;
using row_reduce::kWarps;
using row_reduce::RowBlocks;
using row_reduce::SegmentColumn;
// Keys one merge block sorts at the most (16 KiB of shared memory).
constexpr int kSortKeys = 2048;

// The key of (z, id): larger z first (NaN above everything, -0 == +0), then
// the lower id. Real keys are > 0, since the id's part is >= 2^31.
__device__ __forceinline__ std::uint64_t Key(float z, std::int64_t id) {
  std::uint32_t ordered = 0xffffffffu;
  if (!isnan(z)) {
    const std::uint32_t u = z == 0.0f ? 0u : __float_as_uint(z);
    ordered = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  }
  return (static_cast<std::uint64_t>(ordered) << 32) |
         (0xffffffffu - static_cast<std::uint32_t>(id));
}

__device__ __forceinline__ float KeyZ(std::uint64_t key) {
  const auto ordered = static_cast<std::uint32_t>(key >> 32);
  return __uint_as_float((ordered & 0x80000000u) != 0 ? (ordered & 0x7fffffffu) : ~ordered);
}

__device__ __forceinline__ std::int32_t KeyId(std::uint64_t key) {
  return static_cast<std::int32_t>(0xffffffffu - static_cast<std::uint32_t>(key));
}

// Sorts keys[0, p) (p a power of two) in shared memory, largest first; every
// thread of the block takes part. The caller has synchronized after writing.
__device__ void SortDescending(std::uint64_t* keys, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < p / 2; i += blockDim.x) {
        const int lo = (i / stride) * 2 * stride + (i % stride);
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const std::uint64_t a = keys[lo];
        const std::uint64_t b = keys[hi];
        if ((a < b) == descending) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Up to this many entries a segment's list is picked by rounds of a block
// max (each key unique, so one thread holds it and drops it); beyond, by a
// sort of the whole segment in shared memory.
constexpr int kSelectTopK = 16;

// The segment's top_k keys, best first, into out[0, top_k); every thread of
// the block takes part, each holding kPerThread keys (0 for none). Stops
// early once no key is left, writing 0s for the rest.
__device__ void SelectTopK(std::uint64_t (&key)[kPerThread], int top_k, std::uint64_t* out) {
  __shared__ std::uint64_t warp_best[2][kWarps];
  for (int j = 0; j < top_k; ++j) {
    std::uint64_t best = key[0];
#pragma unroll
    for (int r = 1; r < kPerThread; ++r) best = key[r] > best ? key[r] : best;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const std::uint64_t other = __shfl_xor_sync(0xffffffffu, best, offset);
      best = other > best ? other : best;
    }
    // Two buffers in turn: a warp writes round j + 2's only after the
    // barrier of round j + 1, which every thread passes after reading j's.
    if ((threadIdx.x & 31) == 0) warp_best[j & 1][threadIdx.x >> 5] = best;
    __syncthreads();
    best = warp_best[j & 1][0];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) best = warp_best[j & 1][i] > best ? warp_best[j & 1][i] : best;
    if (best == 0) {
      if (threadIdx.x == 0) {
        for (int rest = j; rest < top_k; ++rest) out[rest] = 0;
      }
      return;
    }
    if (threadIdx.x == 0) out[j] = best;
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) key[r] = key[r] == best ? 0 : key[r];
  }
}

__device__ __forceinline__ bool Counted(const LpRowParams& p, std::int64_t row) {
  return p.targets != nullptr && p.targets[row] != p.ignore_index;
}

// The entropy's Z = sum exp(z - from) (z - from) of a part whose sum of
// exp(z - from) is `sum`, expressed against `to` >= from. A part whose max is
// -Inf adds nothing; against +Inf the entropy is NaN whatever Z is.
__device__ __forceinline__ double ShiftZ(double zsum, double sum, float from, float to) {
  if (from == to) return zsum;
  if (!isfinite(from) || !isfinite(to)) return 0.0;
  const double d = static_cast<double>(from) - static_cast<double>(to);
  return exp(d) * (zsum + d * sum);
}

// Only keys above the k-th best of the chunks folded so far (0 while there
// are fewer) can enter the row's top-k; the others are dropped.
__device__ __forceinline__ std::uint64_t TopKFloor(const LpTopKLists& lists, std::int64_t row,
                                                   int top_k) {
  return lists.keys[row * lists.row_lists * top_k + top_k - 1];
}

// One segment's top_k keys above `floor`, best first, into out[0, top_k);
// z holds this thread's values of the segment (first: its first column).
// Every thread of the block takes part.
__device__ __forceinline__ void SegmentTopK(const float (&z)[kPerThread], std::int64_t n,
                                            std::int64_t first, std::int64_t c0, int top_k,
                                            std::uint64_t floor, std::uint64_t* out) {
  std::uint64_t key[kPerThread];
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const std::int64_t col = SegmentColumn(first, r);
    key[r] = col < n ? Key(z[r], c0 + col) : 0;
    if (key[r] <= floor) key[r] = 0;
  }
  if (top_k <= kSelectTopK) {
    SelectTopK(key, top_k, out);
    return;
  }
  static_assert(kPerThread == 4, "the test below reads four keys");
  if (!__syncthreads_or((key[0] | key[1] | key[2] | key[3]) != 0)) {
    for (int j = threadIdx.x; j < top_k; j += kThreads) out[j] = 0;
    return;
  }
  __shared__ std::uint64_t keys[kCeSegmentColumns];
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) keys[threadIdx.x + r * kThreads] = key[r];
  __syncthreads();
  SortDescending(keys, static_cast<int>(kCeSegmentColumns));
  for (int j = threadIdx.x; j < top_k; j += kThreads) out[j] = keys[j];
}

__global__ void InitKernel(std::int64_t m, LpRowParams p, LpRowState s, LpTopKLists lists) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  s.ce.run_max[row] = row_reduce::NegativeInfinity();
  s.ce.run_sum[row] = 0.0;
  s.ce.target_z[row] = 0.0f;
  s.run_zsum[row] = 0.0;
  // -1 as int64 for an ignored target: LaunchLpRank leaves such rows alone.
  if (s.above != nullptr) s.above[row] = Counted(p, row) ? 0ull : ~0ull;
  for (int j = 0; j < p.top_k; ++j) lists.keys[row * lists.row_lists * p.top_k + j] = 0;
}

__global__ void __launch_bounds__(kThreads)
    StatsKernel(const float* __restrict__ y, std::int64_t n, int segments, std::int64_t c0,
                LpRowParams p, LpRowState s, LpTopKLists lists) {
  __shared__ float shared_max[kWarps];
  __shared__ double shared_sum[kWarps];
  __shared__ double shared_zsum[kWarps];
  const std::int64_t row = blockIdx.x / segments;
  const int seg = static_cast<int>(blockIdx.x % segments);
  const std::int64_t first = static_cast<std::int64_t>(seg) * kCeSegmentColumns + threadIdx.x;
  const row_reduce::Segment z = row_reduce::LoadSegment(y + row * n, n, first, p.logit_softcap,
                                                        p.temperature, shared_max, shared_sum);
  if (Counted(p, row)) {
    const std::int64_t target = p.targets[row];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const std::int64_t col = SegmentColumn(first, r);
      if (col < n && c0 + col == target) s.ce.target_z[row] = z.z[r];
    }
  }
  double zsum = 0.0;
  if (p.entropy) {
    double local = 0.0;
    if (isfinite(z.max)) {
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        if (SegmentColumn(first, r) < n && z.z[r] != z.max) {
          const float d = __fsub_rn(z.z[r], z.max);
          local += static_cast<double>(expf(d)) * static_cast<double>(d);
        }
      }
    }
    zsum = BlockSum(local, shared_zsum);
  }
  if (threadIdx.x == 0) {
    const std::int64_t at = row * segments + seg;
    s.ce.seg_max[at] = z.max;
    s.ce.seg_sum[at] = z.sum;
    if (p.entropy) s.seg_zsum[at] = zsum;
  }
  if (p.top_k == 0) return;
  SegmentTopK(z.z, n, first, c0, p.top_k, TopKFloor(lists, row, p.top_k),
              lists.keys + (row * lists.row_lists + 1 + seg) * p.top_k);
}

// The high half of Key(z, id): z's order (NaN above everything, -0 = +0).
__device__ __forceinline__ std::uint32_t OrderedZ(float z) {
  return static_cast<std::uint32_t>(Key(z, 0) >> 32);
}

// The segment's top_k keys above `floor`, best first, into out[0, top_k),
// by one warp: each round takes the warp's largest key (keys are unique),
// whose lane then drops it and finds its next largest. A lane visits its
// values in column order and keeps the first of equal z, so its best is its
// largest key. The same list as SelectTopK and the sort give. Out of line:
// only segments that may hold candidates come here, and its registers stay
// out of the statistics' way.
__device__ __noinline__ void WarpTopK(const row_reduce::WarpSegment& z, std::int64_t n,
                                      std::int64_t start, std::int64_t c0, int top_k,
                                      std::uint64_t floor, std::uint64_t* out) {
  const int lane = row_reduce::Lane();
  unsigned int taken = 0;  // bit 4 w + r: values[w][r] already listed
  int best_at = -1;
  auto lane_best = [&]() {
    std::uint32_t best = 0;
    best_at = -1;
    // Column 32 w + lane + 256 r: r, then w, is column order.
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int at = w * kPerThread + r;
        if (start + row_reduce::WarpColumn(w, r) < n && ((taken >> at) & 1u) == 0) {
          const std::uint32_t o = OrderedZ(z.z[w][r]);
          if (best_at < 0 || o > best) {
            best = o;
            best_at = at;
          }
        }
      }
    }
    if (best_at < 0) return std::uint64_t{0};
    const int w = best_at / kPerThread;
    const int r = best_at % kPerThread;
    const std::uint64_t key = Key(z.z[w][r], c0 + start + row_reduce::WarpColumn(w, r));
    return key > floor ? key : std::uint64_t{0};
  };
  std::uint64_t mine = lane_best();
  for (int j = 0; j < top_k; ++j) {
    std::uint64_t best = mine;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const std::uint64_t other = __shfl_xor_sync(0xffffffffu, best, offset);
      best = other > best ? other : best;
    }
    if (best == 0) {
      for (int rest = j + lane; rest < top_k; rest += 32) out[rest] = 0;
      return;
    }
    if (lane == 0) out[j] = best;
    if (mine == best) {
      taken |= 1u << best_at;
      mine = lane_best();
    }
  }
}

// One segment of WarpStatsKernel: its partials, the entropy's sum, z at the
// target, and its top-k list.
template <bool kFull, bool kPlain, bool kEntropy>
__device__ __forceinline__ void LpWarpSegment(const float* __restrict__ yr, std::int64_t n,
                                              int segments, int seg, std::int64_t row,
                                              std::int64_t c0, std::int64_t target,
                                              std::uint64_t floor, float floor_z,
                                              const LpRowParams& p, const LpRowState& s,
                                              const LpTopKLists& lists) {
  const std::int64_t start = static_cast<std::int64_t>(seg) * kCeSegmentColumns;
  row_reduce::WarpSegment z;
  row_reduce::LoadWarpSegment<kFull>(yr, n, start, z);
  row_reduce::ReduceWarpSegment<kFull, kPlain, kEntropy>(n, start, p.logit_softcap, p.temperature,
                                                         z);
  if (target >= c0 + start && target < c0 + start + kCeSegmentColumns) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        const std::int64_t col = start + row_reduce::WarpColumn(w, r);
        if (col < n && c0 + col == target) s.ce.target_z[row] = z.z[w][r];
      }
    }
  }
  if (row_reduce::Lane() == 0) {
    const std::int64_t at = row * segments + seg;
    s.ce.seg_max[at] = z.max;
    s.ce.seg_sum[at] = z.sum;
    if (kEntropy) s.seg_zsum[at] = z.zsum;
  }
  if (p.top_k == 0) return;
  std::uint64_t* out = lists.keys + (row * lists.row_lists + 1 + seg) * p.top_k;
  // A segment whose every z is below the floor's has no key above the floor
  // (NaN and ties with the floor's z count as candidates; WarpTopK then
  // drops the keys at or below the floor exactly): its list is empty.
  bool candidate = false;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const bool inside = kFull || start + row_reduce::WarpColumn(w, r) < n;
      candidate |= inside && !(z.z[w][r] < floor_z);
    }
  }
  if (!__any_sync(0xffffffffu, candidate)) {
    for (int j = row_reduce::Lane(); j < p.top_k; j += 32) out[j] = 0;
    return;
  }
  WarpTopK(z, n, start, c0, p.top_k, floor, out);
}

// StatsKernel's values under the warp launch (row_reduce.cuh), walking
// segments as the cross-entropy's WarpStatsKernel does.
// Two blocks per SM (128 registers, some spilled) ran the statistics 1.3 times faster on
// the H200 than one (177 registers unbounded).
__global__ void __launch_bounds__(kThreads, 2)
    WarpStatsKernel(const float* __restrict__ y, std::int64_t m, std::int64_t n, int segments,
                    int runs, std::int64_t c0, LpRowParams p, LpRowState s, LpTopKLists lists) {
  const auto [row, begin, end] = row_reduce::ThisWarpRun(segments, runs);
  if (row >= m) return;  // the whole warp
  const float* yr = y + row * n;
  const std::int64_t target = Counted(p, row) ? p.targets[row] : -1;
  const std::uint64_t floor = p.top_k > 0 ? TopKFloor(lists, row, p.top_k) : 0;
  // The floor's z, or -Inf while the row has fewer than top_k entries.
  const float floor_z = floor == 0 ? row_reduce::NegativeInfinity() : KeyZ(floor);
  const bool plain = p.logit_softcap == 0.0f && p.temperature == 1.0f;
  for (int seg = begin; seg < end; ++seg) {
    const bool full = static_cast<std::int64_t>(seg + 1) * kCeSegmentColumns <= n;
    if (full && plain && p.entropy) {
      LpWarpSegment<true, true, true>(yr, n, segments, seg, row, c0, target, floor, floor_z, p, s,
                                      lists);
    } else if (full && plain) {
      LpWarpSegment<true, true, false>(yr, n, segments, seg, row, c0, target, floor, floor_z, p, s,
                                       lists);
    } else if (p.entropy) {
      LpWarpSegment<false, false, true>(yr, n, segments, seg, row, c0, target, floor, floor_z, p, s,
                                        lists);
    } else {
      LpWarpSegment<false, false, false>(yr, n, segments, seg, row, c0, target, floor, floor_z, p,
                                         s, lists);
    }
  }
}

// One thread per row folds the chunk's segments in order, as the
// cross-entropy's CombineKernel does, and the entropy's sums beside.
__global__ void CombineKernel(std::int64_t m, int segments, LpRowParams p, LpRowState s) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  float run_max = s.ce.run_max[row];
  double run_sum = s.ce.run_sum[row];
  double run_zsum = s.run_zsum[row];
  for (int seg = 0; seg < segments; ++seg) {
    const std::int64_t at = row * segments + seg;
    const float seg_max = s.ce.seg_max[at];
    const double seg_sum = s.ce.seg_sum[at];
    const float next = fmaxf(run_max, seg_max);
    if (p.entropy) {
      run_zsum =
          ShiftZ(run_zsum, run_sum, run_max, next) + ShiftZ(s.seg_zsum[at], seg_sum, seg_max, next);
    }
    run_sum = row_reduce::FoldSum(run_sum, run_max, seg_sum, seg_max, next);
    run_max = next;
  }
  s.ce.run_max[row] = run_max;
  s.ce.run_sum[row] = run_sum;
  s.run_zsum[row] = run_zsum;
}

// CombineKernel's fold with a warp per row (row_reduce::kFullWarp's note).
__global__ void WarpCombineKernel(std::int64_t m, int segments, LpRowParams p, LpRowState s) {
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= m) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x & 31);
  float run_max = s.ce.run_max[row];
  double run_sum = s.ce.run_sum[row];
  double run_zsum = s.run_zsum[row];
  for (int base = 0; base < segments; base += 32) {
    float lane_max = 0.0f;
    double lane_sum = 0.0;
    double lane_zsum = 0.0;
    if (base + lane < segments) {
      const std::int64_t at = row * segments + base + lane;
      lane_max = s.ce.seg_max[at];
      lane_sum = s.ce.seg_sum[at];
      if (p.entropy) lane_zsum = s.seg_zsum[at];
    }
    const int count = segments - base < 32 ? segments - base : 32;
    for (int i = 0; i < count; ++i) {
      const float seg_max = __shfl_sync(row_reduce::kFullWarp, lane_max, i);
      const double seg_sum = __shfl_sync(row_reduce::kFullWarp, lane_sum, i);
      const double seg_zsum = __shfl_sync(row_reduce::kFullWarp, lane_zsum, i);
      const float next = fmaxf(run_max, seg_max);
      if (p.entropy) {
        run_zsum =
            ShiftZ(run_zsum, run_sum, run_max, next) + ShiftZ(seg_zsum, seg_sum, seg_max, next);
      }
      run_sum = row_reduce::FoldSum(run_sum, run_max, seg_sum, seg_max, next);
      run_max = next;
    }
  }
  if (lane == 0) {
    s.ce.run_max[row] = run_max;
    s.ce.run_sum[row] = run_sum;
    s.run_zsum[row] = run_zsum;
  }
}

// Block (row, g) merges lists [g * group, (g + 1) * group) of the row's
// `count` lists in src into list g of dst. With one block per row (count <=
// group) dst may be src's list 0: every key is read before any is written.
__global__ void __launch_bounds__(kThreads)
    MergeKernel(const std::uint64_t* src, std::int64_t src_stride, std::int64_t count,
                std::uint64_t* dst, std::int64_t dst_stride, int top_k, int list_slots, int group,
                int keys_per_block) {
  __shared__ std::uint64_t keys[kSortKeys];
  const std::int64_t groups = (count + group - 1) / group;
  const std::int64_t row = blockIdx.x / groups;
  const std::int64_t g = blockIdx.x % groups;
  for (int i = threadIdx.x; i < keys_per_block; i += kThreads) {
    const std::int64_t list = g * group + i / list_slots;
    const int j = i % list_slots;
    keys[i] = list < count && j < top_k ? src[row * src_stride + list * top_k + j] : 0;
  }
  __syncthreads();
  SortDescending(keys, keys_per_block);
  for (int j = threadIdx.x; j < top_k; j += kThreads) {
    dst[row * dst_stride + g * top_k + j] = keys[j];
  }
}

__global__ void FinalizeKernel(std::int64_t m, LpRowParams p, LpRowState s, float* logprob,
                               float* lse_out, float* entropy) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= m) return;
  const float run_max = s.ce.run_max[row];
  const double run_sum = s.ce.run_sum[row];
  const double lse = row_reduce::RowLse(run_max, run_sum);
  if (lse_out != nullptr) lse_out[row] = static_cast<float>(lse);
  if (logprob != nullptr) {
    logprob[row] =
        Counted(p, row) ? static_cast<float>(static_cast<double>(s.ce.target_z[row]) - lse) : 0.0f;
  }
  if (entropy != nullptr) {
    entropy[row] = isfinite(run_max) ? static_cast<float>(log(run_sum) - s.run_zsum[row] / run_sum)
                                     : __uint_as_float(0x7fc00000u);
  }
}

__global__ void TopKKernel(std::int64_t m, int top_k, LpRowState s, LpTopKLists lists,
                           std::int32_t* ids, float* logprobs) {
  const std::int64_t at = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at >= m * top_k) return;
  const std::int64_t row = at / top_k;
  const std::int64_t j = at % top_k;
  const std::uint64_t key = lists.keys[row * lists.row_lists * top_k + j];
  const double lse = row_reduce::RowLse(s.ce.run_max[row], s.ce.run_sum[row]);
  ids[at] = KeyId(key);
  logprobs[at] = static_cast<float>(static_cast<double>(KeyZ(key)) - lse);
}

__global__ void __launch_bounds__(kThreads)
    RankKernel(const float* __restrict__ y, std::int64_t n, int segments, std::int64_t c0,
               LpRowParams p, LpRowState s) {
  __shared__ int shared_count[kWarps];
  const std::int64_t row = blockIdx.x / segments;
  if (!Counted(p, row)) return;  // the whole block
  const int seg = static_cast<int>(blockIdx.x % segments);
  const std::int64_t first = static_cast<std::int64_t>(seg) * kCeSegmentColumns + threadIdx.x;
  const std::uint64_t target = Key(s.ce.target_z[row], p.targets[row]);
  const float* yr = y + row * n;
  int count = 0;
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const std::int64_t col = SegmentColumn(first, r);
    if (col < n) {
      const float z = row_reduce::LogitZ(yr[col], p.logit_softcap, p.temperature);
      count += Key(z, c0 + col) > target ? 1 : 0;
    }
  }
  const int total = BlockSum(count, shared_count);
  if (threadIdx.x == 0 && total > 0) {
    atomicAdd(&s.above[row], static_cast<unsigned long long>(total));
  }
}

// Slots per list in a merge block (top_k rounded up to a power of two) and
// lists per merge block.
int ListSlots(int top_k) {
  int slots = 1;
  while (slots < top_k) slots <<= 1;
  return slots;
}
int ListsPerBlock(int top_k) { return kSortKeys / ListSlots(top_k); }

// Merges each row's lists [0, count) of `lists` into its list 0.
cudaError_t MergeLists(std::int64_t m, std::int64_t count, int top_k, const LpTopKLists& lists,
                       cudaStream_t stream) {
  const int slots = ListSlots(top_k);
  const int group = ListsPerBlock(top_k);
  const std::uint64_t* src = lists.keys;
  std::int64_t src_stride = lists.row_lists * top_k;
  // Two halves of the merge scratch, used in turn between levels.
  const std::int64_t half = LpMergeKeys(m, lists.row_lists, top_k) / 2;
  int turn = 0;
  for (;;) {
    const std::int64_t groups = (count + group - 1) / group;
    std::uint64_t* dst = lists.keys;
    std::int64_t dst_stride = lists.row_lists * top_k;
    if (groups > 1) {
      dst = lists.merge + turn * half;
      dst_stride = groups * top_k;
      turn ^= 1;
    }
    int keys_per_block = slots;
    while (keys_per_block < std::min<std::int64_t>(count, group) * slots) keys_per_block <<= 1;
    if (m * groups > 0x7fffffff) return cudaErrorInvalidConfiguration;
    MergeKernel<<<static_cast<unsigned int>(m * groups), kThreads, 0, stream>>>(
        src, src_stride, count, dst, dst_stride, top_k, slots, group, keys_per_block);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess || groups == 1) return error;
    src = dst;
    src_stride = dst_stride;
    count = groups;
  }
}

}  // namespace

std::int64_t LpMergeKeys(std::int64_t m, std::int64_t row_lists, int top_k) {
  if (top_k <= 0) return 0;
  const std::int64_t group = ListsPerBlock(top_k);
  const std::int64_t groups = (row_lists + group - 1) / group;
  return groups > 1 ? 2 * m * groups * top_k : 0;
}

cudaError_t LaunchLpInit(std::int64_t m, const LpRowParams& params, const LpRowState& state,
                         const LpTopKLists& lists, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  InitKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(m, params, state, lists);
  return cudaGetLastError();
}

cudaError_t LaunchLpChunkStats(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                               const LpRowParams& params, const LpRowState& state,
                               const LpTopKLists& lists, cudaStream_t stream, CeLaunch launch) {
  int segments = 0;
  unsigned int blocks = 0;
  const bool warps = launch == CeLaunch::kWarps;
  int runs = 0;
  if (warps ? !row_reduce::WarpGrid(m, n, &segments, &runs, &blocks)
            : !ChunkGrid(m, n, &segments, &blocks)) {
    return cudaErrorInvalidConfiguration;
  }
  if (params.top_k > 0 && segments + 1 > lists.row_lists) return cudaErrorInvalidValue;
  if (warps) {
    WarpStatsKernel<<<blocks, kThreads, 0, stream>>>(y, m, n, segments, runs, c0, params, state,
                                                     lists);
  } else {
    StatsKernel<<<blocks, kThreads, 0, stream>>>(y, n, segments, c0, params, state, lists);
  }
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  if (warps) {
    WarpCombineKernel<<<row_reduce::WarpRowBlocks(m), kRowThreads, 0, stream>>>(m, segments, params,
                                                                                state);
  } else {
    CombineKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(m, segments, params, state);
  }
  error = cudaGetLastError();
  if (error != cudaSuccess || params.top_k == 0) return error;
  return MergeLists(m, segments + 1, params.top_k, lists, stream);
}

cudaError_t LaunchLpFinalize(std::int64_t m, const LpRowParams& params, const LpRowState& state,
                             const LpTopKLists& lists, float* logprob, float* lse, float* entropy,
                             std::int32_t* topk_ids, float* topk_logprobs, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  FinalizeKernel<<<RowBlocks(m), kRowThreads, 0, stream>>>(m, params, state, logprob, lse, entropy);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || params.top_k == 0) return error;
  TopKKernel<<<RowBlocks(m * params.top_k), kRowThreads, 0, stream>>>(m, params.top_k, state, lists,
                                                                      topk_ids, topk_logprobs);
  return cudaGetLastError();
}

cudaError_t LaunchLpRank(const float* y, std::int64_t m, std::int64_t n, std::int64_t c0,
                         const LpRowParams& params, const LpRowState& state, cudaStream_t stream) {
  int segments = 0;
  unsigned int blocks = 0;
  if (!ChunkGrid(m, n, &segments, &blocks)) return cudaErrorInvalidConfiguration;
  if (params.targets == nullptr || state.above == nullptr) return cudaErrorInvalidValue;
  RankKernel<<<blocks, kThreads, 0, stream>>>(y, n, segments, c0, params, state);
  return cudaGetLastError();
}

}  // namespace logitd::kernels::cuda

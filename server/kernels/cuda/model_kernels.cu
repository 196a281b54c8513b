// Device side of model_kernels.h. The sums are compute-bound (2·10¹²
// multiply-adds for the logits of 4,096 rows at V = 128,256 and K =
// 4,096): a thread block forms a tile of kTileRows × kTileCols outputs,
// each thread 8 × 4 of them in registers, from kStages groups of kDepth
// terms of both panels in flight in shared memory (asynchronous copies
// of 16 bytes). Every output's sum is sequential in t, each product fused
// with its addition (products of bf16 values are exact: the host's
// separate roundings give the same bits), and the tensor-core model steps
// at the end of each block of terms, where the host's does.
#include <cuda_pipeline.h>

#include <cstdint>

#include "logitd/reference/element_judgement.h"
#include "server/kernels/cuda/model_kernels.h"

namespace logitd::kernels::cuda {
namespace {

constexpr int kTileRows = 128, kTileCols = 64, kThreads = 256, kStages = 3;
constexpr int kDepth = judgement::kModelGroup;
constexpr int kBlock = judgement::kTensorCoreBlock;
static_assert(kDepth % kBlock == 0, "whole blocks a group");
static_assert(kTileRows == 16 * 8 && kTileCols == 16 * 4, "16 × 16 threads of 8 × 4 outputs");

// The pack: a 32 × 32 tile through shared memory, read along the operand's
// unit stride and written along the panel's.
constexpr int kPackTile = 32, kPackRowsPerPass = 8;

__global__ void PackModelPanelKernel(const double* __restrict__ x, std::int64_t s_i,
                                     std::int64_t s_t, std::int64_t count, std::int64_t n,
                                     std::int64_t padded_count, std::int64_t padded_terms,
                                     std::int64_t count_tiles, float* __restrict__ panel) {
  __shared__ float tile[kPackTile][kPackTile + 1];  // [t][i]
  const std::int64_t i0 = (blockIdx.x % count_tiles) * kPackTile;
  const std::int64_t t0 = (blockIdx.x / count_tiles) * kPackTile;
  const bool t_unit = s_t == 1 && s_i != 1;
  for (int r = threadIdx.y; r < kPackTile; r += kPackRowsPerPass) {
    const int il = t_unit ? r : threadIdx.x, tl = t_unit ? threadIdx.x : r;
    const std::int64_t i = i0 + il, t = t0 + tl;
    tile[tl][il] = i < count && t < n ? static_cast<float>(x[i * s_i + t * s_t]) : 0.0f;
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kPackTile; r += kPackRowsPerPass) {
    const std::int64_t t = t0 + r, i = i0 + threadIdx.x;
    if (t < padded_terms && i < padded_count) panel[t * padded_count + i] = tile[r][threadIdx.x];
  }
}

struct Stage {
  float a[kDepth][kTileRows];
  float b[kDepth][kTileCols];
};

// Where a thread's copies of a group come from and go: its two chunks of
// A's group and its one of B's, 16 bytes each (kThreads = kDepth ·
// kTileRows / 8 = kDepth · kTileCols / 4), advanced a group at a time.
struct Copies {
  const float* a0;
  const float* a1;
  const float* b;
  int a0_at, a1_at, b_at;  // floats into the stage's a and b
  std::int64_t a_step, b_step;

  __device__ Copies(const float* a, const float* b_panel, std::int64_t lda, std::int64_t ldb,
                    std::int64_t i0, std::int64_t j0) {
    constexpr int kAPerTerm = kTileRows / 4, kBPerTerm = kTileCols / 4;
    const int c0 = threadIdx.x, c1 = threadIdx.x + kThreads;
    a0_at = c0 / kAPerTerm * kTileRows + c0 % kAPerTerm * 4;
    a1_at = c1 / kAPerTerm * kTileRows + c1 % kAPerTerm * 4;
    b_at = c0 / kBPerTerm * kTileCols + c0 % kBPerTerm * 4;
    a0 = a + (c0 / kAPerTerm) * lda + i0 + c0 % kAPerTerm * 4;
    a1 = a + (c1 / kAPerTerm) * lda + i0 + c1 % kAPerTerm * 4;
    b = b_panel + (c0 / kBPerTerm) * ldb + j0 + c0 % kBPerTerm * 4;
    a_step = kDepth * lda;
    b_step = kDepth * ldb;
  }
  // Group g into `stage`.
  __device__ __forceinline__ void Load(std::int64_t g, Stage* stage) const {
    __pipeline_memcpy_async(&stage->a[0][0] + a0_at, a0 + g * a_step, 16);
    __pipeline_memcpy_async(&stage->a[0][0] + a1_at, a1 + g * a_step, 16);
    __pipeline_memcpy_async(&stage->b[0][0] + b_at, b + g * b_step, 16);
  }
};
static_assert(2 * kThreads * 4 == kDepth * kTileRows && kThreads * 4 == kDepth * kTileCols,
              "two copies of A and one of B a thread");

struct Sums {
  float acc[8][4], s1[8][4], s2[8][4];
};

// A group of terms: kFull a whole one (its blocks end at every kBlock-th
// term), else the last `left` terms of the sum (the panel's zeros past
// them leave the sums as they are; the last block ends at the last term).
template <bool kFull>
__device__ __forceinline__ void Group(const Stage& stage, int ty, int tx, int left, Sums* s) {
#pragma unroll
  for (int tl = 0; tl < kDepth; ++tl) {
    const float4 a0 = *reinterpret_cast<const float4*>(&stage.a[tl][ty * 8]);
    const float4 a1 = *reinterpret_cast<const float4*>(&stage.a[tl][ty * 8 + 4]);
    const float4 bv = *reinterpret_cast<const float4*>(&stage.b[tl][tx * 4]);
    const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      s->acc[r][0] = __fmaf_rn(av[r], bv.x, s->acc[r][0]);
      s->acc[r][1] = __fmaf_rn(av[r], bv.y, s->acc[r][1]);
      s->acc[r][2] = __fmaf_rn(av[r], bv.z, s->acc[r][2]);
      s->acc[r][3] = __fmaf_rn(av[r], bv.w, s->acc[r][3]);
    }
    const bool block_end = kFull ? tl % kBlock == kBlock - 1
                                 : tl < left && (tl % kBlock == kBlock - 1 || tl == left - 1);
    if (block_end) {
#pragma unroll
      for (int r = 0; r < 8; ++r) {
#pragma unroll
        for (int c = 0; c < 4; ++c) judgement::TensorCoreDrift(s->acc[r][c], &s->s1[r][c]);
      }
    }
  }
  // The group's spread, weighted by its blocks.
  const float blocks = static_cast<float>(kFull ? kDepth / kBlock : (left + kBlock - 1) / kBlock);
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int c = 0; c < 4; ++c) judgement::TensorCoreSpread(s->acc[r][c], blocks, &s->s2[r][c]);
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    ModelSumsKernel(const float* __restrict__ a, const float* __restrict__ b, std::int64_t lda,
                    std::int64_t ldb, std::int64_t row_tiles, std::int64_t rows, std::int64_t cols,
                    std::int64_t n, float* __restrict__ seq, double* __restrict__ tc) {
  __shared__ __align__(16) Stage stages[kStages];
  // Row tiles fastest: the blocks in flight share B's tiles.
  const std::int64_t i0 = (blockIdx.x % row_tiles) * kTileRows;
  const std::int64_t j0 = (blockIdx.x / row_tiles) * kTileCols;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;  // rows ty·8 .. +8, columns tx·4 .. +4
  Sums s;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int c = 0; c < 4; ++c) s.acc[r][c] = s.s1[r][c] = s.s2[r][c] = 0.0f;
  }
  const std::int64_t groups = (n + kDepth - 1) / kDepth;
  const Copies copies(a, b, lda, ldb, i0, j0);
#pragma unroll
  for (int g = 0; g < kStages - 1; ++g) {
    if (g < groups) copies.Load(g, &stages[g]);
    __pipeline_commit();
  }
  for (std::int64_t g = 0; g < groups; ++g) {
    __pipeline_wait_prior(kStages - 2);
    // Group g is in every thread's view, and every thread is done with
    // group g - 1, whose stage the next copy fills.
    __syncthreads();
    const std::int64_t next = g + kStages - 1;
    if (next < groups) copies.Load(next, &stages[next % kStages]);
    __pipeline_commit();
    const Stage& stage = stages[g % kStages];
    const std::int64_t left = n - g * kDepth;
    if (left >= kDepth) {
      Group<true>(stage, ty, tx, kDepth, &s);
    } else {
      Group<false>(stage, ty, tx, static_cast<int>(left), &s);
    }
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const std::int64_t i = i0 + ty * 8 + r;
    if (i >= rows) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const std::int64_t j = j0 + tx * 4 + c;
      if (j >= cols) continue;
      seq[i * cols + j] = s.acc[r][c];
      tc[i * cols + j] = judgement::TensorCoreError(s.s1[r][c], s.s2[r][c]);
    }
  }
}

std::int64_t RoundUp(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

ModelPanelShape ModelPanelShapeOf(std::int64_t rows, std::int64_t cols, std::int64_t n) {
  ModelPanelShape shape;
  shape.rows = RoundUp(rows, kTileRows);
  shape.cols = RoundUp(cols, kTileCols);
  shape.terms = RoundUp(n, kDepth);
  return shape;
}

cudaError_t LaunchPackModelPanel(const double* x, std::int64_t s_i, std::int64_t s_t,
                                 std::int64_t count, std::int64_t n, std::int64_t padded_count,
                                 std::int64_t padded_terms, float* panel, cudaStream_t stream) {
  if (padded_count <= 0 || padded_terms <= 0) return cudaSuccess;
  const std::int64_t count_tiles = (padded_count + kPackTile - 1) / kPackTile;
  const std::int64_t term_tiles = (padded_terms + kPackTile - 1) / kPackTile;
  PackModelPanelKernel<<<static_cast<unsigned int>(count_tiles * term_tiles),
                         dim3(kPackTile, kPackRowsPerPass), 0, stream>>>(
      x, s_i, s_t, count, n, padded_count, padded_terms, count_tiles, panel);
  return cudaGetLastError();
}

cudaError_t LaunchModelSums(const float* a_panel, const float* b_panel,
                            const ModelPanelShape& shape, std::int64_t rows, std::int64_t cols,
                            std::int64_t n, float* seq, double* tc, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const std::int64_t row_tiles = shape.rows / kTileRows, col_tiles = shape.cols / kTileCols;
  ModelSumsKernel<<<static_cast<unsigned int>(row_tiles * col_tiles), kThreads, 0, stream>>>(
      a_panel, b_panel, shape.rows, shape.cols, row_tiles, rows, cols, n, seq, tc);
  return cudaGetLastError();
}

}  // namespace logitd::kernels::cuda

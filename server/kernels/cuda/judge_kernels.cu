// Device side of judge_kernels.h. Memory-bound: each element reads its two
// doubles and the two outputs' values once; the counts gather in shared
// memory, the histogram's and the ULP buckets' through one atomic per
// group of lanes with the same bucket, and reach global memory once per
// thread block.
#include <cstdint>

#include "server/kernels/cuda/judge_kernels.h"

namespace logitd::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 2048;

struct Element {
  double candidate, own, reference, bound, p_bound, abs_sum;
  judgement::Judged judged;
};

__device__ __forceinline__ Element JudgeAt(const double* sum, const double* abs_sum,
                                           const void* candidate, const void* own, std::int64_t i,
                                           const judgement::ProductRule& rule) {
  Element e;
  std::uint32_t cb, ob;
  if (rule.bf16) {
    cb = static_cast<const std::uint16_t*>(candidate)[i];
    ob = static_cast<const std::uint16_t*>(own)[i];
    e.candidate = static_cast<double>(__uint_as_float(cb << 16));
    e.own = static_cast<double>(__uint_as_float(ob << 16));
  } else {
    cb = static_cast<const std::uint32_t*>(candidate)[i];
    ob = static_cast<const std::uint32_t*>(own)[i];
    e.candidate = static_cast<double>(__uint_as_float(cb));
    e.own = static_cast<double>(__uint_as_float(ob));
  }
  const judgement::ElementBounds b = judgement::ProductBounds(rule, sum[i], abs_sum[i]);
  e.reference = b.reference;
  e.bound = b.bound;
  e.p_bound = b.p_bound;
  e.abs_sum = abs_sum[i];
  e.judged = judgement::JudgeElement(rule.bf16, e.candidate, cb, e.own, ob, b);
  return e;
}

// One atomic per group of lanes that count into the same bucket (a bucket
// below 0: none).
__device__ __forceinline__ void AddToBucket(unsigned int* buckets, int bucket) {
  const unsigned int peers = __match_any_sync(0xffffffffu, bucket);
  const int leader = __ffs(peers) - 1;
  if (bucket >= 0 && static_cast<int>(threadIdx.x % 32) == leader) {
    atomicAdd(&buckets[bucket], static_cast<unsigned int>(__popc(peers)));
  }
}

__device__ __forceinline__ unsigned long long FractionBits(double f) {
  // NaN is not larger than anything (std::max keeps what it has).
  return f == f ? static_cast<unsigned long long>(__double_as_longlong(f)) : 0ull;
}

__global__ void JudgeKernel(const double* __restrict__ sum, const double* __restrict__ abs_sum,
                            const void* __restrict__ candidate, const void* __restrict__ own,
                            std::int64_t n, std::int64_t cols, judgement::ProductRule rule,
                            JudgeCounts* counts, unsigned int* row_outside) {
  __shared__ unsigned int histogram[judgement::kHistogramBins];
  __shared__ unsigned int ulp[judgement::kUlpBuckets];
  __shared__ unsigned int ulp_exact[judgement::kUlpBuckets];
  __shared__ unsigned int scalars[5];
  __shared__ unsigned long long maxima[5];
  for (int b = threadIdx.x; b < judgement::kUlpBuckets; b += blockDim.x) {
    ulp[b] = 0;
    ulp_exact[b] = 0;
  }
  if (threadIdx.x < judgement::kHistogramBins) histogram[threadIdx.x] = 0;
  if (threadIdx.x < 5) scalars[threadIdx.x] = 0;
  if (threadIdx.x < 5) maxima[threadIdx.x] = 0;
  __syncthreads();

  unsigned int outside = 0, outside_p = 0, own_outside_p = 0, bitwise = 0, mismatches = 0;
  unsigned long long max_ulp = 0, worst = 0, worst_p = 0, first_proven = 0, max_ulp_exact = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  // Every lane of a warp takes every step, so the bucket adds see whole
  // warps; lanes past the end count nothing.
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x; base < n;
       base += stride) {
    const std::int64_t i = base + threadIdx.x;
    int h = -1, u = -1, ue = -1;
    if (i < n) {
      const Element e = JudgeAt(sum, abs_sum, candidate, own, i, rule);
      const judgement::Judged& j = e.judged;
      h = judgement::HistogramBin(j.fraction);
      u = judgement::UlpBucket(j.ulp);
      ue = judgement::UlpBucket(j.ulp_exact);
      max_ulp_exact = max(max_ulp_exact, static_cast<unsigned long long>(j.ulp_exact));
      bitwise += j.bitwise_equal;
      mismatches += j.mismatch;
      own_outside_p += j.own_outside_probabilistic;
      max_ulp = max(max_ulp, static_cast<unsigned long long>(j.ulp));
      worst = max(worst, FractionBits(j.fraction));
      worst_p = max(worst_p, FractionBits(j.p_fraction));
      if (j.fraction > 1.0) {
        ++outside;
        first_proven = max(first_proven, ~static_cast<unsigned long long>(i));
      }
      if (j.p_fraction > 1.0) ++outside_p;
      if (j.fraction > 1.0 || j.p_fraction > 1.0) atomicAdd(&row_outside[i / cols], 1u);
    }
    AddToBucket(histogram, h);
    AddToBucket(ulp, u);
    AddToBucket(ulp_exact, ue);
  }
  atomicAdd(&scalars[0], outside);
  atomicAdd(&scalars[1], outside_p);
  atomicAdd(&scalars[2], own_outside_p);
  atomicAdd(&scalars[3], bitwise);
  atomicAdd(&scalars[4], mismatches);
  atomicMax(&maxima[0], max_ulp);
  atomicMax(&maxima[1], worst);
  atomicMax(&maxima[2], worst_p);
  atomicMax(&maxima[3], first_proven);
  atomicMax(&maxima[4], max_ulp_exact);
  __syncthreads();
  for (int b = threadIdx.x; b < judgement::kUlpBuckets; b += blockDim.x) {
    if (ulp[b] != 0) atomicAdd(&counts->ulp[b], static_cast<unsigned long long>(ulp[b]));
    if (ulp_exact[b] != 0) {
      atomicAdd(&counts->ulp_exact[b], static_cast<unsigned long long>(ulp_exact[b]));
    }
  }
  if (threadIdx.x < judgement::kHistogramBins && histogram[threadIdx.x] != 0) {
    atomicAdd(&counts->histogram[threadIdx.x],
              static_cast<unsigned long long>(histogram[threadIdx.x]));
  }
  if (threadIdx.x == 0) {
    unsigned long long* sums[5] = {&counts->outside, &counts->outside_probabilistic,
                                   &counts->own_outside_probabilistic, &counts->bitwise_equal,
                                   &counts->nan_inf_mismatches};
    for (int s = 0; s < 5; ++s) {
      if (scalars[s] != 0) atomicAdd(sums[s], static_cast<unsigned long long>(scalars[s]));
    }
    atomicMax(&counts->max_ulp, maxima[0]);
    atomicMax(&counts->worst_fraction_bits, maxima[1]);
    atomicMax(&counts->worst_probabilistic_fraction_bits, maxima[2]);
    atomicMax(&counts->first_proven_complement, maxima[3]);
    atomicMax(&counts->max_ulp_exact, maxima[4]);
  }
}

// One thread block a row: each thread counts its columns of the row into a
// ClassRow of its own (element_judgement.h), then the block merges them
// pairwise in shared memory.
constexpr int kClassThreads = 256;

__global__ void ClassRowsKernel(const double* __restrict__ sum, const double* __restrict__ abs_sum,
                                const void* __restrict__ candidate, const void* __restrict__ own,
                                const float* __restrict__ seq, const double* __restrict__ tc,
                                std::int64_t cols, judgement::ProductRule rule,
                                judgement::ClassRow* out) {
  // Raw storage: a __shared__ array of a class with member initializers
  // cannot be declared as such.
  __shared__ __align__(16) unsigned char storage[kClassThreads * sizeof(judgement::ClassRow)];
  judgement::ClassRow* part = reinterpret_cast<judgement::ClassRow*>(storage);
  const std::int64_t row = blockIdx.x;
  const float alpha = static_cast<float>(rule.scale_reference);
  const double scale = fabs(rule.scale_reference);
  const double floor = judgement::ClassFloor(rule.terms);
  judgement::ClassRow mine;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const std::int64_t i = row * cols + c;
    const Element e = JudgeAt(sum, abs_sum, candidate, own, i, rule);
    const float s = alpha == 1.0f ? seq[i] : judgement::MulF(alpha, seq[i]);
    const judgement::ClassTerms t = judgement::ClassTermsOf(
        rule.bf16, e.candidate, e.own, e.reference, scale * e.abs_sum, s, scale * tc[i], floor);
    judgement::ElementBounds b;
    b.reference = e.reference;
    b.bound = e.bound;
    b.p_bound = e.p_bound;
    judgement::AddToRow(&mine, t, i, e.candidate, e.own, b);
  }
  part[threadIdx.x] = mine;
  __syncthreads();
  for (int half = kClassThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) judgement::MergeRows(&part[threadIdx.x], part[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[row] = part[0];
}

// The models (accumulation_models.h) of C = A·B, A(i, t) = a[i·sa_i + t·sa_t]
// and B(t, j) = b[t·sb_t + j·sb_j] (bf16 values as doubles): a thread block
// a tile of kModelRows × kModelCols outputs, each thread 8 × 4 of them,
// kModelGroup terms a step, the tile's operands as fp32 in shared memory. Every output's sum is
// sequential in t, each product fused with its addition (exact products: the host's separate
// roundings give the same bits), and the tensor-core model steps at the end of each block of terms,
// where the host's does.
constexpr int kModelRows = 128, kModelCols = 64, kModelThreads = 256;
constexpr int kModelDepth = judgement::kModelGroup;
static_assert(kModelDepth % judgement::kTensorCoreBlock == 0, "whole blocks a tile");

__global__ void __launch_bounds__(kModelThreads)
    ModelSumsKernel(const double* __restrict__ a, std::int64_t sa_i, std::int64_t sa_t,
                    const double* __restrict__ b, std::int64_t sb_t, std::int64_t sb_j,
                    std::int64_t rows, std::int64_t cols, std::int64_t n, float* __restrict__ seq,
                    double* __restrict__ tc) {
  __shared__ float as[kModelDepth][kModelRows];
  __shared__ __align__(16) float bs[kModelDepth][kModelCols];
  const int tid = threadIdx.x;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * kModelRows;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kModelCols;
  const int ty = tid / 16, tx = tid % 16;  // rows ty·8 .. +8, columns tx·4 .. +4
  float acc[8][4], s1[8][4], s2[8][4];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = s1[r][c] = s2[r][c] = 0.0f;
  }
  for (std::int64_t t0 = 0; t0 < n; t0 += kModelDepth) {
    // The tile's operands, read along their unit stride.
    for (int e = tid; e < kModelRows * kModelDepth; e += kModelThreads) {
      const int il = sa_t == 1 ? e / kModelDepth : e % kModelRows;
      const int tl = sa_t == 1 ? e % kModelDepth : e / kModelRows;
      const std::int64_t i = i0 + il, t = t0 + tl;
      as[tl][il] = i < rows && t < n ? static_cast<float>(a[i * sa_i + t * sa_t]) : 0.0f;
    }
    for (int e = tid; e < kModelCols * kModelDepth; e += kModelThreads) {
      const int jl = sb_t == 1 ? e / kModelDepth : e % kModelCols;
      const int tl = sb_t == 1 ? e % kModelDepth : e / kModelCols;
      const std::int64_t j = j0 + jl, t = t0 + tl;
      bs[tl][jl] = j < cols && t < n ? static_cast<float>(b[t * sb_t + j * sb_j]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int tl = 0; tl < kModelDepth; ++tl) {
      float av[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) av[r] = as[tl][ty * 8 + r];
      const float4 bv = *reinterpret_cast<const float4*>(&bs[tl][tx * 4]);
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        acc[r][0] = __fmaf_rn(av[r], bv.x, acc[r][0]);
        acc[r][1] = __fmaf_rn(av[r], bv.y, acc[r][1]);
        acc[r][2] = __fmaf_rn(av[r], bv.z, acc[r][2]);
        acc[r][3] = __fmaf_rn(av[r], bv.w, acc[r][3]);
      }
      // The end of a block, or of the sum (past it the terms are zeros,
      // which leave the sums as they are).
      const std::int64_t t = t0 + tl;
      if (t < n && ((tl + 1) % judgement::kTensorCoreBlock == 0 || t == n - 1)) {
#pragma unroll
        for (int r = 0; r < 8; ++r) {
#pragma unroll
          for (int c = 0; c < 4; ++c) judgement::TensorCoreDrift(acc[r][c], &s1[r][c]);
        }
      }
    }
    // The group's spread, weighted by its blocks.
    const std::int64_t left = n - t0;
    const float blocks = static_cast<float>(
        ((left < kModelDepth ? left : kModelDepth) + judgement::kTensorCoreBlock - 1) /
        judgement::kTensorCoreBlock);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) judgement::TensorCoreSpread(acc[r][c], blocks, &s2[r][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const std::int64_t i = i0 + ty * 8 + r;
    if (i >= rows) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const std::int64_t j = j0 + tx * 4 + c;
      if (j >= cols) continue;
      seq[i * cols + j] = acc[r][c];
      tc[i * cols + j] = judgement::TensorCoreError(s1[r][c], s2[r][c]);
    }
  }
}

__global__ void CollectOutsideKernel(const double* __restrict__ sum,
                                     const double* __restrict__ abs_sum,
                                     const void* __restrict__ candidate,
                                     const void* __restrict__ own, std::int64_t first,
                                     std::int64_t last, judgement::ProductRule rule,
                                     JudgedElement* entries, unsigned int* count,
                                     unsigned int capacity) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = first + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < last; i += stride) {
    const Element e = JudgeAt(sum, abs_sum, candidate, own, i, rule);
    if (!(e.judged.fraction > 1.0 || e.judged.p_fraction > 1.0)) continue;
    const unsigned int slot = atomicAdd(count, 1u);
    if (slot >= capacity) continue;
    entries[slot] = JudgedElement{
        static_cast<long long>(i), e.candidate,        e.reference, e.bound, e.p_bound, e.own,
        e.judged.fraction,         e.judged.p_fraction};
  }
}

constexpr int kRowThreads = 512;

// The sum (or the largest, `max`) of every thread's value in the block,
// given to every thread.
__device__ double BlockReduce(double value, bool max, double* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const double other = __shfl_down_sync(0xffffffffu, value, offset);
    value = max ? fmax(value, other) : value + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the last reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kRowThreads / 32 ? scratch[lane] : (max ? -INFINITY : 0.0);
    for (int offset = 16; offset > 0; offset /= 2) {
      const double other = __shfl_down_sync(0xffffffffu, value, offset);
      value = max ? fmax(value, other) : value + other;
    }
    if (lane == 0) scratch[0] = value;
  }
  __syncthreads();
  return scratch[0];
}

// log Σ exp(z − mx) over the row's first n entries, z from logit(j, &z,
// &ez), given to every thread.
template <typename Logit>
__device__ double LogSumExp(const Logit& logit, std::int64_t n, double mx, double* scratch) {
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    s += exp(z - mx);
  }
  return log(BlockReduce(s, /*max=*/false, scratch));
}

__global__ void CeRowSumsKernel(const double* __restrict__ sum, const double* __restrict__ abs_sum,
                                std::int64_t cols, const std::int64_t* __restrict__ targets,
                                double gamma, double absolute, double cap, double gamma_sum,
                                RowClassModels models, judgement::CeRowSums* sums) {
  __shared__ double scratch[kRowThreads / 32];
  const std::int64_t row = blockIdx.x;
  const double* y = sum + row * cols;
  const double* y_abs = abs_sum + row * cols;
  const auto logit = [&](std::int64_t j, double* z, double* ez) {
    double f;
    judgement::CappedLogit(y[j], gamma * y_abs[j] + absolute, cap, z, &f, ez);
  };
  double mx = -INFINITY, b = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    mx = fmax(mx, z);
    b = fmax(b, ez);
  }
  mx = BlockReduce(mx, /*max=*/true, scratch);
  b = BlockReduce(b, /*max=*/true, scratch);
  const double log_s = LogSumExp(logit, cols, mx, scratch);
  const double lse = mx + log_s;
  // A logit's class envelope carried into z as its bound is.
  const std::int64_t offset = row * cols;
  const auto class_z = [&](std::int64_t j) {
    const double c = judgement::LogitClassEnvelope(y[j], y_abs[j], models.seq[offset + j],
                                                   models.tc[offset + j], models.floor);
    double z, f, cz;
    judgement::CappedLogit(y[j], c, cap, &z, &f, &cz);
    return cz;
  };
  const bool classed = models.seq != nullptr;
  double w = 0, lin = 0, mean_d = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    const double p = exp(z - lse);
    w += judgement::WeightedExpm1(z - lse, ez + judgement::ExpTermError(mx - z, b, gamma_sum));
    if (classed) {
      lin += p * class_z(j);
      mean_d += p * (mx - z);
    }
  }
  w = BlockReduce(w, /*max=*/false, scratch);
  if (classed) {
    lin = BlockReduce(lin, /*max=*/false, scratch);
    mean_d = BlockReduce(mean_d, /*max=*/false, scratch);
  }
  if (threadIdx.x == 0) {
    judgement::CeRowSums out;
    out.mx = mx;
    out.log_s = log_s;
    out.lse = lse;
    out.b = b;
    out.weighted = w;
    const std::int64_t t = targets[row];
    if (t >= 0 && t < cols) logit(t, &out.zt, &out.ezt);
    if (classed) {
      out.class_formed = true;
      out.class_lin = lin;
      out.class_mean_d = mean_d;
      if (t >= 0 && t < cols) out.class_zt = class_z(t);
    }
    sums[row] = out;
  }
}

// The entry of the block that comes first by judgement::LpBefore among
// every thread's (z, id) (id −1: none), given to every thread.
__device__ void BlockFirst(double* z, std::int64_t* id, double* z_scratch,
                           std::int64_t* id_scratch) {
  const auto take = [&](double oz, std::int64_t oid) {
    if (oid >= 0 && (*id < 0 || judgement::LpBefore(oz, oid, *z, *id))) {
      *z = oz;
      *id = oid;
    }
  };
  for (int offset = 16; offset > 0; offset /= 2) {
    const double oz = __shfl_down_sync(0xffffffffu, *z, offset);
    const std::int64_t oid = __shfl_down_sync(0xffffffffu, *id, offset);
    take(oz, oid);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the scratch may still be read from the last round
  if (lane == 0) {
    z_scratch[warp] = *z;
    id_scratch[warp] = *id;
  }
  __syncthreads();
  if (warp == 0) {
    *z = lane < kRowThreads / 32 ? z_scratch[lane] : 0.0;
    *id = lane < kRowThreads / 32 ? id_scratch[lane] : -1;
    for (int offset = 16; offset > 0; offset /= 2) {
      const double oz = __shfl_down_sync(0xffffffffu, *z, offset);
      const std::int64_t oid = __shfl_down_sync(0xffffffffu, *id, offset);
      take(oz, oid);
    }
    if (lane == 0) {
      z_scratch[0] = *z;
      id_scratch[0] = *id;
    }
  }
  __syncthreads();
  *z = z_scratch[0];
  *id = id_scratch[0];
}

__global__ void LpRowSumsKernel(const double* __restrict__ sum, const double* __restrict__ abs_sum,
                                std::int64_t cols, std::int64_t vocab,
                                const std::int64_t* __restrict__ targets, double gamma,
                                double absolute, double cap, double temperature, double gamma_sum,
                                std::int64_t order_cols, const std::int64_t* __restrict__ ids,
                                std::int64_t ids_k, RowClassModels models,
                                judgement::LpRowSums* sums, std::int64_t* order, double* order_z,
                                double* ids_z) {
  __shared__ double scratch[kRowThreads / 32];
  __shared__ std::int64_t id_scratch[kRowThreads / 32];
  const std::int64_t row = blockIdx.x;
  const double* y = sum + row * cols;
  const double* y_abs = abs_sum + row * cols;
  const auto logit = [&](std::int64_t j, double* z, double* ez) {
    judgement::LpLogit(y[j], gamma * y_abs[j] + absolute, cap, temperature, /*rounded=*/true, z,
                       ez);
  };
  // B and the largest z.
  double mx = -INFINITY, b = 0;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    mx = fmax(mx, z);
    b = fmax(b, ez);
  }
  mx = BlockReduce(mx, /*max=*/true, scratch);
  b = BlockReduce(b, /*max=*/true, scratch);
  const double log_s = LogSumExp(logit, vocab, mx, scratch);
  const double lse = mx + log_s;
  const std::int64_t t = targets[row];
  const bool has_target = t >= 0 && t < vocab;
  double zt = 0, ezt = 0;
  if (has_target) logit(t, &zt, &ezt);
  const std::int64_t offset = row * cols;
  const auto class_z = [&](std::int64_t j) {
    const double c = judgement::LogitClassEnvelope(y[j], y_abs[j], models.seq[offset + j],
                                                   models.tc[offset + j], models.floor);
    double z, cz;
    judgement::LpLogit(y[j], c, cap, temperature, /*rounded=*/true, &z, &cz);
    return cz;
  };
  const bool classed = models.seq != nullptr;
  double lin = 0, lin_d = 0;
  double w = 0, w_ez = 0, w_lez = 0, eval_h = 0, mean_d = 0, h = 0, rank = 0, low = 0, high = 0;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    const double p = exp(z - lse);
    const double d = mx - z;
    const double a = lse - z;
    if (classed) {
      const double cz = class_z(j);
      lin += p * cz;
      lin_d += p * a * cz;
    }
    w += judgement::WeightedExpm1(z - lse, ez + judgement::ExpTermError(d, b, gamma_sum));
    w_ez += p * ez;
    w_lez += p * a * ez;
    if (a > 0)
      eval_h += a * judgement::WeightedExpm1(z - lse, judgement::EntropyTermError(a, b, gamma_sum));
    mean_d += p * d;
    h += p * a;
    if (has_target && j != t) {
      rank += judgement::LpBefore(z, j, zt, t) ? 1 : 0;
      low += z > zt + 2 * b ? 1 : 0;
      high += z >= zt - 2 * b ? 1 : 0;
    }
  }
  w = BlockReduce(w, /*max=*/false, scratch);
  w_ez = BlockReduce(w_ez, /*max=*/false, scratch);
  w_lez = BlockReduce(w_lez, /*max=*/false, scratch);
  eval_h = BlockReduce(eval_h, /*max=*/false, scratch);
  mean_d = BlockReduce(mean_d, /*max=*/false, scratch);
  h = BlockReduce(h, /*max=*/false, scratch);
  rank = BlockReduce(rank, /*max=*/false, scratch);
  low = BlockReduce(low, /*max=*/false, scratch);
  high = BlockReduce(high, /*max=*/false, scratch);
  if (classed) {
    lin = BlockReduce(lin, /*max=*/false, scratch);
    lin_d = BlockReduce(lin_d, /*max=*/false, scratch);
  }
  if (threadIdx.x == 0) {
    judgement::LpRowSums out;
    if (classed) {
      out.class_formed = true;
      out.class_lin = lin;
      out.class_lin_d = lin_d;
      if (has_target) out.class_zt = class_z(t);
    }
    out.b = b;
    out.mx = mx;
    out.log_s = log_s;
    out.lse = lse;
    out.weighted = w;
    out.weighted_ez = w_ez;
    out.weighted_lez = w_lez;
    out.eval_h = eval_h;
    out.mean_d = mean_d;
    out.entropy = h;
    if (has_target) {
      out.zt = zt;
      out.ezt = ezt;
      out.rank = static_cast<std::int64_t>(rank);
      out.low = static_cast<std::int64_t>(low);
      out.high = static_cast<std::int64_t>(high);
    }
    sums[row] = out;
  }
  // The first order_cols entries, one pass each: the first of those after
  // the last one taken.
  double last_z = 0;
  std::int64_t last_id = -1;
  for (std::int64_t p = 0; p < order_cols; ++p) {
    double best_z = 0;
    std::int64_t best_id = -1;
    for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      double z, ez;
      logit(j, &z, &ez);
      if (last_id >= 0 && !judgement::LpBefore(last_z, last_id, z, j)) continue;
      if (best_id < 0 || judgement::LpBefore(z, j, best_z, best_id)) {
        best_z = z;
        best_id = j;
      }
    }
    BlockFirst(&best_z, &best_id, scratch, id_scratch);
    if (threadIdx.x == 0) {
      order[row * order_cols + p] = best_id;
      order_z[row * order_cols + p] = best_z;
    }
    last_z = best_z;
    last_id = best_id;
  }
  if (ids == nullptr) return;
  const std::int64_t* row_ids = ids + row * ids_k;
  for (std::int64_t p = threadIdx.x; p < ids_k; p += blockDim.x) {
    const std::int64_t id = row_ids[p];
    bool valid = id >= 0 && id < vocab;
    for (std::int64_t q = 0; q < p && valid; ++q) valid = row_ids[q] != id;
    double z = NAN, ez;
    if (valid) logit(id, &z, &ez);
    ids_z[row * ids_k + p] = z;
  }
}

unsigned int Blocks(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

}  // namespace

cudaError_t LaunchCeRowSums(const double* sum, const double* abs_sum, std::int64_t rows,
                            std::int64_t cols, const std::int64_t* targets, double gamma,
                            double absolute, double cap, double gamma_sum,
                            const RowClassModels& models, judgement::CeRowSums* sums,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  CeRowSumsKernel<<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
      sum, abs_sum, cols, targets, gamma, absolute, cap, gamma_sum, models, sums);
  return cudaGetLastError();
}

cudaError_t LaunchLpRowSums(const double* sum, const double* abs_sum, std::int64_t rows,
                            std::int64_t cols, std::int64_t vocab, const std::int64_t* targets,
                            double gamma, double absolute, double cap, double temperature,
                            double gamma_sum, std::int64_t order_cols, const std::int64_t* ids,
                            std::int64_t ids_k, const RowClassModels& models,
                            judgement::LpRowSums* sums, std::int64_t* order, double* order_z,
                            double* ids_z, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  LpRowSumsKernel<<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
      sum, abs_sum, cols, vocab, targets, gamma, absolute, cap, temperature, gamma_sum, order_cols,
      ids, ids_k, models, sums, order, order_z, ids_z);
  return cudaGetLastError();
}

cudaError_t LaunchModelSums(const double* a, std::int64_t sa_i, std::int64_t sa_t, const double* b,
                            std::int64_t sb_t, std::int64_t sb_j, std::int64_t rows,
                            std::int64_t cols, std::int64_t n, float* seq, double* tc,
                            cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>((cols + kModelCols - 1) / kModelCols),
                  static_cast<unsigned int>((rows + kModelRows - 1) / kModelRows));
  ModelSumsKernel<<<grid, kModelThreads, 0, stream>>>(a, sa_i, sa_t, b, sb_t, sb_j, rows, cols, n,
                                                      seq, tc);
  return cudaGetLastError();
}

cudaError_t LaunchClassRows(const double* sum, const double* abs_sum, const void* candidate,
                            const void* own, const float* seq, const double* tc, std::int64_t rows,
                            std::int64_t cols, const judgement::ProductRule& rule,
                            judgement::ClassRow* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  ClassRowsKernel<<<static_cast<unsigned int>(rows), kClassThreads, 0, stream>>>(
      sum, abs_sum, candidate, own, seq, tc, cols, rule, out);
  return cudaGetLastError();
}

cudaError_t LaunchJudge(const double* sum, const double* abs_sum, const void* candidate,
                        const void* own, std::int64_t rows, std::int64_t cols,
                        const judgement::ProductRule& rule, JudgeCounts* counts,
                        unsigned int* row_outside, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  JudgeKernel<<<Blocks(n), kThreads, 0, stream>>>(sum, abs_sum, candidate, own, n, cols, rule,
                                                  counts, row_outside);
  return cudaGetLastError();
}

cudaError_t LaunchCollectOutside(const double* sum, const double* abs_sum, const void* candidate,
                                 const void* own, std::int64_t first, std::int64_t last,
                                 const judgement::ProductRule& rule, JudgedElement* entries,
                                 unsigned int* count, unsigned int capacity, cudaStream_t stream) {
  if (last <= first) return cudaSuccess;
  CollectOutsideKernel<<<Blocks(last - first), kThreads, 0, stream>>>(
      sum, abs_sum, candidate, own, first, last, rule, entries, count, capacity);
  return cudaGetLastError();
}

}  // namespace logitd::kernels::cuda

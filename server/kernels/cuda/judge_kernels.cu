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

// A thread block's counts in shared memory added into *counts, once per
// block (after every thread's are in).
__device__ void FlushCounts(const unsigned int* histogram, const unsigned int* ulp,
                            const unsigned int* ulp_exact, const unsigned int* scalars,
                            const unsigned long long* maxima, JudgeCounts* counts) {
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
  FlushCounts(histogram, ulp, ulp_exact, scalars, maxima, counts);
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

// A row's largest z and largest bound of a z (B), over its first n entries.
struct RowMax {
  double mx, b;
};
template <typename Logit>
__device__ RowMax RowMaxOf(const Logit& logit, std::int64_t n, double* scratch) {
  double mx = -INFINITY, b = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    mx = fmax(mx, z);
    b = fmax(b, ez);
  }
  return RowMax{BlockReduce(mx, /*max=*/true, scratch), BlockReduce(b, /*max=*/true, scratch)};
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
  const RowMax r = RowMaxOf(logit, cols, scratch);
  const double mx = r.mx, b = r.b;
  const double log_s = LogSumExp(logit, cols, mx, scratch);
  const double lse = mx + log_s;
  // A logit's class envelope carried into z as its bound is.
  const std::int64_t model_row = models.rows != nullptr ? models.rows[row] : row;
  const std::int64_t offset = model_row * cols;
  const auto class_z = [&](std::int64_t j) {
    const double c = judgement::LogitClassEnvelope(y[j], y_abs[j], models.seq[offset + j],
                                                   models.tc[offset + j], models.floor);
    double z, f, cz;
    judgement::CappedLogit(y[j], c, cap, &z, &f, &cz);
    return cz;
  };
  const bool classed = models.seq != nullptr && model_row >= 0;
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

// A LogProbs row's sums over its entries: each thread's share, then the
// block's (Reduce, in this order on every call: the same bits each time).
struct LpTerms {
  double lin = 0, lin_d = 0;
  double w = 0, w_ez = 0, w_lez = 0, eval_h = 0, mean_d = 0, h = 0, rank = 0, low = 0, high = 0;

  __device__ void Reduce(bool classed, double* scratch) {
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
  }
  // The row's sums as the host reads them (the target's when it has one),
  // with its largest error bound b, largest z, log Σ exp(z − mx) and lse.
  __device__ judgement::LpRowSums Out(bool has_target, double zt, double ezt, double b, double mx,
                                      double log_s, double lse) const {
    judgement::LpRowSums out;
    out.b = b;
    out.mx = mx;
    out.log_s = log_s;
    out.lse = lse;
    out.class_lin = lin;
    out.class_lin_d = lin_d;
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
    return out;
  }
};

// The first order_cols entries of a row's order (judgement::LpBefore), one
// pass over the row each: the first of those after the last one taken.
template <typename Logit>
__device__ void WriteOrder(const Logit& logit, std::int64_t vocab, std::int64_t order_cols,
                           std::int64_t row, std::int64_t* order, double* order_z, double* scratch,
                           std::int64_t* id_scratch) {
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
}

// The z of each of a row's ids (NaN for one out of range or repeated).
template <typename Logit>
__device__ void WriteIdsZ(const Logit& logit, std::int64_t vocab, const std::int64_t* row_ids,
                          std::int64_t ids_k, double* row_ids_z) {
  for (std::int64_t p = threadIdx.x; p < ids_k; p += blockDim.x) {
    const std::int64_t id = row_ids[p];
    bool valid = id >= 0 && id < vocab;
    for (std::int64_t q = 0; q < p && valid; ++q) valid = row_ids[q] != id;
    double z = NAN, ez;
    if (valid) logit(id, &z, &ez);
    row_ids_z[p] = z;
  }
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
  const RowMax r = RowMaxOf(logit, vocab, scratch);
  const double mx = r.mx, b = r.b;
  const double log_s = LogSumExp(logit, vocab, mx, scratch);
  const double lse = mx + log_s;
  const std::int64_t t = targets[row];
  const bool has_target = t >= 0 && t < vocab;
  double zt = 0, ezt = 0;
  if (has_target) logit(t, &zt, &ezt);
  const std::int64_t model_row = models.rows != nullptr ? models.rows[row] : row;
  const std::int64_t offset = model_row * cols;
  const auto class_z = [&](std::int64_t j) {
    const double c = judgement::LogitClassEnvelope(y[j], y_abs[j], models.seq[offset + j],
                                                   models.tc[offset + j], models.floor);
    double z, cz;
    judgement::LpLogit(y[j], c, cap, temperature, /*rounded=*/true, &z, &cz);
    return cz;
  };
  const bool classed = models.seq != nullptr && model_row >= 0;
  LpTerms terms;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    double z, ez;
    logit(j, &z, &ez);
    const double p = exp(z - lse);
    const double d = mx - z;
    const double a = lse - z;
    if (classed) {
      const double cz = class_z(j);
      terms.lin += p * cz;
      terms.lin_d += p * a * cz;
    }
    terms.w += judgement::WeightedExpm1(z - lse, ez + judgement::ExpTermError(d, b, gamma_sum));
    terms.w_ez += p * ez;
    terms.w_lez += p * a * ez;
    if (a > 0) {
      terms.eval_h +=
          a * judgement::WeightedExpm1(z - lse, judgement::EntropyTermError(a, b, gamma_sum));
    }
    terms.mean_d += p * d;
    terms.h += p * a;
    if (has_target && j != t) {
      terms.rank += judgement::LpBefore(z, j, zt, t) ? 1 : 0;
      terms.low += z > zt + 2 * b ? 1 : 0;
      terms.high += z >= zt - 2 * b ? 1 : 0;
    }
  }
  terms.Reduce(classed, scratch);
  if (threadIdx.x == 0) {
    judgement::LpRowSums out = terms.Out(has_target, zt, ezt, b, mx, log_s, lse);
    out.class_formed = classed;
    if (classed && has_target) out.class_zt = class_z(t);
    sums[row] = out;
  }
  WriteOrder(logit, vocab, order_cols, row, order, order_z, scratch, id_scratch);
  if (ids != nullptr) WriteIdsZ(logit, vocab, ids + row * ids_k, ids_k, ids_z + row * ids_k);
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

cudaError_t LaunchLpRowSums(const LpRowSumsArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  LpRowSumsKernel<<<static_cast<unsigned int>(a.rows), kRowThreads, 0, stream>>>(
      a.sum, a.abs_sum, a.cols, a.vocab, a.targets, a.gamma, a.absolute, a.cap, a.temperature,
      a.gamma_sum, a.order_cols, a.ids, a.ids_k, a.models, a.sums, a.order, a.order_z, a.ids_z);
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

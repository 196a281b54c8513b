// The per-element judgement of Verify on the device, where the fp64
// products are formed (fp64_products.h): each candidate element against its
// reference and bounds and against logitd's own value, counted the way
// CandidateCheck counts it on the host (logitd/reference/
// element_judgement.h, which both compile), so that only the counts and a
// few reported elements cross the link instead of the references.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "logitd/reference/token_judgement.h"

namespace logitd::kernels::cuda {

// A block's counts on the device, zeroed before each block.
struct JudgeCounts {
  unsigned long long outside;
  unsigned long long outside_probabilistic;
  unsigned long long own_outside_probabilistic;
  unsigned long long bitwise_equal;
  unsigned long long nan_inf_mismatches;
  unsigned long long max_ulp;
  // The bits of the largest fractions (non-negative doubles order as their
  // bits do).
  unsigned long long worst_fraction_bits;
  unsigned long long worst_probabilistic_fraction_bits;
  // ~position of the first element outside its proven bound: 0 when none.
  unsigned long long first_proven_complement;
  unsigned long long histogram[judgement::kHistogramBins];
  unsigned long long ulp[judgement::kUlpBuckets];
  // Against the exact value correctly rounded to the dtype.
  unsigned long long max_ulp_exact;
  unsigned long long ulp_exact[judgement::kUlpBuckets];
};

// An element outside a bound, as collected.
struct JudgedElement {
  long long position;  // in the block: row · cols + column
  double candidate;
  double reference;
  double bound;
  double probabilistic_bound;
  double own;
  double fraction;
  double probabilistic_fraction;
};

// The block [rows, cols]: sum and abs_sum are the fp64 products and their
// sums of magnitudes, candidate and own its elements in the rule's dtype
// (fp32, or bf16 when rule.bf16). Adds into *counts and, per row, the
// elements outside either bound into row_outside[row].
cudaError_t LaunchJudge(const double* sum, const double* abs_sum, const void* candidate,
                        const void* own, std::int64_t rows, std::int64_t cols,
                        const judgement::ProductRule& rule, JudgeCounts* counts,
                        unsigned int* row_outside, cudaStream_t stream);

// Each row's counts of the precision-class test (element_judgement.h,
// ClassRow) over the block [rows, cols] as LaunchJudge judges it, with the
// models seq and tc: out[r] (top1_index a position in the block). One
// thread block a row.
cudaError_t LaunchClassRows(const double* sum, const double* abs_sum, const void* candidate,
                            const void* own, const float* seq, const double* tc, std::int64_t rows,
                            std::int64_t cols, const judgement::ProductRule& rule,
                            judgement::ClassRow* out, cudaStream_t stream);

// The elements at positions [first, last) of the same block that lie
// outside either bound, appended at entries[*count] in no
// particular order while *count < capacity (*count goes on counting past
// it).
cudaError_t LaunchCollectOutside(const double* sum, const double* abs_sum, const void* candidate,
                                 const void* own, std::int64_t first, std::int64_t last,
                                 const judgement::ProductRule& rule, JudgedElement* entries,
                                 unsigned int* count, unsigned int capacity, cudaStream_t stream);

// The models of the logits of a block of rows (LaunchModelSums: seq and tc
// [rows, cols]) and the class floor of their sums, from which the row
// kernels form the precision-class sums (judgement::LogitClassEnvelope);
// seq null: none. With `rows` (device, [rows]), row r's models are row
// rows[r] of seq and tc, none where it is −1; null: row r's are row r.
struct RowClassModels {
  const float* seq = nullptr;
  const double* tc = nullptr;
  double floor = 0;
  const std::int32_t* rows = nullptr;
};

// The cross-entropy's softmax sums of each row of the logits sum [rows,
// cols] with bounds gamma·abs_sum + absolute, soft-capped at `cap` (0:
// not): sums[r] (element_judgement.h, CeRowSums; gamma_sum = γ_V of the
// candidate's sum of exponentials), with the z of targets[r] when it lies in
// [0, cols). One thread block a row.
cudaError_t LaunchCeRowSums(const double* sum, const double* abs_sum, std::int64_t rows,
                            std::int64_t cols, const std::int64_t* targets, double gamma,
                            double absolute, double cap, double gamma_sum,
                            const RowClassModels& models, judgement::CeRowSums* sums,
                            cudaStream_t stream);

// LogProbs' sums of each row of the logits sum [rows, cols] (bounds
// gamma·abs_sum + absolute) over its first `vocab` entries, z from
// judgement::LpLogit at `cap` and `temperature` (gamma_sum = γ_vocab of the
// candidate's sums): sums[r] with the z and ranks of targets[r] (none when
// outside [0, vocab)); the row's first order_cols entries by
// judgement::LpBefore into order and order_z [rows, order_cols]; and, when
// ids is not null, the z of ids [rows, ids_k] into ids_z (NaN for an id
// outside [0, vocab) or repeated in its row). One thread block a row.
struct LpRowSumsArgs {
  const double* sum = nullptr;
  const double* abs_sum = nullptr;
  std::int64_t rows = 0, cols = 0, vocab = 0;
  const std::int64_t* targets = nullptr;
  double gamma = 0, absolute = 0, cap = 0, temperature = 1, gamma_sum = 0;
  std::int64_t order_cols = 0;
  const std::int64_t* ids = nullptr;
  std::int64_t ids_k = 0;
  RowClassModels models;
  judgement::LpRowSums* sums = nullptr;
  std::int64_t* order = nullptr;
  double* order_z = nullptr;
  double* ids_z = nullptr;
};
cudaError_t LaunchLpRowSums(const LpRowSumsArgs& a, cudaStream_t stream);

}  // namespace logitd::kernels::cuda

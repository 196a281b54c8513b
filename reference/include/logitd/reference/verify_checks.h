// The checks behind Verify: a candidate output of the LM head's products,
// from any implementation, held element by element against the fp64
// reference of the exact products of its bf16 inputs, the proven bound
// (bounds.h) and logitd's own output of the same inputs (CandidateCheck).
// The references are formed a block of rows at a time (OpenBLAS dgemm), so
// no [M, V] of doubles is ever held whole; the elements whose operands
// include a NaN or an infinity are formed again one by one, as IEEE 754
// says they are, which a dgemm need not.
#pragma once

#include <cstdint>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/reference/candidate_check.h"
#include "logitd/tensor.h"

namespace logitd {

// The inputs of a check, as raw row-major arrays.
struct LmHeadInputs {
  const Bf16Bits* x = nullptr;  // [m, k]
  const Bf16Bits* w = nullptr;  // [v, k]
  // dY [m, v], fp32 or bf16 (backward only).
  const void* dy = nullptr;
  DType dy_dtype = DType::kFp32;
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
};

// Rows of M to check: all of them when empty.
using CheckedRows = std::vector<std::int64_t>;

// About `count` rows of m, evenly spaced, the first and the last included;
// all of them when count is 0 or at least m.
CheckedRows SampleRows(std::int64_t m, std::int64_t count);

// Y [m, v] = alpha . X . W^T, the candidate and logitd's own in `dtype`
// (fp32 or bf16). The bound: |alpha| times the sum's (γ_K fp32 and fp64 of
// Σ|x·w|), one fp32 rounding of the scaled value when alpha is not 1, and
// a bf16 output's rounding.
void CheckLogits(const LmHeadInputs& in, float alpha, const CheckedRows& rows,
                 const void* candidate, const void* own, DType dtype, CandidateCheck* check);
// dX [m, k] = G . W with G = bf16(dY) rounded to nearest even once; the
// bound of a sum of V products.
void CheckGradInput(const LmHeadInputs& in, const CheckedRows& rows, const void* candidate,
                    const void* own, DType dtype, CandidateCheck* check);
// dW [v, k] = G^T . X, every row of M feeding every element; the bound of a
// sum of M products.
void CheckGradWeight(const LmHeadInputs& in, const void* candidate, const void* own, DType dtype,
                     CandidateCheck* check);

}  // namespace logitd

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
#include <functional>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/reference/candidate_check.h"
#include "logitd/tensor.h"

namespace logitd {

class Fp64Products;

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
  // Where the fp64 products X·Wᵀ and G·W are formed (fp64_products.h):
  // null for OpenBLAS on the host.
  Fp64Products* products = nullptr;

  // Logits' inputs (no dY).
  static LmHeadInputs Forward(const Bf16Bits* x, const Bf16Bits* w, std::int64_t m, std::int64_t v,
                              std::int64_t k) {
    LmHeadInputs in;
    in.x = x;
    in.w = w;
    in.m = m;
    in.v = v;
    in.k = k;
    return in;
  }
};

// Rows of M to check: all of them when empty.
using CheckedRows = std::vector<std::int64_t>;

// `count` rows of m in increasing order, all of them when count is 0 or at
// least m. With seed 0 evenly spaced, the first and the last always
// included (so a count of 1 or 2 gives those two); else drawn uniformly
// without replacement by a splitmix64 stream of that seed (the same rows
// on every platform).
CheckedRows SampleRows(std::int64_t m, std::int64_t count, std::uint64_t seed = 0);

// The most tokens the precision-class test of the per-token outputs takes
// in one call (docs/PROTOCOL.md, "The precision-class test of the
// per-token outputs"): their envelopes need the models of every logit of
// their rows, an fp32 pass over M·V·K products.
inline constexpr std::int64_t kClassTokens = 512;
// The rows of m whose per-token outputs that test takes: every row when m
// is at most `cap` (then empty); else a mask [m] of `cap` rows drawn
// uniformly without replacement by SampleRows' splitmix64 stream of a
// seed mixed from `seed`, first among the rows with a counted target
// (targets[i] != ignore_index; every row when targets is null), then, when
// fewer than `cap` are counted, among the others. The same rows on every
// platform.
std::vector<std::uint8_t> ClassTokenRows(const std::int64_t* targets, std::int64_t m,
                                         std::int64_t ignore_index, std::int64_t cap,
                                         std::uint64_t seed);

// Asked between blocks of rows: true stops a check early (a caller that
// went away), which then returns false. Empty: never.
using StopCheck = std::function<bool()>;

// Y [m, v] = alpha . X . W^T, the candidate and logitd's own in `dtype`
// (fp32 or bf16). The proven bound: |alpha| times the sum's (γ_K fp32 and
// fp64 of Σ|x·w|; γ_{K+2} for fp32 when alpha is not 1, covering the
// scale's rounding whether it scales the sum or an operand), and a bf16
// output's rounding; the probabilistic bound the same with γ̃ for fp32.
bool CheckLogits(const LmHeadInputs& in, float alpha, const CheckedRows& rows,
                 const void* candidate, const void* own, DType dtype, CandidateCheck* check,
                 const StopCheck& stop = {});
// dX [m, k] = G . W with G = bf16(dY) rounded to nearest even once; the
// bound of a sum of V products.
bool CheckGradInput(const LmHeadInputs& in, const CheckedRows& rows, const void* candidate,
                    const void* own, DType dtype, CandidateCheck* check,
                    const StopCheck& stop = {});
// dW [v, k] = G^T . X, every row of M feeding every element; the bound of a
// sum of M products.
bool CheckGradWeight(const LmHeadInputs& in, const void* candidate, const void* own, DType dtype,
                     CandidateCheck* check, const StopCheck& stop = {});

// A per-token output of the cross-entropy or LogProbs (fp32 [M]; with
// `rows`, reference j is row rows[j]) against its reference's values,
// proven bounds and precision-class envelopes (empty: a reduced loss,
// held to its bound only), judged by the precision-class test of the
// per-token outputs with at most `independent` independent errors
// (DistinctTokens); `drawn_from` > 0: the envelopes were formed for a draw
// of the tokens (ClassTokenRows) out of that many.
void CheckTokenValues(const std::vector<double>& values, const std::vector<double>& bounds,
                      const std::vector<double>& envelopes, const CheckedRows& rows,
                      const float* candidate, const float* own, std::int64_t independent,
                      CandidateCheck* check, std::int64_t drawn_from = 0);
// The cross-entropy's pre-cast gradient, gathered whole from
// ReferenceCrossEntropy's blocks (CeGradientSink): g, its pre-cast bound
// and, with class envelopes, CastFlip's weights, [m, V] each for the m rows
// of the reference's inputs.
struct CeGradients {
  std::vector<double> g, pre_err, flip_mean, flip_var;
};
// A cross-entropy's dX (`dw` false: [M, K] in `dtype`, fp32 or bf16; with
// `rows`, reference row j is the call's row rows[j]) or dW (fp32 [V, K])
// candidate against the products of the reference's g: held to the proven
// bound (CrossEntropyGradInputReference, CrossEntropyGradWeightReference)
// and, when g.flip_mean is formed, by the precision-class test of the gradients
// (docs/PROTOCOL.md) with `tokens` distinct rows of G (DistinctTokens).
// dX's products go through in.products when it is not null. False when
// `stop` ended the walk.
bool CheckCrossEntropyGradient(bool dw, const LmHeadInputs& in, const CheckedRows& rows,
                               const CeGradients& g, std::int64_t tokens, const void* candidate,
                               const void* own, DType dtype, CandidateCheck* check,
                               const StopCheck& stop = {});

// Elements whose operands are equal up to a power of two err alike in
// every order: the distinct classes of W's rows and of its columns (kept
// in the engine's WeightMemo when in.products has one), and of X's columns.
std::int64_t WeightRowClasses(const LmHeadInputs& in);
std::int64_t WeightColumnClasses(const LmHeadInputs& in);
std::int64_t InputColumnClasses(const LmHeadInputs& in);

// Tokens whose rows of X and targets (null: none) are equal have equal
// values and errors in every implementation: how many distinct ones the
// m rows of in.x hold (with `rows`, those i with rows[i] non-zero).
std::int64_t DistinctTokens(const LmHeadInputs& in, const std::int64_t* targets,
                            const std::uint8_t* rows = nullptr);
// Both counts from one pass over X: the distinct (row of X, target) pairs
// and the distinct rows of X alone.
struct DistinctTokenCounts {
  std::int64_t with_targets = 0;
  std::int64_t rows = 0;
};
DistinctTokenCounts CountDistinctTokens(const LmHeadInputs& in, const std::int64_t* targets,
                                        const std::uint8_t* rows = nullptr);

// The most memory each check takes besides its arguments (the doubles of
// its references, blocks of widened operands), for a caller that admits
// work by its memory: `rows` is the number of rows of M checked.
std::uint64_t LogitsCheckBytes(std::int64_t rows, std::int64_t v, std::int64_t k);
std::uint64_t GradInputCheckBytes(std::int64_t rows, std::int64_t v, std::int64_t k);
std::uint64_t GradWeightCheckBytes(std::int64_t m, std::int64_t v, std::int64_t k);

}  // namespace logitd

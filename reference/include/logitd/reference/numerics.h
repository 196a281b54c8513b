// fp64 references of the LM head's products, shared by the harness and the
// server's Verify: fp64 GEMMs of bf16 operands through OpenBLAS dgemm (with
// the Σ|a·b| sums that error bounds need), rounding-error constants, ULP
// distances and an IEEE 754 predictor for special values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/tensor.h"

namespace logitd {

// Unit roundoffs for round to nearest: 2^-p for a p-bit significand.
inline constexpr double kFp32UnitRoundoff = 0x1p-24;
inline constexpr double kFp64UnitRoundoff = 0x1p-53;
inline constexpr double kBf16UnitRoundoff = 0x1p-8;

// γ_n = n·u / (1 − n·u), the bound on the relative error of an n-term sum of
// products in a precision with unit roundoff u, whatever the summation order
// (Higham, Accuracy and Stability of Numerical Algorithms, Lemma 3.1),
// rounded up. +Inf when n·u >= 1.
double Gamma(std::int64_t n, double u);

// What the proven bounds assume of each step of an fp32 accumulation: its
// result within one unit in the last place of the exact sum of its
// operands, 2^-23 relative (docs/PROTOCOL.md, "The proven bound"): round to
// nearest (half that), directed rounding, and the truncating multi-operand
// adders of tensor cores, which bench/accumulation_probe.py checks on the
// device. Their γ is Gamma(n, kFp32StepError).
inline constexpr double kFp32StepError = 0x1p-23;
// The absolute error a step may add below fp32's normal range, where its
// spacing is 2^-149: a product or fused product that underflows (sums of
// fp32 values are exact there). Gradual underflow is assumed: a kernel
// that flushes subnormal results to zero errs by up to 2^-126 there.
inline constexpr double kFp32Underflow = 0x1p-149;
// The most terms a proven bound is formed for: γ_n(2^-23) is 1 at 2^22,
// where the bound would reach Σ|products| and decide nothing (Verify
// refuses longer sums).
inline constexpr std::int64_t kMaxBoundTerms = std::int64_t{1} << 22;

// The probabilistic counterpart of γ_n (Higham and Mary, "A new approach to
// probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019,
// Theorems 2.4 and 3.1): when the n rounding errors of a sum of products are
// independent with mean zero, |error| <= γ̃_n(λ)·Σ|a·b| with
// γ̃_n(λ) = exp(λ·√n·u + n·u²/(1 − u)) − 1, except with probability at most
// 2n·exp(−λ²(1 − u)²/2). With kProbabilisticLambda that is below 2^-89
// for any n up to 2^31: a conforming fp32 accumulation never exceeds it in
// practice, while bf16 rounding of the result does at every K.
inline constexpr double kProbabilisticLambda = 13.0;
double ProbabilisticGamma(std::int64_t n, double u, double lambda = kProbabilisticLambda);

// A row-major bf16 matrix the references read without copying it whole.
struct Bf16Matrix {
  const Bf16Bits* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};
Bf16Matrix AsMatrix(const Tensor& t);  // rank-2 bf16 tensor

// Widens a bf16 or fp32 tensor exactly to double (|x| when `absolute`).
std::vector<double> ToDouble(const Tensor& t, bool absolute = false);

// A big operand is widened to double a block of rows at a time, at most this
// many elements, so that a [32768, 16384] weight never exists as 4 GiB of
// doubles.
inline constexpr std::int64_t kReferenceBlockElements = std::int64_t{1} << 23;

// y[m, n] = Σ_k x[m, k]·w[n, k] in fp64 (Y = X·Wᵀ); when y_abs is not null it
// receives Σ_k |x[m, k]·w[n, k]|. x is [m, K] as doubles; y and y_abs hold m·n.
void ReferenceXWt(const std::vector<double>& x, std::int64_t m, Bf16Matrix w, double* y,
                  double* y_abs, std::int64_t block_elements = kReferenceBlockElements);

// dx[m, k] = Σ_n g[m, n]·w[n, k] (dX = G·W), g [m, N] as doubles; dx and
// dx_abs hold m·K.
void ReferenceGW(const std::vector<double>& g, std::int64_t m, Bf16Matrix w, double* dx,
                 double* dx_abs, std::int64_t block_elements = kReferenceBlockElements);

// dw[n, k] = Σ_m g[m, n]·x[m, k] (dW = Gᵀ·X) for g [m, N] and x [m, K]. The
// [N, K] result can be gigabytes, so it is handed to `sink` one block of rows
// at a time; `abs` is null unless with_abs. `stop`, when given, is asked
// before each block: true ends the walk there.
using RowBlockSink = std::function<void(std::int64_t row0, std::int64_t rows, const double* value,
                                        const double* abs)>;
void ReferenceGtX(const std::vector<double>& g, const std::vector<double>& x, std::int64_t m,
                  std::int64_t n, std::int64_t k, bool with_abs, const RowBlockSink& sink,
                  std::int64_t block_elements = kReferenceBlockElements,
                  const std::function<bool()>& stop = {});

// The same walk with G never whole: `g_columns` writes G's columns
// [col0, col0 + cols) as a row-major [m, cols] block of doubles, one block of
// dW's rows at a time. Blocks hold at most block_elements elements of G's
// block or of dW's, whichever is wider (one column or row at least), so the
// walk holds X, |X| and two blocks of each kind.
using ColumnGather = std::function<void(std::int64_t col0, std::int64_t cols, double* out)>;
void ReferenceGtX(const ColumnGather& g_columns, const std::vector<double>& x, std::int64_t m,
                  std::int64_t n, std::int64_t k, bool with_abs, const RowBlockSink& sink,
                  std::int64_t block_elements = kReferenceBlockElements,
                  const std::function<bool()>& stop = {});

// Rows of dW in one block of that walk.
std::int64_t GtXBlockRows(std::int64_t m, std::int64_t k,
                          std::int64_t block_elements = kReferenceBlockElements);

// Distance in units in the last place between two values of one format,
// counting the representable values between them; ±0 are one value. Two
// NaNs are 0 apart; a NaN and a number are infinitely apart (INT64_MAX).
std::int64_t UlpDistanceFp32(std::uint32_t a, std::uint32_t b);
std::int64_t UlpDistanceBf16(Bf16Bits a, Bf16Bits b);

// Bits of element i as uint32 (fp32) or widened uint16 (bf16).
std::uint32_t ElementBits(const Tensor& t, std::int64_t i);
// ULP distance between element i of two tensors of the same dtype.
std::int64_t UlpDistanceAt(const Tensor& a, const Tensor& b, std::int64_t i);

// The fp32 value nearest an exact value given as a double, with IEEE 754
// overflow to ±Inf (a double cast past FLT_MAX is undefined in C++).
float RoundToFp32(double exact);

// Spacing of bf16 values at |r| (the subnormal spacing 2^-133 below 2^-126,
// and for 0 and non-finite values).
double Bf16Ulp(double r);
// Rounds a double to the nearest bf16 value, ties to even, in one step (no
// double rounding through fp32); ±Inf past the largest finite value.
double RoundDoubleToBf16(double d);

// What IEEE 754 fp32 arithmetic gives for Σ_k a[k·stride_a]·b[k·stride_b]:
// each product rounded to fp32, then summed. Also evaluates the sum in the
// reverse order and exactly (in fp64 when finite); `order_independent` is
// false when those disagree, i.e. when the inputs do not pin the result down
// and a test built on them would be ambiguous.
struct IeeeDot {
  float value = 0;
  bool order_independent = true;
};
IeeeDot PredictIeeeDot(const float* a, std::int64_t stride_a, const float* b, std::int64_t stride_b,
                       std::int64_t k);

// Elementwise comparison of an output with what it must be, bit for bit.
struct BitwiseComparison {
  std::int64_t compared = 0;
  std::int64_t differing = 0;
  std::int64_t first_index = -1;  // first differing element
  std::uint32_t first_got = 0;
  std::uint32_t first_want = 0;
  std::int64_t max_ulp = 0;  // over differing elements
  // "3 of 524288 elements differ; first at [0, 17]: got 0x.. want 0x..; max 1 ulp"
  std::string Describe(const std::vector<std::int64_t>& shape) const;
};

// Options for the comparison: ±0 compare equal (the sign of an exact zero sum
// depends on the summation order); any NaN matches any NaN (payloads differ
// between conforming implementations).
struct CompareOptions {
  bool signed_zero_equal = true;
  bool any_nan_equal = false;
};

// `got` (fp32 or bf16) against wanted fp32 values; for a bf16 `got` the wanted
// value is rounded to bf16 first (RNE), which is exact when it already is one.
BitwiseComparison CompareWith(const Tensor& got, const float* want, std::int64_t n,
                              const CompareOptions& options = {});
// The same for elements [offset, offset + n) of `got`, accumulated into `acc`,
// for references produced a block at a time.
void CompareRangeInto(const Tensor& got, std::int64_t offset, const float* want, std::int64_t n,
                      const CompareOptions& options, BitwiseComparison* acc);
// Two tensors of the same dtype and shape, bit for bit.
BitwiseComparison CompareTensors(const Tensor& got, const Tensor& want,
                                 const CompareOptions& options = {});

// "[1, 17]" for flat index 17 of shape [16, 32].
std::string IndexString(std::int64_t flat, const std::vector<std::int64_t>& shape);
// "0x3f800000" / "0x3f80".
std::string BitsHex(std::uint32_t bits, DType dtype);

}  // namespace logitd

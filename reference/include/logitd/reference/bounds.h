// The error bounds the harness proves, in one place: an output that sums n
// exact products of bf16 values in fp32 (in any order), optionally rounded
// once to bf16, against an fp64 reference of the same products; and the
// bookkeeping of a tensor checked element by element against its bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "logitd/reference/element_judgement.h"
#include "logitd/tensor.h"

namespace logitd {

// How an output that sums n exact products of bf16 values in fp32, scaled
// by alpha, is referenced and bounded (element_judgement.h, ProductRule;
// docs/PROTOCOL.md, "The proven bound"): |got − ref| may reach
// |alpha|·(γ_s(2^-23) + γ_{n+1}(2^-53))·S + A, with S = Σ|a·b| over the n
// products, s = n accumulation steps (n + 2 with alpha ≠ 1: one more
// rounding of the scale, and one more if a kernel scales products), the
// fp64 reference's own error and A = 2·s·2^-149·max(1, |alpha|) for
// products that underflow; a partial sum of any order lies within
// max(1, |alpha|)·(1 + γ_s(2^-23)) times the sum of the products of one
// sign. A bf16 output adds one rounding. The one place the bounds of sums
// of products are composed: the harness, Verify and the device's judging
// all take them from here.
judgement::ProductRule SumOfProductsRule(std::int64_t n, double alpha, DType out);

// The proven bound of such an output at one element (alpha 1).
double SumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out);

// The same with the probabilistic γ̃_n (numerics.h: ProbabilisticGamma) for
// the fp32 sum, never above SumOfProductsBound: what a conforming fp32
// accumulation stays within unless its rounding errors conspire, which is
// what tells bf16 rounding of the result apart at large n, where the
// worst-case bound grows as n while the bf16 error grows as √n.
double ProbabilisticSumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out);

// Elements checked against their bounds: how many lie outside, the first
// of them and the worst error as a fraction of its bound. The same rule as
// Verify's (element_judgement.h, Fraction): a NaN or an infinity is right
// only where a conforming order can give it there.
struct BoundStats {
  std::int64_t checked = 0;
  std::int64_t violations = 0;
  std::int64_t first = -1;
  double worst_fraction = 0;
  double first_got = 0, first_ref = 0, first_bound = 0;

  void Add(std::int64_t i, double got, const judgement::ElementBounds& bounds);
  // An element known to lie within `bound` of `ref` (an fp32 value).
  void Add(std::int64_t i, double got, double ref, double bound);
  bool within() const { return violations == 0; }
  // "3 of 65536 dX elements outside their bound; first [0, 17]: got …, fp64
  // reference …, bound …" (empty when none).
  std::string Describe(const std::string& what, const std::vector<std::int64_t>& shape) const;
};

// The backward contract's G = bf16(dY), rounded to nearest even once, as
// doubles (exact).
std::vector<double> BackwardG(const Tensor& dy);

// Outputs of the LM head's products, each element against its fp64
// reference and bound (SumOfProductsBound in the output's dtype). Shapes
// must agree (the caller checks them): Y = X·Wᵀ [M, V]; dX = G·W [M, K];
// dW = Gᵀ·X [V, K], with G = BackwardG(dY).
BoundStats CheckLogitsBounds(const Tensor& x, const Tensor& w, const Tensor& y);
BoundStats CheckGradInputBounds(const Tensor& dy, const Tensor& w, const Tensor& dx);
BoundStats CheckGradWeightBounds(const Tensor& dy, const Tensor& x, const Tensor& dw);

}  // namespace logitd

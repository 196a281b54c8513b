// The error bounds the harness proves, in one place: an output that sums n
// exact products of bf16 values in fp32 (in any order), optionally rounded
// once to bf16, against an fp64 reference of the same products; and the
// bookkeeping of a tensor checked element by element against its bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "logitd/tensor.h"

namespace logitd {

// |got − ref| may reach γ_n(fp32)·S + γ_n(fp64)·S, with S = Σ|a·b| over the
// n products (Higham, Lemma 3.1, for the fp32 sum and for the fp64
// reference); a bf16 output adds one rounding: relative 2^-8 of the fp32
// value (at most |ref| plus that bound), or half the smallest bf16
// subnormal spacing near zero.
double SumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out);

// The same with the probabilistic γ̃_n (numerics.h: ProbabilisticGamma) for
// the fp32 sum, never above SumOfProductsBound: what a conforming fp32
// accumulation stays within unless its rounding errors conspire, which is
// what tells bf16 rounding of the result apart at large n, where the
// worst-case bound grows as n while the bf16 error grows as √n.
double ProbabilisticSumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out);

// Elements checked against their bounds: how many lie outside, the first
// of them and the worst error as a fraction of its bound.
struct BoundStats {
  std::int64_t checked = 0;
  std::int64_t violations = 0;
  std::int64_t first = -1;
  double worst_fraction = 0;
  double first_got = 0, first_ref = 0, first_bound = 0;

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

// Bit-exact emulations of LM-head implementations, conforming (fp32 in many
// orders and adders) and defective (bf16 or fp16 where fp32 belongs), and the
// seeded inputs they run on: what Verify's verdicts are measured against.
#ifndef LOGITD_TESTS_REFERENCE_EMULATED_KERNELS_H_
#define LOGITD_TESTS_REFERENCE_EMULATED_KERNELS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "logitd/bf16.h"

namespace logitd::emulated {

// Σ_t a[t·sa] · b[t·sb] over t < n, as one implementation computes it.
using DotFn = std::function<float(const float* a, std::int64_t sa, const float* b, std::int64_t sb,
                                  std::int64_t n)>;

struct Implementation {
  std::string name;  // "sequential fp32", "tensor-core blocks of 16, truncated", ...
  // An fp32-accumulating implementation, which Verify must pass.
  bool conforming = true;
  // The value the implementation would write: fp32, or for a bf16-output
  // implementation the bf16 value widened to float. a and b hold bf16
  // values widened to float (fp32 values for a missing gradient cast).
  DotFn dot;
};

// Every addition rounded to nearest unless the name says otherwise.
std::vector<Implementation> ConformingImplementations();
std::vector<Implementation> DefectiveImplementations();

// Y [m, v] = alpha · X · Wᵀ: each element the implementation's dot of a row
// of X [m, k] and a row of W [v, k], times alpha in one fp32 multiply.
std::vector<float> Logits(const Implementation& impl, const std::vector<Bf16Bits>& x,
                          const std::vector<Bf16Bits>& w, std::int64_t m, std::int64_t v,
                          std::int64_t k, float alpha = 1.0f);

// dX [m, k] = G · W with G = bf16(dY) rounded to nearest even (the backward
// contract), dY [m, v] and W [v, k]. cast_g = false is the missing cast: G =
// dY's fp32 values, whose products fp32 multiplication rounds.
std::vector<float> GradInput(const Implementation& impl, const std::vector<float>& dy,
                             const std::vector<Bf16Bits>& w, std::int64_t m, std::int64_t v,
                             std::int64_t k, bool cast_g = true);

// dW [v, k] = Gᵀ · X with G as for GradInput and X [m, k].
std::vector<float> GradWeight(const Implementation& impl, const std::vector<float>& dy,
                              const std::vector<Bf16Bits>& x, std::int64_t m, std::int64_t v,
                              std::int64_t k, bool cast_g = true);

struct LmHeadCase {
  std::string name;
  std::vector<Bf16Bits> x, w;  // X [m, k], W [v, k]
  std::int64_t m = 0, v = 0, k = 0;
};

// Seeded inputs of one kind (CaseKinds()) at any shape. Unknown kinds abort.
LmHeadCase MakeCase(const std::string& kind, std::int64_t m, std::int64_t v, std::int64_t k,
                    std::uint64_t seed);
std::vector<std::string> CaseKinds();

// f rounded to IEEE binary16 (nearest, ties to even, subnormals below 2⁻¹⁴,
// ±inf from 65520 on), as a float.
float RoundToFp16(float f);

// An exact sum of doubles, kept as a nonoverlapping expansion (Shewchuk,
// "Adaptive precision floating-point arithmetic", 1997): exact for any
// finite addends whose partial sums stay far from double's overflow, as
// fp32 values and exact products of two fp32 values always do.
class ExactSum {
 public:
  void Add(double x);
  void Clear() { parts_.clear(); }
  // −1, 0 or 1: the sign of the exact sum.
  int Sign() const;
  // The sign of the exact sum minus x.
  int SignMinus(double x) const;
  // The components added in increasing magnitude: within a few double ulps.
  double Estimate() const;
  // The exact sum rounded toward zero to fp32 (±FLT_MAX past the range).
  float TruncatedToFloat() const;

 private:
  std::vector<double> parts_;  // nonoverlapping, increasing magnitude, no zeros
};

}  // namespace logitd::emulated

#endif  // LOGITD_TESTS_REFERENCE_EMULATED_KERNELS_H_

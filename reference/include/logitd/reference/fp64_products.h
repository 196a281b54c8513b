// Where the references' fp64 products are formed. By default OpenBLAS's
// dgemm on the host (numerics.h); a server with a device of its own offers
// another engine for the weight of one call (the cuda backend: cuBLAS DGEMM
// on the GPU). The proofs do not depend on the engine: every one multiplies
// the bf16 values widened to fp64, whose products are exact (8 x 8
// significand bits), and sums them in fp64 in some order, so each sum lies
// within γ_K(fp64)·Σ|x·w| of the exact one whatever the engine, its order,
// blocking or fused multiply-adds (Higham, Lemma 3.1); the bounds already
// carry that term. Elements whose operands include a NaN or an infinity are
// formed again on the host one product at a time either way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "logitd/reference/numerics.h"

namespace logitd {

class Fp64Products {
 public:
  virtual ~Fp64Products() = default;

  // y [m, V] = x·Wᵀ and, when y_abs is not null, y_abs [m, V] = |x|·|W|ᵀ,
  // for x [m, K] as doubles and the weight W [V, K] this engine was made
  // for. False when the engine could not form them (error() says why); the
  // caller then forms them on the host.
  virtual bool XWt(const double* x, std::int64_t m, double* y, double* y_abs) = 0;
  // dx [m, K] = g·W and dx_abs = |g|·|W|, for g [m, V] as doubles.
  virtual bool GW(const double* g, std::int64_t m, double* dx, double* dx_abs) = 0;

  // Why the last product was not formed here; empty while every one was.
  virtual std::string error() const = 0;
  // "cuBLAS DGEMM on NVIDIA H200", for logs and results.
  virtual std::string name() const = 0;
};

// ReferenceXWt and ReferenceGW (numerics.h) through `engine` when it is not
// null and forms them, else on the host.
void FormXWt(Fp64Products* engine, const std::vector<double>& x, std::int64_t m, Bf16Matrix w,
             double* y, double* y_abs);
void FormGW(Fp64Products* engine, const std::vector<double>& g, std::int64_t m, Bf16Matrix w,
            double* dx, double* dx_abs);

}  // namespace logitd

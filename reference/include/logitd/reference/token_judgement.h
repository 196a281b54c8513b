// The cross-entropy's and LogProbs' per-token judgement, written once for
// the host and for a device that forms a row's sums where its logits are
// (nvcc compiles these as __host__ __device__, as element_judgement.h's):
// the functions' error the bounds assume of a candidate, a logit's soft
// cap, the bounds of exp and entropy terms, a row's sums, and the
// precision-class envelopes of per-token outputs. Only <cstdint>, through
// element_judgement.h: a .cu file includes it.
#pragma once

#include <cstdint>

#include "logitd/reference/element_judgement.h"

namespace logitd::judgement {

// The cross-entropy's softmax reference, a row of logits at a time
// (cross_entropy.cc proves its bounds): the part a device forms where the
// logits are, so that a row's sums cross back instead of its logits. Not
// bitwise the host's (the sums run in another order, and a device's exp,
// log and tanh are its own within an ulp or two); the reference's own fp64
// evaluation is what the bounds' γ_V(fp64)·(|lse| + 1) term covers.

// What the cross-entropy's and LogProbs' bounds assume of a candidate's
// exp, log and tanh (docs/PROTOCOL.md, "The cross-entropy's and LogProbs'
// bounds"): each within kFnError relatively (4 fp32 ulps), exp besides
// within 3·2^-24 per unit of its argument's magnitude (the rounding of the
// argument and a fast exponential's scaling of it by log2(e)), and log
// within kFnError absolutely too. CUDA's expf, logf and tanhf and the fast
// __expf and __logf meet it; the 11-bit tanh.approx does not.
inline constexpr double kFnError = 0x1p-21;

// A logit y (fp64) within dy of the candidate's fp32 logit, soft-capped at
// `cap` when it is positive: z, dz/dy and the bound on the candidate's z.
// tanh is 1-Lipschitz, so |Δ tanh| ≤ |Δ(y/cap)| plus tanh's own error;
// the division y/cap and the multiplication by cap round once each.
LOGITD_HD inline void CappedLogit(double y, double dy, double cap, double* z, double* f,
                                  double* ez) {
  constexpr double kU = 0x1p-24;
  if (cap > 0) {
#if defined(__CUDA_ARCH__)
    const double t = tanh(y / cap);
#else
    const double t = __builtin_tanh(y / cap);
#endif
    *z = cap * t;
    *f = 1 - t * t;
    const double da = (dy + kU * (Abs(y) + dy)) / cap;
    const double dt = da + kFnError * (Abs(t) + da);
    *ez = cap * dt + kU * (Abs(*z) + cap * dt);
  } else {
    *z = y;
    *f = 1;
    *ez = dy;
  }
}

// The log of the factor by which a candidate's term exp(ẑ − m̂) of a row's
// sum of exponentials may stand off exp(z − m), besides its logit's error:
// its exp at an argument of magnitude at most d + 2E (d = max − z, E the
// row's largest logit bound) and its share of an fp32 sum of positive terms
// (gamma_sum = γ_V(2^-23): each term passes through at most V steps of a
// faithful adder), as −log(1 − ρ).
LOGITD_HD inline double ExpTermError(double d, double e_max, double gamma_sum) {
  constexpr double kU = 0x1p-24;
  const double rho = kFnError + 3 * kU * (d + 2 * e_max) + gamma_sum;
  // An argument so far below the largest (or logits so loose) that the
  // term's relative error is not bounded: no finite factor.
  if (!(rho < 1)) return Infinity();
#if defined(__CUDA_ARCH__)
  return -log1p(-rho);
#else
  return -__builtin_log1p(-rho);
#endif
}

// e^a − 1.
LOGITD_HD inline double ExpM1(double a) {
#if defined(__CUDA_ARCH__)
  return expm1(a);
#else
  return __builtin_expm1(a);
#endif
}

// A row's sums: the largest z, log Σ exp(z − max), lse = max + that, the
// largest bound on z (E), W = Σ p·(exp(e_z + ExpTermError) − 1) with
// p = exp(z − lse), and the target's z and e_z (0 for a target outside the
// row). lse(ẑ) lies within log(1 + W) of lse(z) for any ẑ within e_z of z
// evaluated as the kFnError model says (cross_entropy.cc).
struct CeRowSums {
  double mx = 0;
  double log_s = 0;
  double lse = 0;
  double b = 0;
  double weighted = 0;
  double zt = 0;
  double ezt = 0;
  // The precision-class test's sums (TokenClassTerms), when formed:
  // Σ p·c_z (c_z the logit's class envelope, LogitClassEnvelope, carried
  // into z as CappedLogit carries a bound), Σ p·(max − z), and the
  // target's c_z.
  bool class_formed = false;
  double class_lin = 0;
  double class_mean_d = 0;
  double class_zt = 0;
};

// LogProbs' z of one logit y with its bound dy (logprobs.cc proves the
// bounds): soft-capped as CappedLogit caps it, over the temperature t, and
// the bound on z, with the division's own rounding when the logit is an
// fp32 sum (`rounded`) and t is not 1.
LOGITD_HD inline void LpLogit(double y, double dy, double cap, double t, bool rounded, double* z,
                              double* ez) {
  constexpr double kU = 0x1p-24;
  double c, f, ec;
  CappedLogit(y, dy, cap, &c, &f, &ec);
  *z = c / t;
  *ez = ec / t + (rounded && t != 1.0 ? kU * (Abs(*z) + ec / t) : 0.0);
}

// The log of the factor by which a candidate's entropy term p̂·(L̂ − ẑ) may
// stand off p·(lse − z), besides the logits' and lse's errors: its exp (as
// ExpTermError, at the argument lse − z), the subtraction's and the
// product's roundings, and its share of the fp32 sum of V non-negative
// terms.
LOGITD_HD inline double EntropyTermError(double lse_minus_z, double e_max, double gamma_sum) {
  constexpr double kU = 0x1p-24;
  return ExpTermError(lse_minus_z, e_max, gamma_sum + 2 * kU);
}

// LogProbs' order: (za, a) before (zb, b) when z is larger, ties to the
// lower id.
LOGITD_HD inline bool LpBefore(double za, std::int64_t a, double zb, std::int64_t b) {
  return za != zb ? za > zb : a < b;
}

// A LogProbs row's sums over the vocabulary that counts (d = max − z,
// p = exp(z − lse)), what the bounds of logprobs.cc are made of: the host
// forms them from a row of z, a device where the logits are; the host
// finishes the row from them either way. rank, low and high count the
// entries j != t before the target, surely above it (z_j > z_t + 2B) and
// possibly above it (z_j >= z_t − 2B); −1 without a target.
struct LpRowSums {
  double b = 0;             // B: the largest e_z of the row
  double mx = 0;            // the largest z
  double log_s = 0;         // log Σ exp(z − mx)
  double lse = 0;           // mx + log_s
  double weighted = 0;      // W = Σ p·(exp(e_z + ExpTermError) − 1), as CeRowSums'
  double weighted_ez = 0;   // Σ p·e_z
  double weighted_lez = 0;  // Σ p·(lse − z)·e_z
  double eval_h = 0;        // Σ p·(lse − z)·(exp(EntropyTermError) − 1)
  double mean_d = 0;        // Σ p·d
  double entropy = 0;       // Σ p·(lse − z)
  double zt = 0;            // the target's z and e_z (0 without one)
  double ezt = 0;
  std::int64_t rank = -1;
  std::int64_t low = -1;
  std::int64_t high = -1;
  // The precision-class test's sums, as CeRowSums' (mean_d above), and
  // Σ p·(lse − z)·c_z for the entropy.
  bool class_formed = false;
  double class_lin = 0;
  double class_lin_d = 0;
  double class_zt = 0;
};

// The precision-class test of a per-token output (docs/PROTOCOL.md, "The
// precision-class test of the per-token outputs"). A logit's class
// envelope c_y: the largest of the sequential fp32 sum's error, the
// tensor-core model's, half an fp32 ulp of the value and the floor (in
// units of 2^-24·Σ|x·w|), as ClassTermsOf forms it for Logits (without
// logitd's own output, which a fused cross-entropy does not show). NaN
// where a value is not finite: the token is then not counted.
LOGITD_HD inline double LogitClassEnvelope(double y, double abs_sum, float seq, double tc,
                                           double floor) {
  if (!(IsFinite(y) && IsFinite(abs_sum) && IsFinite(static_cast<double>(seq)) && IsFinite(tc) &&
        Abs(y) <= kFp32MaxFinite)) {
    return Add(Infinity(), -Infinity());
  }
  const double half_ulp = Mul(0.5, Fp32Ulp(static_cast<float>(y)));
  const double seq_err = Abs(Add(static_cast<double>(seq), -y));
  double env = seq_err > half_ulp ? seq_err : half_ulp;
  if (tc > env) env = tc;
  const double floor_err = Mul(floor, Mul(0x1p-24, abs_sum));
  return floor_err > env ? floor_err : env;
}

// p·(e^a − 1) for p = e^{log_p} (at most 1) and a ≥ 0, finite where p
// underflows and e^a overflows (+Inf only where the product does): e^a − 1
// < e^a, so past a = 700 the product is taken as e^{log_p + a}.
LOGITD_HD inline double WeightedExpm1(double log_p, double a) {
#if defined(__CUDA_ARCH__)
  return a > 700 ? exp(log_p + a) : exp(log_p) * expm1(a);
#else
  return a > 700 ? __builtin_exp(log_p + a) : __builtin_exp(log_p) * __builtin_expm1(a);
#endif
}

// The evaluation part of an lse's class envelope, in a conforming fp32
// softmax: its exps and log within kFnError each (the bounds' assumption)
// and an exp's argument rounding and scaling (2^-24 per unit of max − z,
// four times over), the final addition's half ulp, and the fp32 sum of V
// positive terms, whose rounding errors a sequential sum accumulates to a
// standard deviation of at most 0.42·√V·2^-24 of the sum (every partial
// sum at most the whole), taken as 0.5·√V·2^-24.
LOGITD_HD inline double LseEvalEnvelope(double log_s, double lse, double mean_d, std::int64_t v) {
  constexpr double kU = 0x1p-24;
#if defined(__CUDA_ARCH__)
  const double root = sqrt(static_cast<double>(v));
#else
  const double root = __builtin_sqrt(static_cast<double>(v));
#endif
  return kFnError * (2 + Abs(log_s)) + kU * (Abs(lse) + 4 * mean_d + 0.5 * root);
}

}  // namespace logitd::judgement

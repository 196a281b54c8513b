// One candidate element judged the way CandidateCheck counts it, written
// once for the host and for a device that checks where it forms the
// references (nvcc compiles these as __host__ __device__): its bounds from
// the sum of |products|, its error as a fraction of each bound, its ULP
// distance from logitd's own value, and the buckets it is counted in. The
// arithmetic is plain IEEE 754 double, every multiply and add rounded on
// its own (no fused multiply-add), so the host and a device give the same
// figures to the bit. Only <cstdint>: a .cu file includes it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOGITD_HD __host__ __device__
#else
#define LOGITD_HD
#endif

namespace logitd::judgement {

inline constexpr int kHistogramBins = 10;
inline constexpr int kHistogramEdgeCount = 8;
// Exact ULP distances up to this, then one bucket per power of two.
inline constexpr std::int64_t kExactUlp = 64;
inline constexpr int kUlpBuckets = static_cast<int>(kExactUlp) + 1 + (63 - 6);
inline constexpr std::int64_t kInt64Max = INT64_MAX;

LOGITD_HD inline double HistogramEdge(int e) {
  constexpr double kEdges[kHistogramEdgeCount] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0};
  return kEdges[e];
}

LOGITD_HD inline std::uint64_t DoubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(d));
#else
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}
LOGITD_HD inline bool IsNan(double d) { return d != d; }
LOGITD_HD inline bool IsFinite(double d) {
  return (DoubleBits(d) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
LOGITD_HD inline bool SignBit(double d) { return (DoubleBits(d) >> 63) != 0; }
LOGITD_HD inline double Abs(double d) {
#if defined(__CUDA_ARCH__)
  return fabs(d);
#else
  return __builtin_fabs(d);
#endif
}
LOGITD_HD inline double Infinity() {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(0x7ff0000000000000ll);
#else
  return __builtin_huge_val();
#endif
}
// a·b and a + b, each rounded once, never fused.
LOGITD_HD inline double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LOGITD_HD inline double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// The place of a value among the format's values in order (±0 one place),
// from its bits: `sign` is the format's sign bit.
LOGITD_HD inline std::int64_t Ordinal(std::uint32_t bits, std::uint32_t sign) {
  const std::int64_t magnitude = static_cast<std::int64_t>(bits & (sign - 1));
  return (bits & sign) != 0 ? -magnitude : magnitude;
}
LOGITD_HD inline bool IsNanBits(std::uint32_t bits, bool bf16) {
  return bf16 ? (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0
              : (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
}
// Units in the last place between two fp32 (or bf16) values: NaN and NaN
// 0, NaN and a number INT64_MAX.
LOGITD_HD inline std::int64_t UlpDistance(std::uint32_t a, std::uint32_t b, bool bf16) {
  const bool a_nan = IsNanBits(a, bf16), b_nan = IsNanBits(b, bf16);
  if (a_nan || b_nan) return a_nan && b_nan ? 0 : kInt64Max;
  const std::uint32_t sign = bf16 ? 0x8000u : 0x80000000u;
  const std::int64_t d = Ordinal(a, sign) - Ordinal(b, sign);
  return d < 0 ? -d : d;
}

// The bucket of a ULP distance: itself up to kExactUlp, then the power of
// two above it.
LOGITD_HD inline int UlpBucket(std::int64_t ulp) {
  if (ulp <= kExactUlp) return static_cast<int>(ulp);
  int log2 = 0;
  while (log2 < 63 && (std::int64_t{1} << log2) < ulp) ++log2;
  return static_cast<int>(kExactUlp) + (log2 - 6);
}

// The histogram's bin of |error| / bound: 0 for exactly 0, then the first
// edge it does not pass, then past the last (NaN there too).
LOGITD_HD inline int HistogramBin(double fraction) {
  if (fraction == 0) return 0;
  for (int e = 0; e < kHistogramEdgeCount; ++e) {
    if (fraction <= HistogramEdge(e)) return e + 1;
  }
  return kHistogramBins - 1;
}

// |value − reference| as a fraction of `bound`: 0 when equal, +Inf for a
// NaN or an infinity IEEE 754 does not give there (*mismatch set). An
// infinity is right where the bounded value overflows the format, whose
// largest finite value is `max_finite`.
LOGITD_HD inline double Fraction(double value, double reference, double bound, double max_finite,
                                 bool* mismatch) {
  const double inf = Infinity();
  *mismatch = false;
  if (!IsFinite(reference)) {
    const bool same = IsNan(reference) ? IsNan(value) : value == reference;
    *mismatch = !same;
    return same ? 0 : inf;
  }
  if (!IsFinite(value)) {
    const bool overflows = !IsNan(value) && Add(Abs(reference), bound) > max_finite &&
                           SignBit(value) == SignBit(reference);
    *mismatch = !overflows;
    return overflows ? 0 : inf;
  }
  const double err = Abs(Add(value, -reference));
  return err == 0 ? 0 : bound > 0 ? err / bound : inf;
}

// How the references of one product's elements are formed and bounded
// (bounds.h): reference = scale_reference·sum, proven bound =
// gamma·Σ|products| and probabilistic bound = p_gamma·Σ|products| (the γ
// terms, times |alpha| for Logits), and for a bf16 output one more
// rounding: relative 2^-8 of at most |reference| plus the bound, or half
// the smallest bf16 subnormal spacing near zero.
struct ProductRule {
  double scale_reference = 1;
  double gamma = 0;
  double p_gamma = 0;
  bool bf16 = false;
};

// `bound` widened by a bf16 output's rounding.
LOGITD_HD inline double WithBf16Rounding(double reference, double bound) {
  return Add(Add(bound, Mul(0x1p-8, Add(Abs(reference), bound))), 0x1p-134);
}

// The reference and both bounds of an element from its fp64 sum and its
// sum of magnitudes.
LOGITD_HD inline void ProductBounds(const ProductRule& rule, double sum, double abs_sum,
                                    double* reference, double* bound, double* p_bound) {
  *reference = Mul(sum, rule.scale_reference);
  double b = Mul(rule.gamma, abs_sum);
  double pb = Mul(rule.p_gamma, abs_sum);
  if (rule.bf16) {
    b = WithBf16Rounding(*reference, b);
    pb = WithBf16Rounding(*reference, pb);
  }
  *bound = b;
  *p_bound = pb;
}

// What counting one element takes from it.
struct Judged {
  bool bitwise_equal = false;
  bool mismatch = false;  // a NaN or infinity where the reference has none, or the reverse
  bool own_outside_probabilistic = false;
  std::int64_t ulp = 0;
  double fraction = 0;    // of the proven bound
  double p_fraction = 0;  // of the probabilistic bound
};

// An fp32 or bf16 element: the candidate's and logitd's values and bits,
// the reference and its two bounds.
LOGITD_HD inline Judged JudgeElement(bool bf16, double candidate, std::uint32_t candidate_bits,
                                     double own, std::uint32_t own_bits, double reference,
                                     double bound, double p_bound) {
  const double max_finite = bf16 ? 0x1.fep127 : 0x1.fffffep127;
  Judged j;
  // Against logitd's own output: bits, NaNs of any payload alike.
  j.bitwise_equal = candidate_bits == own_bits || (IsNan(candidate) && IsNan(own));
  j.ulp = UlpDistance(candidate_bits, own_bits, bf16);
  bool unused = false;
  j.fraction = Fraction(candidate, reference, bound, max_finite, &j.mismatch);
  j.p_fraction = Fraction(candidate, reference, p_bound, max_finite, &unused);
  // logitd's own value: the candidate's when their bits are equal.
  const double own_p = candidate_bits == own_bits
                           ? j.p_fraction
                           : Fraction(own, reference, p_bound, max_finite, &unused);
  j.own_outside_probabilistic = own_p > 1.0;
  return j;
}

// The cross-entropy's softmax reference, a row of logits at a time
// (cross_entropy.cc states its bounds): the part a device forms where the
// logits are, so that a row's sums cross back instead of its logits. Not
// bitwise the host's (the sums run in another order, and a device's exp,
// log and tanh are its own within an ulp or two); the reference's own fp64
// evaluation is what the bounds' γ_V(fp64)·(|lse| + 1) term covers.

// A logit y (fp64) with its bound dy, soft-capped at `cap` when it is
// positive: z, dz/dy and the bound on z.
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
    *ez = (*f + 2 * dy / cap) * (dy + kU * Abs(y)) + 4 * kU * Abs(*z);
  } else {
    *z = y;
    *f = 1;
    *ez = dy;
  }
}

// A row's sums: the largest z, log Σ exp(z − max), lse = max + that,
// Σ p·e_z and Σ p·(3 + 2.2·(max − z)) with p = exp(z − lse), and the
// target's z and e_z (0 for a target outside the row).
struct CeRowSums {
  double mx = 0;
  double log_s = 0;
  double lse = 0;
  double weighted_ez = 0;
  double weighted_exp = 0;
  double zt = 0;
  double ezt = 0;
};

// LogProbs' z of one logit y with its bound dy (logprobs.cc states the
// bounds): soft-capped as CappedLogit caps it, over the temperature t, and
// the bound on z, with the division's own rounding when the logit is an
// fp32 sum (`rounded`) and t is not 1.
LOGITD_HD inline void LpLogit(double y, double dy, double cap, double t, bool rounded, double* z,
                              double* ez) {
  constexpr double kU = 0x1p-24;
  double c, f, ec;
  CappedLogit(y, dy, cap, &c, &f, &ec);
  *z = c / t;
  *ez = ec / t + (rounded && t != 1.0 ? kU * Abs(*z) : 0.0);
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
  double weighted_ez = 0;   // Σ p·e_z
  double weighted_exp = 0;  // Σ p·(3 + 2.2·d)
  double mean_d = 0;        // Σ p·d
  double weighted_d = 0;    // Σ p·d·(4 + 2.2·d)
  double entropy = 0;       // Σ p·(lse − z)
  double zt = 0;            // the target's z and e_z (0 without one)
  double ezt = 0;
  std::int64_t rank = -1;
  std::int64_t low = -1;
  std::int64_t high = -1;
};

}  // namespace logitd::judgement

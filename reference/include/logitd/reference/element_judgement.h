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

// The largest finite fp32 and bf16 values.
inline constexpr double kFp32MaxFinite = 0x1.fffffep127;
inline constexpr double kBf16MaxFinite = 0x1.fep127;

// An element's reference and bounds, and the infinities a conforming
// order may reach there: a sum whose partial sums can exceed the format's
// largest finite value in some order may end at ±Inf, or at NaN where
// both signs can (+Inf + −Inf), even though its exact value is finite
// (docs/PROTOCOL.md, "Infinities and NaN").
struct ElementBounds {
  double reference = 0;
  double bound = 0;    // proven
  double p_bound = 0;  // probabilistic figure
  bool pos_inf = false;
  bool neg_inf = false;
};

// |value − reference| as a fraction of `bound`: 0 when equal, +Inf for a
// NaN or an infinity no conforming order gives there (*mismatch set).
// Where the reference is an infinity (an infinite operand), the same
// infinity is right, and NaN too where the finite products of the other
// sign can overflow to the other infinity first; a NaN reference takes a
// NaN only.
LOGITD_HD inline double Fraction(double value, const ElementBounds& e, double bound,
                                 bool* mismatch) {
  const double inf = Infinity();
  const double reference = e.reference;
  bool right;
  if (IsNan(reference)) {
    right = IsNan(value);
  } else if (!IsFinite(reference)) {
    const bool other = SignBit(reference) ? e.pos_inf : e.neg_inf;
    right = value == reference || (IsNan(value) && other);
  } else if (IsNan(value)) {
    right = e.pos_inf && e.neg_inf;
  } else if (!IsFinite(value)) {
    right = SignBit(value) ? e.neg_inf : e.pos_inf;
  } else {
    *mismatch = false;
    const double err = Abs(Add(value, -reference));
    return err == 0 ? 0 : bound > 0 ? err / bound : inf;
  }
  *mismatch = !right;
  return right ? 0 : inf;
}

// An element that is not a sum of products (a log-sum-exp, a loss), known
// to lie within `bound` of `reference`: an infinity is right where that
// interval passes the format's largest finite value on its side.
LOGITD_HD inline ElementBounds ValueBounds(double reference, double bound, double p_bound,
                                           double max_finite) {
  ElementBounds e;
  e.reference = reference;
  e.bound = bound;
  e.p_bound = p_bound;
  if (IsFinite(reference)) {
    e.pos_inf = Add(reference, bound) > max_finite;
    e.neg_inf = Add(-reference, bound) > max_finite;
  }
  return e;
}

// How the references of one product's elements are formed and bounded
// (bounds.h, docs/PROTOCOL.md "The proven bound"): reference =
// scale_reference·sum; proven bound = gamma·Σ|products| + absolute (the γ
// terms, times |alpha| for Logits, and the products' underflow); the
// probabilistic figure p_gamma·Σ|products| + absolute. A partial sum of
// any conforming order lies within partial·P± of zero, P+ and P− the sums
// of the positive and negative products, so it can overflow only where
// that passes the largest finite value. A bf16 output adds one rounding:
// relative 2^-8 of at most |reference| plus the bound, or half the
// smallest bf16 subnormal spacing near zero.
struct ProductRule {
  double scale_reference = 1;
  double gamma = 0;
  double p_gamma = 0;
  double absolute = 0;
  double partial = 1;
  bool bf16 = false;
  std::int64_t terms = 0;  // products a sum holds (the precision-class test's floor)
};

// `bound` widened by a bf16 output's rounding.
LOGITD_HD inline double WithBf16Rounding(double reference, double bound) {
  return Add(Add(bound, Mul(0x1p-8, Add(Abs(reference), bound))), 0x1p-134);
}

// The reference and bounds of an element from its fp64 sum and its sum of
// magnitudes. An element with an infinite operand comes as sum = ±Inf
// (the infinity IEEE 754 gives) with abs_sum the magnitude of its finite
// products of the other sign, or as sum = NaN.
LOGITD_HD inline ElementBounds ProductBounds(const ProductRule& rule, double sum, double abs_sum) {
  ElementBounds e;
  e.reference = Mul(sum, rule.scale_reference);
  const double max_finite = rule.bf16 ? kBf16MaxFinite : kFp32MaxFinite;
  if (!IsFinite(sum)) {
    // The finite products of the other sign overflowing first: NaN.
    const bool other = !IsNan(sum) && Add(Mul(rule.partial, abs_sum), rule.absolute) > max_finite;
    e.pos_inf = !IsNan(e.reference) && SignBit(e.reference) && other;
    e.neg_inf = !IsNan(e.reference) && !SignBit(e.reference) && other;
    return e;
  }
  double b = Add(Mul(rule.gamma, abs_sum), rule.absolute);
  double pb = Add(Mul(rule.p_gamma, abs_sum), rule.absolute);
  if (rule.bf16) {
    b = WithBf16Rounding(e.reference, b);
    pb = WithBf16Rounding(e.reference, pb);
  }
  e.bound = b;
  e.p_bound = pb;
  // P+ and P− of the unscaled products; a negative scale swaps their signs.
  const double plus = Mul(0.5, Add(abs_sum, sum)), minus = Mul(0.5, Add(abs_sum, -sum));
  const bool over_plus = Add(Mul(rule.partial, plus), rule.absolute) > max_finite;
  const bool over_minus = Add(Mul(rule.partial, minus), rule.absolute) > max_finite;
  const bool flip = SignBit(rule.scale_reference);
  // The value itself rounding past the largest finite one.
  const bool over_value = Add(Abs(e.reference), b) > max_finite;
  e.pos_inf = (flip ? over_minus : over_plus) || (over_value && !SignBit(e.reference));
  e.neg_inf = (flip ? over_plus : over_minus) || (over_value && SignBit(e.reference));
  return e;
}

// d·2^e, exactly (no overflow or underflow for the values used here).
LOGITD_HD inline double ScaleByPowerOfTwo(double d, int e) {
#if defined(__CUDA_ARCH__)
  return scalbn(d, e);
#else
  return __builtin_scalbn(d, e);
#endif
}

// The fp32 value nearest a double, ties to even, ±Inf past the largest
// finite one; and the bf16 value nearest it in one step (no double
// rounding through fp32). Their bits.
LOGITD_HD inline std::uint32_t NearestFp32Bits(double d) {
  if (IsNan(d)) return 0x7fc00000u;
  const std::uint32_t sign = SignBit(d) ? 0x80000000u : 0u;
  const double a = Abs(d);
  // Values at or past the midpoint of FLT_MAX and 2^128 round to infinity.
  if (a >= 0x1.ffffffp127) return sign | 0x7f800000u;
#if defined(__CUDA_ARCH__)
  return __float_as_uint(__double2float_rn(d));
#else
  const float f = static_cast<float>(d);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
LOGITD_HD inline std::uint32_t NearestBf16Bits(double d) {
  if (IsNan(d)) return 0x7fc0u;
  const std::uint32_t sign = SignBit(d) ? 0x8000u : 0u;
  const double a = Abs(d);
  if (a >= 0x1.ffp127) return sign | 0x7f80u;  // the midpoint of bf16's max and 2^128
  if (a < 0x1p-133) {
    // Subnormal spacing 2^-133: the nearest multiple, ties to even.
    const double q = a * 0x1p133;
    double n = static_cast<double>(static_cast<std::int64_t>(q));
    const double r = q - n;
    if (r > 0.5 || (r == 0.5 && static_cast<std::int64_t>(n) % 2 != 0)) n += 1;
    return sign | static_cast<std::uint32_t>(n);
  }
  // Normal range: scale the value's binade to [2^7, 2^8) and round to an
  // integer, ties to even (exact in double: 8 bits kept of 53).
  const std::uint64_t bits = DoubleBits(a);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  const int e = exponent < -126 ? -126 : exponent;
  const double q = ScaleByPowerOfTwo(a, 7 - e);  // exact
  double n = static_cast<double>(static_cast<std::int64_t>(q));
  const double r = q - n;
  if (r > 0.5 || (r == 0.5 && static_cast<std::int64_t>(n) % 2 != 0)) n += 1;
  // n in [2^7, 2^8]: 2^8 carries into the next binade.
  int biased = e + 127;
  std::uint32_t mantissa = static_cast<std::uint32_t>(n);
  if (mantissa == 256) {
    mantissa = 128;
    ++biased;
  }
  if (biased >= 255) return sign | 0x7f80u;
  if (exponent < -126 && mantissa < 128) return sign | mantissa;  // stayed subnormal
  return sign | (static_cast<std::uint32_t>(biased) << 7) | (mantissa & 0x7fu);
}

// What counting one element takes from it.
struct Judged {
  bool bitwise_equal = false;
  bool mismatch = false;  // a NaN or infinity where no conforming order gives one, or the reverse
  bool own_outside_probabilistic = false;
  std::int64_t ulp = 0;        // from logitd's own value
  std::int64_t ulp_exact = 0;  // from the exact value correctly rounded to the dtype
  double fraction = 0;         // of the proven bound
  double p_fraction = 0;       // of the probabilistic figure
};

// An fp32 or bf16 element: the candidate's and logitd's values and bits,
// the reference and its bounds.
LOGITD_HD inline Judged JudgeElement(bool bf16, double candidate, std::uint32_t candidate_bits,
                                     double own, std::uint32_t own_bits, const ElementBounds& e) {
  Judged j;
  // Against logitd's own output: bits, NaNs of any payload alike.
  j.bitwise_equal = candidate_bits == own_bits || (IsNan(candidate) && IsNan(own));
  j.ulp = UlpDistance(candidate_bits, own_bits, bf16);
  j.ulp_exact = UlpDistance(
      candidate_bits, bf16 ? NearestBf16Bits(e.reference) : NearestFp32Bits(e.reference), bf16);
  bool unused = false;
  j.fraction = Fraction(candidate, e, e.bound, &j.mismatch);
  j.p_fraction = Fraction(candidate, e, e.p_bound, &unused);
  // logitd's own value: the candidate's when their bits are equal.
  const double own_p =
      candidate_bits == own_bits ? j.p_fraction : Fraction(own, e, e.p_bound, &unused);
  j.own_outside_probabilistic = own_p > 1.0;
  return j;
}

// The precision-class test's per-element part (reference/precision_class.h
// finishes it; docs/PROTOCOL.md, "The precision-class test"). Errors are
// measured in units of w = 2^-24·|alpha|·Σ|products|, the scale of fp32
// rounding in the element's sum.

// Products summed exactly before each truncating step of the tensor-core
// model: 4, the smallest block of the tensor cores that take bf16 or TF32
// operands (bench/accumulation_probe.py measures the device's). The
// model's spread term is sampled once per group of kModelGroup products.
inline constexpr int kTensorCoreBlock = 4;
inline constexpr int kModelGroup = 16;

// The unit in the last place of an fp32 value (2^-149 in the subnormal
// range).
LOGITD_HD inline double Fp32Ulp(float f) {
#if defined(__CUDA_ARCH__)
  const std::uint32_t bits = __float_as_uint(f);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
#endif
  const int field = static_cast<int>((bits >> 23) & 0xff);
  return ScaleByPowerOfTwo(1.0, (field == 0 ? 1 : field) - 127 - 23);
}

// fp32 a + b and a·b, each rounded to nearest on its own (never fused).
LOGITD_HD inline float AddF(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LOGITD_HD inline float MulF(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The tensor-core model, along the sequential sum: at the end of each
// block of kTensorCoreBlock products (and at the last product), where the
// sum is s, a truncating adder loses a fraction of ulp(s) toward zero,
// taken as uniform on [0, 1), with ulp(s) about 1.44·2^-24·|s| (its mean
// over a binade). The losses' mean is then −0.72·2^-24·Σ s and their
// variance (1.44·2^-24)²/12·Σ s²: s1 holds Σ s over the blocks' ends, s2
// Σ s² sampled at the end of each group of kModelGroup products (and at
// the last), weighted by the blocks the group holds. Both in fp32.
LOGITD_HD inline void TensorCoreDrift(float s, float* s1) { *s1 = AddF(*s1, s); }
LOGITD_HD inline void TensorCoreSpread(float s, float blocks, float* s2) {
  *s2 = AddF(*s2, MulF(MulF(s, s), blocks));
}
// The model's error magnitude, sqrt(mean² + variance).
LOGITD_HD inline double TensorCoreError(float s1, float s2) {
  const double a = static_cast<double>(s1), b = static_cast<double>(s2);
  const double sq = Add(Mul(0.52027, Mul(a, a)), Mul(0.17345, b));
#if defined(__CUDA_ARCH__)
  return Mul(0x1p-24, sqrt(sq));
#else
  return Mul(0x1p-24, __builtin_sqrt(sq));
#endif
}

// The floor of the envelope, in units of 2^-24·Σ|products|, for sums of n
// products: what an order that the inputs' structure does not favour errs
// by (docs/PROTOCOL.md, "The precision-class test"). Summing the products
// in an order independent of their signs, the partial sums walk like
// random sums of n terms: a sequential round-to-nearest sum errs by about
// 0.59·sqrt(n·Σp²)/Σ|p| and the tensor-core model by 0.42·sqrt(n)/4 times
// that, with sqrt(n·Σp²) ≥ Σ|p|. Inputs whose structure makes the
// sequential sum exact (products cancelling in adjacent pairs) are then
// still held to what an interleaved or split order gives on them.
LOGITD_HD inline double ClassFloor(std::int64_t n) {
#if defined(__CUDA_ARCH__)
  const double root = sqrt(static_cast<double>(n));
#else
  const double root = __builtin_sqrt(static_cast<double>(n));
#endif
  const double tc = Mul(0.42 / kTensorCoreBlock, root);
  return tc > 1.0 ? tc : 1.0;
}

// An element's terms: its error, the sequential model's and the
// envelope of the conforming ones, each over w; counted when every value
// is finite and w is at least 2^-126 (fp32 rounding relative there).
struct ClassTerms {
  bool counted = false;
  double w = 0;
  double candidate = 0;  // |candidate − reference| / w
  double seq = 0;        // max(|sequential − reference|, half an fp32 ulp of it) / w
  double envelope = 0;   // max of the conforming errors / w
};

// Half the bf16 spacing at |v| (2^-8 of its binade's base; 2^-134 below
// bf16's normal range): what rounding an fp32 value to bf16 may move it by.
LOGITD_HD inline double HalfBf16Ulp(double v) {
  const double a = Abs(v);
  if (!(a >= 0x1p-126)) return 0x1p-134;
  return Mul(0.5, ScaleByPowerOfTwo(
                      Fp32Ulp(static_cast<float>(a < kFp32MaxFinite ? a : kFp32MaxFinite)), 16));
}

// `scale` = |alpha|·Σ|products|; `seq` the sequential model's output
// (alpha applied as one fp32 multiply), `tc` the tensor-core model's error
// (times |alpha|), `floor` ClassFloor of the sum's length. The envelope:
// the largest of the sequential sum's error, the tensor-core model's,
// logitd's own output's, half an fp32 ulp of the reference (a correctly
// rounded result's) and the floor. A bf16 output is an fp32 value rounded
// once: its error and logitd's own are taken past that rounding (less half
// a bf16 ulp of the larger of the value and the reference, at least 0), so
// that both tests hold what remains to the fp32 envelope.
LOGITD_HD inline ClassTerms ClassTermsOf(bool bf16, double candidate, double own, double reference,
                                         double scale, float seq, double tc, double floor) {
  ClassTerms t;
  const double w = Mul(0x1p-24, scale);
  if (!(IsFinite(candidate) && IsFinite(own) && IsFinite(reference) && IsFinite(scale) &&
        IsFinite(tc) && IsFinite(static_cast<double>(seq)) && w >= 0x1p-126 &&
        Abs(reference) <= kFp32MaxFinite)) {
    return t;
  }
  // The part of |value − reference| a bf16 output's rounding does not explain.
  const auto past_rounding = [&](double value) {
    const double err = Abs(Add(value, -reference));
    if (!bf16) return err;
    const double a = HalfBf16Ulp(value), b = HalfBf16Ulp(reference);
    const double excess = Add(err, -(a > b ? a : b));
    return excess > 0 ? excess : 0.0;
  };
  const double half_ulp = Mul(0.5, Fp32Ulp(static_cast<float>(reference)));
  const double seq_err = Abs(Add(static_cast<double>(seq), -reference));
  const double own_err = past_rounding(own);
  const double seq_term = seq_err > half_ulp ? seq_err : half_ulp;
  double env = seq_term > tc ? seq_term : tc;
  const double floor_err = Mul(floor, w);
  if (floor_err > env) env = floor_err;
  if (own_err > env) env = own_err;
  t.counted = true;
  t.w = w;
  t.candidate = past_rounding(candidate) / w;
  t.seq = seq_term / w;
  t.envelope = env / w;
  return t;
}

// One row's part of the test, as counted: sums of squares of the terms,
// the largest envelope term (for the effective number of elements), and
// the row's two largest candidate terms, the first with its place and
// values.
struct ClassRow {
  std::int64_t n = 0;
  double candidate_sq = 0;
  double seq_sq = 0;
  double envelope_sq = 0;
  double envelope_max = 0;
  double top1 = -1;  // −1: none yet
  double top2 = -1;
  std::int64_t top1_index = -1;
  double top1_seq = 0;  // the sequential model's term there
  double top1_candidate = 0;
  double top1_reference = 0;
  double top1_w = 0;
  double top1_bound = 0;    // its proven bound
  double top1_p_bound = 0;  // and probabilistic figure
  double top1_own = 0;      // logitd's own value there
};

// Whether (a, ia) comes before (b, ib) among the largest: larger first,
// ties to the lower index (so that any order of adding gives one answer).
LOGITD_HD inline bool ClassBefore(double a, std::int64_t ia, double b, std::int64_t ib) {
  return a != b ? a > b : ia < ib;
}

LOGITD_HD inline void AddToRow(ClassRow* r, const ClassTerms& t, std::int64_t index,
                               double candidate, double own, const ElementBounds& e) {
  const double reference = e.reference;
  if (!t.counted) return;
  ++r->n;
  r->candidate_sq = Add(r->candidate_sq, Mul(t.candidate, t.candidate));
  r->seq_sq = Add(r->seq_sq, Mul(t.seq, t.seq));
  r->envelope_sq = Add(r->envelope_sq, Mul(t.envelope, t.envelope));
  if (t.envelope > r->envelope_max) r->envelope_max = t.envelope;
  if (r->top1_index < 0 || ClassBefore(t.candidate, index, r->top1, r->top1_index)) {
    r->top2 = r->top1;
    r->top1 = t.candidate;
    r->top1_index = index;
    r->top1_seq = t.seq;
    r->top1_candidate = candidate;
    r->top1_reference = reference;
    r->top1_w = t.w;
    r->top1_bound = e.bound;
    r->top1_p_bound = e.p_bound;
    r->top1_own = own;
  } else if (t.candidate > r->top2) {
    r->top2 = t.candidate;
  }
}

LOGITD_HD inline void MergeRows(ClassRow* into, const ClassRow& from) {
  if (from.n == 0) return;
  into->n += from.n;
  into->candidate_sq = Add(into->candidate_sq, from.candidate_sq);
  into->seq_sq = Add(into->seq_sq, from.seq_sq);
  into->envelope_sq = Add(into->envelope_sq, from.envelope_sq);
  if (from.envelope_max > into->envelope_max) into->envelope_max = from.envelope_max;
  if (into->top1_index < 0 ||
      ClassBefore(from.top1, from.top1_index, into->top1, into->top1_index)) {
    const double second = into->top1 > from.top2 ? into->top1 : from.top2;
    const double keep_top2 = into->top1_index < 0 ? from.top2 : second;
    const std::int64_t n = into->n;
    const double c = into->candidate_sq, s = into->seq_sq, e = into->envelope_sq,
                 e_max = into->envelope_max;
    *into = from;
    into->n = n;
    into->candidate_sq = c;
    into->seq_sq = s;
    into->envelope_sq = e;
    into->envelope_max = e_max;
    into->top2 = keep_top2;
  } else if (from.top1 > into->top2) {
    into->top2 = from.top1;
  }
}

}  // namespace logitd::judgement

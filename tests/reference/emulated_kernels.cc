// The emulated LM-head implementations and inputs of emulated_kernels.h.
// Built with -ffp-contract=off: every float operation below is rounded on
// its own, and std::fma fuses where an implementation fuses.
#include "tests/reference/emulated_kernels.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

namespace logitd::emulated {
namespace {

// The terms of one dot product.
struct Terms {
  const float* a;
  std::int64_t sa;
  const float* b;
  std::int64_t sb;
  // fp32 multiplication: exact for bf16 operands unless the product falls
  // below 2⁻¹²⁶, where fp32 rounds it as any fp32 kernel would.
  float Product(std::int64_t t) const { return a[t * sa] * b[t * sb]; }
  // Exact for any two fp32 values (48 significant bits at most, far inside
  // double's range), as a tensor core's multipliers form it.
  double ExactProduct(std::int64_t t) const {
    return static_cast<double>(a[t * sa]) * static_cast<double>(b[t * sb]);
  }
};

using TermsFn = std::function<float(const Terms& p, std::int64_t n)>;

Implementation Make(std::string name, bool conforming, TermsFn f) {
  return {std::move(name), conforming,
          [f = std::move(f)](const float* a, std::int64_t sa, const float* b, std::int64_t sb,
                             std::int64_t n) {
            return f(Terms{a, sa, b, sb}, n);
          }};
}

// s + e = a + b exactly, s = a + b rounded (Knuth's TwoSum).
void TwoSum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

// A binary format narrower than double: significant bits, the exponent of
// its smallest normal, its largest finite value.
struct Format {
  int digits;
  int emin;
  double max_finite;
};
constexpr Format kFp16{11, -14, 65504.0};
constexpr Format kBf16{8, -126, 0x1.fep127};

// The exact hi + lo (hi being it rounded to double) rounded once to nearest,
// ties to even, in format f; ±inf past its range. lo matters only when hi is
// a midpoint of f: were a midpoint strictly between hi and hi + lo, that
// double would be nearer hi + lo than hi is.
double RoundToFormat(double hi, double lo, const Format& f) {
  if (hi == 0.0 || !std::isfinite(hi)) return hi;
  const int q = std::max(std::ilogb(hi), f.emin) - (f.digits - 1);
  const double scaled = std::ldexp(hi, -q);  // exact: a power-of-two scaling
  double r = std::nearbyint(scaled);
  if (scaled - std::floor(scaled) == 0.5 && lo != 0.0) {
    r = lo > 0.0 ? std::ceil(scaled) : std::floor(scaled);
  }
  const double out = std::ldexp(r, q);
  return std::fabs(out) > f.max_finite ? std::copysign(INFINITY, out) : out;
}

// acc + x rounded once to format f.
double AddInFormat(double acc, double x, const Format& f) {
  double s, e;
  TwoSum(acc, x, s, e);
  return RoundToFormat(s, e, f);
}

// d rounded toward zero to fp32 (±FLT_MAX past the range).
float TruncateToFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isinf(f) && std::isfinite(d)) return std::copysign(FLT_MAX, f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return f;
}

// --- fp32 summation orders -------------------------------------------------

float Sequential(const Terms& p, std::int64_t lo, std::int64_t hi) {
  float acc = 0.0f;
  for (std::int64_t t = lo; t < hi; ++t) acc += p.Product(t);
  return acc;
}

float Reverse(const Terms& p, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t t = n - 1; t >= 0; --t) acc += p.Product(t);
  return acc;
}

// The product is not rounded before the addition: one rounding per term.
float SequentialFma(const Terms& p, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t t = 0; t < n; ++t) acc = std::fma(p.a[t * p.sa], p.b[t * p.sb], acc);
  return acc;
}

float Pairwise(const Terms& p, std::int64_t lo, std::int64_t hi) {
  if (hi - lo <= 0) return 0.0f;
  if (hi - lo == 1) return p.Product(lo);
  const std::int64_t mid = lo + (hi - lo) / 2;
  return Pairwise(p, lo, mid) + Pairwise(p, mid, hi);
}

float InOrder(const std::vector<float>& v) {
  float acc = 0.0f;
  for (float x : v) acc += x;
  return acc;
}

float Tree(const float* v, std::size_t n) {
  if (n == 0) return 0.0f;
  if (n == 1) return v[0];
  return Tree(v, n / 2) + Tree(v + n / 2, n - n / 2);
}

// Sequential within blocks, the block sums added in order (a BLAS kc loop).
float Blocked(const Terms& p, std::int64_t n, std::int64_t block) {
  std::vector<float> sums;
  for (std::int64_t lo = 0; lo < n; lo += block) {
    sums.push_back(Sequential(p, lo, std::min(n, lo + block)));
  }
  return InOrder(sums);
}

float Kahan(const Terms& p, std::int64_t n) {
  float sum = 0.0f, c = 0.0f;
  for (std::int64_t t = 0; t < n; ++t) {
    const float y = p.Product(t) - c;
    const float next = sum + y;
    c = (next - sum) - y;
    sum = next;
  }
  return sum;
}

struct Split {
  int parts;
  bool strided;        // part q takes t ≡ q mod parts, else a contiguous range
  bool tree;           // the partials added pairwise, else in order
  bool bf16_partials;  // each partial rounded to bf16 first (a defect)
};

// Split-K: each part summed sequentially in fp32 (its own accumulator, as
// interleaved SIMD lanes or separate thread blocks), then the partials.
float SplitK(const Terms& p, std::int64_t n, const Split& s) {
  std::vector<float> partial(static_cast<std::size_t>(s.parts), 0.0f);
  if (s.strided) {
    for (std::int64_t t = 0; t < n; ++t) partial[t % s.parts] += p.Product(t);
  } else {
    const std::int64_t chunk = (n + s.parts - 1) / s.parts;
    for (int q = 0; q < s.parts; ++q) {
      partial[q] = Sequential(p, std::min(n, q * chunk), std::min(n, (q + 1) * chunk));
    }
  }
  if (s.bf16_partials) {
    for (float& x : partial) x = RoundToBf16(x);
  }
  return s.tree ? Tree(partial.data(), partial.size()) : InOrder(partial);
}

// --- tensor-core adders ----------------------------------------------------

// The accumulator and a block's exact products summed exactly, then
// truncated to fp32. NaN and infinity propagate as in the double sum.
float ExactAdder(const std::vector<double>& addends, ExactSum& sum) {
  double naive = 0.0;
  for (double x : addends) naive += x;
  if (!std::isfinite(naive)) return static_cast<float>(naive);
  sum.Clear();
  for (double x : addends) sum.Add(x);
  return sum.TruncatedToFloat();
}

// Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor
// cores" (PeerJ CS, 2021): the addends aligned to the largest one's leading
// bit and cut toward zero to fp32's 24 bits plus 3 more, summed exactly,
// the sum truncated to fp32.
float AlignedAdder(const std::vector<double>& addends) {
  double naive = 0.0;
  int top = INT_MIN;
  for (double x : addends) {
    naive += x;
    if (x != 0.0) top = std::max(top, std::ilogb(x));
  }
  if (!std::isfinite(naive)) return static_cast<float>(naive);
  if (top == INT_MIN) return 0.0f;
  const int q = top - (24 + 3 - 1);  // the weight of the last bit kept
  // Each cut addend is below 2²⁷ units of 2^q: their sum is exact in int64
  // and in double, and so is its scaling back.
  std::int64_t units = 0;
  for (double x : addends) units += static_cast<std::int64_t>(std::trunc(std::ldexp(x, -q)));
  return TruncateToFloat(std::ldexp(static_cast<double>(units), q));
}

float TensorCore(const Terms& p, std::int64_t n, std::int64_t block, bool aligned) {
  float acc = 0.0f;
  std::vector<double> addends;
  ExactSum sum;
  for (std::int64_t lo = 0; lo < n; lo += block) {
    addends.assign(1, acc);
    for (std::int64_t t = lo; t < std::min(n, lo + block); ++t) {
      addends.push_back(p.ExactProduct(t));
    }
    acc = aligned ? AlignedAdder(addends) : ExactAdder(addends, sum);
  }
  return acc;
}

// --- defects ----------------------------------------------------------------

// The accumulator held in format f, every addition rounded once to it.
float NarrowAccumulator(const Terms& p, std::int64_t n, const Format& f) {
  double acc = 0.0;
  for (std::int64_t t = 0; t < n; ++t) acc = AddInFormat(acc, p.Product(t), f);
  return static_cast<float>(acc);
}

// fp32 within blocks, the block sums accumulated in fp16.
float Fp16AcrossBlocks(const Terms& p, std::int64_t n, std::int64_t block) {
  double acc = 0.0;
  for (std::int64_t lo = 0; lo < n; lo += block) {
    acc = AddInFormat(acc, Sequential(p, lo, std::min(n, lo + block)), kFp16);
  }
  return static_cast<float>(acc);
}

float Bf16Products(const Terms& p, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t t = 0; t < n; ++t) acc += RoundToBf16(p.Product(t));
  return acc;
}

std::string PartsName(const char* what, int parts, const char* how) {
  return std::string(what) + " " + std::to_string(parts) + " parts, " + how;
}

std::vector<float> Widen(const std::vector<Bf16Bits>& v) {
  std::vector<float> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), Bf16ToFloat);
  return out;
}

void CheckSize(const char* what, std::size_t size, std::int64_t expected) {
  if (static_cast<std::int64_t>(size) != expected) {
    std::fprintf(stderr, "emulated kernels: %s has %zu elements, expected %lld\n", what, size,
                 static_cast<long long>(expected));
    std::abort();
  }
}

}  // namespace

// --- ExactSum ---------------------------------------------------------------

// Shewchuk's Grow-Expansion with zero elimination, in place: the output's
// components never outrun the input's.
void ExactSum::Add(double x) {
  std::size_t kept = 0;
  double q = x;
  for (double part : parts_) {
    double s, e;
    TwoSum(q, part, s, e);
    if (e != 0.0) parts_[kept++] = e;
    q = s;
  }
  parts_.resize(kept);
  if (q != 0.0) parts_.push_back(q);
}

// Nonoverlapping components: the largest outweighs all the others together.
int ExactSum::Sign() const {
  if (parts_.empty()) return 0;
  return parts_.back() > 0.0 ? 1 : -1;
}

int ExactSum::SignMinus(double x) const {
  ExactSum d = *this;
  d.Add(-x);
  return d.Sign();
}

double ExactSum::Estimate() const {
  double s = 0.0;
  for (double part : parts_) s += part;
  return s;
}

// The estimate's fp32 rounding is within an ulp or two of the answer; exact
// comparisons step it to the float of largest magnitude not above the sum's.
float ExactSum::TruncatedToFloat() const {
  const int sign = Sign();
  if (sign == 0) return 0.0f;
  float t = static_cast<float>(Estimate());
  if (std::isinf(t)) t = std::copysign(FLT_MAX, t);
  while (t != 0.0f && SignMinus(t) == -sign) t = std::nextafter(t, 0.0f);
  const float away = sign > 0 ? INFINITY : -INFINITY;
  for (float up = std::nextafter(t, away); std::isfinite(up) && SignMinus(up) != -sign;
       up = std::nextafter(t, away)) {
    t = up;
  }
  return t;
}

float RoundToFp16(float f) { return static_cast<float>(RoundToFormat(f, 0.0, kFp16)); }

// --- the lists --------------------------------------------------------------

std::vector<Implementation> ConformingImplementations() {
  std::vector<Implementation> out = {
      Make("sequential fp32", true,
           [](const Terms& p, std::int64_t n) { return Sequential(p, 0, n); }),
      Make("reverse fp32", true, Reverse),
      Make("sequential fp32, fused multiply-add", true, SequentialFma),
      Make("pairwise fp32", true, [](const Terms& p, std::int64_t n) { return Pairwise(p, 0, n); }),
      Make("Kahan compensated fp32", true, Kahan),
  };
  for (std::int64_t block : {32, 256}) {
    out.push_back(Make("blocked fp32, blocks of " + std::to_string(block), true,
                       [block](const Terms& p, std::int64_t n) { return Blocked(p, n, block); }));
  }
  for (int lanes : {4, 8}) {
    const Split s{lanes, true, false, false};
    out.push_back(Make("OpenBLAS-like, " + std::to_string(lanes) + " interleaved accumulators",
                       true, [s](const Terms& p, std::int64_t n) { return SplitK(p, n, s); }));
  }
  std::vector<std::pair<std::string, Split>> splits;
  for (int parts : {2, 4, 16}) {
    splits.push_back(
        {PartsName("split-K", parts, "partials in order"), {parts, false, false, false}});
    splits.push_back(
        {PartsName("split-K", parts, "partials as a tree"), {parts, false, true, false}});
    splits.push_back(
        {PartsName("strided split-K", parts, "partials as a tree"), {parts, true, true, false}});
  }
  splits.push_back(
      {PartsName("strided split-K", 16, "partials in order"), {16, true, false, false}});
  for (const auto& [name, s] : splits) {
    out.push_back(
        Make(name, true, [s = s](const Terms& p, std::int64_t n) { return SplitK(p, n, s); }));
  }
  for (std::int64_t block : {4, 8, 16, 32}) {
    out.push_back(
        Make("tensor-core blocks of " + std::to_string(block) + ", truncated", true,
             [block](const Terms& p, std::int64_t n) { return TensorCore(p, n, block, false); }));
  }
  for (std::int64_t block : {4, 8, 16}) {
    out.push_back(Make(
        "tensor-core blocks of " + std::to_string(block) + ", 27-bit aligned adder, truncated",
        true, [block](const Terms& p, std::int64_t n) { return TensorCore(p, n, block, true); }));
  }
  // TF32 keeps 10 explicit significand bits, bf16 7: a TF32 GEMM of bf16
  // values is a tensor-core sum of the same exact products.
  out.push_back(Make("TF32 tensor core (bf16 values exact in TF32), blocks of 8, truncated", true,
                     [](const Terms& p, std::int64_t n) { return TensorCore(p, n, 8, false); }));
  return out;
}

std::vector<Implementation> DefectiveImplementations() {
  std::vector<Implementation> out = {
      Make("bf16 logits upcast", false,
           [](const Terms& p, std::int64_t n) { return RoundToBf16(Sequential(p, 0, n)); }),
  };
  for (int parts : {2, 4, 16}) {
    const Split s{parts, false, false, true};
    out.push_back(Make(PartsName("split-K", parts, "bf16 partials"), false,
                       [s](const Terms& p, std::int64_t n) { return SplitK(p, n, s); }));
  }
  out.push_back(Make("fp16 accumulation, sequential", false, [](const Terms& p, std::int64_t n) {
    return NarrowAccumulator(p, n, kFp16);
  }));
  out.push_back(Make("fp16 accumulation across blocks of 32 (fp32 within)", false,
                     [](const Terms& p, std::int64_t n) { return Fp16AcrossBlocks(p, n, 32); }));
  out.push_back(Make("bf16 accumulation, sequential", false, [](const Terms& p, std::int64_t n) {
    return NarrowAccumulator(p, n, kBf16);
  }));
  out.push_back(Make("fp32 sum of products rounded to bf16", false, Bf16Products));
  return out;
}

// --- the LM head ------------------------------------------------------------

std::vector<float> Logits(const Implementation& impl, const std::vector<Bf16Bits>& x,
                          const std::vector<Bf16Bits>& w, std::int64_t m, std::int64_t v,
                          std::int64_t k, float alpha) {
  CheckSize("x", x.size(), m * k);
  CheckSize("w", w.size(), v * k);
  const std::vector<float> xf = Widen(x), wf = Widen(w);
  std::vector<float> y(static_cast<std::size_t>(m * v));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      y[i * v + j] = alpha * impl.dot(xf.data() + i * k, 1, wf.data() + j * k, 1, k);
    }
  }
  return y;
}

namespace {

std::vector<float> Gradient(const std::vector<float>& dy, bool cast_g) {
  std::vector<float> g = dy;
  if (cast_g) {
    for (float& x : g) x = RoundToBf16(x);
  }
  return g;
}

}  // namespace

std::vector<float> GradInput(const Implementation& impl, const std::vector<float>& dy,
                             const std::vector<Bf16Bits>& w, std::int64_t m, std::int64_t v,
                             std::int64_t k, bool cast_g) {
  CheckSize("dy", dy.size(), m * v);
  CheckSize("w", w.size(), v * k);
  const std::vector<float> g = Gradient(dy, cast_g), wf = Widen(w);
  std::vector<float> dx(static_cast<std::size_t>(m * k));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t c = 0; c < k; ++c) {
      dx[i * k + c] = impl.dot(g.data() + i * v, 1, wf.data() + c, k, v);
    }
  }
  return dx;
}

std::vector<float> GradWeight(const Implementation& impl, const std::vector<float>& dy,
                              const std::vector<Bf16Bits>& x, std::int64_t m, std::int64_t v,
                              std::int64_t k, bool cast_g) {
  CheckSize("dy", dy.size(), m * v);
  CheckSize("x", x.size(), m * k);
  const std::vector<float> g = Gradient(dy, cast_g), xf = Widen(x);
  std::vector<float> dw(static_cast<std::size_t>(v * k));
  for (std::int64_t j = 0; j < v; ++j) {
    for (std::int64_t c = 0; c < k; ++c) {
      dw[j * k + c] = impl.dot(g.data() + j, v, xf.data() + c, k, m);
    }
  }
  return dw;
}

// --- inputs -----------------------------------------------------------------

namespace {

using Rng = std::mt19937_64;

std::vector<Bf16Bits> NormalValues(std::int64_t n, float stddev, Rng& rng, bool positive = false) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (Bf16Bits& b : out) {
    const float f = normal(rng);
    b = FloatToBf16(positive ? std::fabs(f) : f);
  }
  return out;
}

// Scaling by a power of two keeps a bf16 value exact.
Bf16Bits Scaled(Bf16Bits b, float s) { return FloatToBf16(Bf16ToFloat(b) * s); }

void FillRow(std::vector<Bf16Bits>& a, std::int64_t row, std::int64_t k, Bf16Bits value) {
  std::fill(a.begin() + row * k, a.begin() + (row + 1) * k, value);
}

// A real LM head's scales: activations of order 1, weights of order 0.02.
void NormalCase(LmHeadCase& c, Rng& rng) {
  c.x = NormalValues(c.m * c.k, 1.0f, rng);
  c.w = NormalValues(c.v * c.k, 0.02f, rng);
}

// Logits of an LM head's spread: z ~ N(0, 3²) whatever K, so that a
// softmax over them is as peaked as a language model's.
void LmLogitsCase(LmHeadCase& c, Rng& rng) {
  c.x = NormalValues(c.m * c.k, 1.0f, rng);
  c.w = NormalValues(c.v * c.k,
                     3.0f / std::sqrt(static_cast<float>(std::max<std::int64_t>(c.k, 1))), rng);
}

void UnitNormalCase(LmHeadCase& c, Rng& rng) {
  c.x = NormalValues(c.m * c.k, 1.0f, rng);
  c.w = NormalValues(c.v * c.k, 1.0f, rng);
}

// No cancellation: every error is a fraction of the sum itself.
void AllPositiveCase(LmHeadCase& c, Rng& rng) {
  c.x = NormalValues(c.m * c.k, 1.0f, rng, true);
  c.w = NormalValues(c.v * c.k, 1.0f, rng, true);
}

// The rounding errors of a sum of equal terms are not independent: the
// probabilistic model's premise fails.
void EqualProductsCase(LmHeadCase& c, Rng& rng) {
  c.x.resize(static_cast<std::size_t>(c.m * c.k));
  c.w.resize(static_cast<std::size_t>(c.v * c.k));
  for (std::int64_t i = 0; i < c.m; ++i) FillRow(c.x, i, c.k, NormalValues(1, 1.0f, rng)[0]);
  for (std::int64_t j = 0; j < c.v; ++j) FillRow(c.w, j, c.k, NormalValues(1, 1.0f, rng)[0]);
}

// Every fourth row of X constant (padding or a repeated token), the rest normal.
void ConstantRowsCase(LmHeadCase& c, Rng& rng) {
  NormalCase(c, rng);
  for (std::int64_t i = 0; i < c.m; i += 4) FillRow(c.x, i, c.k, NormalValues(1, 1.0f, rng)[0]);
}

// Adjacent products +p and −p, one pair in eight off by an ulp of w: exact
// sums near 0 beside a large Σ|x·w|.
void CancellationCase(LmHeadCase& c, Rng& rng) {
  NormalCase(c, rng);
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t t = 0; t + 1 < c.k; t += 2) c.x[i * c.k + t + 1] = c.x[i * c.k + t];
  }
  for (std::int64_t j = 0; j < c.v; ++j) {
    for (std::int64_t t = 0; t + 1 < c.k; t += 2) {
      Bf16Bits b = c.w[j * c.k + t];
      if (rng() % 8 == 0) b = (b & 0x7fff) == 0 || rng() % 2 == 0 ? b + 1 : b - 1;
      c.w[j * c.k + t + 1] = static_cast<Bf16Bits>(b ^ 0x8000);
    }
  }
}

// Massive activations: one channel of X 100x larger, of W 10x larger.
void OutlierChannelCase(LmHeadCase& c, Rng& rng) {
  NormalCase(c, rng);
  if (c.k == 0) return;
  const std::int64_t channel = static_cast<std::int64_t>(rng() % c.k);
  for (std::int64_t i = 0; i < c.m; ++i) {
    c.x[i * c.k + channel] = FloatToBf16(Bf16ToFloat(c.x[i * c.k + channel]) * 100.0f);
  }
  for (std::int64_t j = 0; j < c.v; ++j) {
    c.w[j * c.k + channel] = FloatToBf16(Bf16ToFloat(c.w[j * c.k + channel]) * 10.0f);
  }
}

// Rows [1, t, t, …] with t = (1 − 2⁻⁸)·2⁻²³, W all ones: rounding to
// nearest adds each t to 1 as an ulp, a truncating adder drops about an ulp
// per block.
void DominantTermCase(LmHeadCase& c, Rng&) {
  c.x.assign(static_cast<std::size_t>(c.m * c.k), FloatToBf16(std::ldexp(255.0f, -31)));
  for (std::int64_t i = 0; i < c.m && c.k > 0; ++i) c.x[i * c.k] = FloatToBf16(1.0f);
  c.w.assign(static_cast<std::size_t>(c.v * c.k), FloatToBf16(1.0f));
}

// The first half of K's products positive, the second half negative.
void HalvesCase(LmHeadCase& c, Rng& rng) {
  c.x = NormalValues(c.m * c.k, 1.0f, rng, true);
  c.w = NormalValues(c.v * c.k, 0.02f, rng, true);
  for (std::int64_t j = 0; j < c.v; ++j) {
    for (std::int64_t t = c.k / 2; t < c.k; ++t) c.w[j * c.k + t] ^= 0x8000;
  }
}

// Values near 2⁻⁷⁰: products near 2⁻¹⁴⁰, subnormal in fp32.
void TinyCase(LmHeadCase& c, Rng& rng) {
  UnitNormalCase(c, rng);
  for (Bf16Bits& b : c.x) b = Scaled(b, std::ldexp(1.0f, -70));
  for (Bf16Bits& b : c.w) b = Scaled(b, std::ldexp(1.0f, -70));
}

// Rows of X and of W scaled by powers of two from 2⁻²⁰ to 2²⁰.
void MixedScaleCase(LmHeadCase& c, Rng& rng) {
  NormalCase(c, rng);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (std::int64_t i = 0; i < c.m * c.k; i += c.k) {
    const float s = std::ldexp(1.0f, exponent(rng));
    for (std::int64_t t = i; t < i + c.k; ++t) c.x[t] = Scaled(c.x[t], s);
  }
  for (std::int64_t j = 0; j < c.v * c.k; j += c.k) {
    const float s = std::ldexp(1.0f, exponent(rng));
    for (std::int64_t t = j; t < j + c.k; ++t) c.w[t] = Scaled(c.w[t], s);
  }
}

using Filler = void (*)(LmHeadCase&, Rng&);

const std::vector<std::pair<std::string, Filler>>& Kinds() {
  static const auto* kinds = new std::vector<std::pair<std::string, Filler>>{
      {"normal", NormalCase},
      {"unit normal", UnitNormalCase},
      {"lm logits", LmLogitsCase},
      {"all positive", AllPositiveCase},
      {"equal products", EqualProductsCase},
      {"constant rows", ConstantRowsCase},
      {"cancellation", CancellationCase},
      {"outlier channel", OutlierChannelCase},
      {"dominant term", DominantTermCase},
      {"halves", HalvesCase},
      {"tiny", TinyCase},
      {"mixed scale", MixedScaleCase},
  };
  return *kinds;
}

}  // namespace

std::vector<std::string> CaseKinds() {
  std::vector<std::string> out;
  for (const auto& kind : Kinds()) out.push_back(kind.first);
  return out;
}

LmHeadCase MakeCase(const std::string& kind, std::int64_t m, std::int64_t v, std::int64_t k,
                    std::uint64_t seed) {
  for (const auto& [name, fill] : Kinds()) {
    if (name != kind) continue;
    LmHeadCase c{kind, {}, {}, m, v, k};
    Rng rng(seed);
    fill(c, rng);
    return c;
  }
  std::fprintf(stderr, "emulated kernels: no case kind '%s'\n", kind.c_str());
  std::abort();
}

}  // namespace logitd::emulated

#include "logitd/reference/numerics.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "logitd/reference/element_judgement.h"

namespace logitd {
namespace {

std::int64_t BlockRows(std::int64_t cols, std::int64_t block_elements) {
  return std::max<std::int64_t>(1, block_elements / std::max<std::int64_t>(1, cols));
}

void WidenRows(Bf16Matrix w, std::int64_t row0, std::int64_t rows, bool absolute, double* out) {
  const Bf16Bits* src = w.data + row0 * w.cols;
  const std::int64_t n = rows * w.cols;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = Bf16ToFloat(src[i]);
    out[i] = absolute ? std::fabs(v) : v;
  }
}

std::vector<double> Abs(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(v[i]);
  return out;
}

// The product of activations `a` with the weight W [n, k], in double, into
// `out`: a [m, k]·Wᵀ, [m, n], when `transposed`, else a [m, n]·W, [m, k]. When
// out_abs is not null, the same product of the magnitudes (the sums of
// |a·b|) into it. W is widened a block of whole rows at a time, at most
// block_elements elements, never all at once.
void MultiplyWeight(const std::vector<double>& a, std::int64_t m, Bf16Matrix w, bool transposed,
                    double* out, double* out_abs, std::int64_t block_elements) {
  const int n = static_cast<int>(w.rows);
  const int k = static_cast<int>(w.cols);
  const std::vector<double> a_abs = out_abs != nullptr ? Abs(a) : std::vector<double>();
  const auto gemm = [&](std::int64_t r0, std::int64_t rows, const double* wb, const double* a_data,
                        double* c) {
    if (transposed) {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(rows), k, 1.0, a_data, k, wb, k, 0.0, c + r0, n);
    } else {
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), k,
                  static_cast<int>(rows), 1.0, a_data + r0, n, wb, k, r0 == 0 ? 0.0 : 1.0, c, k);
    }
  };
  const std::int64_t block = BlockRows(w.cols, block_elements);
  std::vector<double> wb(static_cast<std::size_t>(std::min(block, w.rows) * w.cols));
  for (std::int64_t r0 = 0; r0 < w.rows; r0 += block) {
    const std::int64_t rows = std::min(block, w.rows - r0);
    WidenRows(w, r0, rows, /*absolute=*/false, wb.data());
    gemm(r0, rows, wb.data(), a.data(), out);
    if (out_abs != nullptr) {
      for (double& v : wb) v = std::fabs(v);
      gemm(r0, rows, wb.data(), a_abs.data(), out_abs);
    }
  }
}

bool IsNanBits(std::uint32_t bits, DType dtype) {
  return judgement::IsNanBits(bits, dtype == DType::kBf16);
}

bool IsZeroBits(std::uint32_t bits, DType dtype) {
  return dtype == DType::kBf16 ? (bits & 0x7fffu) == 0 : (bits & 0x7fffffffu) == 0;
}

bool SameValue(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b;  // ±0 are one value here: their sign depends on the order
}

}  // namespace

double Gamma(std::int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  if (nu >= 1.0) return std::numeric_limits<double>::infinity();
  // Up by a few units of fp64 rounding, so that the bound is never below
  // the exact γ.
  return nu / (1.0 - nu) * (1 + 0x1p-50);
}

double ProbabilisticGamma(std::int64_t n, double u, double lambda) {
  const double nd = static_cast<double>(n);
  return std::expm1(lambda * std::sqrt(nd) * u + nd * u * u / (1.0 - u));
}

Bf16Matrix AsMatrix(const Tensor& t) { return Bf16Matrix{t.data<Bf16Bits>(), t.dim(0), t.dim(1)}; }

std::vector<double> ToDouble(const Tensor& t, bool absolute) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.At(i);
    out[static_cast<std::size_t>(i)] = absolute ? std::fabs(v) : v;
  }
  return out;
}

void ReferenceXWt(const std::vector<double>& x, std::int64_t m, Bf16Matrix w, double* y,
                  double* y_abs, std::int64_t block_elements) {
  MultiplyWeight(x, m, w, /*transposed=*/true, y, y_abs, block_elements);
}

void ReferenceGW(const std::vector<double>& g, std::int64_t m, Bf16Matrix w, double* dx,
                 double* dx_abs, std::int64_t block_elements) {
  MultiplyWeight(g, m, w, /*transposed=*/false, dx, dx_abs, block_elements);
}

void ReferenceGtX(const std::vector<double>& g, const std::vector<double>& x, std::int64_t m,
                  std::int64_t n, std::int64_t k, bool with_abs, const RowBlockSink& sink,
                  std::int64_t block_elements, const std::function<bool()>& stop) {
  ReferenceGtX(
      [&](std::int64_t col0, std::int64_t cols, double* out) {
        for (std::int64_t i = 0; i < m; ++i) {
          std::copy_n(g.data() + i * n + col0, cols, out + i * cols);
        }
      },
      x, m, n, k, with_abs, sink, block_elements, stop);
}

std::int64_t GtXBlockRows(std::int64_t m, std::int64_t k, std::int64_t block_elements) {
  return BlockRows(std::max(m, k), block_elements);
}

void ReferenceGtX(const ColumnGather& g_columns, const std::vector<double>& x, std::int64_t m,
                  std::int64_t n, std::int64_t k, bool with_abs, const RowBlockSink& sink,
                  std::int64_t block_elements, const std::function<bool()>& stop) {
  const std::int64_t block = std::min(GtXBlockRows(m, k, block_elements), n);
  std::vector<double> gb(static_cast<std::size_t>(block * m));
  std::vector<double> value(static_cast<std::size_t>(block * k));
  std::vector<double> abs(with_abs ? value.size() : 0);
  const std::vector<double> x_abs = with_abs ? Abs(x) : std::vector<double>();
  for (std::int64_t r0 = 0; r0 < n; r0 += block) {
    if (stop && stop()) return;
    const std::int64_t rows = std::min(block, n - r0);
    g_columns(r0, rows, gb.data());
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, gb.data(), static_cast<int>(rows),
                x.data(), static_cast<int>(k), 0.0, value.data(), static_cast<int>(k));
    if (with_abs) {
      for (std::int64_t i = 0; i < rows * m; ++i) {
        gb[static_cast<std::size_t>(i)] = std::fabs(gb[static_cast<std::size_t>(i)]);
      }
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(k), static_cast<int>(m), 1.0, gb.data(), static_cast<int>(rows),
                  x_abs.data(), static_cast<int>(k), 0.0, abs.data(), static_cast<int>(k));
    }
    sink(r0, rows, value.data(), with_abs ? abs.data() : nullptr);
  }
}

std::int64_t UlpDistanceFp32(std::uint32_t a, std::uint32_t b) {
  return judgement::UlpDistance(a, b, /*bf16=*/false);
}

std::int64_t UlpDistanceBf16(Bf16Bits a, Bf16Bits b) {
  return judgement::UlpDistance(a, b, /*bf16=*/true);
}

std::uint32_t ElementBits(const Tensor& t, std::int64_t i) {
  if (t.dtype() == DType::kBf16) return t.data<Bf16Bits>()[i];
  return t.data<std::uint32_t>()[i];
}

std::int64_t UlpDistanceAt(const Tensor& a, const Tensor& b, std::int64_t i) {
  if (a.dtype() == DType::kBf16) {
    return UlpDistanceBf16(a.data<Bf16Bits>()[i], b.data<Bf16Bits>()[i]);
  }
  return UlpDistanceFp32(ElementBits(a, i), ElementBits(b, i));
}

float RoundToFp32(double exact) {
  // Values at or past FLT_MAX + half an ulp (2^128 - 2^103) round to ±Inf.
  constexpr double kOverflow = 0x1p128 - 0x1p103;
  if (std::isnan(exact)) return std::numeric_limits<float>::quiet_NaN();
  if (std::fabs(exact) >= kOverflow) {
    return std::signbit(exact) ? -std::numeric_limits<float>::infinity()
                               : std::numeric_limits<float>::infinity();
  }
  if (std::fabs(exact) > std::numeric_limits<float>::max()) {
    return std::signbit(exact) ? -std::numeric_limits<float>::max()
                               : std::numeric_limits<float>::max();
  }
  return static_cast<float>(exact);
}

double Bf16Ulp(double r) {
  if (r == 0 || !std::isfinite(r)) return 0x1p-133;
  return std::ldexp(1.0, std::max(std::ilogb(r), -126) - 7);
}

double RoundDoubleToBf16(double d) {
  if (d == 0 || !std::isfinite(d)) return d;
  const double q = Bf16Ulp(d);
  const double r = std::nearbyint(d / q) * q;  // the default mode: ties to even
  if (std::fabs(r) > std::numeric_limits<float>::max()) {
    return std::copysign(std::numeric_limits<double>::infinity(), d);
  }
  return r;
}

IeeeDot PredictIeeeDot(const float* a, std::int64_t stride_a, const float* b, std::int64_t stride_b,
                       std::int64_t k) {
  float forward = 0.0f;
  for (std::int64_t i = 0; i < k; ++i) forward += a[i * stride_a] * b[i * stride_b];
  float reverse = 0.0f;
  for (std::int64_t i = k - 1; i >= 0; --i) reverse += a[i * stride_a] * b[i * stride_b];
  // Products of fp32 values are exact in fp64; only their sum rounds there.
  double exact = 0.0;
  for (std::int64_t i = 0; i < k; ++i) {
    exact += static_cast<double>(a[i * stride_a]) * static_cast<double>(b[i * stride_b]);
  }
  IeeeDot out;
  out.value = forward;
  out.order_independent = SameValue(forward, reverse) && SameValue(forward, RoundToFp32(exact));
  return out;
}

std::string BitwiseComparison::Describe(const std::vector<std::int64_t>& shape) const {
  if (differing == 0) return absl::StrCat("all ", compared, " elements equal");
  return absl::StrCat(differing, " of ", compared, " elements differ; first at ",
                      IndexString(first_index, shape), ": got ", absl::StrFormat("0x%x", first_got),
                      " want ", absl::StrFormat("0x%x", first_want), "; max ",
                      max_ulp == std::numeric_limits<std::int64_t>::max()
                          ? std::string("inf (NaN vs number)")
                          : absl::StrCat(max_ulp),
                      " ulp");
}

namespace {

// Element i of a comparison, its bits `g` got and `w` wanted: counted when
// they differ and the options do not take them as equal, keeping the first
// difference and the largest ulp distance.
void CompareElement(std::int64_t i, std::uint32_t g, std::uint32_t w, DType dtype,
                    const CompareOptions& options, BitwiseComparison* c) {
  if (g == w) return;
  if (options.signed_zero_equal && IsZeroBits(g, dtype) && IsZeroBits(w, dtype)) return;
  if (options.any_nan_equal && IsNanBits(g, dtype) && IsNanBits(w, dtype)) return;
  if (c->differing++ == 0) {
    c->first_index = i;
    c->first_got = g;
    c->first_want = w;
  }
  const std::int64_t ulp = dtype == DType::kBf16
                               ? UlpDistanceBf16(static_cast<Bf16Bits>(g), static_cast<Bf16Bits>(w))
                               : UlpDistanceFp32(g, w);
  c->max_ulp = std::max(c->max_ulp, ulp);
}

}  // namespace

void CompareRangeInto(const Tensor& got, std::int64_t offset, const float* want, std::int64_t n,
                      const CompareOptions& options, BitwiseComparison* acc) {
  BitwiseComparison& c = *acc;
  const DType dtype = got.dtype();
  c.compared += n;
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t i = offset + j;
    const std::uint32_t g = ElementBits(got, i);
    const std::uint32_t w = dtype == DType::kBf16 ? FloatToBf16(want[j]) : FloatBits(want[j]);
    CompareElement(i, g, w, dtype, options, &c);
  }
}

BitwiseComparison CompareWith(const Tensor& got, const float* want, std::int64_t n,
                              const CompareOptions& options) {
  BitwiseComparison c;
  if (n != got.numel()) {
    c.compared = std::max(n, got.numel());
    c.differing = c.compared;
    c.first_index = 0;
    return c;
  }
  CompareRangeInto(got, 0, want, n, options, &c);
  return c;
}

BitwiseComparison CompareTensors(const Tensor& got, const Tensor& want,
                                 const CompareOptions& options) {
  BitwiseComparison c;
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    c.compared = want.numel();
    c.differing = want.numel();
    c.first_index = 0;
    return c;
  }
  c.compared = got.numel();
  const DType dtype = got.dtype();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    CompareElement(i, ElementBits(got, i), ElementBits(want, i), dtype, options, &c);
  }
  return c;
}

std::string IndexString(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return absl::StrCat("[", flat, "]");
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

std::string BitsHex(std::uint32_t bits, DType dtype) {
  return dtype == DType::kBf16 ? absl::StrFormat("0x%04x", bits) : absl::StrFormat("0x%08x", bits);
}

}  // namespace logitd

#include "logitd/reference/bounds.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "logitd/reference/element_judgement.h"
#include "logitd/reference/numerics.h"

namespace logitd {

judgement::ProductRule SumOfProductsRule(std::int64_t n, double alpha, DType out) {
  const std::int64_t steps = alpha == 1.0 ? n : n + 2;
  const double scale = std::fabs(alpha);
  const double gamma32 = Gamma(steps, kFp32StepError);
  const double gamma64 = Gamma(n + 1, kFp64UnitRoundoff);
  judgement::ProductRule rule;
  rule.scale_reference = alpha;
  rule.gamma = scale * (gamma32 + gamma64);
  rule.p_gamma =
      scale * (std::min(ProbabilisticGamma(steps, kFp32UnitRoundoff), gamma32) + gamma64);
  const double widest = std::max(1.0, scale);
  rule.absolute = 2 * static_cast<double>(steps) * kFp32Underflow * widest;
  rule.partial = widest * (1 + gamma32);
  rule.bf16 = out == DType::kBf16;
  rule.terms = n;
  return rule;
}

double SumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out) {
  return judgement::ProductBounds(SumOfProductsRule(n, 1.0, out), ref, abs_sum).bound;
}

double ProbabilisticSumOfProductsBound(std::int64_t n, double abs_sum, double ref, DType out) {
  return judgement::ProductBounds(SumOfProductsRule(n, 1.0, out), ref, abs_sum).p_bound;
}

void BoundStats::Add(std::int64_t i, double got, const judgement::ElementBounds& e) {
  ++checked;
  bool mismatch = false;
  const double fraction = judgement::Fraction(got, e, e.bound, &mismatch);
  if (!(fraction <= 1)) {
    if (violations++ == 0) {
      first = i;
      first_got = got;
      first_ref = e.reference;
      first_bound = e.bound;
    }
  }
  if (std::isfinite(fraction)) worst_fraction = std::max(worst_fraction, fraction);
}

void BoundStats::Add(std::int64_t i, double got, double ref, double bound) {
  Add(i, got, judgement::ValueBounds(ref, bound, bound, judgement::kFp32MaxFinite));
}

std::string BoundStats::Describe(const std::string& what,
                                 const std::vector<std::int64_t>& shape) const {
  if (violations == 0) return std::string();
  return absl::StrFormat(
      "%d of %d %s elements outside their bound; first %s: got %.9g, fp64 reference %.17g, bound "
      "%.3e",
      violations, checked, what, IndexString(first, shape), first_got, first_ref, first_bound);
}

std::vector<double> BackwardG(const Tensor& dy) {
  std::vector<double> g(static_cast<std::size_t>(dy.numel()));
  for (std::int64_t i = 0; i < dy.numel(); ++i) {
    g[static_cast<std::size_t>(i)] = RoundToBf16(static_cast<float>(dy.At(i)));
  }
  return g;
}

BoundStats CheckLogitsBounds(const Tensor& x, const Tensor& w, const Tensor& y) {
  const std::int64_t m = x.shape()[0], k = x.shape()[1], v = w.shape()[0];
  BoundStats stats;
  // A block of rows at a time: the reference of a whole [M, V] can be large.
  const std::int64_t rows_per_block = std::max<std::int64_t>(1, kReferenceBlockElements / v);
  const judgement::ProductRule rule = SumOfProductsRule(k, 1.0, y.dtype());
  std::vector<double> ref, abs;
  for (std::int64_t r0 = 0; r0 < m; r0 += rows_per_block) {
    const std::int64_t rows = std::min(rows_per_block, m - r0);
    std::vector<double> xd(static_cast<std::size_t>(rows * k));
    for (std::int64_t i = 0; i < rows * k; ++i) {
      xd[static_cast<std::size_t>(i)] = x.At(r0 * k + i);
    }
    ref.resize(static_cast<std::size_t>(rows * v));
    abs.resize(ref.size());
    ReferenceXWt(xd, rows, AsMatrix(w), ref.data(), abs.data());
    for (std::int64_t i = 0; i < rows * v; ++i) {
      const double want = ref[static_cast<std::size_t>(i)];
      stats.Add(r0 * v + i, y.At(r0 * v + i),
                judgement::ProductBounds(rule, want, abs[static_cast<std::size_t>(i)]));
    }
  }
  return stats;
}

BoundStats CheckGradInputBounds(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const std::int64_t m = dy.shape()[0], v = dy.shape()[1], k = w.shape()[1];
  std::vector<double> ref(static_cast<std::size_t>(m * k));
  std::vector<double> abs(ref.size());
  ReferenceGW(BackwardG(dy), m, AsMatrix(w), ref.data(), abs.data());
  BoundStats stats;
  const judgement::ProductRule rule = SumOfProductsRule(v, 1.0, dx.dtype());
  for (std::int64_t i = 0; i < m * k; ++i) {
    stats.Add(i, dx.At(i),
              judgement::ProductBounds(rule, ref[static_cast<std::size_t>(i)],
                                       abs[static_cast<std::size_t>(i)]));
  }
  return stats;
}

BoundStats CheckGradWeightBounds(const Tensor& dy, const Tensor& x, const Tensor& dw) {
  const std::int64_t m = dy.shape()[0], v = dy.shape()[1], k = x.shape()[1];
  BoundStats stats;
  const judgement::ProductRule rule = SumOfProductsRule(m, 1.0, dw.dtype());
  ReferenceGtX(BackwardG(dy), ToDouble(x), m, v, k, true,
               [&](std::int64_t row0, std::int64_t rows, const double* value, const double* abs) {
                 for (std::int64_t j = 0; j < rows * k; ++j) {
                   stats.Add(row0 * k + j, dw.At(row0 * k + j),
                             judgement::ProductBounds(rule, value[j], abs[j]));
                 }
               });
  return stats;
}

}  // namespace logitd

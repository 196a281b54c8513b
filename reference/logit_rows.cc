#include "logit_rows.h"

#include <algorithm>
#include <cmath>

#include "logitd/reference/numerics.h"

namespace logitd::reference_internal {
namespace {

double Bf16At(const Bf16Bits* data, std::int64_t i) { return Bf16ToFloat(data[i]); }

bool AnyNonFinite(const Bf16Bits* row, std::int64_t n) {
  for (std::int64_t t = 0; t < n; ++t) {
    if (!std::isfinite(Bf16At(row, t))) return true;
  }
  return false;
}

// Σ x·w and Σ|x·w| over k in fp64, one product at a time.
void NaiveDot(const Bf16Bits* x, const Bf16Bits* w, std::int64_t k, double* sum, double* abs) {
  double s = 0, s_abs = 0;
  for (std::int64_t t = 0; t < k; ++t) {
    const double p = Bf16At(x, t) * Bf16At(w, t);
    s += p;
    s_abs += std::fabs(p);
  }
  *sum = s;
  *abs = s_abs;
}

}  // namespace

std::int64_t DefaultBlockRows(std::int64_t v) {
  return std::max<std::int64_t>(1, kReferenceBlockElements / std::max<std::int64_t>(1, v));
}

LogitRows::LogitRows(const LmHeadInputs& in, LogitModel model) : in_(in), model_(model) {
  for (std::int64_t j = 0; j < in.v; ++j) {
    if (AnyNonFinite(in.w + j * in.k, in.k)) bad_w_.push_back(j);
  }
}

void LogitRows::Compute(std::int64_t row0, std::int64_t n, std::vector<double>* y,
                        std::vector<double>* y_err) const {
  const std::int64_t v = in_.v, k = in_.k;
  const bool bounded = model_ == LogitModel::kFp32Sum;
  std::vector<double> xd(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < n * k; ++i) {
    xd[static_cast<std::size_t>(i)] = Bf16At(in_.x, row0 * k + i);
  }
  y->assign(static_cast<std::size_t>(n * v), 0.0);
  if (bounded) {
    y_err->assign(y->size(), 0.0);
  } else {
    y_err->clear();
  }
  ReferenceXWt(xd, n, Bf16Matrix{in_.w, v, k}, y->data(), bounded ? y_err->data() : nullptr);
  // The elements a dgemm may get wrong: every one of a row of X with a NaN
  // or an infinity, and those of the rows of W with one.
  for (std::int64_t r = 0; r < n; ++r) {
    const Bf16Bits* x_row = in_.x + (row0 + r) * k;
    double* y_row = y->data() + r * v;
    double* abs_row = bounded ? y_err->data() + r * v : nullptr;
    const auto naive = [&](std::int64_t j) {
      double abs = 0;
      NaiveDot(x_row, in_.w + j * k, k, &y_row[j], &abs);
      if (abs_row != nullptr) abs_row[j] = abs;
    };
    if (AnyNonFinite(x_row, k)) {
      for (std::int64_t j = 0; j < v; ++j) naive(j);
    } else {
      for (std::int64_t j : bad_w_) naive(j);
    }
  }
  if (bounded) {
    const double gamma = Gamma(k, kFp32UnitRoundoff) + Gamma(k, kFp64UnitRoundoff);
    for (double& e : *y_err) e *= gamma;
  } else if (model_ == LogitModel::kBf16Rounded) {
    for (double& value : *y) value = RoundDoubleToBf16(value);
  }
}

}  // namespace logitd::reference_internal

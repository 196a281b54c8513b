// cross_entropy's exact cases: data on which the server's G, dX and dW are
// predictable bit for bit.
//
// Bitwise, the gradient-cast contract. In general the client cannot predict
// the server's fp32 softmax bit for bit (exp differs between libraries), and
// therefore not G = bf16(g) either. It can where every value within e_g of
// g rounds to the same bf16 value: then G is known exactly. The exact cases
// build such data: integer X and W whose logits are exact and take two
// values per row, rows resampled until every g is decided, and magnitudes
// small enough that every partial sum of G·W and Gᵀ·X is an fp32 value. Then
// dX and dW are exact whatever the chunking or order, and must equal the
// prediction bit for bit; a cast that is not round-to-nearest-even, a
// missing cast, or a scale applied after the cast shows. The server's own
// Backward of the predicted G must give the same bits, and accumulating dW
// twice into the server-held buffer must give exactly twice it.
//

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/cross_entropy.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {

namespace {

bool AllIntegers(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.At(i);
    if (!std::isfinite(v) || v != std::nearbyint(v)) return false;
  }
  return true;
}

double RowMaxAbs(const Tensor& t, std::int64_t row) {
  const std::int64_t cols = t.dim(1);
  double m = 0;
  for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, std::fabs(t.At(row * cols + j)));
  return m;
}

}  // namespace

absl::StatusOr<ExactGradients> PredictExactGradients(const CeReference& ref, const Tensor& x,
                                                     const Tensor& w) {
  const std::int64_t m = ref.m, v = ref.v, k = x.dim(1);
  if (!AllIntegers(x) || !AllIntegers(w)) {
    return absl::FailedPreconditionError("exact gradients need integer-valued X and W");
  }
  ExactGradients out;
  out.g = Tensor(DType::kBf16, {m, v});
  std::vector<double> g(static_cast<std::size_t>(m * v));
  for (std::int64_t i = 0; i < m * v; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    float rounded = 0;
    if (!Bf16RoundingIsDecided(ref.g[s], ref.g_pre_err[s], &rounded)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "G%s is not decided: g = %.17g with a pre-cast error bound %.3e straddles a bf16 "
          "rounding boundary",
          IndexString(i, {m, v}), ref.g[s], ref.g_pre_err[s]));
    }
    out.g.data<Bf16Bits>()[i] = FloatToBf16(rounded);
    g[s] = rounded;
  }
  // Every product G·w (w an integer) is a multiple of the smallest bf16
  // spacing q among the G values of its sum; while the sum of magnitudes
  // stays below 2^24·q every partial sum, in any order, is an fp32 value.
  const auto q_of = [](double gv) { return Bf16Ulp(gv); };
  std::vector<double> w_max(static_cast<std::size_t>(v)), x_max(static_cast<std::size_t>(m));
  for (std::int64_t j = 0; j < v; ++j) w_max[static_cast<std::size_t>(j)] = RowMaxAbs(w, j);
  for (std::int64_t i = 0; i < m; ++i) x_max[static_cast<std::size_t>(i)] = RowMaxAbs(x, i);
  for (std::int64_t i = 0; i < m; ++i) {
    double q = std::numeric_limits<double>::infinity(), total = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const double gv = g[static_cast<std::size_t>(i * v + j)];
      if (gv == 0) continue;
      q = std::min(q, q_of(gv));
      total += std::fabs(gv) * w_max[static_cast<std::size_t>(j)];
    }
    if (total > 0 && !(total < 0x1p24 * q)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "dX row %d is not exact in fp32: sum of magnitudes %.3e, spacing %.3e", i, total, q));
    }
  }
  for (std::int64_t j = 0; j < v; ++j) {
    double q = std::numeric_limits<double>::infinity(), total = 0;
    for (std::int64_t i = 0; i < m; ++i) {
      const double gv = g[static_cast<std::size_t>(i * v + j)];
      if (gv == 0) continue;
      q = std::min(q, q_of(gv));
      total += std::fabs(gv) * x_max[static_cast<std::size_t>(i)];
    }
    if (total > 0 && !(total < 0x1p24 * q)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "dW row %d is not exact in fp32: sum of magnitudes %.3e, spacing %.3e", j, total, q));
    }
  }
  // The sums are exact in fp64 too (far below 2^53·q).
  std::vector<double> dx(static_cast<std::size_t>(m * k));
  ReferenceGW(g, m, AsMatrix(w), dx.data(), nullptr);
  out.dx.assign(dx.begin(), dx.end());
  out.dw.resize(static_cast<std::size_t>(v * k));
  ReferenceGtX(g, ToDouble(x), m, v, k, false,
               [&](std::int64_t row0, std::int64_t rows, const double* value, const double*) {
                 std::copy(value, value + rows * k, out.dw.begin() + row0 * k);
               });
  return out;
}

absl::StatusOr<ExactData> MakeExactData(std::uint64_t seed, absl::string_view stream,
                                        std::int64_t m, std::int64_t v, std::int64_t k,
                                        CeRequest* request) {
  if (k < 4) return absl::InvalidArgumentError("exact data needs K >= 4");
  Rng rng = Rng::Stream(seed, stream);
  // Columns: 0 selects the group (logit c + a·b_v), 1 carries the offset c,
  // [2, 2 + k2) are W's own (X is 0 there), the rest X's own (W is 0 there).
  const std::int64_t k2 = (k - 2) / 2;
  ExactData d;
  d.w = Tensor(DType::kBf16, {v, k});
  d.x = Tensor(DType::kBf16, {m, k});
  std::vector<double> group(static_cast<std::size_t>(v));
  for (std::int64_t j = 0; j < v; ++j) {
    Bf16Bits* row = d.w.data<Bf16Bits>() + j * k;
    group[static_cast<std::size_t>(j)] = static_cast<double>(rng.UniformInt(0, 1));
    row[0] = FloatToBf16(static_cast<float>(group[static_cast<std::size_t>(j)]));
    row[1] = FloatToBf16(1.0f);
    for (std::int64_t c = 2; c < k; ++c) {
      row[c] = FloatToBf16(c < 2 + k2 ? static_cast<float>(rng.UniformInt(-8, 8)) : 0.0f);
    }
  }
  std::vector<bool> ignored(static_cast<std::size_t>(m));
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    ignored[static_cast<std::size_t>(i)] = i > 0 && rng.UniformInt(0, 7) == 0;
    counted += ignored[static_cast<std::size_t>(i)] ? 0 : 1;
  }
  request->targets.assign(static_cast<std::size_t>(m), request->ignore_index);
  const CeReferenceOptions options = request->ReferenceOptions();
  const double scale = CrossEntropyGradScale(options, counted);
  std::vector<double> y(static_cast<std::size_t>(v)), g(y.size()), err(y.size());
  for (std::int64_t i = 0; i < m; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    Bf16Bits* row = d.x.data<Bf16Bits>() + i * k;
    for (std::int64_t c = 2; c < k; ++c) {
      row[c] = FloatToBf16(c < 2 + k2 ? 0.0f : static_cast<float>(rng.UniformInt(-8, 8)));
    }
    bool decided = false;
    for (int attempt = 0; attempt < 1000 && !decided; ++attempt) {
      const std::int64_t a = rng.UniformInt(-2, 2);
      const std::int64_t c = rng.UniformInt(-12, 12);
      const std::int64_t t = rng.UniformInt(0, v - 1);
      row[0] = FloatToBf16(static_cast<float>(a));
      row[1] = FloatToBf16(static_cast<float>(c));
      if (!ignored[s]) request->targets[s] = t;
      for (std::int64_t j = 0; j < v; ++j) {
        y[static_cast<std::size_t>(j)] =
            static_cast<double>(c) + static_cast<double>(a) * group[static_cast<std::size_t>(j)];
      }
      CrossEntropyReferenceRow(y.data(), nullptr, v, request->targets[s], !ignored[s], scale,
                               options, g.data(), err.data());
      decided = true;
      for (std::size_t j = 0; j < g.size() && decided; ++j) {
        float rounded = 0;
        decided = Bf16RoundingIsDecided(g[j], err[j], &rounded);
      }
    }
    if (!decided) {
      return absl::InternalError(
          absl::StrCat("exact data: no decided gradient for row ", i, " in 1000 draws"));
    }
  }
  return d;
}

void CheckExactGradients(const ExactGradients& want, const client::CrossEntropyResult& got,
                         const CeWants& wants, CaseResult& r, const std::string& label) {
  const std::string what = absl::StrCat(label, ": ");
  const std::int64_t m = want.g.dim(0), v = want.g.dim(1);
  const std::int64_t k = static_cast<std::int64_t>(want.dx.size()) / m;
  nlohmann::ordered_json fig;
  if (wants.dx && r.Check(got.dx.has_value(), what + "dX asked for but not returned") &&
      CheckTensor(r, *got.dx, wants.dx_dtype, {m, k}, what + "dX")) {
    const BitwiseComparison c =
        CompareWith(*got.dx, want.dx.data(), static_cast<std::int64_t>(want.dx.size()));
    fig["dx"] = {{"compared", c.compared}, {"differing", c.differing}, {"max_ulp", c.max_ulp}};
    r.Check(c.differing == 0,
            absl::StrCat(what, "dX ", DTypeName(got.dx->dtype()),
                         " differs from the exact G·W of G = bf16(g) (RNE, after the scale): ",
                         c.Describe(got.dx->shape())));
  }
  if (wants.dw && r.Check(got.dw.has_value(), what + "dW asked for but not returned") &&
      CheckTensor(r, *got.dw, DType::kFp32, {v, k}, what + "dW")) {
    const BitwiseComparison c =
        CompareWith(*got.dw, want.dw.data(), static_cast<std::int64_t>(want.dw.size()));
    fig["dw"] = {{"compared", c.compared}, {"differing", c.differing}, {"max_ulp", c.max_ulp}};
    r.Check(c.differing == 0,
            absl::StrCat(what,
                         "dW fp32 differs from the exact Gᵀ·X of G = bf16(g) (RNE, after the "
                         "scale): ",
                         c.Describe(got.dw->shape())));
  }
  r.figures[label] = std::move(fig);
}

}  // namespace logitd::validate

#include "client/logitctl/stress_checks.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "logitd/reference/bounds.h"
#include "logitd/reference/numerics.h"

namespace logitd::logitctl::stress {
namespace {

// The n-th sampled row (row 0 first, then random rows) in fp64.
SampledRow SampleRow(const Tensor& x, const StressWeight& w, std::int64_t m, int n,
                     std::mt19937_64& rng) {
  SampledRow row;
  row.i = n == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(m));
  row.z.assign(static_cast<std::size_t>(w.v), 0.0);
  double z_max = -INFINITY;
  for (std::int64_t j = 0; j < w.v; ++j) {
    double s = 0, a = 0;
    for (std::int64_t l = 0; l < w.k; ++l) {
      const double t = Value(x, row.i * w.k + l) * Value(w.w, j * w.k + l);
      s += t;
      a += std::fabs(t);
    }
    row.z[static_cast<std::size_t>(j)] = s;
    z_max = std::max(z_max, s);
    row.err = std::max(row.err, StepGamma(w.k) * a);
  }
  double sum = 0;
  for (double zj : row.z) sum += std::exp(zj - z_max);
  row.lse = z_max + std::log(sum);
  return row;
}

}  // namespace

double StepGamma(std::int64_t n) { return Gamma(n, kFp32StepError); }

Tensor RandomTensor(DType dtype, std::vector<std::int64_t> shape, bool integer,
                    std::mt19937_64& rng) {
  Tensor t(dtype, std::move(shape));
  std::uniform_int_distribution<int> ints(-8, 8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float f = integer ? static_cast<float>(ints(rng)) : normal(rng);
    if (dtype == DType::kBf16) {
      t.data<Bf16Bits>()[i] = FloatToBf16(f);
    } else {
      t.data<float>()[i] = f;
    }
  }
  return t;
}

double Value(const Tensor& t, std::int64_t i) { return t.At(i); }

// got (element i of an fp32 or bf16 tensor) against an fp64 reference whose
// terms' magnitudes sum to `abs_sum` over n terms: bitwise for exact
// problems (a zero may be -0), else within the proven bound of such a sum
// (SumOfProductsBound), which adds the final bf16 rounding for bf16 outputs.
bool Agrees(const Tensor& got, std::int64_t i, double ref, double abs_sum, std::int64_t n,
            bool exact) {
  const double g = Value(got, i);
  if (exact) {
    const float want = static_cast<float>(ref);
    if (got.dtype() == DType::kFp32) {
      const float f = got.data<float>()[i];
      return FloatBits(f) == FloatBits(want) || (f == 0.0f && want == 0.0f);
    }
    const Bf16Bits b = got.data<Bf16Bits>()[i];
    return b == FloatToBf16(want) || (g == 0.0 && want == 0.0f);
  }
  return std::isfinite(g) && std::fabs(g - ref) <= SumOfProductsBound(n, abs_sum, ref, got.dtype());
}

std::vector<Sample> Samples(std::int64_t rows, std::int64_t cols, std::mt19937_64& rng) {
  std::vector<Sample> s = {{0, 0}, {rows - 1, cols - 1}, {rows - 1, 0}, {0, cols - 1}};
  for (int n = 0; n < 44; ++n) {
    s.push_back({static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rows)),
                 static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cols))});
  }
  return s;
}

Tensor RandomTargets(std::int64_t m, std::int64_t v, std::mt19937_64& rng) {
  Tensor targets(DType::kInt64, {m});
  for (std::int64_t i = 0; i < m; ++i) {
    targets.data<std::int64_t>()[i] =
        rng() % 20 == 0 ? -100 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(v));
  }
  return targets;
}

std::vector<SampledRow> SampleRows(const Tensor& x, const StressWeight& w, std::int64_t m,
                                   std::mt19937_64& rng) {
  std::vector<SampledRow> rows;
  for (int n = 0; n < 3; ++n) rows.push_back(SampleRow(x, w, m, n, rng));
  return rows;
}

// One accumulating Backward of random integer dY and X.
absl::Status OwnGradient::Accumulate(client::Client& c, std::mt19937_64& rng) {
  const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 64);
  const Tensor dy = RandomTensor(DType::kFp32, {m, w.v}, true, rng);
  const Tensor x = RandomTensor(DType::kBf16, {m, w.k}, true, rng);
  client::BackwardOptions o;
  o.accumulate_dw = true;
  o.want_dx = rng() % 2 == 0;
  absl::StatusOr<client::BackwardResult> r = c.Backward(dy, x, w.handle, o);
  if (!r.ok()) return r.status();
  ++accumulated;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t v = 0; v < w.v; ++v) {
      const double gv = Value(dy, i * w.v + v);
      if (gv == 0) continue;
      for (std::int64_t j = 0; j < w.k; ++j) {
        expected[static_cast<std::size_t>(v * w.k + j)] += gv * Value(x, i * w.k + j);
      }
    }
  }
  return absl::OkStatus();
}

// FetchGradient with zeroing: the count and every element exact; what is
// wrong, or empty.
std::string OwnGradient::Fetch(client::Client& c, absl::Status* status) {
  absl::StatusOr<client::GradientResult> r = c.FetchGradient(w.handle, true);
  if (!r.ok()) {
    *status = r.status();
    return "";
  }
  std::string problem;
  if (r->accumulated_calls != accumulated) {
    problem = absl::StrCat("counted ", r->accumulated_calls, " accumulations, made ", accumulated);
  }
  for (std::int64_t i = 0; i < r->dw.numel() && problem.empty(); ++i) {
    const float want = static_cast<float>(expected[static_cast<std::size_t>(i)]);
    const float got = r->dw.data<float>()[i];
    if (FloatBits(got) != FloatBits(want) && !(got == 0.0f && want == 0.0f)) {
      problem = absl::StrFormat("gradient[%d] = %.9g, exact sum %.9g", i, got, want);
    }
  }
  std::fill(expected.begin(), expected.end(), 0.0);
  accumulated = 0;
  return problem;
}

}  // namespace logitd::logitctl::stress

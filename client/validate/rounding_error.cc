// rounding_error: the seed's accuracy experiment. Normal bf16 activations
// [16, K] and weights [V, K]; fp32-out and bf16-out logits against an fp64
// reference. Every fp32-out element must sit inside the fp32 accumulation
// bound, and bf16-out must be at least 50x worse, at every K: keeping the
// accumulator is what the fp32 path is for.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"
#include "logitd/reference/bounds.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
namespace {

constexpr char kRoundingErrorSuite[] = "rounding_error";
constexpr double kMinRatio = 50.0;

struct ErrorStats {
  double max_abs = 0;
  double sum_sq = 0;
  bool all_finite = true;
  void Add(double got, double want) {
    if (!std::isfinite(got)) {
      all_finite = false;
      return;
    }
    const double e = std::fabs(got - want);
    max_abs = std::max(max_abs, e);
    sum_sq += e * e;
  }
};

double Ratio(double num, double den) {
  if (den == 0) return num == 0 ? 1.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

// The fp32 and bf16 logits' errors against the fp64 reference, and the
// fp32 ones against their bound gamma * Σ|x·w|.
struct Measured {
  ErrorStats e32;
  ErrorStats e16;
  double rel32 = 0;  // relative Frobenius errors
  double rel16 = 0;
  std::int64_t violations = 0;
  std::int64_t first_violation = -1;
  double worst_fraction = 0;
};

Measured Measure(const std::vector<double>& ref, const std::vector<double>& abs_sum,
                 const Tensor& y32, const Tensor& y16, std::int64_t k) {
  Measured f;
  double ref_sq = 0;
  const std::int64_t n = static_cast<std::int64_t>(ref.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const double want = ref[static_cast<std::size_t>(i)];
    const double got32 = y32.At(i);
    f.e32.Add(got32, want);
    f.e16.Add(y16.At(i), want);
    ref_sq += want * want;
    const double bound =
        SumOfProductsBound(k, abs_sum[static_cast<std::size_t>(i)], want, DType::kFp32);
    const double err = std::fabs(got32 - want);
    if (!(err <= bound)) {
      if (f.violations++ == 0) f.first_violation = i;
    }
    if (bound > 0) f.worst_fraction = std::max(f.worst_fraction, err / bound);
  }
  const double ref_norm = std::sqrt(ref_sq);
  f.rel32 = std::sqrt(f.e32.sum_sq) / ref_norm;
  f.rel16 = std::sqrt(f.e16.sum_sq) / ref_norm;
  return f;
}

// The case's figures for the report.
void AddFigures(const Measured& f, double ratio, double ratio_max, double gamma, CaseResult* r) {
  r->figures["fp32_max_abs_err"] = JsonNumber(f.e32.max_abs);
  r->figures["fp32_rel_frobenius_err"] = JsonNumber(f.rel32);
  r->figures["bf16_max_abs_err"] = JsonNumber(f.e16.max_abs);
  r->figures["bf16_rel_frobenius_err"] = JsonNumber(f.rel16);
  r->figures["ratio_rel_frobenius"] = JsonNumber(ratio);
  r->figures["ratio_max_abs"] = JsonNumber(ratio_max);
  r->figures["gamma_k"] = JsonNumber(gamma);
  r->figures["bound_violations"] = f.violations;
  r->figures["worst_bound_fraction"] = JsonNumber(f.worst_fraction);
}

absl::Status RunK(RunContext& ctx, CaseResult& r, std::int64_t m, std::int64_t v, std::int64_t k) {
  PhaseTimer timer(&r);
  const std::uint64_t seed = ctx.options().seed;
  Rng x_rng = Rng::Stream(seed, "rounding_error/x", k);
  Rng w_rng = Rng::Stream(seed, "rounding_error/w", k);
  auto x = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {m, k}, 1.0, x_rng));
  auto w = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {v, k}, 1.0, w_rng));
  r.figures["seed"] = seed;
  r.figures["m"] = m;
  r.figures["v"] = v;
  r.figures["k"] = k;
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *w, absl::StrCat("rounding_error_k", k));
  if (!weight.ok()) return weight.status();
  timer.Lap("register");

  client::LogitsOptions fp32_out;
  fp32_out.out_dtype = DType::kFp32;
  absl::StatusOr<Tensor> y32 = ctx.client().Logits(*x, weight->handle(), fp32_out);
  if (!y32.ok()) return Annotate(y32.status(), "Logits(fp32 out)");
  ctx.RecordOutput("y fp32", *y32);
  OfferLogitsReplay(ctx, kRoundingErrorSuite, absl::StrCat("Logits fp32 out, normal data, K=", k),
                    x, w, fp32_out, *y32);
  client::LogitsOptions bf16_out;
  bf16_out.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> y16 = ctx.client().Logits(*x, weight->handle(), bf16_out);
  if (!y16.ok()) return Annotate(y16.status(), "Logits(bf16 out)");
  ctx.RecordOutput("y bf16", *y16);
  timer.Lap("server");
  const std::int64_t n = m * v;
  if (!r.Check(
          y32->numel() == n && y16->numel() == n,
          absl::StrCat("expected ", n, " logits, got ", y32->numel(), " and ", y16->numel()))) {
    return absl::OkStatus();
  }

  std::vector<double> ref(static_cast<std::size_t>(n));
  std::vector<double> abs_sum(static_cast<std::size_t>(n));
  ReferenceXWt(ToDouble(*x), m, AsMatrix(*w), ref.data(), abs_sum.data());
  timer.Lap("reference");

  // Each fp32 logit against the proven bound of a sum of K products in any
  // order, round-to-nearest or a tensor core's truncating adder, with the
  // fp64 reference's own error and an absolute term for products that
  // underflow (logitd/reference/bounds.h, as Verify takes it).
  const double gamma = SumOfProductsRule(k, 1.0, DType::kFp32).gamma;
  const Measured f = Measure(ref, abs_sum, *y32, *y16, k);
  const double ratio = Ratio(f.rel16, f.rel32);
  const double ratio_max = Ratio(f.e16.max_abs, f.e32.max_abs);

  timer.Lap("compare");
  AddFigures(f, ratio, ratio_max, gamma, &r);
  r.summary = absl::StrFormat("fp32 rel %.2e, bf16 rel %.2e, ratio %.1e, bound %d viol", f.rel32,
                              f.rel16, ratio, f.violations);

  r.Check(f.e32.all_finite && f.e16.all_finite, "non-finite logits from finite inputs");
  if (f.violations > 0) {
    const std::int64_t i = f.first_violation;
    r.Check(false, absl::StrFormat(
                       "%d of %d fp32 logits lie outside the fp32 accumulation bound, the proven "
                       "bound of a sum of K products (γ·Σ|x·w| + A, γ=%.3e); first %s: got %.9g, "
                       "fp64 reference %.17g, bound %.3e",
                       f.violations, n, gamma, IndexString(i, {m, v}), y32->At(i),
                       ref[static_cast<std::size_t>(i)],
                       SumOfProductsBound(k, abs_sum[static_cast<std::size_t>(i)],
                                          ref[static_cast<std::size_t>(i)], DType::kFp32)));
  }
  r.Check(ratio >= kMinRatio,
          absl::StrFormat("bf16-out relative Frobenius error %.3e is only %.1fx the fp32-out "
                          "error %.3e (need >= %.0fx)",
                          f.rel16, ratio, f.rel32, kMinRatio));
  r.Check(ratio_max >= kMinRatio,
          absl::StrFormat("bf16-out max abs error %.3e is only %.1fx the fp32-out error %.3e "
                          "(need >= %.0fx)",
                          f.e16.max_abs, ratio_max, f.e32.max_abs, kMinRatio));
  return absl::OkStatus();
}

double Figure(const CaseResult& r, const char* key) {
  auto it = r.figures.find(key);
  if (it == r.figures.end()) return std::nan("");
  if (it->is_number()) return it->get<double>();
  if (it->is_string() && it->get<std::string>() == "inf") {
    return std::numeric_limits<double>::infinity();
  }
  return std::nan("");
}

class RoundingErrorSuite final : public Suite {
 public:
  std::string name() const override { return kRoundingErrorSuite; }
  std::vector<Case> Cases(const Options& options) override {
    shapes_ = ShapesFor(options);
    seed_ = options.seed;
    std::vector<Case> cases;
    for (std::int64_t k : shapes_.ks) {
      cases.push_back({absl::StrCat("K=", k),
                       [m = shapes_.m, v = shapes_.v, k](RunContext& ctx, CaseResult& r) {
                         return RunK(ctx, r, m, v, k);
                       }});
    }
    return cases;
  }

  // The seed's table: fp32-out and bf16-out error against fp64, per K.
  std::string DetailTable(const std::vector<CaseResult>& results) const override {
    std::string t = absl::StrFormat(
        "rounding_error: seed %d, X [%d, K] and W [%d, K] ~ N(0, 1) in bf16, errors against an "
        "fp64 reference\n",
        seed_, shapes_.m, shapes_.v);
    absl::StrAppend(&t, absl::StrFormat("%6s  %13s  %13s  %13s  %13s  %9s  %s\n", "K",
                                        "fp32 max abs", "fp32 rel Frob", "bf16 max abs",
                                        "bf16 rel Frob", "ratio", "fp32 in γ_K bound"));
    for (const CaseResult& r : results) {
      if (!r.figures.contains("fp32_rel_frobenius_err")) {
        absl::StrAppend(&t, absl::StrFormat("%6s  %s\n", r.name.substr(2),
                                            std::string(VerdictName(r.verdict))));
        continue;
      }
      const std::int64_t violations = r.figures.value("bound_violations", std::int64_t{0});
      absl::StrAppend(
          &t,
          absl::StrFormat("%6d  %13.3e  %13.3e  %13.3e  %13.3e  %9.1f  %s\n",
                          r.figures.value("k", std::int64_t{0}), Figure(r, "fp32_max_abs_err"),
                          Figure(r, "fp32_rel_frobenius_err"), Figure(r, "bf16_max_abs_err"),
                          Figure(r, "bf16_rel_frobenius_err"), Figure(r, "ratio_rel_frobenius"),
                          violations == 0 ? absl::StrFormat("yes (worst %.2g%% of bound)",
                                                            100 * Figure(r, "worst_bound_fraction"))
                                          : absl::StrCat("NO: ", violations, " outside")));
    }
    return t;
  }

 private:
  Shapes shapes_;
  std::uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<Suite> MakeRoundingErrorSuite() { return std::make_unique<RoundingErrorSuite>(); }

}  // namespace logitd::validate

// cross_entropy: the fused LM-head cross-entropy against an fp64 reference.
//
// The reference and its bounds come from logitd_reference
// (logitd/reference/cross_entropy.h; the derivation of every bound is at the
// top of its cross_entropy.cc): per token the lse and loss, the reduced
// loss, and per element the pre-cast gradient g with its bound, gathered
// here whole. From those this file forms dX = G·W and dW = Gᵀ·X and their
// elementwise bounds, |ΔdX_ik| ≤ Σ_v (|G − g|_iv + (γ_V(fp32)·(1 + 2^-8) +
// γ_V(fp64))·|G|_iv)·|w_vk| by one dgemm of the bounds with |W| (dW alike
// with γ_M and |X|; a bf16 dX adds its rounding). Every server value must
// lie inside its bound, element by element.
//
// Besides the bounds, two empirical checks: the per-token loss and lse must
// be >= 16x closer to fp64 than the same quantities computed from logits
// rounded to bf16 (the seed's question asked of the loss), and the relative
// Frobenius errors of dX and dW must stay at or below 2·2^-8. Each element
// of G is within 2^-8 of g relatively and the rounding errors are
// independent, so their effect on G·W has a norm of about 2^-8/√3 of the
// product's; only cancellation in G·W (rows of G sum to about 0) can raise
// it, which the factor 2 allows for. The elementwise bounds are the
// rigorous check; this one says how far from the bf16 limit the result is.
//
//
// This file: the reference and the checks against it. The exact cases are
// in cross_entropy_exact.cc, the suite's cases in cross_entropy.cc.

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

constexpr double kU = kFp32UnitRoundoff;
// Relative Frobenius error of dX and dW: the bf16 unit roundoff of G with a
// factor 2 for cancellation in the product.
constexpr double kMaxGradRelFrobenius = 2 * kBf16UnitRoundoff;

double Sq(double v) { return v * v; }

// Spacing of fp32 values at |r| (subnormal spacing below 2^-126).
double Fp32Ulp(double r) {
  if (r == 0 || !std::isfinite(r)) return 0x1p-149;
  return std::ldexp(1.0, std::max(std::ilogb(r), -126) - 23);
}

// Largest |got − want| against its bound, first violation, norms.
struct Tracker {
  std::int64_t compared = 0;
  std::int64_t violations = 0;
  std::int64_t first = -1;
  double first_got = 0, first_want = 0, first_bound = 0;
  double max_abs = 0, max_ulp = 0, worst = 0;
  double err_sq = 0, ref_sq = 0;

  void Add(std::int64_t i, double got, double want, double bound) {
    ++compared;
    const double err = std::fabs(got - want);
    if (!(err <= bound)) {
      if (violations++ == 0) {
        first = i;
        first_got = got;
        first_want = want;
        first_bound = bound;
      }
    }
    if (std::isfinite(err)) {
      max_abs = std::max(max_abs, err);
      max_ulp = std::max(max_ulp, err / Fp32Ulp(want));
      err_sq += err * err;
    } else {
      max_abs = std::numeric_limits<double>::infinity();
      max_ulp = max_abs;
      err_sq = max_abs;
    }
    ref_sq += want * want;
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  double RelFrobenius() const {
    if (ref_sq == 0) return err_sq == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return std::sqrt(err_sq / ref_sq);
  }
  void Report(CaseResult& r, const std::string& what,
              const std::vector<std::int64_t>& shape) const {
    r.Check(violations == 0,
            absl::StrFormat("%s: %d of %d elements outside their bound; first %s: got %.9g, fp64 "
                            "reference %.17g, bound %.3e",
                            what, violations, compared, IndexString(first, shape), first_got,
                            first_want, first_bound));
  }
  // Ulps only where they mean something (values well away from zero).
  nlohmann::ordered_json Json(bool with_ulp) const {
    nlohmann::ordered_json j = {
        {"compared", compared}, {"violations", violations}, {"max_abs_err", JsonNumber(max_abs)}};
    if (with_ulp) j["max_ulp"] = JsonNumber(max_ulp);
    j["rel_frobenius_err"] = JsonNumber(RelFrobenius());
    j["worst_bound_fraction"] = JsonNumber(worst);
    return j;
  }
};

}  // namespace

bool CheckTensor(CaseResult& r, const Tensor& t, DType dtype,
                 const std::vector<std::int64_t>& shape, const std::string& what) {
  return r.Check(t.dtype() == dtype && t.shape() == shape,
                 absl::StrCat(what, ": expected ", DTypeName(dtype), " ", ShapeString(shape),
                              ", got ", DTypeName(t.dtype()), " ", ShapeString(t.shape())));
}

// ---------------------------------------------------------------------------
// CeRequest

client::CrossEntropyOptions CeRequest::Options() const {
  client::CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  o.reduction = reduction;
  o.z_loss = z_loss;
  o.logit_softcap = logit_softcap;
  o.grad_scale = grad_scale;
  return o;
}

CeReferenceOptions CeRequest::ReferenceOptions() const {
  CeReferenceOptions o;
  o.ignore_index = ignore_index;
  o.reduction = reduction == client::Reduction::kNone  ? CeReduction::kNone
                : reduction == client::Reduction::kSum ? CeReduction::kSum
                                                       : CeReduction::kMean;
  o.z_loss = z_loss;
  o.logit_softcap = logit_softcap;
  o.grad_scale = grad_scale;
  return o;
}

Tensor CeRequest::TargetsTensor(DType dtype) const {
  Tensor t(dtype, {static_cast<std::int64_t>(targets.size())});
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (dtype == DType::kInt32) {
      t.data<std::int32_t>()[i] = static_cast<std::int32_t>(targets[i]);
    } else {
      t.data<std::int64_t>()[i] = targets[i];
    }
  }
  return t;
}

// ---------------------------------------------------------------------------
// The reference

CeReference ComputeReference(const Tensor& x, const Tensor& w, const CeRequest& request,
                             LogitModel logits) {
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  LmHeadInputs in = LmHeadInputs::Forward(x.data<Bf16Bits>(), w.data<Bf16Bits>(), m, v, k);
  CeReference ref;
  ref.g.resize(static_cast<std::size_t>(m * v));
  ref.g_pre_err.resize(ref.g.size());
  ReferenceCrossEntropy(
      in, request.targets.data(), request.ReferenceOptions(), logits, &ref,
      [&](std::int64_t row0, std::int64_t rows, const double* g, const double* g_pre_err,
          const double* /*flip_mean*/, const double* /*flip_var*/) {
        std::copy(g, g + rows * v, ref.g.begin() + row0 * v);
        std::copy(g_pre_err, g_pre_err + rows * v, ref.g_pre_err.begin() + row0 * v);
      });
  return ref;
}

// ---------------------------------------------------------------------------
// Checks

namespace {

// The parts of CheckAgainstReference, one output each: `what` prefixes every
// message, `fig` collects the figures, `e` the errors.
void CheckLoss(const CeReference& ref, const CeRequest& request,
               const client::CrossEntropyResult& got, CaseResult& r, const std::string& what,
               nlohmann::ordered_json& fig, CeErrors& e) {
  const std::int64_t m = ref.m;
  const bool per_token = request.reduction == client::Reduction::kNone;
  const std::vector<std::int64_t> loss_shape =
      per_token ? std::vector<std::int64_t>{m} : std::vector<std::int64_t>{1};
  if (CheckTensor(r, got.loss, DType::kFp32, loss_shape, what + "loss")) {
    Tracker loss;
    if (per_token) {
      std::int64_t nonzero_ignored = 0, first_nonzero = -1;
      for (std::int64_t i = 0; i < m; ++i) {
        const double l = got.loss.At(i);
        if (request.Ignored(i)) {
          if (l != 0 && nonzero_ignored++ == 0) first_nonzero = i;
          continue;
        }
        loss.Add(i, l, ref.loss[static_cast<std::size_t>(i)],
                 ref.loss_bound[static_cast<std::size_t>(i)]);
      }
      r.Check(nonzero_ignored == 0,
              absl::StrFormat("%sloss of %d ignored tokens is not 0; first [%d]: %.9g", what,
                              nonzero_ignored, first_nonzero,
                              first_nonzero >= 0 ? got.loss.At(first_nonzero) : 0.0));
      fig["ignored_tokens_nonzero_loss"] = nonzero_ignored;
    } else if (request.reduction == client::Reduction::kSum) {
      loss.Add(0, got.loss.At(0), ref.sum, ref.sum_bound);
    } else if (ref.counted == 0) {
      r.Check(std::isnan(got.loss.At(0)),
              absl::StrFormat("%smean loss with no counted token is %.9g, expected NaN", what,
                              got.loss.At(0)));
    } else {
      loss.Add(0, got.loss.At(0), ref.mean, ref.mean_bound);
    }
    if (loss.compared > 0) {
      loss.Report(r, what + "loss", loss_shape);
      fig["loss"] = loss.Json(true);
      e.loss_max_abs = loss.max_abs;
      e.loss_max_ulp = loss.max_ulp;
      e.loss_worst_fraction = loss.worst;
      e.violations += loss.violations;
    }
  }
}

// lse, for every token: it is defined whatever the target.
void CheckLse(const CeReference& ref, const client::CrossEntropyResult& got, const CeWants& wants,
              CaseResult& r, const std::string& what, nlohmann::ordered_json& fig, CeErrors& e) {
  const std::int64_t m = ref.m;
  if (!wants.lse) {
    r.Check(!got.lse.has_value(), what + "lse returned although not asked for");
  } else if (r.Check(got.lse.has_value(), what + "lse asked for but not returned") &&
             CheckTensor(r, *got.lse, DType::kFp32, {m}, what + "lse")) {
    Tracker lse;
    for (std::int64_t i = 0; i < m; ++i) {
      lse.Add(i, got.lse->At(i), ref.lse[static_cast<std::size_t>(i)],
              ref.lse_bound[static_cast<std::size_t>(i)]);
    }
    lse.Report(r, what + "lse", {m});
    fig["lse"] = lse.Json(true);
    e.lse_max_abs = lse.max_abs;
    e.lse_max_ulp = lse.max_ulp;
    e.lse_worst_fraction = lse.worst;
    e.violations += lse.violations;
  }
}

void CheckDx(const CeReference& ref, const CeRequest& request, const Tensor& w,
             const client::CrossEntropyResult& got, const CeWants& wants, CaseResult& r,
             const std::string& what, nlohmann::ordered_json& fig, CeErrors& e) {
  const std::int64_t m = ref.m, k = w.dim(1);
  if (!wants.dx) {
    r.Check(!got.dx.has_value(), what + "dX returned although not asked for");
  } else if (r.Check(got.dx.has_value(), what + "dX asked for but not returned") &&
             CheckTensor(r, *got.dx, wants.dx_dtype, {m, k}, what + "dX")) {
    const Tensor& dx = *got.dx;
    std::int64_t nonzero = 0, first_nonzero = -1;
    for (std::int64_t i = 0; i < m; ++i) {
      if (!request.Ignored(i)) continue;
      for (std::int64_t j = 0; j < k; ++j) {
        if (dx.At(i * k + j) != 0 && nonzero++ == 0) first_nonzero = i * k + j;
      }
    }
    r.Check(nonzero == 0,
            absl::StrCat(what, "dX rows of ignored tokens must be exactly zero; ", nonzero,
                         " elements are not, first at ", IndexString(first_nonzero, {m, k})));
    fig["dx_ignored_rows_nonzero"] = nonzero;

    Tracker t;
    CrossEntropyGradInputReference(
        ref.g.data(), ref.g_pre_err.data(), m, AsMatrix(w), dx.dtype() == DType::kBf16,
        [&](std::int64_t row0, std::int64_t rows, const double* value, const double* bound) {
          for (std::int64_t j = 0; j < rows * k; ++j) {
            t.Add(row0 * k + j, dx.At(row0 * k + j), value[j], bound[j]);
          }
        });
    t.Report(r, absl::StrCat(what, "dX ", DTypeName(dx.dtype())), {m, k});
    e.dx_rel_frobenius = t.RelFrobenius();
    e.dx_worst_fraction = t.worst;
    e.violations += t.violations;
    fig["dx"] = t.Json(false);
    r.Check(e.dx_rel_frobenius <= kMaxGradRelFrobenius,
            absl::StrFormat("%sdX relative Frobenius error %.3e exceeds 2·2^-8 = %.3e (2^-8 is "
                            "the unit roundoff of the bf16 G)",
                            what, e.dx_rel_frobenius, kMaxGradRelFrobenius));
  }
}

void CheckDw(const CeReference& ref, const Tensor& x, const client::CrossEntropyResult& got,
             const CeWants& wants, CaseResult& r, const std::string& what,
             nlohmann::ordered_json& fig, CeErrors& e) {
  const std::int64_t m = ref.m, v = ref.v, k = x.dim(1);
  const bool dw_returned = wants.dw;
  if (!dw_returned) {
    r.Check(!got.dw.has_value(), what + "dW returned although not asked for (or accumulated)");
  } else if (r.Check(got.dw.has_value(), what + "dW asked for but not returned") &&
             CheckTensor(r, *got.dw, DType::kFp32, {v, k}, what + "dW")) {
    const Tensor& dw = *got.dw;
    Tracker t;
    CrossEntropyGradWeightReference(
        ref.g.data(), ref.g_pre_err.data(), x.data<Bf16Bits>(), m, v, k,
        [&](std::int64_t row0, std::int64_t rows, const double* value, const double* bound) {
          for (std::int64_t j = 0; j < rows * k; ++j) {
            const std::int64_t i = row0 * k + j;
            t.Add(i, dw.At(i), value[j], bound[j]);
          }
        });
    t.Report(r, what + "dW fp32", {v, k});
    e.dw_rel_frobenius = t.RelFrobenius();
    e.dw_worst_fraction = t.worst;
    e.violations += t.violations;
    fig["dw"] = t.Json(false);
    r.Check(e.dw_rel_frobenius <= kMaxGradRelFrobenius,
            absl::StrFormat("%sdW relative Frobenius error %.3e exceeds 2·2^-8 = %.3e (2^-8 is "
                            "the unit roundoff of the bf16 G)",
                            what, e.dw_rel_frobenius, kMaxGradRelFrobenius));
  }
}

}  // namespace

CeErrors CheckAgainstReference(const CeReference& ref, const CeRequest& request, const Tensor& x,
                               const Tensor& w, const client::CrossEntropyResult& got,
                               const CeWants& wants, CaseResult& r, const std::string& label) {
  CeErrors e;
  nlohmann::ordered_json fig;
  const std::string what = absl::StrCat(label, ": ");

  r.Check(got.counted_tokens == ref.counted,
          absl::StrCat(what, "counted_tokens is ", got.counted_tokens, ", expected ", ref.counted,
                       " (tokens whose target is not ignore_index ", request.ignore_index, ")"));
  fig["counted_tokens"] = got.counted_tokens;

  CheckLoss(ref, request, got, r, what, fig, e);
  CheckLse(ref, got, wants, r, what, fig, e);
  CheckDx(ref, request, w, got, wants, r, what, fig, e);
  CheckDw(ref, x, got, wants, r, what, fig, e);
  fig["violations"] = e.violations;
  r.figures[label] = std::move(fig);
  return e;
}

void CheckReductionConsistency(const Tensor& per_token, const client::CrossEntropyResult& reduced,
                               client::Reduction reduction, std::int64_t counted, CaseResult& r,
                               const std::string& label) {
  const std::string what = absl::StrCat(label, ": ");
  if (!r.Check(reduced.loss.dtype() == DType::kFp32 && reduced.loss.numel() == 1,
               what + "reduced loss is not one fp32 value")) {
    return;
  }
  r.Check(reduced.counted_tokens == counted,
          absl::StrCat(what, "counted_tokens ", reduced.counted_tokens,
                       " differs from the per-token request's ", counted));
  double sum = 0, sum_abs = 0;
  for (std::int64_t i = 0; i < per_token.numel(); ++i) {
    sum += per_token.At(i);
    sum_abs += std::fabs(per_token.At(i));
  }
  // The same fp32 per-token values in another order (a few ulps of leeway
  // per token), and the fp64 sum's own error.
  const double gamma =
      Gamma(per_token.numel() + 2, kU) + Gamma(per_token.numel(), kFp64UnitRoundoff);
  const double got = reduced.loss.At(0);
  double want = sum, bound = gamma * sum_abs;
  if (reduction == client::Reduction::kMean) {
    if (counted == 0) {
      r.Check(std::isnan(got),
              absl::StrFormat("%smean over no counted token is %.9g, expected NaN", what, got));
      return;
    }
    want = sum / static_cast<double>(counted);
    bound = bound / static_cast<double>(counted) + 2 * kU * std::fabs(want);
  }
  r.figures[label] = {
      {"got", JsonNumber(got)}, {"from_per_token", JsonNumber(want)}, {"bound", JsonNumber(bound)}};
  r.Check(std::fabs(got - want) <= bound,
          absl::StrFormat("%s%s loss %.9g differs from the one computed from the per-token losses "
                          "(%.17g) by %.3e, beyond the fp32 summation bound %.3e",
                          what, reduction == client::Reduction::kMean ? "mean" : "sum", got, want,
                          std::fabs(got - want), bound));
}

void CheckFp32LogitsShow(const CeReference& ref, const CeReference& ref16,
                         const client::CrossEntropyResult& got, const CeRequest& request,
                         double min_ratio, CaseResult& r, const std::string& label) {
  const std::string what = absl::StrCat(label, ": ");
  if (got.loss.numel() != ref.m || !got.lse.has_value() || got.lse->numel() != ref.m) return;
  double loss32 = 0, loss16 = 0, lse32 = 0, lse16 = 0;
  for (std::int64_t i = 0; i < ref.m; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    lse32 += Sq(got.lse->At(i) - ref.lse[s]);
    lse16 += Sq(ref16.lse[s] - ref.lse[s]);
    if (request.Ignored(i)) continue;
    loss32 += Sq(got.loss.At(i) - ref.loss[s]);
    loss16 += Sq(ref16.loss[s] - ref.loss[s]);
  }
  const auto ratio = [](double e16, double e32) {
    if (e32 == 0) return std::numeric_limits<double>::infinity();
    return std::sqrt(e16 / e32);
  };
  const double loss_ratio = ratio(loss16, loss32);
  const double lse_ratio = ratio(lse16, lse32);
  const double n = static_cast<double>(std::max<std::int64_t>(ref.counted, 1));
  const double mm = static_cast<double>(std::max<std::int64_t>(ref.m, 1));
  r.figures[label] = {{"loss_rms_err_fp32_logits", JsonNumber(std::sqrt(loss32 / n))},
                      {"loss_rms_err_bf16_logits", JsonNumber(std::sqrt(loss16 / n))},
                      {"loss_ratio", JsonNumber(loss_ratio)},
                      {"lse_rms_err_fp32_logits", JsonNumber(std::sqrt(lse32 / mm))},
                      {"lse_rms_err_bf16_logits", JsonNumber(std::sqrt(lse16 / mm))},
                      {"lse_ratio", JsonNumber(lse_ratio)}};
  if (ref.counted > 0) {
    r.Check(
        loss_ratio >= min_ratio,
        absl::StrFormat("%sthe loss error (rms %.3e) is only %.1fx below that of the loss "
                        "from bf16-rounded logits (rms %.3e); need >= %.0fx",
                        what, std::sqrt(loss32 / n), loss_ratio, std::sqrt(loss16 / n), min_ratio));
  }
  r.Check(
      lse_ratio >= min_ratio,
      absl::StrFormat("%sthe lse error (rms %.3e) is only %.1fx below that of the lse from "
                      "bf16-rounded logits (rms %.3e); need >= %.0fx",
                      what, std::sqrt(lse32 / mm), lse_ratio, std::sqrt(lse16 / mm), min_ratio));
}

bool Bf16RoundingIsDecided(double exact, double err, float* rounded) {
  const double lo = RoundDoubleToBf16(exact - err);
  const double hi = RoundDoubleToBf16(exact + err);
  if (lo != hi) return false;
  // Rounding is monotonic: everything between the ends rounds like them.
  *rounded = static_cast<float>(RoundDoubleToBf16(exact));
  return *rounded == static_cast<float>(lo);
}

}  // namespace logitd::validate

// cross_entropy: the fused LM-head cross-entropy against an fp64 reference.
//
// The reference. Logits y = x·wᵀ come from a dgemm of the widened bf16
// operands; z, lse, loss and the pre-cast gradient g = dL/dy · scale are then
// evaluated in fp64 with the formulas of logitd.v1.CrossEntropyHeader.
//
// The bounds. With u = 2^-24 (fp32), for one token and vocabulary entry v:
//   logit      |Δy_v| ≤ e_y,v = (γ_K(fp32) + γ_K(fp64))·Σ_k|x_k·w_vk|: the
//              fp32 accumulation bound for any summation order (Higham,
//              Lemma 3.1), plus the reference's own; 0 for small integers,
//              whose fp32 sums are exact.
//   capped z   |Δz_v| ≤ e_z,v = (f_v + 2e_y,v/cap)·(e_y,v + u|y_v|) + 4u|z_v|
//              with f_v = 1 − (z_v/cap)² = dz/dy: the logit error carried
//              through tanh, the rounding of y/cap, and a tanh within a
//              few ulps; e_z,v = e_y,v without capping.
//   lse        lse is a softmax-weighted mean of its inputs' perturbations,
//              |Δlse| ≤ Σ_v p_v·e_z,v, plus its own evaluation:
//              Σ_v exp(z_v − max) over V terms (and the rescalings of an
//              online max over at most V chunks) is within γ_2V relatively;
//              each exp within (3 + 2.2·(max − z_v))·u relatively (the
//              subtraction's rounding and an exp accurate to 2 + 1.2|arg|
//              ulps, which covers fast device exponentials); log within
//              2u·(2 + log s) absolutely; and max + log s rounds once. These
//              are first-order bounds; they are doubled to cover the
//              second-order terms.
//   loss       Δlse·(1 + 2·z_loss·|lse|) + 2e_z,t + 4u·(|lse| + |z_t| +
//              2·z_loss·lse² + |loss|) (the roundings of the three terms).
//   sum, mean  Σ of the token bounds + γ_M·Σ(|loss_i| + bound_i); a mean
//              adds 3u per term and 2u of its own (either order of dividing).
//   g          p_v = exp(z_v − lse) is off by p_v·(e_z,v + Δlse + exp);
//              dL/dz = p·(1 + 2·z_loss·lse) − onehot and its product with f
//              and scale add a few u each; doubled as above. Then the bf16
//              cast: |G − g| ≤ e_g + 2^-8·(|g| + e_g) + 2^-134.
//   dX, dW     |ΔdX_ik| ≤ Σ_v (|G − g|_iv + (γ_V(fp32)·(1 + 2^-8) +
//              γ_V(fp64))·|G|_iv)·|w_vk|, by one dgemm of the bounds with
//              |W|; dW alike with γ_M and |X|. A bf16 dX adds its rounding.
// Every server value must lie inside its bound, element by element.
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
// Also: ignored tokens (loss 0, not counted, all-zero dX rows; an
// all-ignored mean is NaN), an ignore_index inside [0, V), int32 and int64
// targets giving the same bits, and out-of-range targets refused with
// INVALID_ARGUMENT (never clamped) by a server that then still answers.

#include "client/validate/cross_entropy.h"

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
#include "client/validate/numerics.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"

namespace logitd::validate {
namespace {

constexpr char kSuite[] = "cross_entropy";
constexpr double kU = kFp32UnitRoundoff;
// Absolute slack for values that underflow: half the smallest bf16
// subnormal spacing (2^-133), and fp32 intermediates near 2^-126.
constexpr double kBf16Underflow = 0x1p-134;
constexpr double kFp32Underflow = 0x1p-125;
// The loss from fp32 logits must be this much closer to fp64 than the loss
// from bf16 logits. Lower than rounding_error's 50x on purpose: the suite's
// K=1024 logits carry the device's fp32 accumulation error, which on Hopper
// tensor cores grows about linearly with K (relative ~1e-6 at K=1024, ~10x
// the cpu backend's), while bf16 rounding costs 2^-9 whatever K is, so 2^-9
// over ~1e-6 leaves ~30x to 200x depending on the case (24x measured with
// soft-capping on the H200). 16x still separates fp32 logits from bf16 ones
// by more than an order of magnitude; the elementwise bounds stay rigorous.
constexpr double kMinBf16Ratio = 16.0;
// Relative Frobenius error of dX and dW: the bf16 unit roundoff of G with a
// factor 2 for cancellation in the product.
constexpr double kMaxGradRelFrobenius = 2 * kBf16UnitRoundoff;

double Sq(double v) { return v * v; }

// Spacing of fp32 values at |r| (subnormal spacing below 2^-126).
double Fp32Ulp(double r) {
  if (r == 0 || !std::isfinite(r)) return 0x1p-149;
  return std::ldexp(1.0, std::max(std::ilogb(r), -126) - 23);
}

// Spacing of bf16 values at |r|.
double Bf16Ulp(double r) {
  if (r == 0 || !std::isfinite(r)) return 0x1p-133;
  return std::ldexp(1.0, std::max(std::ilogb(r), -126) - 7);
}

// Rounds a double to the nearest bf16 value, ties to even, in one step.
double RoundDoubleToBf16(double d) {
  if (d == 0 || !std::isfinite(d)) return d;
  const double q = Bf16Ulp(d);
  const double r = std::nearbyint(d / q) * q;  // the default mode: ties to even
  if (std::fabs(r) > std::numeric_limits<float>::max()) {
    return std::copysign(std::numeric_limits<double>::infinity(), d);
  }
  return r;
}

// One token's reference: lse, loss and their bounds; g and its pre-cast
// bound for the row (left untouched when null).
struct RowResult {
  double lse = 0, lse_bound = 0, loss = 0, loss_bound = 0;
};

RowResult ReferenceRow(const double* y, const double* y_err, std::int64_t v, std::int64_t target,
                       bool counted, double scale, const CeRequest& rq, double* g,
                       double* g_pre_err) {
  const double cap = rq.logit_softcap;
  const double zl = rq.z_loss;
  std::vector<double> z(static_cast<std::size_t>(v)), f(z.size()), ez(z.size());
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < v; ++j) {
    const std::size_t s = static_cast<std::size_t>(j);
    const double dy = y_err != nullptr ? y_err[j] : 0.0;
    if (cap > 0) {
      const double t = std::tanh(y[j] / cap);
      z[s] = cap * t;
      f[s] = 1 - t * t;
      ez[s] = (f[s] + 2 * dy / cap) * (dy + kU * std::fabs(y[j])) + 4 * kU * std::fabs(z[s]);
    } else {
      z[s] = y[j];
      f[s] = 1;
      ez[s] = dy;
    }
    mx = std::max(mx, z[s]);
  }
  double sum_exp = 0;
  for (double zj : z) sum_exp += std::exp(zj - mx);
  const double log_s = std::log(sum_exp);
  RowResult out;
  out.lse = mx + log_s;
  double weighted_ez = 0, weighted_exp = 0;
  for (std::size_t s = 0; s < z.size(); ++s) {
    const double p = std::exp(z[s] - out.lse);
    weighted_ez += p * ez[s];
    weighted_exp += p * (3 + 2.2 * (mx - z[s]));
  }
  const double eval =
      Gamma(2 * v, kU) + kU * weighted_exp + 2 * kU * (2 + log_s) + kU * std::fabs(out.lse);
  out.lse_bound = 2 * (weighted_ez + eval) + Gamma(v, kFp64UnitRoundoff) * (std::fabs(out.lse) + 1);

  if (!counted) {
    if (g != nullptr) {
      std::fill(g, g + v, 0.0);
      std::fill(g_pre_err, g_pre_err + v, 0.0);
    }
    return out;
  }
  const std::size_t ts = static_cast<std::size_t>(target);
  const double lse = out.lse;
  const double zt = z[ts];
  out.loss = lse - zt + zl * lse * lse;
  out.loss_bound =
      out.lse_bound * (1 + 2 * zl * std::fabs(lse)) + zl * Sq(out.lse_bound) + 2 * ez[ts] +
      4 * kU * (std::fabs(lse) + std::fabs(zt) + 2 * zl * lse * lse + std::fabs(out.loss));
  if (g == nullptr) return out;
  const double c = 1 + 2 * zl * lse;
  const double dc = 2 * zl * out.lse_bound + 2 * kU * std::fabs(c);
  for (std::int64_t j = 0; j < v; ++j) {
    const std::size_t s = static_cast<std::size_t>(j);
    const double onehot = j == target ? 1.0 : 0.0;
    const double p = std::exp(z[s] - lse);
    const double d = p * c - onehot;
    const double arg = lse - z[s];
    const double ep = p * (ez[s] + out.lse_bound + kU * (3 + 2.2 * arg));
    const double ed = ep * std::fabs(c) + p * dc + 2 * kU * (p * std::fabs(c) + onehot);
    const double ef = cap > 0 ? 2 * std::fabs(z[s]) * ez[s] / (cap * cap) + 4 * kU : 0.0;
    g[j] = d * f[s] * scale;
    g_pre_err[j] = 2 * std::fabs(scale) * (ed * (f[s] + ef) + std::fabs(d) * ef) +
                   3 * kU * std::fabs(g[j]) +
                   kFp32Underflow * std::fabs(scale) * (std::fabs(c) + 1);
  }
  return out;
}

double ScaleFor(const CeRequest& rq, std::int64_t counted) {
  if (rq.reduction == client::Reduction::kMean) {
    return static_cast<double>(rq.grad_scale) / static_cast<double>(counted);
  }
  return rq.grad_scale;
}

// Bound on |G − g| for the server's bf16 G, and on |G|.
double GError(double g, double pre) {
  return pre + kBf16UnitRoundoff * (std::fabs(g) + pre) + kBf16Underflow;
}
double GMagnitude(double g, double pre) {
  return (1 + kBf16UnitRoundoff) * (std::fabs(g) + pre) + kBf16Underflow;
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

bool CheckTensor(CaseResult& r, const Tensor& t, DType dtype,
                 const std::vector<std::int64_t>& shape, const std::string& what) {
  return r.Check(t.dtype() == dtype && t.shape() == shape,
                 absl::StrCat(what, ": expected ", DTypeName(dtype), " ", ShapeString(shape),
                              ", got ", DTypeName(t.dtype()), " ", ShapeString(t.shape())));
}

// The bound coefficients of one gradient GEMM: |G − g| + γ_n·|G|.
std::vector<double> BoundCoefficients(const CeReference& ref, std::int64_t n) {
  const double gamma = Gamma(n, kU) * (1 + kBf16UnitRoundoff) + Gamma(n, kFp64UnitRoundoff);
  std::vector<double> c(ref.g.size());
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i] = GError(ref.g[i], ref.g_pre_err[i]) + gamma * GMagnitude(ref.g[i], ref.g_pre_err[i]);
  }
  return c;
}

// dW = Gᵀ·X and its bound Cᵀ·|X|, one block of rows of [V, K] at a time.
void GradWBlocks(
    const std::vector<double>& g, const std::vector<double>& c, const std::vector<double>& x,
    std::int64_t m, std::int64_t v, std::int64_t k,
    const std::function<void(std::int64_t, std::int64_t, const double*, const double*)>& sink) {
  std::vector<double> x_abs(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x_abs[i] = std::fabs(x[i]);
  const std::int64_t block =
      std::max<std::int64_t>(1, kReferenceBlockElements / std::max<std::int64_t>(1, k));
  std::vector<double> value(static_cast<std::size_t>(std::min(block, v) * k));
  std::vector<double> bound(value.size());
  for (std::int64_t r0 = 0; r0 < v; r0 += block) {
    const std::int64_t rows = std::min(block, v - r0);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, g.data() + r0, static_cast<int>(v),
                x.data(), static_cast<int>(k), 0.0, value.data(), static_cast<int>(k));
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, c.data() + r0, static_cast<int>(v),
                x_abs.data(), static_cast<int>(k), 0.0, bound.data(), static_cast<int>(k));
    sink(r0, rows, value.data(), bound.data());
  }
}

}  // namespace

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

void ReferenceLogits(const Tensor& x, const Tensor& w, bool exact_logits, std::vector<double>* y,
                     std::vector<double>* y_err) {
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  y->assign(static_cast<std::size_t>(m * v), 0.0);
  if (exact_logits) {
    y_err->clear();
    ReferenceXWt(ToDouble(x), m, AsMatrix(w), y->data(), nullptr);
    return;
  }
  y_err->assign(y->size(), 0.0);
  ReferenceXWt(ToDouble(x), m, AsMatrix(w), y->data(), y_err->data());
  const double gamma = Gamma(k, kU) + Gamma(k, kFp64UnitRoundoff);
  for (double& e : *y_err) e *= gamma;
}

CeReference ReferenceFromLogits(const std::vector<double>& y, const std::vector<double>* y_err,
                                std::int64_t m, std::int64_t v, const CeRequest& request) {
  CeReference ref;
  ref.m = m;
  ref.v = v;
  for (std::int64_t i = 0; i < m; ++i) ref.counted += request.Ignored(i) ? 0 : 1;
  ref.scale = ScaleFor(request, std::max<std::int64_t>(ref.counted, 1));
  const std::size_t mm = static_cast<std::size_t>(m);
  ref.lse.resize(mm);
  ref.lse_bound.resize(mm);
  ref.loss.resize(mm);
  ref.loss_bound.resize(mm);
  ref.g.resize(static_cast<std::size_t>(m * v));
  ref.g_pre_err.resize(ref.g.size());
  double sum_abs = 0, sum_bounds = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    const RowResult row = ReferenceRow(
        y.data() + i * v, y_err != nullptr && !y_err->empty() ? y_err->data() + i * v : nullptr, v,
        request.targets[s], !request.Ignored(i), ref.scale, request, ref.g.data() + i * v,
        ref.g_pre_err.data() + i * v);
    ref.lse[s] = row.lse;
    ref.lse_bound[s] = row.lse_bound;
    ref.loss[s] = row.loss;
    ref.loss_bound[s] = row.loss_bound;
    ref.sum += row.loss;
    sum_abs += std::fabs(row.loss);
    sum_bounds += row.loss_bound;
  }
  ref.sum_bound =
      sum_bounds + Gamma(m, kU) * (sum_abs + sum_bounds) + Gamma(m, kFp64UnitRoundoff) * sum_abs;
  if (ref.counted == 0) {
    ref.mean = std::numeric_limits<double>::quiet_NaN();
    ref.mean_bound = 0;
  } else {
    const double n = static_cast<double>(ref.counted);
    ref.mean = ref.sum / n;
    ref.mean_bound = (ref.sum_bound + 3 * kU * sum_abs) / n + 2 * kU * std::fabs(ref.mean);
  }
  return ref;
}

CeReference ComputeReference(const Tensor& x, const Tensor& w, const CeRequest& request,
                             bool exact_logits) {
  std::vector<double> y, y_err;
  ReferenceLogits(x, w, exact_logits, &y, &y_err);
  return ReferenceFromLogits(y, exact_logits ? nullptr : &y_err, x.dim(0), w.dim(0), request);
}

// ---------------------------------------------------------------------------
// Checks

CeErrors CheckAgainstReference(const CeReference& ref, const CeRequest& request, const Tensor& x,
                               const Tensor& w, const client::CrossEntropyResult& got,
                               const CeWants& wants, CaseResult& r, const std::string& label) {
  CeErrors e;
  const std::int64_t m = ref.m, v = ref.v, k = x.dim(1);
  nlohmann::ordered_json fig;
  const std::string what = absl::StrCat(label, ": ");

  r.Check(got.counted_tokens == ref.counted,
          absl::StrCat(what, "counted_tokens is ", got.counted_tokens, ", expected ", ref.counted,
                       " (tokens whose target is not ignore_index ", request.ignore_index, ")"));
  fig["counted_tokens"] = got.counted_tokens;

  // Loss.
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

  // lse, for every token: it is defined whatever the target.
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

  // dX.
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

    std::vector<double> dx_ref(static_cast<std::size_t>(m * k));
    std::vector<double> dx_bound(dx_ref.size()), scratch(dx_ref.size());
    ReferenceGW(ref.g, m, AsMatrix(w), dx_ref.data(), nullptr);
    ReferenceGW(BoundCoefficients(ref, v), m, AsMatrix(w), scratch.data(), dx_bound.data());
    Tracker t;
    for (std::int64_t i = 0; i < m * k; ++i) {
      const std::size_t s = static_cast<std::size_t>(i);
      double b = dx_bound[s];
      if (dx.dtype() == DType::kBf16) {
        b += kBf16UnitRoundoff * (std::fabs(dx_ref[s]) + b) + kBf16Underflow;
      }
      t.Add(i, dx.At(i), dx_ref[s], b);
    }
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

  // dW.
  const bool dw_returned = wants.dw;
  if (!dw_returned) {
    r.Check(!got.dw.has_value(), what + "dW returned although not asked for (or accumulated)");
  } else if (r.Check(got.dw.has_value(), what + "dW asked for but not returned") &&
             CheckTensor(r, *got.dw, DType::kFp32, {v, k}, what + "dW")) {
    const Tensor& dw = *got.dw;
    Tracker t;
    GradWBlocks(
        ref.g, BoundCoefficients(ref, m), ToDouble(x), m, v, k,
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
  const double scale = ScaleFor(*request, counted);
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
      ReferenceRow(y.data(), nullptr, v, request->targets[s], !ignored[s], scale, *request,
                   g.data(), err.data());
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

// ---------------------------------------------------------------------------
// The suite

namespace {

struct CeShapes {
  std::int64_t m, v, k;                    // normal data
  std::int64_t exact_m, exact_v, exact_k;  // integer data with decided gradients
};

CeShapes ShapesOf(const Options& o) {
  if (o.quick) return {32, 4096, 256, 32, 96, 64};
  return {64, 32768, 1024, 64, 192, 128};
}

struct NormalData {
  std::shared_ptr<Tensor> x, w;
};

// X ~ N(0, 1) and W ~ N(0, (logit_std)²/K), so that the logits have
// standard deviation about logit_std, as an LM head's do.
NormalData MakeNormalData(const Options& o, const CeShapes& s, const std::string& stream,
                          double logit_std) {
  Rng x_rng = Rng::Stream(o.seed, absl::StrCat("cross_entropy/", stream, "/x"));
  Rng w_rng = Rng::Stream(o.seed, absl::StrCat("cross_entropy/", stream, "/w"));
  NormalData d;
  d.x = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {s.m, s.k}, 1.0, x_rng));
  d.w = std::make_shared<Tensor>(RandomNormal(
      DType::kBf16, {s.v, s.k}, logit_std / std::sqrt(static_cast<double>(s.k)), w_rng));
  return d;
}

absl::StatusOr<client::CrossEntropyResult> Send(client::Client& c, const Tensor& x,
                                                const CeRequest& rq, DType targets_dtype,
                                                const std::string& handle, const CeWants& wants,
                                                bool accumulate, const std::string& what) {
  client::CrossEntropyOptions o = rq.Options();
  o.want_lse = wants.lse;
  o.want_dx = wants.dx;
  o.want_dw = wants.dw;
  o.dx_dtype = wants.dx_dtype;
  o.accumulate_dw = accumulate;
  absl::StatusOr<client::CrossEntropyResult> res =
      c.CrossEntropy(x, rq.TargetsTensor(targets_dtype), handle, o);
  if (!res.ok()) return Annotate(res.status(), absl::StrCat("CrossEntropy(", what, ")"));
  return res;
}

// The same through the run's client, the outputs recorded for --compare.
absl::StatusOr<client::CrossEntropyResult> Send(RunContext& ctx, const Tensor& x,
                                                const CeRequest& rq, DType targets_dtype,
                                                const std::string& handle, const CeWants& wants,
                                                bool accumulate, const std::string& what) {
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx.client(), x, rq, targets_dtype, handle, wants, accumulate, what);
  if (!res.ok()) return res;
  ctx.RecordOutput(what + " loss", res->loss);
  if (res->lse.has_value()) ctx.RecordOutput(what + " lse", *res->lse);
  if (res->dx.has_value()) ctx.RecordOutput(what + " dx", *res->dx);
  if (res->dw.has_value()) ctx.RecordOutput(what + " dw", *res->dw);
  return res;
}

std::vector<Tensor> Outputs(client::CrossEntropyResult&& res) {
  std::vector<Tensor> out;
  out.push_back(std::move(res.loss));
  if (res.lse.has_value()) out.push_back(*std::move(res.lse));
  if (res.dx.has_value()) out.push_back(*std::move(res.dx));
  if (res.dw.has_value()) out.push_back(*std::move(res.dw));
  return out;
}

// Folds one response's errors into the case's row of the detail table.
void Fold(const CeErrors& e, CeErrors* acc) {
  acc->loss_max_abs = std::max(acc->loss_max_abs, e.loss_max_abs);
  acc->loss_max_ulp = std::max(acc->loss_max_ulp, e.loss_max_ulp);
  acc->loss_worst_fraction = std::max(acc->loss_worst_fraction, e.loss_worst_fraction);
  acc->lse_max_abs = std::max(acc->lse_max_abs, e.lse_max_abs);
  acc->lse_max_ulp = std::max(acc->lse_max_ulp, e.lse_max_ulp);
  acc->lse_worst_fraction = std::max(acc->lse_worst_fraction, e.lse_worst_fraction);
  acc->dx_rel_frobenius = std::max(acc->dx_rel_frobenius, e.dx_rel_frobenius);
  acc->dx_worst_fraction = std::max(acc->dx_worst_fraction, e.dx_worst_fraction);
  acc->dw_rel_frobenius = std::max(acc->dw_rel_frobenius, e.dw_rel_frobenius);
  acc->dw_worst_fraction = std::max(acc->dw_worst_fraction, e.dw_worst_fraction);
  acc->violations += e.violations;
}

void PutTable(CaseResult& r, const CeErrors& e) {
  r.figures["table"] = {{"loss_max_abs_err", JsonNumber(e.loss_max_abs)},
                        {"loss_max_ulp", JsonNumber(e.loss_max_ulp)},
                        {"loss_worst_bound_fraction", JsonNumber(e.loss_worst_fraction)},
                        {"lse_max_abs_err", JsonNumber(e.lse_max_abs)},
                        {"lse_max_ulp", JsonNumber(e.lse_max_ulp)},
                        {"lse_worst_bound_fraction", JsonNumber(e.lse_worst_fraction)},
                        {"dx_rel_frobenius_err", JsonNumber(e.dx_rel_frobenius)},
                        {"dx_worst_bound_fraction", JsonNumber(e.dx_worst_fraction)},
                        {"dw_rel_frobenius_err", JsonNumber(e.dw_rel_frobenius)},
                        {"dw_worst_bound_fraction", JsonNumber(e.dw_worst_fraction)},
                        {"bound_violations", e.violations}};
  r.summary = absl::StrFormat(
      "loss err %.2g (%.2g ulp), lse err %.2g, dX rel %.2g, dW rel %.2g; %d outside bounds",
      e.loss_max_abs, e.loss_max_ulp, e.lse_max_abs, e.dx_rel_frobenius, e.dw_rel_frobenius,
      e.violations);
}

// ---------------------------------------------------------------------------
// Numeric cases: one set of options, three requests (per-token with lse and
// both gradients, the sum, the mean with both gradients), each against the
// fp64 reference, and the reductions against the per-token losses.

struct NumericCase {
  std::string name;
  double logit_std = 2;
  float z_loss = 0;
  float softcap = 0;
  float grad_scale = 1;
  DType dx_dtype = DType::kBf16;
  DType targets_dtype = DType::kInt64;
};

absl::Status RunNumeric(RunContext& ctx, CaseResult& r, const NumericCase& nc) {
  PhaseTimer timer(&r);
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, nc.name, nc.logit_std);
  Rng t_rng = Rng::Stream(ctx.options().seed, absl::StrCat("cross_entropy/", nc.name, "/t"));
  CeRequest rq;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 8);
  rq.z_loss = nc.z_loss;
  rq.logit_softcap = nc.softcap;
  rq.grad_scale = nc.grad_scale;
  r.figures["m"] = s.m;
  r.figures["v"] = s.v;
  r.figures["k"] = s.k;
  r.figures["logit_std"] = nc.logit_std;
  r.figures["z_loss"] = nc.z_loss;
  r.figures["logit_softcap"] = nc.softcap;
  r.figures["grad_scale"] = nc.grad_scale;
  r.figures["targets"] = std::string(DTypeName(nc.targets_dtype));
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, absl::StrCat("cross_entropy_", nc.name));
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();
  timer.Lap("register");

  CeRequest none = rq, sum = rq, mean = rq;
  none.reduction = client::Reduction::kNone;
  sum.reduction = client::Reduction::kSum;
  mean.reduction = client::Reduction::kMean;
  const CeWants all{true, true, true, nc.dx_dtype};
  const CeWants grads{false, true, true, nc.dx_dtype};
  absl::StatusOr<client::CrossEntropyResult> r_none =
      Send(ctx, *d.x, none, nc.targets_dtype, handle, all, false, "none");
  if (!r_none.ok()) return r_none.status();
  if (ctx.WantsReplay(kSuite)) {
    Replay replay;
    replay.suite = kSuite;
    replay.description =
        absl::StrCat("CrossEntropy ", nc.name, ", reduction none, lse, dX, dW, V=", s.v);
    const DType td = nc.targets_dtype;
    replay.send = [x = d.x, w = d.w, none, all,
                   td](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
      absl::StatusOr<ScopedWeight> again = ScopedWeight::Register(c, *w, "cross_entropy_replay");
      if (!again.ok()) return again.status();
      absl::StatusOr<client::CrossEntropyResult> res =
          Send(c, *x, none, td, again->handle(), all, false, "replay");
      if (!res.ok()) return res.status();
      return Outputs(*std::move(res));
    };
    replay.first.push_back(r_none->loss.Clone());
    if (r_none->lse) replay.first.push_back(r_none->lse->Clone());
    if (r_none->dx) replay.first.push_back(r_none->dx->Clone());
    if (r_none->dw) replay.first.push_back(r_none->dw->Clone());
    ctx.OfferReplay(std::move(replay));
  }
  absl::StatusOr<client::CrossEntropyResult> r_sum =
      Send(ctx, *d.x, sum, nc.targets_dtype, handle, {}, false, "sum");
  if (!r_sum.ok()) return r_sum.status();
  absl::StatusOr<client::CrossEntropyResult> r_mean =
      Send(ctx, *d.x, mean, nc.targets_dtype, handle, grads, false, "mean");
  if (!r_mean.ok()) return r_mean.status();
  timer.Lap("server");

  std::vector<double> y, y_err;
  ReferenceLogits(*d.x, *d.w, false, &y, &y_err);
  const CeReference ref_none = ReferenceFromLogits(y, &y_err, s.m, s.v, none);
  const CeReference ref_mean = ReferenceFromLogits(y, &y_err, s.m, s.v, mean);
  std::vector<double> y16(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) y16[i] = RoundDoubleToBf16(y[i]);
  const CeReference ref16 = ReferenceFromLogits(y16, nullptr, s.m, s.v, none);
  timer.Lap("reference");

  CeErrors table;
  Fold(CheckAgainstReference(ref_none, none, *d.x, *d.w, *r_none, all, r, "none"), &table);
  Fold(CheckAgainstReference(ref_none, sum, *d.x, *d.w, *r_sum, {}, r, "sum"), &table);
  Fold(CheckAgainstReference(ref_mean, mean, *d.x, *d.w, *r_mean, grads, r, "mean"), &table);
  if (r_none->loss.numel() == s.m) {
    CheckReductionConsistency(r_none->loss, *r_sum, client::Reduction::kSum, ref_none.counted, r,
                              "sum_vs_none");
    CheckReductionConsistency(r_none->loss, *r_mean, client::Reduction::kMean, ref_none.counted, r,
                              "mean_vs_none");
  }
  CheckFp32LogitsShow(ref_none, ref16, *r_none, none, kMinBf16Ratio, r, "fp32_vs_bf16_logits");
  PutTable(r, table);
  const nlohmann::ordered_json& ratio = r.figures["fp32_vs_bf16_logits"];
  if (ratio.contains("loss_ratio")) {
    r.figures["table"]["bf16_logits_loss_ratio"] = ratio["loss_ratio"];
  }
  timer.Lap("compare");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// ignore_index

absl::Status RunIgnoreIndex(RunContext& ctx, CaseResult& r) {
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, "ignore_index", 2.0);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "cross_entropy_ignore_index");
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();

  // A vocabulary id as ignore_index (some tokenizers pad with a real id):
  // about a quarter of the targets are that id.
  Rng t_rng = Rng::Stream(ctx.options().seed, "cross_entropy/ignore_index/t");
  CeRequest rq;
  rq.ignore_index = 3;
  rq.reduction = client::Reduction::kNone;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 4);
  const CeWants all{true, true, true, DType::kFp32};
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx, *d.x, rq, DType::kInt64, handle, all, false, "ignore_index 3");
  if (!res.ok()) return res.status();
  const CeReference ref = ComputeReference(*d.x, *d.w, rq);
  r.figures["ignored"] = ref.m - ref.counted;
  CeErrors table;
  Fold(CheckAgainstReference(ref, rq, *d.x, *d.w, *res, all, r, "ignore_index_3"), &table);

  // Nothing counted: the mean is NaN, the sum 0, and both gradients zero.
  CeRequest none_counted;
  none_counted.targets.assign(static_cast<std::size_t>(s.m), none_counted.ignore_index);
  for (client::Reduction red : {client::Reduction::kMean, client::Reduction::kSum}) {
    none_counted.reduction = red;
    const std::string label = absl::StrCat("all_ignored_", client::ReductionName(red));
    absl::StatusOr<client::CrossEntropyResult> all_ignored =
        Send(ctx, *d.x, none_counted, DType::kInt64, handle, {false, true, true, DType::kBf16},
             false, label);
    if (!all_ignored.ok()) return all_ignored.status();
    r.Check(all_ignored->counted_tokens == 0,
            absl::StrCat(label, ": counted_tokens ", all_ignored->counted_tokens, ", expected 0"));
    if (r.Check(all_ignored->loss.numel() == 1 && all_ignored->loss.dtype() == DType::kFp32,
                absl::StrCat(label, ": loss is not one fp32 value"))) {
      const double l = all_ignored->loss.At(0);
      if (red == client::Reduction::kMean) {
        r.Check(std::isnan(l), absl::StrFormat("%s: loss %.9g, expected NaN", label, l));
      } else {
        r.Check(l == 0, absl::StrFormat("%s: loss %.9g, expected 0", label, l));
      }
    }
    for (const auto& [name, t] :
         {std::pair{"dX", &all_ignored->dx}, std::pair{"dW", &all_ignored->dw}}) {
      if (!r.Check(t->has_value(), absl::StrCat(label, ": ", name, " asked for but missing"))) {
        continue;
      }
      std::int64_t nonzero = 0;
      for (std::int64_t i = 0; i < (*t)->numel(); ++i) nonzero += (*t)->At(i) != 0 ? 1 : 0;
      r.Check(nonzero == 0, absl::StrCat(label, ": ", name, ": ", nonzero, " of ", (*t)->numel(),
                                         " gradient elements are not zero (no token counts)"));
    }
  }
  PutTable(r, table);
  r.summary =
      absl::StrCat(ref.m - ref.counted, " of ", ref.m,
                   " ignored with ignore_index 3; all-ignored mean NaN, sum 0; ", r.summary);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// int32 and int64 targets

absl::Status RunTargetTypes(RunContext& ctx, CaseResult& r) {
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, "int32", 3.0);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "cross_entropy_int32");
  if (!weight.ok()) return weight.status();
  Rng t_rng = Rng::Stream(ctx.options().seed, "cross_entropy/int32/t");
  CeRequest rq;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 8);
  rq.reduction = client::Reduction::kMean;
  const CeWants all{true, true, true, DType::kBf16};
  absl::StatusOr<client::CrossEntropyResult> r32 =
      Send(ctx, *d.x, rq, DType::kInt32, weight->handle(), all, false, "int32");
  if (!r32.ok()) return r32.status();
  absl::StatusOr<client::CrossEntropyResult> r64 =
      Send(ctx, *d.x, rq, DType::kInt64, weight->handle(), all, false, "int64");
  if (!r64.ok()) return r64.status();
  const CeReference ref = ComputeReference(*d.x, *d.w, rq);
  CeErrors table;
  Fold(CheckAgainstReference(ref, rq, *d.x, *d.w, *r32, all, r, "int32"), &table);
  r.Check(r32->counted_tokens == r64->counted_tokens,
          absl::StrCat("counted_tokens: ", r32->counted_tokens, " with int32 targets, ",
                       r64->counted_tokens, " with int64"));
  const CompareOptions strict{/*signed_zero_equal=*/false, /*any_nan_equal=*/false};
  std::int64_t differing = 0;
  std::vector<Tensor> a = Outputs(*std::move(r32));
  std::vector<Tensor> b = Outputs(*std::move(r64));
  if (r.Check(a.size() == b.size(), "int32 and int64 targets returned different outputs")) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const BitwiseComparison c = CompareTensors(a[i], b[i], strict);
      differing += c.differing;
      r.Check(c.differing == 0,
              absl::StrCat("output ", i,
                           " with int32 targets differs from int64: ", c.Describe(b[i].shape())));
    }
  }
  r.figures["differing_int32_vs_int64"] = differing;
  PutTable(r, table);
  r.summary = absl::StrCat(differing, " elements differ between int32 and int64; ", r.summary);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Invalid targets

absl::Status RunInvalidTargets(RunContext& ctx, CaseResult& r) {
  constexpr std::int64_t m = 8, v = 64, k = 32;
  Rng rng = Rng::Stream(ctx.options().seed, "cross_entropy/invalid");
  const Tensor x = RandomNormal(DType::kBf16, {m, k}, 1.0, rng);
  const Tensor w = RandomNormal(DType::kBf16, {v, k}, 0.25, rng);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), w, "cross_entropy_invalid");
  if (!weight.ok()) return weight.status();
  struct Bad {
    std::string what;
    std::int64_t index;
    std::int64_t value;
    std::int64_t ignore_index;
    DType dtype;
  };
  const std::vector<Bad> bad = {
      {"target V", 3, v, -100, DType::kInt64},
      {"target -1", 2, -1, -100, DType::kInt64},
      {"target INT64_MIN", 7, std::numeric_limits<std::int64_t>::min(), -100, DType::kInt64},
      {"target INT64_MAX", 0, std::numeric_limits<std::int64_t>::max(), -100, DType::kInt64},
      {"int32 target V+5", 5, v + 5, -100, DType::kInt32},
      {"int32 target INT32_MIN", 1, std::numeric_limits<std::int32_t>::min(), -100, DType::kInt32},
      {"target -100 with ignore_index -1", 4, -100, -1, DType::kInt64},
  };
  std::int64_t refused = 0;
  for (const Bad& b : bad) {
    CeRequest rq;
    rq.ignore_index = b.ignore_index;
    rq.targets.resize(m);
    for (std::int64_t i = 0; i < m; ++i) rq.targets[static_cast<std::size_t>(i)] = (i * 7) % v;
    rq.targets[static_cast<std::size_t>(b.index)] = b.value;
    client::CrossEntropyOptions o = rq.Options();
    o.want_dx = true;
    absl::StatusOr<client::CrossEntropyResult> res =
        ctx.client().CrossEntropy(x, rq.TargetsTensor(b.dtype), weight->handle(), o);
    if (res.ok()) {
      r.Check(false, absl::StrCat(b.what, " at [", b.index,
                                  "]: accepted (loss computed); out-of-range targets must be "
                                  "INVALID_ARGUMENT, never clamped"));
      continue;
    }
    if (IsServerUnreachable(res.status())) return res.status();
    if (r.Check(res.status().code() == absl::StatusCode::kInvalidArgument,
                absl::StrCat(b.what, ": expected INVALID_ARGUMENT, got ",
                             absl::StatusCodeToString(res.status().code()), ": ",
                             res.status().message()))) {
      ++refused;
    }
  }
  // The server still serves, and an out-of-range ignore_index used as such
  // is fine.
  CeRequest ok;
  ok.ignore_index = v;
  ok.reduction = client::Reduction::kSum;
  ok.targets.resize(m);
  for (std::int64_t i = 0; i < m; ++i) ok.targets[static_cast<std::size_t>(i)] = i % 2 ? v : i;
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx, x, ok, DType::kInt64, weight->handle(), {}, false, "ignore_index V");
  if (!res.ok()) return res.status();
  r.Check(res->counted_tokens == m / 2, absl::StrCat("ignore_index V: counted_tokens ",
                                                     res->counted_tokens, ", expected ", m / 2));
  r.figures["refused"] = refused;
  r.figures["tried"] = bad.size();
  r.summary = absl::StrCat(refused, "/", bad.size(),
                           " invalid target sets refused with INVALID_ARGUMENT; server answers");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Exact gradients: the cast contract bit for bit.

struct ExactCase {
  std::string name;
  client::Reduction reduction = client::Reduction::kSum;
  float grad_scale = 1;
  float z_loss = 0;
  float softcap = 0;
};

absl::Status RunExact(RunContext& ctx, CaseResult& r, const ExactCase& ec) {
  PhaseTimer timer(&r);
  const CeShapes s = ShapesOf(ctx.options());
  CeRequest rq;
  rq.reduction = ec.reduction;
  rq.grad_scale = ec.grad_scale;
  rq.z_loss = ec.z_loss;
  rq.logit_softcap = ec.softcap;
  absl::StatusOr<ExactData> d =
      MakeExactData(ctx.options().seed, absl::StrCat("cross_entropy/", ec.name), s.exact_m,
                    s.exact_v, s.exact_k, &rq);
  if (!d.ok()) return absl::InternalError(absl::StrCat("harness: ", d.status().message()));
  const CeReference ref = ComputeReference(d->x, d->w, rq, /*exact_logits=*/true);
  absl::StatusOr<ExactGradients> want = PredictExactGradients(ref, d->x, d->w);
  if (!want.ok()) {
    return absl::InternalError(absl::StrCat("harness: ", want.status().message()));
  }
  r.figures["m"] = s.exact_m;
  r.figures["v"] = s.exact_v;
  r.figures["k"] = s.exact_k;
  r.figures["reduction"] = std::string(client::ReductionName(ec.reduction));
  r.figures["counted"] = ref.counted;
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), d->w, absl::StrCat("cross_entropy_", ec.name));
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();
  client::Client& c = ctx.client();

  const CeWants fp32{true, true, true, DType::kFp32};
  absl::StatusOr<client::CrossEntropyResult> a =
      Send(ctx, d->x, rq, DType::kInt64, handle, fp32, false, "dX fp32");
  if (!a.ok()) return a.status();
  const CeWants bf16{false, true, false, DType::kBf16};
  absl::StatusOr<client::CrossEntropyResult> b =
      Send(ctx, d->x, rq, DType::kInt32, handle, bf16, false, "dX bf16");
  if (!b.ok()) return b.status();
  timer.Lap("server");

  CeErrors table;
  // Loss and lse from exact logits: bounds of a few ulps.
  CeWants no_grads = fp32;
  no_grads.dx = no_grads.dw = false;
  client::CrossEntropyResult loss_only;
  loss_only.loss = a->loss.Clone();
  if (a->lse) loss_only.lse = a->lse->Clone();
  loss_only.counted_tokens = a->counted_tokens;
  Fold(CheckAgainstReference(ref, rq, d->x, d->w, loss_only, no_grads, r, "loss"), &table);
  CheckExactGradients(*want, *a, fp32, r, "fp32_dx");
  CheckExactGradients(*want, *b, bf16, r, "bf16_dx");

  // The server's own Backward of the predicted G gives the same bits.
  client::BackwardOptions bo;
  bo.dx_dtype = DType::kFp32;
  absl::StatusOr<client::BackwardResult> back = c.Backward(want->g, d->x, handle, bo);
  if (!back.ok()) return Annotate(back.status(), "Backward(predicted G)");
  std::int64_t backward_differing = 0;
  if (a->dx && a->dw && back->dx && back->dw) {
    const BitwiseComparison cx = CompareTensors(*a->dx, *back->dx);
    const BitwiseComparison cw = CompareTensors(*a->dw, *back->dw);
    backward_differing = cx.differing + cw.differing;
    r.Check(cx.differing == 0,
            absl::StrCat("CrossEntropy's dX differs from Backward's dX for the same G: ",
                         cx.Describe(a->dx->shape())));
    r.Check(cw.differing == 0,
            absl::StrCat("CrossEntropy's dW differs from Backward's dW for the same G: ",
                         cw.Describe(a->dw->shape())));
  }
  r.figures["differing_vs_backward"] = backward_differing;

  // Twice into the server-held buffer: exactly 2·dW.
  const absl::Status zero = c.ZeroGradient(handle);
  if (!zero.ok() && zero.code() != absl::StatusCode::kNotFound &&
      zero.code() != absl::StatusCode::kFailedPrecondition) {
    return Annotate(zero, "ZeroGradient");
  }
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<client::CrossEntropyResult> acc =
        Send(c, d->x, rq, DType::kInt64, handle, {false, false, true, DType::kBf16}, true,
             "accumulate_dw");
    if (!acc.ok()) return acc.status();
    r.Check(!acc->dw.has_value(), "accumulate_dw: dW returned although accumulated");
  }
  absl::StatusOr<client::GradientResult> fetched = c.FetchGradient(handle, true);
  if (!fetched.ok()) return Annotate(fetched.status(), "FetchGradient");
  r.figures["accumulated_calls"] = fetched->accumulated_calls;
  r.Check(fetched->accumulated_calls == 2,
          absl::StrCat("FetchGradient counts ", fetched->accumulated_calls,
                       " accumulated calls after ZeroGradient and 2 accumulating CrossEntropy "
                       "calls"));
  std::int64_t acc_differing = -1;
  if (CheckTensor(r, fetched->dw, DType::kFp32, {s.exact_v, s.exact_k}, "FetchGradient dW")) {
    std::vector<float> twice(want->dw.size());
    for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * want->dw[i];
    const BitwiseComparison cmp =
        CompareWith(fetched->dw, twice.data(), static_cast<std::int64_t>(twice.size()));
    acc_differing = cmp.differing;
    r.Check(cmp.differing == 0, absl::StrCat("dW accumulated twice differs from 2·(exact Gᵀ·X): ",
                                             cmp.Describe(fetched->dw.shape())));
  }
  r.figures["differing_accumulated"] = acc_differing;
  timer.Lap("compare");

  std::int64_t differing = 0;
  for (const char* key : {"fp32_dx", "bf16_dx"}) {
    for (const char* t : {"dx", "dw"}) {
      if (r.figures[key].contains(t)) differing += r.figures[key][t].value("differing", 0);
    }
  }
  // The gradients are compared bit for bit, not against bounds.
  table.dx_rel_frobenius = table.dx_worst_fraction = std::nan("");
  table.dw_rel_frobenius = table.dw_worst_fraction = std::nan("");
  PutTable(r, table);
  r.figures["table"]["bitwise_differing"] =
      differing + backward_differing + std::max<std::int64_t>(acc_differing, 0);
  r.summary = absl::StrFormat(
      "%d dX/dW elements differ from exact bf16-G sums, %d from Backward, %d accumulated; "
      "loss err %.2g ulp",
      differing, backward_differing, acc_differing, table.loss_max_ulp);
  return absl::OkStatus();
}

double Figure(const nlohmann::ordered_json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nan("");
  if (it->is_number()) return it->get<double>();
  if (it->is_string() && it->get<std::string>() == "inf") {
    return std::numeric_limits<double>::infinity();
  }
  return std::nan("");
}

class CrossEntropySuite final : public Suite {
 public:
  std::string name() const override { return kSuite; }
  std::vector<Case> Cases(const Options& options) override {
    shapes_ = ShapesOf(options);
    std::vector<Case> cases;
    const std::vector<NumericCase> numeric = {
        {"reference", 2.0, 0.0f, 0.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"z_loss", 2.0, 1e-3f, 0.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"softcap", 8.0, 0.0f, 10.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"softcap_z_loss_scaled", 6.0, 1e-4f, 15.0f, 0.37f, DType::kFp32, DType::kInt32},
    };
    for (const NumericCase& nc : numeric) {
      cases.push_back(
          {nc.name, [nc](RunContext& ctx, CaseResult& r) { return RunNumeric(ctx, r, nc); }});
    }
    cases.push_back({"ignore_index", RunIgnoreIndex});
    cases.push_back({"int32_equals_int64", RunTargetTypes});
    cases.push_back({"invalid_targets", RunInvalidTargets});
    const std::vector<ExactCase> exact = {
        {"exact_grads", client::Reduction::kSum, 1.0f, 0.0f, 0.0f},
        {"exact_grads_mean_softcap_z_loss", client::Reduction::kMean, 2.0f, 1e-3f, 20.0f},
    };
    for (const ExactCase& ec : exact) {
      cases.push_back(
          {ec.name, [ec](RunContext& ctx, CaseResult& r) { return RunExact(ctx, r, ec); }});
    }
    return cases;
  }

  std::string DetailTable(const std::vector<CaseResult>& results) const override {
    std::string t = absl::StrFormat(
        "cross_entropy: X [%d, %d] ~ N(0, 1), W [%d, %d] scaled to the logit std; errors of the "
        "fused loss against fp64 (max over the case's requests; %% = worst fraction of the "
        "fp32 bound)\n",
        shapes_.m, shapes_.k, shapes_.v, shapes_.k);
    absl::StrAppend(&t, absl::StrFormat("%-32s %10s %8s %7s %10s %7s %10s %7s %10s %7s %9s  %s\n",
                                        "case", "loss err", "ulp", "%", "lse err", "%", "dX relF",
                                        "%", "dW relF", "%", "bf16/fp32", "verdict"));
    for (const CaseResult& r : results) {
      if (!r.figures.contains("table")) {
        absl::StrAppend(&t, absl::StrFormat("%-32s %s\n", r.name, VerdictName(r.verdict)));
        continue;
      }
      const nlohmann::ordered_json& j = r.figures.at("table");
      std::string tail;
      if (j.contains("bitwise_differing")) {
        tail =
            absl::StrCat("bitwise: ", j.value("bitwise_differing", std::int64_t{0}), " differ; ");
      }
      // "-" where a figure does not apply (e.g. gradients compared bit for bit).
      const auto sci = [&](const char* key) {
        const double v = Figure(j, key);
        return std::isnan(v) ? std::string("-") : absl::StrFormat("%.2e", v);
      };
      const auto pct = [&](const char* key) {
        const double v = Figure(j, key);
        return std::isnan(v) ? std::string("-") : absl::StrFormat("%.2g", 100 * v);
      };
      const double ratio = Figure(j, "bf16_logits_loss_ratio");
      absl::StrAppend(
          &t, absl::StrFormat("%-32s %10s %8.2f %7s %10s %7s %10s %7s %10s %7s %9s  %s%s\n", r.name,
                              sci("loss_max_abs_err"), Figure(j, "loss_max_ulp"),
                              pct("loss_worst_bound_fraction"), sci("lse_max_abs_err"),
                              pct("lse_worst_bound_fraction"), sci("dx_rel_frobenius_err"),
                              pct("dx_worst_bound_fraction"), sci("dw_rel_frobenius_err"),
                              pct("dw_worst_bound_fraction"),
                              std::isnan(ratio) ? std::string("-") : absl::StrFormat("%.3g", ratio),
                              tail, VerdictName(r.verdict)));
    }
    return t;
  }

 private:
  CeShapes shapes_{};
};

}  // namespace

std::unique_ptr<Suite> MakeCrossEntropySuite() { return std::make_unique<CrossEntropySuite>(); }

}  // namespace logitd::validate

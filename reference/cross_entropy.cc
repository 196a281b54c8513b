// cross_entropy: the fused LM-head cross-entropy's fp64 reference and its
// proven bounds (cross_entropy.h).
//
// The reference. Logits y = x·wᵀ come from a dgemm of the widened bf16
// operands; z, lse, loss and the pre-cast gradient g = dL/dy · scale are then
// evaluated in fp64 with the formulas of logitd.v1.CrossEntropyHeader.
//
// The bounds hold for any candidate whose fp32 logits obey the proven bound
// of a sum of products (bounds.h) and whose exp, log and tanh obey the
// kFnError model (element_judgement.h); each term below is an inequality,
// not a first-order estimate. u = 2^-24, γ_n = n·2^-23/(1 − n·2^-23).
//   logit      |Δy_v| ≤ e_y,v = (γ_K + γ_{K+1}(fp64))·Σ_k|x_k·w_vk| + 2K·2^-149.
//   capped z   |Δz_v| ≤ e_z,v (judgement::CappedLogit): tanh is 1-Lipschitz,
//              so |Δ tanh| ≤ |Δ(y/cap)| plus tanh's own error; y/cap and the
//              product with cap round once each. e_z,v = e_y,v without a cap.
//   lse        lse(z + δ) = lse(z) + log Σ_v p_v·e^{δ_v} exactly, so for
//              |δ_v| ≤ a_v, |Δlse| ≤ log Σ_v p_v·e^{a_v} (Jensen:
//              log Σ p·e^{−a} ≥ −Σ p·a ≥ −log Σ p·e^{a}). A candidate forms
//              m̂ + log Σ_v exp(ẑ_v − m̂)·(1 + τ_v), each term off by its exp
//              (kFnError + 3u·|argument|, the argument at most d_v + 2E with
//              d_v = max − z_v and E = max e_z) and by its share of the fp32 sum
//              of V positive terms (within γ_V of each), as the factor
//              e^{±r_v} of judgement::ExpTermError. So with
//              W = Σ_v p_v·(e^{e_z,v + r_v} − 1):
//              |Δlse| ≤ log(1 + W) + kFnError·(1 + |log_s| + log(1 + W)) (its
//              log) + 2u·(|lse| + log(1 + W)) (m̂ + log, rounded) + γ_V(fp64)·
//              (|lse| + 1) (the reference's own evaluation).
//   loss       lse − z_t + zl·lse²: B_lse·(1 + 2·zl·|lse|) + zl·B_lse² + e_z,t
//              + 4u·(|lse| + |z_t| + 2·zl·lse² + |loss|) (the roundings of
//              its three terms).
//   sum, mean  Σ of the token bounds + γ_M·Σ(|loss_i| + bound_i) (an fp32 sum
//              in any order) + γ_M(fp64)·Σ|loss_i|; a mean adds 3u per term
//              and 2u of its own (either order of dividing).
//   g          p_v = exp(z_v − lse): the candidate's p̂_v lies within the
//              factor e^{a_v} of it, a_v = e_z,v + B_lse + ρ_v (its exp at an
//              argument of at most lse − z_v + e_z,v + B_lse), so |p̂ − p| ≤
//              p·(e^{a_v} − 1); dL/dz = p·c − onehot with c = 1 + 2·zl·lse
//              off by 2·zl·B_lse + 2u|c|; the product with f = 1 − t² (f off
//              by (2|t| + Δt)·Δt + 4u) and with scale round a few times more.
//              Then the bf16 cast: |G − g| ≤ e_g + 2^-8·(|g| + e_g) + 2^-134.
//   dX, dW     |ΔdX_ik| ≤ Σ_v (|G − g|_iv + (γ_V·(1 + 2^-8) + γ_V(fp64))·|G|_iv)·
//              |w_vk|, by one dgemm of the bounds with |W|; dW alike with γ_M
//              and |X|. A bf16 dX adds its rounding. (The caller forms these
//              from the blocks of g: CastGradientError, CastGradientMagnitude,
//              GradientProductCoefficient.)
// Every value of a correct implementation lies inside its bound, element by
// element.

#include "logitd/reference/cross_entropy.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "logit_rows.h"
#include "logitd/bf16.h"
#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"
#include "logitd/reference/precision_class.h"
#include "logitd/reference/token_judgement.h"

namespace logitd {
namespace {

constexpr double kU = kFp32UnitRoundoff;
// Absolute slack for values that underflow: half the smallest bf16
// subnormal spacing (2^-133), and fp32 intermediates near 2^-126.
constexpr double kBf16Underflow = 0x1p-134;
constexpr double kExpUnderflow = 0x1p-125;

double Sq(double v) { return v * v; }

}  // namespace

std::int64_t CountedTokens(const std::int64_t* targets, std::int64_t m, std::int64_t ignore_index) {
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < m; ++i) counted += targets[i] == ignore_index ? 0 : 1;
  return counted;
}

double CrossEntropyGradScale(const CeReferenceOptions& options, std::int64_t counted) {
  if (options.reduction == CeReduction::kMean) {
    return static_cast<double>(options.grad_scale) / static_cast<double>(counted);
  }
  return options.grad_scale;
}

CeTokenReference CrossEntropyTokenFromSums(const judgement::CeRowSums& sums, std::int64_t v,
                                           bool counted, const CeReferenceOptions& options) {
  const double zl = options.z_loss;
  CeTokenReference out;
  out.lse = sums.lse;
  const double spread = std::log1p(sums.weighted);
  out.lse_bound = spread + judgement::kFnError * (1 + std::fabs(sums.log_s) + spread) +
                  2 * kU * (std::fabs(out.lse) + spread) +
                  Gamma(v, kFp64UnitRoundoff) * (std::fabs(out.lse) + 1);
  const bool classed = sums.class_formed && std::isfinite(sums.class_lin) &&
                       std::isfinite(sums.class_zt) && std::isfinite(out.lse);
  if (classed) {
    out.lse_class =
        sums.class_lin + judgement::LseEvalEnvelope(sums.log_s, sums.lse, sums.class_mean_d, v);
  }
  if (!counted) return out;
  const double lse = out.lse;
  const double zt = sums.zt;
  out.loss = lse - zt + zl * lse * lse;
  // (The z-loss terms only with a z-loss: 0·∞ is no bound.)
  out.loss_bound =
      out.lse_bound * (1 + 2 * zl * std::fabs(lse)) + (zl > 0 ? zl * Sq(out.lse_bound) : 0.0) +
      sums.ezt +
      4 * kU * (std::fabs(lse) + std::fabs(zt) + 2 * zl * lse * lse + std::fabs(out.loss));
  if (classed) {
    // dloss/dz_v = p_v·(1 + 2·zl·lse) − [v = t]: the lse's envelope times
    // |1 + 2·zl·lse|, the target's, and the roundings of the three terms.
    out.loss_class =
        out.lse_class * std::fabs(1 + 2 * zl * lse) + sums.class_zt +
        2 * kU * (std::fabs(lse) + std::fabs(zt) + 2 * zl * lse * lse + std::fabs(out.loss));
  }
  return out;
}

judgement::CeRowSums CrossEntropyRowSums(const double* z, const double* ez, std::int64_t v,
                                         const double* cz) {
  judgement::CeRowSums sums;
  sums.mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < v; ++j) {
    sums.mx = std::max(sums.mx, z[j]);
    sums.b = std::max(sums.b, ez[j]);
  }
  double sum_exp = 0;
  for (std::int64_t j = 0; j < v; ++j) sum_exp += std::exp(z[j] - sums.mx);
  sums.log_s = std::log(sum_exp);
  sums.lse = sums.mx + sums.log_s;
  const double gamma_sum = Gamma(v, kFp32StepError);
  for (std::int64_t j = 0; j < v; ++j) {
    const double p = std::exp(z[j] - sums.lse);
    const double r = judgement::ExpTermError(sums.mx - z[j], sums.b, gamma_sum);
    sums.weighted += judgement::WeightedExpm1(z[j] - sums.lse, ez[j] + r);
    if (cz != nullptr) {
      sums.class_lin += p * cz[j];
      sums.class_mean_d += p * (sums.mx - z[j]);
    }
  }
  sums.class_formed = cz != nullptr;
  return sums;
}

namespace {

// A row's capped logits z, their factors f = 1 − t² and bounds e_z, and
// with class envelopes the envelopes c_z carried into z.
struct CappedRow {
  std::vector<double> z, f, ez, cz;
};

CappedRow CapRow(const double* y, const double* y_err, std::int64_t v, double cap,
                 const double* y_class) {
  CappedRow row;
  std::vector<double>& z = row.z;
  std::vector<double>& f = row.f;
  std::vector<double>& ez = row.ez;
  std::vector<double>& cz = row.cz;
  z.resize(static_cast<std::size_t>(v));
  f.resize(z.size());
  ez.resize(z.size());
  for (std::int64_t j = 0; j < v; ++j) {
    const std::size_t s = static_cast<std::size_t>(j);
    judgement::CappedLogit(y[j], y_err != nullptr ? y_err[j] : 0.0, cap, &z[s], &f[s], &ez[s]);
  }
  // The class envelopes carried into z as the bounds are (a conforming
  // tanh within kFnError, its roundings).
  if (y_class != nullptr) {
    cz.resize(z.size());
    for (std::int64_t j = 0; j < v; ++j) {
      double zj, fj;
      judgement::CappedLogit(y[j], y_class[j], cap, &zj, &fj, &cz[static_cast<std::size_t>(j)]);
    }
  }
  return row;
}

// A counted row's pre-cast gradient g [v] with its bound g_pre_err, and
// with flip_mean CastFlip's weights (0 without class envelopes), from its
// capped logits and its token's reference `out`.
void RowGradient(const CappedRow& row, std::int64_t v, std::int64_t target, double scale,
                 const CeReferenceOptions& options, const CeTokenReference& out, double* g,
                 double* g_pre_err, double* flip_mean, double* flip_var) {
  const double cap = options.logit_softcap;
  const double zl = options.z_loss;
  const std::vector<double>& z = row.z;
  const std::vector<double>& f = row.f;
  const std::vector<double>& ez = row.ez;
  const std::vector<double>& cz = row.cz;
  const double lse = out.lse;
  const double c = 1 + 2 * zl * lse;
  const double dc = (zl > 0 ? 2 * zl * out.lse_bound : 0.0) + 2 * kU * std::fabs(c);
  const double gamma_sum = Gamma(v, kFp32StepError);
  for (std::int64_t j = 0; j < v; ++j) {
    const std::size_t s = static_cast<std::size_t>(j);
    const double onehot = j == target ? 1.0 : 0.0;
    const double p = std::exp(z[s] - lse);
    const double d = p * c - onehot;
    // p̂ = exp(ẑ − L̂): its argument is off by at most e_z + B_lse and is
    // at most lse − z + that in magnitude.
    const double off = ez[s] + out.lse_bound;
    const double ep = judgement::WeightedExpm1(
        z[s] - lse, off + judgement::ExpTermError(lse - z[s] + off, 0, gamma_sum));
    const double ed = ep * (std::fabs(c) + dc) + p * dc + 2 * kU * (p * std::fabs(c) + onehot);
    // f = 1 − t², t = z/cap off by e_z/cap.
    const double dt = cap > 0 ? ez[s] / cap : 0.0;
    const double ef = cap > 0 ? (2 * std::fabs(z[s] / cap) + dt) * dt + 4 * kU : 0.0;
    g[j] = d * f[s] * scale;
    g_pre_err[j] = std::fabs(scale) * (ed * (f[s] + ef) + std::fabs(d) * ef) +
                   3 * kU * (std::fabs(g[j]) + std::fabs(scale) * ed * (f[s] + ef)) +
                   kExpUnderflow * std::fabs(scale) * (std::fabs(c) + 1);
    if (flip_mean == nullptr) continue;
    if (cz.empty()) {
      flip_mean[j] = flip_var[j] = 0;
      continue;
    }
    // The scale of a conforming fp32 g's error, as the bounds carry theirs
    // but from the class envelopes: p's argument z − lse off by the logit's
    // c_z and the lse's envelope, its exp within kFnError and 4u per unit
    // of the argument; c off by the z-loss's share of the lse's; f by the
    // soft-cap's tanh (2|t|·Δt); three roundings of the products.
    const double rel = cz[s] + out.lse_class + judgement::kFnError + 4 * kU * std::fabs(z[s] - lse);
    const double dd = p * rel * std::fabs(c) + (zl > 0 ? p * 2 * zl * out.lse_class : 0.0);
    const double df = cap > 0 ? 2 * std::fabs(z[s] / cap) * (cz[s] / cap) : 0.0;
    const double eta =
        std::fabs(scale) * (dd * f[s] + std::fabs(d) * df) + 3 * kU * std::fabs(g[j]);
    const CastFlipWeights flip = CastFlip(g[j], kClassSpread * eta);
    flip_mean[j] = flip.mean;
    flip_var[j] = flip.var;
  }
}

}  // namespace

CeTokenReference CrossEntropyReferenceRow(const double* y, const double* y_err, std::int64_t v,
                                          std::int64_t target, bool counted, double scale,
                                          const CeReferenceOptions& options, double* g,
                                          double* g_pre_err, const double* y_class,
                                          double* flip_mean, double* flip_var) {
  const double cap = options.logit_softcap;
  const CappedRow capped = CapRow(y, y_err, v, cap, y_class);
  const std::vector<double>& z = capped.z;
  const std::vector<double>& ez = capped.ez;
  const std::vector<double>& cz = capped.cz;
  judgement::CeRowSums sums =
      CrossEntropyRowSums(z.data(), ez.data(), v, cz.empty() ? nullptr : cz.data());
  if (counted) {
    sums.zt = z[static_cast<std::size_t>(target)];
    sums.ezt = ez[static_cast<std::size_t>(target)];
    if (!cz.empty()) sums.class_zt = cz[static_cast<std::size_t>(target)];
  }
  const CeTokenReference out = CrossEntropyTokenFromSums(sums, v, counted, options);
  if (!counted) {
    if (g != nullptr) {
      std::fill(g, g + v, 0.0);
      std::fill(g_pre_err, g_pre_err + v, 0.0);
      if (flip_mean != nullptr) {
        std::fill(flip_mean, flip_mean + v, 0.0);
        std::fill(flip_var, flip_var + v, 0.0);
      }
    }
    return out;
  }
  if (g == nullptr) return out;
  RowGradient(capped, v, target, scale, options, out, g, g_pre_err, flip_mean, flip_var);
  return out;
}

double ModelCast(double g) { return RoundToBf16(static_cast<float>(g)); }

namespace {

// g's two bf16 neighbours (of fp32(g)): toward zero, and the next one away.
bool Bf16Neighbours(double g, double* lo, double* hi) {
  const float f = static_cast<float>(g);
  if (!std::isfinite(f)) return false;
  const std::uint32_t a = FloatBits(f) & 0xffff0000u;
  *lo = BitsToFloat(a);
  *hi = BitsToFloat(a + 0x10000u);
  return std::isfinite(*hi);
}

}  // namespace

CastFlipWeights CastFlip(double g, double sigma) {
  CastFlipWeights out;
  double lo, hi;
  if (!(sigma > 0) || !Bf16Neighbours(g, &lo, &hi)) return out;
  const double s = std::fabs(hi - lo), mid = 0.5 * (lo + hi);
  const double model = ModelCast(g);
  const double near = std::fabs(g - mid), far = std::max(0.0, s - near);
  const double scale = sigma * std::sqrt(2.0);
  const double p_near = 0.5 * std::erfc(near / scale), p_far = 0.5 * std::erfc(far / scale);
  // fp32(g) a bf16 value itself: both midpoints about as far, no direction.
  const double other = model == lo ? hi : lo;
  out.mean = static_cast<float>(g) == static_cast<float>(lo) ? 0.0 : p_near * (other - model);
  out.var = std::min(1.0, p_near + p_far) * s * s;
  return out;
}

namespace {

// Token s's values into *ref: lse, loss and their bounds, and with class
// envelopes theirs (from the host's rows or the engine's sums alike).
void StoreToken(const CeTokenReference& row, std::size_t s, bool classed,
                CrossEntropyReference* out) {
  CrossEntropyReference& ref = *out;
  ref.lse[s] = row.lse;
  ref.lse_bound[s] = row.lse_bound;
  ref.loss[s] = row.loss;
  ref.loss_bound[s] = row.loss_bound;
  if (classed) {
    ref.lse_class[s] = row.lse_class;
    ref.loss_class[s] = row.loss_class;
  }
}

// The blocks of rows of one ReferenceCrossEntropy call, each formed on the
// host or from the engine's sums, into the reference's tokens.
class CrossEntropyBlocks {
 public:
  CrossEntropyBlocks(const LmHeadInputs& in, const std::int64_t* targets,
                     const CeReferenceOptions& options, const reference_internal::LogitRows& rows,
                     bool classed, const CeGradientSink& gradients, CrossEntropyReference* ref)
      : in_(in),
        targets_(targets),
        options_(options),
        rows_(rows),
        classed_(classed),
        gradients_(gradients),
        ref_(*ref) {}

  // The rows [r0, r0 + n) on the host: their logits, then each row on
  // threads.
  void Host(std::int64_t r0, std::int64_t n);
  // The chunk's rows from the softmax sums the engine forms (logit_gamma
  // and logit_absolute: the logits' bound); false when it did not form them.
  bool Device(const reference_internal::RowChunk& chunk, double logit_gamma, double logit_absolute);

 private:
  // The block's rows from r0 whose class envelopes to form: null for none
  // (classed_ false) or, with options_.class_rows empty, every row.
  const std::uint8_t* ClassRows(std::int64_t r0, std::int64_t n);

  const LmHeadInputs& in_;
  const std::int64_t* const targets_;
  const CeReferenceOptions& options_;
  const reference_internal::LogitRows& rows_;
  const bool classed_;
  const CeGradientSink& gradients_;
  CrossEntropyReference& ref_;
  std::vector<double> y_, y_err_, y_class_, g_, g_pre_err_, flip_mean_, flip_var_;
  std::vector<std::uint8_t> every_row_;
};

const std::uint8_t* CrossEntropyBlocks::ClassRows(std::int64_t r0, std::int64_t n) {
  return reference_internal::BlockClassRows(classed_, options_.class_rows, r0, n, &every_row_);
}

void CrossEntropyBlocks::Host(std::int64_t r0, std::int64_t n) {
  const std::int64_t v = in_.v;
  const std::uint8_t* class_rows = ClassRows(r0, n);
  rows_.Compute(r0, n, &y_, &y_err_, classed_ ? &y_class_ : nullptr, class_rows);
  if (gradients_) {
    g_.resize(static_cast<std::size_t>(n * v));
    g_pre_err_.resize(g_.size());
    if (classed_) {
      flip_mean_.resize(g_.size());
      flip_var_.resize(g_.size());
    }
  }
  reference_internal::ForRowsInParallel(
      n, n * v, [&](std::int64_t first, std::int64_t last, int /*part*/) {
        for (std::int64_t r = first; r < last; ++r) {
          const std::int64_t i = r0 + r;
          const std::size_t s = static_cast<std::size_t>(i);
          const bool counted = targets_[i] != options_.ignore_index;
          const CeTokenReference row = CrossEntropyReferenceRow(
              y_.data() + r * v, y_err_.empty() ? nullptr : y_err_.data() + r * v, v, targets_[i],
              counted, ref_.scale, options_, gradients_ ? g_.data() + r * v : nullptr,
              gradients_ ? g_pre_err_.data() + r * v : nullptr,
              classed_ && class_rows[r] != 0 ? y_class_.data() + r * v : nullptr,
              gradients_ && classed_ ? flip_mean_.data() + r * v : nullptr,
              gradients_ && classed_ ? flip_var_.data() + r * v : nullptr);
          StoreToken(row, s, classed_, &ref_);
        }
      });
  if (gradients_) {
    gradients_(r0, n, g_.data(), g_pre_err_.data(), classed_ ? flip_mean_.data() : nullptr,
               classed_ ? flip_var_.data() : nullptr);
  }
}

bool CrossEntropyBlocks::Device(const reference_internal::RowChunk& chunk, double logit_gamma,
                                double logit_absolute) {
  const std::vector<std::int64_t>& rows = chunk.rows;
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  std::vector<double> xd;
  if (!reference_internal::WidenFiniteRows(in_.x, rows, in_.k, &xd)) return false;
  std::vector<std::int64_t> targets(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) targets[r] = targets_[rows[r]];
  every_row_.assign(rows.size(), 1);
  std::vector<judgement::CeRowSums> sums(rows.size());
  if (!in_.products->CeRowSums(xd.data(), n, targets.data(), logit_gamma, logit_absolute,
                               options_.logit_softcap, chunk.classed ? every_row_.data() : nullptr,
                               sums.data())) {
    return false;
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const CeTokenReference row =
        CrossEntropyTokenFromSums(sums[r], in_.v, targets[r] != options_.ignore_index, options_);
    StoreToken(row, static_cast<std::size_t>(rows[r]), classed_, &ref_);
  }
  return true;
}

}  // namespace

bool ReferenceCrossEntropy(const LmHeadInputs& in, const std::int64_t* targets,
                           const CeReferenceOptions& options, LogitModel logits,
                           CrossEntropyReference* out, const CeGradientSink& gradients,
                           const StopCheck& stop, std::int64_t block_rows) {
  const std::int64_t m = in.m, v = in.v;
  CrossEntropyReference& ref = *out;
  ref = CrossEntropyReference();
  ref.m = m;
  ref.v = v;
  ref.counted = options.counted_tokens > 0 ? options.counted_tokens
                                           : CountedTokens(targets, m, options.ignore_index);
  ref.scale = CrossEntropyGradScale(options, std::max<std::int64_t>(ref.counted, 1));
  const std::size_t mm = static_cast<std::size_t>(m);
  ref.lse.resize(mm);
  ref.lse_bound.resize(mm);
  ref.loss.resize(mm);
  ref.loss_bound.resize(mm);
  const std::int64_t block = block_rows > 0 ? block_rows : reference_internal::DefaultBlockRows(v);
  const reference_internal::LogitRows rows(in, logits);
  const bool classed = options.class_envelope && logits == LogitModel::kFp32Sum;
  if (classed) {
    ref.lse_class.assign(mm, 0.0);
    ref.loss_class.assign(mm, 0.0);
  }
  CrossEntropyBlocks blocks(in, targets, options, rows, classed, gradients, &ref);
  double sum_abs = 0, sum_bounds = 0;
  // Without gradients, the rows' softmax sums where the engine forms the
  // logits, when it does and every operand is finite (the rows of X are
  // looked at as they are widened); the tokens from them here.
  const bool on_device = !gradients && logits == LogitModel::kFp32Sum && in.products != nullptr &&
                         in.products->WeightFinite();
  const std::int64_t device_rows = on_device ? in.products->JudgeBlockRows(std::max(v, in.k)) : 0;
  const double logit_gamma = Gamma(in.k, kFp32StepError) + Gamma(in.k + 1, kFp64UnitRoundoff);
  const double logit_absolute = 2 * static_cast<double>(in.k) * kFp32Underflow;
  if (!reference_internal::FormRows(
          m, block, device_rows, classed, options.class_rows,
          [&](const reference_internal::RowChunk& chunk) {
            return blocks.Device(chunk, logit_gamma, logit_absolute);
          },
          [&](std::int64_t r0, std::int64_t n) { blocks.Host(r0, n); }, stop)) {
    return false;
  }
  // The sums in row order, whichever way and order the rows went.
  for (std::size_t s = 0; s < mm; ++s) {
    ref.sum += ref.loss[s];
    sum_abs += std::fabs(ref.loss[s]);
    sum_bounds += ref.loss_bound[s];
  }
  ref.sum_bound = sum_bounds + Gamma(m, kFp32StepError) * (sum_abs + sum_bounds) +
                  Gamma(m, kFp64UnitRoundoff) * sum_abs;
  if (ref.counted == 0) {
    ref.mean = std::numeric_limits<double>::quiet_NaN();
    ref.mean_bound = 0;
  } else {
    const double n = static_cast<double>(ref.counted);
    ref.mean = ref.sum / n;
    ref.mean_bound = (ref.sum_bound + 3 * kU * sum_abs) / n + 2 * kU * std::fabs(ref.mean);
  }
  return true;
}

double CastGradientError(double g, double g_pre_err) {
  return g_pre_err + kBf16UnitRoundoff * (std::fabs(g) + g_pre_err) + kBf16Underflow;
}

double CastGradientMagnitude(double g, double g_pre_err) {
  return (1 + kBf16UnitRoundoff) * (std::fabs(g) + g_pre_err) + kBf16Underflow;
}

double GradientProductGamma(std::int64_t n) {
  return Gamma(n, kFp32StepError) * (1 + kBf16UnitRoundoff) + Gamma(n, kFp64UnitRoundoff);
}

double GradientProductCoefficient(double g, double g_pre_err, double gamma) {
  return CastGradientError(g, g_pre_err) + gamma * CastGradientMagnitude(g, g_pre_err);
}

namespace {

// Rows of a gradient product's output per block: at most
// kReferenceBlockElements elements of the widest operand row.
std::int64_t GradientBlockRows(std::int64_t a, std::int64_t b) {
  return std::max<std::int64_t>(
      1, kReferenceBlockElements / std::max<std::int64_t>(1, std::max(a, b)));
}

}  // namespace

bool CrossEntropyGradInputReference(const double* g, const double* g_pre_err, std::int64_t m,
                                    Bf16Matrix w, bool dx_bf16, const RowBlockSink& sink,
                                    const StopCheck& stop, Fp64Products* products) {
  const std::int64_t v = w.rows, k = w.cols;
  const double gamma = GradientProductGamma(v);
  const std::int64_t block = GradientBlockRows(v, k);
  std::vector<double> gb, cb, value, scratch, bound;
  for (std::int64_t r0 = 0; r0 < m; r0 += block) {
    if (stop && stop()) return false;
    const std::int64_t rows = std::min(block, m - r0);
    const std::size_t n = static_cast<std::size_t>(rows * v);
    const std::size_t first = static_cast<std::size_t>(r0 * v);
    gb.assign(g + first, g + first + n);
    cb.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      cb[i] = GradientProductCoefficient(g[first + i], g_pre_err[first + i], gamma);
    }
    value.resize(static_cast<std::size_t>(rows * k));
    scratch.resize(value.size());
    bound.resize(value.size());
    FormGW(products, gb, rows, w, value.data(), nullptr);
    // C ≥ 0, so Σ|C|·|W| is C·|W|.
    FormGW(products, cb, rows, w, scratch.data(), bound.data());
    // Products of G and W that underflow fp32 (bounds.h).
    for (double& b : bound) b += 2 * static_cast<double>(v) * kFp32Underflow;
    if (dx_bf16) {
      for (std::size_t i = 0; i < bound.size(); ++i) {
        bound[i] += kBf16UnitRoundoff * (std::fabs(value[i]) + bound[i]) + kBf16Underflow;
      }
    }
    sink(r0, rows, value.data(), bound.data());
  }
  return true;
}

bool CrossEntropyGradWeightReference(const double* g, const double* g_pre_err, const Bf16Bits* x,
                                     std::int64_t m, std::int64_t v, std::int64_t k,
                                     const RowBlockSink& sink, const StopCheck& stop) {
  const double gamma = GradientProductGamma(m);
  std::vector<double> xd(static_cast<std::size_t>(m * k)), x_abs(xd.size());
  for (std::size_t i = 0; i < xd.size(); ++i) {
    xd[i] = Bf16ToFloat(x[i]);
    x_abs[i] = std::fabs(xd[i]);
  }
  std::vector<double> c(static_cast<std::size_t>(m * v));
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i] = GradientProductCoefficient(g[i], g_pre_err[i], gamma);
  }
  const std::int64_t block = GradientBlockRows(k, 1);
  std::vector<double> value(static_cast<std::size_t>(std::min(block, v) * k));
  std::vector<double> bound(value.size());
  for (std::int64_t r0 = 0; r0 < v; r0 += block) {
    if (stop && stop()) return false;
    const std::int64_t rows = std::min(block, v - r0);
    // Rows r0.. of dW are columns r0.. of G: Gᵀ's block through lda = v.
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, g + r0, static_cast<int>(v),
                xd.data(), static_cast<int>(k), 0.0, value.data(), static_cast<int>(k));
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, c.data() + r0, static_cast<int>(v),
                x_abs.data(), static_cast<int>(k), 0.0, bound.data(), static_cast<int>(k));
    for (double& b : bound) b += 2 * static_cast<double>(m) * kFp32Underflow;
    sink(r0, rows, value.data(), bound.data());
  }
  return true;
}

std::uint64_t CrossEntropyGradientReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                                 bool dx, bool dw) {
  constexpr std::uint64_t kDouble = sizeof(double);
  const std::uint64_t um = static_cast<std::uint64_t>(m), uv = static_cast<std::uint64_t>(v),
                      uk = static_cast<std::uint64_t>(k);
  std::uint64_t bytes = 0;
  // The precision-class test's (ce_gradient_check.cc) for a block of
  // `rows` rows of the product reducing `n` terms: its model, magnitudes,
  // flips' mean, variance and envelope, models (a float and a double) and
  // W²'s panel of 2^22 doubles.
  const auto class_block = [&](std::uint64_t rows, std::uint64_t n) {
    return rows * uk * (6 * kDouble + sizeof(float)) + n * rows * sizeof(float) +
           (std::uint64_t{1} << 22) * kDouble;
  };
  if (dx) {
    // A block's g and C, three [rows, K] results, and ReferenceGW's
    // widened block of W; the class test's G_m and flips' means [rows, V].
    const std::uint64_t rows = std::min(um, static_cast<std::uint64_t>(GradientBlockRows(v, k)));
    bytes = std::max<std::uint64_t>(bytes, (4 * rows * uv + 3 * rows * uk) * kDouble +
                                               2 * kReferenceBlockElements * kDouble +
                                               class_block(rows, uv));
  }
  if (dw) {
    // X widened with its magnitudes, C whole, a block's value and bound;
    // the class test's G_m and |G_m| whole, X's squares.
    const std::uint64_t rows = std::min(uv, static_cast<std::uint64_t>(GradientBlockRows(k, 1)));
    bytes = std::max<std::uint64_t>(
        bytes, (3 * um * uk + 3 * um * uv + 2 * rows * uk) * kDouble + class_block(rows, um));
  }
  return bytes;
}

std::uint64_t CrossEntropyReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                         bool with_gradients, std::int64_t block_rows) {
  constexpr std::uint64_t kDouble = sizeof(double);
  const std::int64_t rows =
      std::min(m, block_rows > 0 ? block_rows : reference_internal::DefaultBlockRows(v));
  const std::uint64_t n = static_cast<std::uint64_t>(std::max<std::int64_t>(rows, 1));
  const std::uint64_t uv = static_cast<std::uint64_t>(v), uk = static_cast<std::uint64_t>(k);
  // The block's rows of X widened, with their magnitudes; its logits and
  // their bounds; g and its bound, and the flips' weights (CastFlip).
  std::uint64_t bytes = n * (2 * uk + 2 * uv) * kDouble;
  if (with_gradients) bytes += 4 * n * uv * kDouble;
  // A row's z, f and e_z; a block of W widened (whole rows, at most
  // kReferenceBlockElements elements); the rows of W with a NaN or an
  // infinity.
  const std::uint64_t w_rows =
      static_cast<std::uint64_t>(std::min(v, reference_internal::DefaultBlockRows(k)));
  bytes += 3 * uv * kDouble + w_rows * uk * kDouble + uv * sizeof(std::int64_t);
  // The precision-class test's: the block's class envelopes and models
  // (a float and a double a logit), a row's c_z, and the models' panels.
  bytes += n * uv * (2 * kDouble + sizeof(float)) + uv * kDouble +
           2 * uk * static_cast<std::uint64_t>(kModelPanel) * sizeof(float);
  return bytes;
}

}  // namespace logitd

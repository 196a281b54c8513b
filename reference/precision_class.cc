// The derivation is in docs/PROTOCOL.md ("The precision-class test"). In
// short: under the test's model a conforming candidate's error at an
// element is a centred normal value of standard deviation at most
// kClassSpread times the envelope's there, independent of the others'.
// Then for a mean of squares over elements of weights σ_i² the Chernoff
// bound with n' = Σσ_i² / max σ_i² equal weights is conservative (the log
// of the moment generating function is convex in each σ_i²), which gives
// the RMS tests; the largest of a row's n errors exceeds t·σ with
// probability at most n times one's, which gives the element test, where
// σ is bounded above by the row's other errors at the lower quantile of
// their mean square.
#include "logitd/reference/precision_class.h"

#include <algorithm>
#include <cmath>

namespace logitd {
namespace {

// (n/2)(t − 1 − ln t): the Chernoff exponent of a mean of n squared
// standard normals at t.
double Exponent(double n, double t) { return 0.5 * n * (t - 1 - std::log(t)); }

struct RowOutcome {
  RowPrecisionFigures figures;
  bool element_outside = false;
  ClassOutlier outlier;
  double severity = 0;  // the larger of ratio / threshold and the element's excess
};

RowOutcome JudgeRow(std::int64_t row, const judgement::ClassRow& r, std::int64_t independent,
                    double* alpha) {
  RowOutcome o;
  RowPrecisionFigures& f = o.figures;
  const double n = static_cast<double>(r.n);
  f.row = row;
  f.elements = r.n;
  f.effective_bits = EffectiveBits(r.candidate_sq, r.seq_sq);
  f.class_bits = EffectiveBits(r.envelope_sq, r.seq_sq);
  // Its RMS against the envelope's, with n' elements of equal weight, at
  // most as many as it holds independent ones.
  const double n_eff = std::min(
      static_cast<double>(independent),
      r.envelope_max > 0 ? std::max(1.0, r.envelope_sq / (r.envelope_max * r.envelope_max)) : n);
  f.rms_ratio = r.envelope_sq > 0 ? std::sqrt(r.candidate_sq / r.envelope_sq) : 0;
  f.threshold = kClassSpread * std::sqrt(UpperMeanSquareQuantile(n_eff, kClassTestAlpha));
  f.outside = f.rms_ratio > f.threshold;
  *alpha += kClassTestAlpha;
  // Its largest error against the scale of its others, of the sequential
  // sum and of the sequential sum at that element.
  double scale_sq = std::max({r.seq_sq / n, std::pow(kClassElementSpread * r.top1_seq, 2),
                              kClassElementFloor * kClassElementFloor});
  if (r.n >= 2) {
    const double others = std::max(0.0, r.candidate_sq - r.top1 * r.top1) / (n - 1);
    scale_sq = std::max(scale_sq, others / LowerMeanSquareQuantile(n - 1, kClassTestAlpha));
    *alpha += kClassTestAlpha;
  } else {
    scale_sq = std::max(scale_sq, kClassSpread * kClassSpread * r.envelope_sq / n);
  }
  const double t = std::sqrt(UpperMeanSquareQuantile(1, kClassTestAlpha / n) * scale_sq);
  *alpha += kClassTestAlpha;
  const double excess = t > 0 ? r.top1 / t : 0;
  o.element_outside = r.top1 > t;
  o.outlier = ClassOutlier{r.top1_index, r.top1_candidate, r.top1_reference, t * r.top1_w,
                           excess,       r.top1_bound,     r.top1_p_bound,   r.top1_own};
  o.severity = std::max(f.threshold > 0 ? f.rms_ratio / f.threshold : 0, excess);
  return o;
}

}  // namespace

double UpperMeanSquareQuantile(double n, double alpha) {
  const double target = std::log(1 / alpha);
  double lo = 1, hi = 2;
  while (Exponent(n, hi) < target) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (Exponent(n, mid) < target ? lo : hi) = mid;
  }
  return hi;
}

double LowerMeanSquareQuantile(double n, double alpha) {
  const double target = std::log(1 / alpha);
  // Exponent grows without bound as s falls to 0: bisect ln s.
  double lo = -1, hi = 0;  // ln s
  while (Exponent(n, std::exp(lo)) < target) lo *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12; ++i) {
    const double mid = 0.5 * (lo + hi);
    (Exponent(n, std::exp(mid)) < target ? hi : lo) = mid;
  }
  return std::exp(lo);
}

double EffectiveBits(double candidate_sq, double seq_sq) {
  if (candidate_sq <= 0) return 64;
  if (seq_sq <= 0) return -64;
  return std::clamp(24 - 0.5 * std::log2(candidate_sq / seq_sq), -64.0, 64.0);
}

PrecisionClassFigures JudgePrecisionClass(const std::map<std::int64_t, judgement::ClassRow>& rows,
                                          std::int64_t per_row, std::int64_t total) {
  PrecisionClassFigures p;
  judgement::ClassRow all;
  std::vector<RowOutcome> outcomes;
  for (const auto& [row, r] : rows) {
    if (r.n == 0) continue;
    judgement::MergeRows(&all, r);
    outcomes.push_back(JudgeRow(row, r, per_row, &p.alpha));
  }
  if (all.n == 0) {
    p.reason = "no element qualifies (every one non-finite, or its Σ|products| below 2^-102)";
    return p;
  }
  p.tested = true;
  p.elements = all.n;
  p.rows = static_cast<std::int64_t>(outcomes.size());
  p.effective_bits = EffectiveBits(all.candidate_sq, all.seq_sq);
  p.class_bits = EffectiveBits(all.envelope_sq, all.seq_sq);
  const double n_eff =
      std::min(static_cast<double>(total),
               std::max(1.0, all.envelope_sq / (all.envelope_max * all.envelope_max)));
  p.rms_ratio = std::sqrt(all.candidate_sq / all.envelope_sq);
  p.threshold = kClassSpread * std::sqrt(UpperMeanSquareQuantile(n_eff, kClassTestAlpha));
  p.alpha += kClassTestAlpha;
  p.outside = p.rms_ratio > p.threshold;
  for (const RowOutcome& o : outcomes) {
    p.rows_outside += o.figures.outside;
    if (o.element_outside) {
      ++p.elements_outside;
      p.outliers.push_back(o.outlier);
    }
  }
  p.outside = p.outside || p.rows_outside > 0 || p.elements_outside > 0;
  std::sort(outcomes.begin(), outcomes.end(), [](const RowOutcome& a, const RowOutcome& b) {
    return a.severity != b.severity ? a.severity > b.severity : a.figures.row < b.figures.row;
  });
  for (std::size_t i = 0; i < outcomes.size() && i < PrecisionClassFigures::kReportedRows; ++i) {
    p.worst_rows.push_back(outcomes[i].figures);
  }
  std::sort(p.outliers.begin(), p.outliers.end(), [](const ClassOutlier& a, const ClassOutlier& b) {
    return a.excess != b.excess ? a.excess > b.excess : a.index < b.index;
  });
  if (p.outliers.size() > PrecisionClassFigures::kReportedOutliers) {
    p.outliers.resize(PrecisionClassFigures::kReportedOutliers);
  }
  return p;
}

PrecisionClassFigures JudgeValueClass(const std::vector<ValueClassTerm>& terms,
                                      std::int64_t total) {
  PrecisionClassFigures p;
  if (terms.empty()) {
    p.reason = "no value qualifies (every one non-finite, ignored, or without an envelope)";
    return p;
  }
  const double n = static_cast<double>(terms.size());
  struct Ratio {
    double r;
    std::size_t at;
  };
  std::vector<Ratio> ratios;
  ratios.reserve(terms.size());
  double sq = 0;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    const ValueClassTerm& t = terms[i];
    const double r = std::fabs(t.candidate - t.reference) / t.envelope;
    sq += r * r;
    ratios.push_back({r, i});
  }
  p.tested = true;
  p.envelope =
      "fp32 logits (each within its envelope: " + ClassEnvelopeName() +
      ") through an fp32 softmax (exp and log within 2^-21, a sequential sum of the exponentials)";
  p.elements = static_cast<std::int64_t>(terms.size());
  p.rows = p.elements;
  p.rms_ratio = std::sqrt(sq / n);
  p.effective_bits = EffectiveBits(sq / n, 1);
  p.class_bits = 24;
  const double n_eff = std::min(static_cast<double>(total), n);
  p.threshold =
      kClassSpread * std::sqrt(UpperMeanSquareQuantile(std::max(1.0, n_eff), kClassTestAlpha));
  const double each = kClassSpread * std::sqrt(UpperMeanSquareQuantile(1, kClassTestAlpha / n));
  p.alpha = 2 * kClassTestAlpha;
  std::sort(ratios.begin(), ratios.end(), [&](const Ratio& a, const Ratio& b) {
    return a.r != b.r ? a.r > b.r : terms[a.at].index < terms[b.at].index;
  });
  for (const Ratio& q : ratios) {
    if (q.r <= each) break;
    ++p.elements_outside;
    const ValueClassTerm& t = terms[q.at];
    if (p.outliers.size() < PrecisionClassFigures::kReportedOutliers) {
      p.outliers.push_back(ClassOutlier{t.index, t.candidate, t.reference, each * t.envelope,
                                        q.r / each, t.bound, t.bound, t.logitd});
    }
  }
  p.rows_outside = p.elements_outside;
  p.outside = p.rms_ratio > p.threshold || p.elements_outside > 0;
  for (std::size_t i = 0; i < ratios.size() && i < PrecisionClassFigures::kReportedRows; ++i) {
    const ValueClassTerm& t = terms[ratios[i].at];
    RowPrecisionFigures f;
    f.row = t.index;
    f.elements = 1;
    f.effective_bits = EffectiveBits(ratios[i].r * ratios[i].r, 1);
    f.class_bits = 24;
    f.rms_ratio = ratios[i].r;
    f.threshold = each;
    f.outside = ratios[i].r > each;
    p.worst_rows.push_back(f);
  }
  return p;
}

std::string ClassEnvelopeName() {
  return "the sequential fp32 sum (round to nearest), a tensor-core model (blocks of " +
         std::to_string(judgement::kTensorCoreBlock) +
         " truncated), logitd's own output and the correctly rounded result";
}

}  // namespace logitd

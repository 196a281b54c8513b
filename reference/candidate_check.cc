#include "logitd/reference/candidate_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "logitd/reference/element_judgement.h"
#include "logitd/reference/numerics.h"

namespace logitd {
namespace {

// The value and bits of element i of a tensor of `dtype` at `data`.
double ValueAt(DType dtype, const void* data, std::int64_t i, std::uint32_t* bits) {
  if (dtype == DType::kBf16) {
    Bf16Bits b;
    std::memcpy(&b, static_cast<const std::byte*>(data) + i * 2, 2);
    *bits = b;
    return Bf16ToFloat(b);
  }
  std::uint32_t u;
  std::memcpy(&u, static_cast<const std::byte*>(data) + i * 4, 4);
  *bits = u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::int64_t BucketValue(std::size_t bucket) {
  if (bucket <= static_cast<std::size_t>(CandidateCheck::kExactUlp)) {
    return static_cast<std::int64_t>(bucket);
  }
  const int log2 = static_cast<int>(bucket) - static_cast<int>(CandidateCheck::kExactUlp) + 6;
  return log2 >= 63 ? std::numeric_limits<std::int64_t>::max() : std::int64_t{1} << log2;
}

}  // namespace

CandidateCheck::CandidateCheck(DType dtype) : dtype_(dtype) {}

double CandidateCheck::MaxFinite() const {
  return dtype_ == DType::kBf16 ? judgement::kBf16MaxFinite : judgement::kFp32MaxFinite;
}

void CandidateCheck::Add(std::int64_t index, const void* candidate, const void* own,
                         double reference, double bound, double probabilistic_bound) {
  std::uint32_t cb = 0, ob = 0;
  const double c = ValueAt(dtype_, candidate, 0, &cb);
  const double o = ValueAt(dtype_, own, 0, &ob);
  Count(index, c, cb, o, ob,
        judgement::ValueBounds(reference, bound, probabilistic_bound, MaxFinite()));
}

void CandidateCheck::AddInteger(std::int64_t index, std::int64_t candidate, std::int64_t own,
                                double value, double reference, double bound,
                                double shown_reference) {
  const CheckedElement shown{index, static_cast<double>(candidate), shown_reference, bound,
                             bound, static_cast<double>(own)};
  // logitd's own integer is taken as right (its value is not looked up):
  // only the candidate's is judged.
  Count(index, value, candidate == own ? 0u : 1u, reference, 0u,
        judgement::ValueBounds(reference, bound, bound, std::numeric_limits<double>::max()),
        &shown);
}

void CandidateCheck::AddRange(std::int64_t offset, std::int64_t n, const void* candidate,
                              const void* own, const double* reference, const double* bound,
                              const double* probabilistic_bound) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t cb = 0, ob = 0;
    const double c = ValueAt(dtype_, candidate, i, &cb);
    const double o = ValueAt(dtype_, own, i, &ob);
    Count(offset + i, c, cb, o, ob,
          judgement::ValueBounds(reference[i], bound[i], probabilistic_bound[i], MaxFinite()));
  }
}

judgement::ClassRow& CandidateCheck::Row(std::int64_t row) {
  class_.reset();
  return f_.class_rows[row];
}

void CandidateCheck::AddProducts(std::int64_t offset, std::int64_t n, const void* candidate,
                                 const void* own, const judgement::ProductRule& rule,
                                 const double* sum, const double* abs_sum,
                                 const ClassInputs* models) {
  const bool bf16 = dtype_ == DType::kBf16;
  const float alpha = static_cast<float>(rule.scale_reference);
  const double scale = std::fabs(rule.scale_reference);
  const double floor = judgement::ClassFloor(rule.terms);
  judgement::ClassRow* row = nullptr;
  std::int64_t row_index = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t cb = 0, ob = 0;
    const double c = ValueAt(dtype_, candidate, i, &cb);
    const double o = ValueAt(dtype_, own, i, &ob);
    const judgement::ElementBounds e = judgement::ProductBounds(rule, sum[i], abs_sum[i]);
    Tally(judgement::JudgeElement(bf16, c, cb, o, ob, e),
          CheckedElement{offset + i, c, e.reference, e.bound, e.p_bound, o});
    if (models == nullptr) continue;
    const std::int64_t r = (offset + i) / models->cols;
    if (r != row_index) {
      row = &Row(r);
      row_index = r;
    }
    // The sequential model's output with alpha applied as one fp32
    // multiply, as a kernel that scales its sum does.
    const float seq = alpha == 1.0f ? models->seq[i] : judgement::MulF(alpha, models->seq[i]);
    const judgement::ClassTerms t = judgement::ClassTermsOf(
        bf16, c, o, e.reference, scale * abs_sum[i], seq, scale * models->tc[i], floor);
    judgement::AddToRow(row, t, offset + i, c, o, e);
  }
}

void CandidateCheck::AddClassTerms(std::int64_t row, std::int64_t index,
                                   const judgement::ClassTerms& terms, double candidate, double own,
                                   const judgement::ElementBounds& bounds) {
  judgement::AddToRow(&Row(row), terms, index, candidate, own, bounds);
  class_.reset();
}

void CandidateCheck::Count(std::int64_t index, double candidate, std::uint32_t candidate_bits,
                           double own, std::uint32_t own_bits,
                           const judgement::ElementBounds& bounds, const CheckedElement* shown) {
  const CheckedElement element =
      shown != nullptr ? *shown : CheckedElement{index,        candidate,      bounds.reference,
                                                 bounds.bound, bounds.p_bound, own};
  if (dtype_ != DType::kInt32 && dtype_ != DType::kInt64) {
    Tally(judgement::JudgeElement(dtype_ == DType::kBf16, candidate, candidate_bits, own, own_bits,
                                  bounds),
          element);
    return;
  }
  // An integer: equal to logitd's or not (AddInteger passes bits 0
  // against 0 or 1), and its value against the reference; logitd's own
  // is taken as right. It has no correctly rounded counterpart.
  judgement::Judged j;
  j.bitwise_equal = candidate_bits == own_bits;
  j.ulp = j.bitwise_equal ? 0 : 1;
  j.ulp_exact = -1;
  bool unused = false;
  j.fraction = judgement::Fraction(candidate, bounds, bounds.bound, &j.mismatch);
  j.p_fraction = judgement::Fraction(candidate, bounds, bounds.p_bound, &unused);
  j.own_outside_probabilistic = judgement::Fraction(own, bounds, bounds.p_bound, &unused) > 1.0;
  Tally(j, element);
}

void CandidateCheck::Tally(const judgement::Judged& j, const CheckedElement& element) {
  ++f_.elements;
  if (j.bitwise_equal) ++f_.bitwise_equal;
  f_.max_ulp = std::max(f_.max_ulp, j.ulp);
  ++f_.ulp_counts[static_cast<std::size_t>(judgement::UlpBucket(j.ulp))];
  if (j.ulp_exact >= 0) {
    ++f_.ulp_exact_elements;
    f_.max_ulp_exact = std::max(f_.max_ulp_exact, j.ulp_exact);
    ++f_.ulp_exact_counts[static_cast<std::size_t>(judgement::UlpBucket(j.ulp_exact))];
  }
  if (j.own_outside_probabilistic) ++f_.own_outside_probabilistic;
  if (j.mismatch) ++f_.nan_inf_mismatches;
  f_.worst_fraction = std::max(f_.worst_fraction, j.fraction);
  f_.worst_probabilistic_fraction = std::max(f_.worst_probabilistic_fraction, j.p_fraction);
  ++f_.histogram[static_cast<std::size_t>(judgement::HistogramBin(j.fraction))];
  if (j.fraction <= 1.0 && j.p_fraction <= 1.0) return;
  NoteOutside(element, j.fraction, j.p_fraction);
}

void CandidateCheck::NoteOutside(const CheckedElement& element, double fraction,
                                 double p_fraction) {
  CheckedElement e = element;
  e.outside_bound = fraction > 1.0;
  if (e.outside_bound && f_.outside++ == 0) f_.first_proven_outside = e;
  if (p_fraction <= 1.0) return;
  if (f_.outside_probabilistic++ < kReportedOutside) f_.first_outside.push_back(e);
}

void CandidateCheck::AddCounted(const CheckFigures& o) {
  class_.reset();
  if (o.outside > 0 &&
      (f_.outside == 0 || o.first_proven_outside.index < f_.first_proven_outside.index)) {
    f_.first_proven_outside = o.first_proven_outside;
  }
  f_.first_outside.insert(f_.first_outside.end(), o.first_outside.begin(), o.first_outside.end());
  std::sort(f_.first_outside.begin(), f_.first_outside.end(),
            [](const CheckedElement& a, const CheckedElement& b) { return a.index < b.index; });
  if (f_.first_outside.size() > static_cast<std::size_t>(kReportedOutside)) {
    f_.first_outside.resize(static_cast<std::size_t>(kReportedOutside));
  }
  f_.elements += o.elements;
  f_.outside += o.outside;
  f_.worst_fraction = std::max(f_.worst_fraction, o.worst_fraction);
  f_.outside_probabilistic += o.outside_probabilistic;
  f_.worst_probabilistic_fraction =
      std::max(f_.worst_probabilistic_fraction, o.worst_probabilistic_fraction);
  f_.own_outside_probabilistic += o.own_outside_probabilistic;
  f_.bitwise_equal += o.bitwise_equal;
  f_.nan_inf_mismatches += o.nan_inf_mismatches;
  for (std::size_t b = 0; b < f_.histogram.size(); ++b) f_.histogram[b] += o.histogram[b];
  f_.max_ulp = std::max(f_.max_ulp, o.max_ulp);
  for (std::size_t b = 0; b < f_.ulp_counts.size(); ++b) f_.ulp_counts[b] += o.ulp_counts[b];
  f_.ulp_exact_elements += o.ulp_exact_elements;
  f_.max_ulp_exact = std::max(f_.max_ulp_exact, o.max_ulp_exact);
  for (std::size_t b = 0; b < f_.ulp_exact_counts.size(); ++b) {
    f_.ulp_exact_counts[b] += o.ulp_exact_counts[b];
  }
  for (const auto& [row, counts] : o.class_rows) judgement::MergeRows(&f_.class_rows[row], counts);
  f_.value_class.insert(f_.value_class.end(), o.value_class.begin(), o.value_class.end());
  class_.reset();
}

void CandidateCheck::AddValueClass(std::int64_t index, double candidate, double reference,
                                   double envelope, double bound, double own) {
  if (!(std::isfinite(candidate) && std::isfinite(reference) && std::isfinite(envelope) &&
        envelope > 0)) {
    return;
  }
  f_.value_class.push_back(ValueClassTerm{index, candidate, reference, envelope, bound, own});
  class_.reset();
}

namespace {

// The p-th percentile of `counts` (exact buckets, then powers of two) over
// `elements`, at most `max`.
std::int64_t Percentile(const std::array<std::int64_t, judgement::kUlpBuckets>& counts,
                        std::int64_t elements, std::int64_t max, double p) {
  if (elements == 0) return 0;
  const auto want = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(elements)));
  std::int64_t seen = 0;
  for (std::size_t b = 0; b < counts.size(); ++b) {
    seen += counts[b];
    if (seen >= std::max<std::int64_t>(want, 1)) return std::min(BucketValue(b), max);
  }
  return max;
}

}  // namespace

std::int64_t CandidateCheck::UlpPercentile(double p) const {
  return Percentile(f_.ulp_counts, f_.elements, f_.max_ulp, p);
}

std::int64_t CandidateCheck::UlpExactPercentile(double p) const {
  if (f_.ulp_exact_elements == 0) return -1;
  return Percentile(f_.ulp_exact_counts, f_.ulp_exact_elements, f_.max_ulp_exact, p);
}

const PrecisionClassFigures& CandidateCheck::precision_class() const {
  if (!class_.has_value()) {
    if (!f_.value_class.empty()) {
      class_ = JudgeValueClass(f_.value_class, independent_total_);
      class_->drawn_from = class_drawn_from_;
    } else if (f_.class_rows.empty()) {
      class_.emplace();
      class_->reason = dtype_ == DType::kInt32 || dtype_ == DType::kInt64
                           ? "an integer output: judged by its order against the reference's"
                           : "not a sum of products: held to its proven bound";
    } else {
      class_ = JudgePrecisionClass(f_.class_rows, independent_per_row_, independent_total_);
      class_->envelope = class_envelope_;
    }
  }
  return *class_;
}

void CandidateCheck::LimitIndependent(std::int64_t per_row, std::int64_t total) {
  independent_per_row_ = std::max<std::int64_t>(1, per_row);
  independent_total_ = std::max<std::int64_t>(1, total);
  class_.reset();
}

std::string CandidateCheck::Verdict() const {
  if (f_.outside > 0) return "outside_bounds";
  const PrecisionClassFigures& p = precision_class();
  if (p.tested && p.outside) return "outside_precision_class";
  if (f_.bitwise_equal == f_.elements) return "bitwise_equal_to_logitd";
  return "within_bounds";
}

bool CandidateCheck::passed() const {
  const std::string verdict = Verdict();
  return verdict == "within_bounds" || verdict == "bitwise_equal_to_logitd";
}

std::vector<CheckedElement> CandidateCheck::ReportedElements() const {
  std::vector<CheckedElement> out;
  const auto room = [&] { return out.size() < static_cast<std::size_t>(kReportedOutside); };
  for (const CheckedElement& e : f_.first_outside) {
    if (e.outside_bound && room()) out.push_back(e);
  }
  if (f_.outside > 0 && room() &&
      std::none_of(out.begin(), out.end(), [&](const CheckedElement& e) {
        return e.index == f_.first_proven_outside.index;
      })) {
    out.insert(out.begin(), f_.first_proven_outside);
  }
  for (const ClassOutlier& o : precision_class().outliers) {
    if (!room()) break;
    // Listed once: an element outside the proven bound already is.
    if (std::any_of(out.begin(), out.end(),
                    [&](const CheckedElement& e) { return e.index == o.index; })) {
      continue;
    }
    CheckedElement e{o.index, o.candidate, o.reference, o.bound, o.p_bound, o.logitd};
    e.class_threshold = o.threshold;
    out.push_back(e);
  }
  for (const CheckedElement& e : f_.first_outside) {
    if (!e.outside_bound && room()) out.push_back(e);
  }
  return out;
}

std::string CandidateCheck::Describe(const std::string& name,
                                     const std::vector<std::int64_t>& shape) const {
  if (passed()) return std::string();
  if (f_.outside > 0) {
    const CheckedElement& f = f_.first_proven_outside;
    return absl::StrFormat(
        "%d of %d elements of '%s' outside their proven bound (%d a NaN or infinity no "
        "conforming order gives, or the reverse); worst %.3g times its bound; first %s: candidate "
        "%.9g, fp64 reference %.17g, bound %.3e, logitd %.9g",
        f_.outside, f_.elements, name, f_.nan_inf_mismatches, f_.worst_fraction,
        IndexString(f.index, shape), f.candidate, f.reference, f.bound, f.logitd);
  }
  const PrecisionClassFigures& p = precision_class();
  std::string what = absl::StrFormat(
      "'%s' is outside the precision class of fp32 accumulation (a conforming implementation is "
      "found outside with probability at most %.1e): its errors' RMS is %.3g times the envelope "
      "of conforming errors, where a conforming one reaches at most %.3g; effective precision "
      "%.1f bits, the envelope's %.1f; %d of %d rows outside",
      name, p.alpha, p.rms_ratio, p.threshold, p.effective_bits, p.class_bits, p.rows_outside,
      p.rows);
  if (!p.outliers.empty()) {
    const ClassOutlier& o = p.outliers.front();
    absl::StrAppendFormat(
        &what,
        "; %d rows with an element beyond their conforming scale, worst %s: candidate %.9g, fp64 "
        "reference %.17g, |error| %.3e where a conforming one reaches %.3e",
        p.elements_outside, IndexString(o.index, shape), o.candidate, o.reference,
        std::fabs(o.candidate - o.reference), o.threshold);
  }
  return what;
}

}  // namespace logitd

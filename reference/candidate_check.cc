#include "logitd/reference/candidate_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "logitd/reference/numerics.h"

namespace logitd {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

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

// The largest finite value of the dtype.
double MaxFinite(DType dtype) {
  return dtype == DType::kBf16 ? 0x1.fep127 : std::numeric_limits<float>::max();
}

// The bucket of a ULP distance: itself up to kExactUlp, then the power of
// two above it.
std::size_t UlpBucket(std::int64_t ulp) {
  if (ulp <= CandidateCheck::kExactUlp) return static_cast<std::size_t>(ulp);
  int log2 = 0;
  while (log2 < 63 && (std::int64_t{1} << log2) < ulp) ++log2;
  return static_cast<std::size_t>(CandidateCheck::kExactUlp + (log2 - 6));
}

std::int64_t BucketValue(std::size_t bucket) {
  if (bucket <= static_cast<std::size_t>(CandidateCheck::kExactUlp)) {
    return static_cast<std::int64_t>(bucket);
  }
  const int log2 = static_cast<int>(bucket) - static_cast<int>(CandidateCheck::kExactUlp) + 6;
  return log2 >= 63 ? std::numeric_limits<std::int64_t>::max() : std::int64_t{1} << log2;
}

// The histogram's bin of |error| / bound: 0 for exactly 0, then the first
// edge it does not pass, then past the last.
std::size_t HistogramBin(double fraction) {
  if (fraction == 0) return 0;
  for (std::size_t e = 0; e < CandidateCheck::kHistogramEdges.size(); ++e) {
    if (fraction <= CandidateCheck::kHistogramEdges[e]) return e + 1;
  }
  return CandidateCheck::kHistogramBins - 1;
}

}  // namespace

CandidateCheck::CandidateCheck(DType dtype)
    : dtype_(dtype), ulp_counts_(static_cast<std::size_t>(kExactUlp) + 1 + (63 - 6), 0) {}

void CandidateCheck::Add(std::int64_t index, const void* candidate, const void* own,
                         double reference, double bound, double probabilistic_bound) {
  std::uint32_t cb = 0, ob = 0;
  const double c = ValueAt(dtype_, candidate, 0, &cb);
  const double o = ValueAt(dtype_, own, 0, &ob);
  Count(index, c, cb, o, ob, reference, bound, probabilistic_bound);
}

void CandidateCheck::AddInteger(std::int64_t index, std::int64_t candidate, std::int64_t own,
                                double value, double reference, double bound,
                                double shown_reference) {
  const CheckedElement shown{index, static_cast<double>(candidate), shown_reference, bound,
                             bound, static_cast<double>(own)};
  // logitd's own integer is taken as right (its value is not looked up):
  // only the candidate's is judged.
  Count(index, value, candidate == own ? 0u : 1u, reference, 0u, reference, bound, bound, &shown);
}

void CandidateCheck::AddRange(std::int64_t offset, std::int64_t n, const void* candidate,
                              const void* own, const double* reference, const double* bound,
                              const double* probabilistic_bound) {
  if (dtype_ == DType::kFp32) {
    AddFp32Range(offset, n, static_cast<const std::byte*>(candidate),
                 static_cast<const std::byte*>(own), reference, bound, probabilistic_bound);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t cb = 0, ob = 0;
    const double c = ValueAt(dtype_, candidate, i, &cb);
    const double o = ValueAt(dtype_, own, i, &ob);
    Count(offset + i, c, cb, o, ob, reference[i], bound[i], probabilistic_bound[i]);
  }
}

// Count's arithmetic for fp32 elements whose values, reference and bounds
// are finite and whose bounds are positive, the all but every element of a
// large check, inline; any other element goes through Count. The figures
// are Count's to the bit (candidate_check_test compares the two).
void CandidateCheck::AddFp32Range(std::int64_t offset, std::int64_t n, const std::byte* candidate,
                                  const std::byte* own, const double* reference,
                                  const double* bound, const double* probabilistic_bound) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t cb, ob;
    std::memcpy(&cb, candidate + i * 4, 4);
    std::memcpy(&ob, own + i * 4, 4);
    float cf, of;
    std::memcpy(&cf, &cb, 4);
    std::memcpy(&of, &ob, 4);
    const double c = cf, o = of, r = reference[i], b = bound[i], pb = probabilistic_bound[i];
    if (!(std::isfinite(c) && std::isfinite(o) && std::isfinite(r) && b > 0 && pb > 0 &&
          std::isfinite(b) && std::isfinite(pb))) {
      Count(offset + i, c, cb, o, ob, r, b, pb);
      continue;
    }
    ++elements_;
    std::int64_t ulp = 0;
    if (cb == ob) {
      ++bitwise_equal_;
    } else {
      ulp = UlpDistanceFp32(cb, ob);
    }
    max_ulp_ = std::max(max_ulp_, ulp);
    ++ulp_counts_[UlpBucket(ulp)];
    const double err = std::fabs(c - r);
    const double fraction = err == 0 ? 0 : err / b;
    const double p_fraction = err == 0 ? 0 : err / pb;
    double own_p_fraction = p_fraction;
    if (cb != ob) {
      const double own_err = std::fabs(o - r);
      own_p_fraction = own_err == 0 ? 0 : own_err / pb;
    }
    if (own_p_fraction > 1.0) ++own_outside_probabilistic_;
    worst_fraction_ = std::max(worst_fraction_, fraction);
    worst_probabilistic_fraction_ = std::max(worst_probabilistic_fraction_, p_fraction);
    ++histogram_[HistogramBin(fraction)];
    if (p_fraction > 1.0 || fraction > 1.0) {
      NoteOutside(CheckedElement{offset + i, c, r, b, pb, o}, fraction, p_fraction);
    }
  }
}

// |value − reference| as a fraction of `bound`: 0 when equal, +Inf for a
// NaN or an infinity IEEE 754 does not give there (*mismatch set).
double CandidateCheck::Fraction(double value, double reference, double bound,
                                bool* mismatch) const {
  *mismatch = false;
  if (!std::isfinite(reference)) {
    const bool same = std::isnan(reference) ? std::isnan(value) : value == reference;
    *mismatch = !same;
    return same ? 0 : kInf;
  }
  if (!std::isfinite(value)) {
    // An infinity is right where the bounded value overflows the dtype.
    const bool overflows = std::isinf(value) && std::fabs(reference) + bound > MaxFinite(dtype_) &&
                           std::signbit(value) == std::signbit(reference);
    *mismatch = !overflows;
    return overflows ? 0 : kInf;
  }
  const double err = std::fabs(value - reference);
  return err == 0 ? 0 : bound > 0 ? err / bound : kInf;
}

void CandidateCheck::Count(std::int64_t index, double candidate, std::uint32_t candidate_bits,
                           double own, std::uint32_t own_bits, double reference, double bound,
                           double probabilistic_bound, const CheckedElement* shown) {
  ++elements_;
  const bool integer = dtype_ == DType::kInt32 || dtype_ == DType::kInt64;
  // Against logitd's own output: bits, NaNs of any payload alike (integers:
  // equal or not, which AddInteger passes as bits 0 against 0 or 1).
  const bool both_nan = !integer && std::isnan(candidate) && std::isnan(own);
  if (candidate_bits == own_bits || both_nan) ++bitwise_equal_;
  const std::int64_t ulp =
      integer ? (candidate_bits == own_bits ? 0 : 1)
      : dtype_ == DType::kBf16
          ? UlpDistanceBf16(static_cast<Bf16Bits>(candidate_bits), static_cast<Bf16Bits>(own_bits))
          : UlpDistanceFp32(candidate_bits, own_bits);
  max_ulp_ = std::max(max_ulp_, ulp);
  ++ulp_counts_[UlpBucket(ulp)];

  // Against the reference and its bounds.
  bool mismatch = false, unused = false;
  const double fraction = Fraction(candidate, reference, bound, &mismatch);
  const double p_fraction = Fraction(candidate, reference, probabilistic_bound, &unused);
  // logitd's own value: the candidate's when their bits are equal (the
  // common case, and the most of the work saved).
  const double own_p_fraction = candidate_bits == own_bits && !integer
                                    ? p_fraction
                                    : Fraction(own, reference, probabilistic_bound, &unused);
  if (own_p_fraction > 1.0) ++own_outside_probabilistic_;
  if (mismatch) ++nan_inf_mismatches_;
  worst_fraction_ = std::max(worst_fraction_, fraction);
  worst_probabilistic_fraction_ = std::max(worst_probabilistic_fraction_, p_fraction);
  ++histogram_[HistogramBin(fraction)];
  if (fraction <= 1.0 && p_fraction <= 1.0) return;
  NoteOutside(shown != nullptr
                  ? *shown
                  : CheckedElement{index, candidate, reference, bound, probabilistic_bound, own},
              fraction, p_fraction);
}

void CandidateCheck::NoteOutside(const CheckedElement& element, double fraction,
                                 double p_fraction) {
  if (fraction > 1.0 && outside_++ == 0) first_proven_outside_ = element;
  if (p_fraction <= 1.0) return;
  if (outside_probabilistic_++ < kReportedOutside) first_outside_.push_back(element);
}

void CandidateCheck::Merge(const CandidateCheck& other) {
  if (other.outside_ > 0 &&
      (outside_ == 0 || other.first_proven_outside_.index < first_proven_outside_.index)) {
    first_proven_outside_ = other.first_proven_outside_;
  }
  first_outside_.insert(first_outside_.end(), other.first_outside_.begin(),
                        other.first_outside_.end());
  std::sort(first_outside_.begin(), first_outside_.end(),
            [](const CheckedElement& a, const CheckedElement& b) { return a.index < b.index; });
  if (first_outside_.size() > static_cast<std::size_t>(kReportedOutside)) {
    first_outside_.resize(static_cast<std::size_t>(kReportedOutside));
  }
  elements_ += other.elements_;
  outside_ += other.outside_;
  worst_fraction_ = std::max(worst_fraction_, other.worst_fraction_);
  outside_probabilistic_ += other.outside_probabilistic_;
  worst_probabilistic_fraction_ =
      std::max(worst_probabilistic_fraction_, other.worst_probabilistic_fraction_);
  own_outside_probabilistic_ += other.own_outside_probabilistic_;
  bitwise_equal_ += other.bitwise_equal_;
  nan_inf_mismatches_ += other.nan_inf_mismatches_;
  for (std::size_t b = 0; b < histogram_.size(); ++b) histogram_[b] += other.histogram_[b];
  max_ulp_ = std::max(max_ulp_, other.max_ulp_);
  for (std::size_t b = 0; b < ulp_counts_.size(); ++b) ulp_counts_[b] += other.ulp_counts_[b];
}

std::int64_t CandidateCheck::UlpPercentile(double p) const {
  if (elements_ == 0) return 0;
  const auto want = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(elements_)));
  std::int64_t seen = 0;
  for (std::size_t b = 0; b < ulp_counts_.size(); ++b) {
    seen += ulp_counts_[b];
    if (seen >= std::max<std::int64_t>(want, 1)) return std::min(BucketValue(b), max_ulp_);
  }
  return max_ulp_;
}

std::string CandidateCheck::Verdict() const {
  if (outside_ > 0) return "outside_bounds";
  if (outside_probabilistic_ > 0 && probabilistic_applies()) return "outside_probabilistic_bounds";
  if (bitwise_equal_ == elements_) return "bitwise_equal_to_logitd";
  return "within_bounds";
}

bool CandidateCheck::passed() const {
  const std::string verdict = Verdict();
  return verdict == "within_bounds" || verdict == "bitwise_equal_to_logitd";
}

std::string CandidateCheck::Describe(const std::string& name,
                                     const std::vector<std::int64_t>& shape) const {
  if (passed()) return std::string();
  if (outside_ > 0) {
    const CheckedElement& f = first_proven_outside_;
    return absl::StrFormat(
        "%d of %d elements of '%s' outside their proven bound (%d a NaN or infinity where the "
        "reference has none, or the reverse); worst %.3g times its bound; first %s: candidate "
        "%.9g, fp64 reference %.17g, bound %.3e, logitd %.9g",
        outside_, elements_, name, nan_inf_mismatches_, worst_fraction_,
        IndexString(f.index, shape), f.candidate, f.reference, f.bound, f.logitd);
  }
  const CheckedElement& f = first_outside_.front();
  return absl::StrFormat(
      "%d of %d elements of '%s' outside their probabilistic bound, where logitd's own output "
      "is inside every one (all inside the proven bound); worst %.3g times it; first %s: "
      "candidate %.9g, fp64 reference %.17g, probabilistic bound %.3e (proven %.3e), logitd %.9g",
      outside_probabilistic_, elements_, name, worst_probabilistic_fraction_,
      IndexString(f.index, shape), f.candidate, f.reference, f.probabilistic_bound, f.bound,
      f.logitd);
}

}  // namespace logitd

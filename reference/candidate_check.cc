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
    ++f_.elements;
    std::int64_t ulp = 0;
    if (cb == ob) {
      ++f_.bitwise_equal;
    } else {
      ulp = UlpDistanceFp32(cb, ob);
    }
    f_.max_ulp = std::max(f_.max_ulp, ulp);
    ++f_.ulp_counts[static_cast<std::size_t>(judgement::UlpBucket(ulp))];
    const double err = std::fabs(c - r);
    const double fraction = err == 0 ? 0 : err / b;
    const double p_fraction = err == 0 ? 0 : err / pb;
    double own_p_fraction = p_fraction;
    if (cb != ob) {
      const double own_err = std::fabs(o - r);
      own_p_fraction = own_err == 0 ? 0 : own_err / pb;
    }
    if (own_p_fraction > 1.0) ++f_.own_outside_probabilistic;
    f_.worst_fraction = std::max(f_.worst_fraction, fraction);
    f_.worst_probabilistic_fraction = std::max(f_.worst_probabilistic_fraction, p_fraction);
    ++f_.histogram[static_cast<std::size_t>(judgement::HistogramBin(fraction))];
    if (p_fraction > 1.0 || fraction > 1.0) {
      NoteOutside(CheckedElement{offset + i, c, r, b, pb, o}, fraction, p_fraction);
    }
  }
}

void CandidateCheck::Count(std::int64_t index, double candidate, std::uint32_t candidate_bits,
                           double own, std::uint32_t own_bits, double reference, double bound,
                           double probabilistic_bound, const CheckedElement* shown) {
  const CheckedElement element =
      shown != nullptr ? *shown : CheckedElement{index, candidate,           reference,
                                                 bound, probabilistic_bound, own};
  if (dtype_ != DType::kInt32 && dtype_ != DType::kInt64) {
    Tally(judgement::JudgeElement(dtype_ == DType::kBf16, candidate, candidate_bits, own, own_bits,
                                  reference, bound, probabilistic_bound),
          element);
    return;
  }
  // An integer: equal to logitd's or not (AddInteger passes bits 0
  // against 0 or 1), and its value against the reference; logitd's own
  // is taken as right.
  judgement::Judged j;
  j.bitwise_equal = candidate_bits == own_bits;
  j.ulp = j.bitwise_equal ? 0 : 1;
  const double no_overflow = std::numeric_limits<float>::max();
  bool unused = false;
  j.fraction = judgement::Fraction(candidate, reference, bound, no_overflow, &j.mismatch);
  j.p_fraction =
      judgement::Fraction(candidate, reference, probabilistic_bound, no_overflow, &unused);
  j.own_outside_probabilistic =
      judgement::Fraction(own, reference, probabilistic_bound, no_overflow, &unused) > 1.0;
  Tally(j, element);
}

void CandidateCheck::Tally(const judgement::Judged& j, const CheckedElement& element) {
  ++f_.elements;
  if (j.bitwise_equal) ++f_.bitwise_equal;
  f_.max_ulp = std::max(f_.max_ulp, j.ulp);
  ++f_.ulp_counts[static_cast<std::size_t>(judgement::UlpBucket(j.ulp))];
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
  if (fraction > 1.0 && f_.outside++ == 0) f_.first_proven_outside = element;
  if (p_fraction <= 1.0) return;
  if (f_.outside_probabilistic++ < kReportedOutside) f_.first_outside.push_back(element);
}

void CandidateCheck::AddCounted(const CheckFigures& o) {
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
}

std::int64_t CandidateCheck::UlpPercentile(double p) const {
  if (f_.elements == 0) return 0;
  const auto want = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(f_.elements)));
  std::int64_t seen = 0;
  for (std::size_t b = 0; b < f_.ulp_counts.size(); ++b) {
    seen += f_.ulp_counts[b];
    if (seen >= std::max<std::int64_t>(want, 1)) return std::min(BucketValue(b), f_.max_ulp);
  }
  return f_.max_ulp;
}

std::string CandidateCheck::Verdict() const {
  if (f_.outside > 0) return "outside_bounds";
  if (f_.outside_probabilistic > 0 && probabilistic_applies()) {
    return "outside_probabilistic_bounds";
  }
  if (f_.bitwise_equal == f_.elements) return "bitwise_equal_to_logitd";
  return "within_bounds";
}

bool CandidateCheck::passed() const {
  const std::string verdict = Verdict();
  return verdict == "within_bounds" || verdict == "bitwise_equal_to_logitd";
}

std::string CandidateCheck::Describe(const std::string& name,
                                     const std::vector<std::int64_t>& shape) const {
  if (passed()) return std::string();
  if (f_.outside > 0) {
    const CheckedElement& f = f_.first_proven_outside;
    return absl::StrFormat(
        "%d of %d elements of '%s' outside their proven bound (%d a NaN or infinity where the "
        "reference has none, or the reverse); worst %.3g times its bound; first %s: candidate "
        "%.9g, fp64 reference %.17g, bound %.3e, logitd %.9g",
        f_.outside, f_.elements, name, f_.nan_inf_mismatches, f_.worst_fraction,
        IndexString(f.index, shape), f.candidate, f.reference, f.bound, f.logitd);
  }
  const CheckedElement& f = f_.first_outside.front();
  return absl::StrFormat(
      "%d of %d elements of '%s' outside their probabilistic bound, where logitd's own output "
      "is inside every one (all inside the proven bound); worst %.3g times it; first %s: "
      "candidate %.9g, fp64 reference %.17g, probabilistic bound %.3e (proven %.3e), logitd %.9g",
      f_.outside_probabilistic, f_.elements, name, f_.worst_probabilistic_fraction,
      IndexString(f.index, shape), f.candidate, f.reference, f.probabilistic_bound, f.bound,
      f.logitd);
}

}  // namespace logitd

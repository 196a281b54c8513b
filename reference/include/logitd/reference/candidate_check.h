// A candidate output of another implementation, checked element by element
// the way the server's Verify judges it: against its fp64 reference and two
// bounds (bounds.h): the proven one, which no conforming fp32 accumulation
// can exceed in any order, and the probabilistic one, which it exceeds with
// probability below 2^-89 when its rounding errors are independent; and
// against logitd's own output of the same inputs, bit for bit and in units
// in the last place. Non-finite values follow IEEE 754: where the reference
// is NaN or ±Inf the candidate must be the same, and a NaN or infinity where
// the reference is finite is a mismatch; either way the element lies
// outside both bounds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "logitd/reference/element_judgement.h"
#include "logitd/tensor.h"

namespace logitd {

// One element, as reported: where, and its values.
struct CheckedElement {
  std::int64_t index = 0;  // flat
  double candidate = 0;
  double reference = 0;
  double bound = 0;                // proven
  double probabilistic_bound = 0;  // at most `bound`
  double logitd = 0;               // logitd's own value
};

// The figures of a check, as CandidateCheck keeps them: what a device that
// checks where it forms the references counts for a block of elements,
// with the elements it reports, to be added (CandidateCheck::AddCounted).
struct CheckFigures {
  std::int64_t elements = 0;
  std::int64_t outside = 0;
  double worst_fraction = 0;
  std::int64_t outside_probabilistic = 0;
  double worst_probabilistic_fraction = 0;
  std::int64_t own_outside_probabilistic = 0;
  std::int64_t bitwise_equal = 0;
  std::int64_t nan_inf_mismatches = 0;
  std::array<std::int64_t, judgement::kHistogramBins> histogram{};
  std::int64_t max_ulp = 0;
  // [0, kExactUlp] exactly, then one bucket per power of two up to 2^63.
  std::array<std::int64_t, judgement::kUlpBuckets> ulp_counts{};
  // The first elements outside their probabilistic bound in index order
  // (those outside the proven one among them), at most kReportedOutside:
  // for figures added, at least as many as the check still has room for.
  std::vector<CheckedElement> first_outside;
  // The first element outside its proven bound, when outside > 0.
  CheckedElement first_proven_outside;
};

class CandidateCheck {
 public:
  // The elements outside their probabilistic bound that are reported (those
  // outside the proven one among them), the first ones in index order.
  static constexpr int kReportedOutside = 32;
  // |error| / bound is counted in bins: exactly 0, then up to each edge
  // (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1), then over 1 (NaN
  // included): ten bins (element_judgement.h).
  static constexpr int kHistogramBins = judgement::kHistogramBins;
  // ULP distances up to this are counted exactly; larger ones by the power
  // of two above them (p50 and p99 are then that power).
  static constexpr std::int64_t kExactUlp = judgement::kExactUlp;

  // `dtype` is the candidate's and logitd's output dtype (fp32 or bf16).
  explicit CandidateCheck(DType dtype);

  // Element `index`: the candidate's and logitd's values at it (their bits
  // are the dtype's), the fp64 reference and its two bounds.
  void Add(std::int64_t index, const void* candidate, const void* own, double reference,
           double bound, double probabilistic_bound);
  // An element of an integer output (LogProbs' top-k ids and ranks; the
  // check's dtype INT32 or INT64): the candidate's and logitd's integers,
  // equal or not (their "ULP distance" is 0 or 1), and the quantity each is
  // judged by: `value` against `reference` within `bound` (the z of an id
  // against the z its place has; a rank against the middle of its
  // interval), NaN for an integer that cannot be right (an id out of range
  // or repeated). Reported elements show the integers, with
  // `shown_reference` as the reference.
  void AddInteger(std::int64_t index, std::int64_t candidate, std::int64_t own, double value,
                  double reference, double bound, double shown_reference);
  // A whole range [offset, offset + n) of both tensors (same dtype), with
  // references and bounds given as arrays of n.
  void AddRange(std::int64_t offset, std::int64_t n, const void* candidate, const void* own,
                const double* reference, const double* bound, const double* probabilistic_bound);

  // Adds elements counted elsewhere, whose indices all come after those
  // added so far or are merged in index order: as if each had been added
  // here.
  void AddCounted(const CheckFigures& counted);
  // Adds the elements `other` counted (of the same dtype) to these, as if
  // each had been added here: what a check split over threads, one
  // CandidateCheck each, gives once its parts are merged in any order.
  void Merge(const CandidateCheck& other) { AddCounted(other.f_); }

  DType dtype() const { return dtype_; }
  std::int64_t elements() const { return f_.elements; }
  // Outside the proven bound: wrong for certain.
  std::int64_t outside() const { return f_.outside; }
  double worst_fraction() const { return f_.worst_fraction; }
  // Outside the probabilistic bound (those outside the proven one included).
  std::int64_t outside_probabilistic() const { return f_.outside_probabilistic; }
  double worst_probabilistic_fraction() const { return f_.worst_probabilistic_fraction; }
  // logitd's own output outside the probabilistic bound: nonzero means the
  // inputs' rounding errors are not independent (constant rows, say), and
  // the probabilistic bound says nothing about the candidate either.
  std::int64_t own_outside_probabilistic() const { return f_.own_outside_probabilistic; }
  bool probabilistic_applies() const { return f_.own_outside_probabilistic == 0; }
  const std::vector<CheckedElement>& first_outside() const { return f_.first_outside; }
  std::int64_t bitwise_equal() const { return f_.bitwise_equal; }
  std::int64_t nan_inf_mismatches() const { return f_.nan_inf_mismatches; }
  const std::array<std::int64_t, kHistogramBins>& histogram() const { return f_.histogram; }
  // Units in the last place between the candidate and logitd's output:
  // the largest, and the median and 99th percentile (exact up to
  // kExactUlp, else the power of two above); INT64_MAX for a NaN against a
  // number.
  std::int64_t max_ulp() const { return f_.max_ulp; }
  std::int64_t UlpPercentile(double p) const;
  const CheckFigures& figures() const { return f_; }

  // "outside_bounds" (an element outside its proven bound), else
  // "outside_probabilistic_bounds" (one outside its probabilistic bound,
  // where logitd's own output is inside every one), else
  // "bitwise_equal_to_logitd" (every element equal to logitd's own) or
  // "within_bounds".
  std::string Verdict() const;
  bool passed() const;
  // "3 of 65536 elements of 'y' outside their proven bound ...; first [0,
  // 17]: candidate ..., fp64 reference ..., bound ..."; empty when it
  // passed.
  std::string Describe(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  // An element outside its proven or probabilistic bound: counted, and
  // kept among the reported ones while there is room.
  void NoteOutside(const CheckedElement& element, double fraction, double p_fraction);
  void AddFp32Range(std::int64_t offset, std::int64_t n, const std::byte* candidate,
                    const std::byte* own, const double* reference, const double* bound,
                    const double* probabilistic_bound);
  // Counts one judged element; `element` is it as reported.
  void Tally(const judgement::Judged& j, const CheckedElement& element);
  // `shown` (when not null) is the element as reported, in place of the
  // values judged.
  void Count(std::int64_t index, double candidate, std::uint32_t candidate_bits, double own,
             std::uint32_t own_bits, double reference, double bound, double probabilistic_bound,
             const CheckedElement* shown = nullptr);

  DType dtype_;
  CheckFigures f_;
};

}  // namespace logitd

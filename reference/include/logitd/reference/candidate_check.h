// A candidate output of another implementation, checked element by element
// the way the server's Verify judges it: against its fp64 reference and
// its proven bound (bounds.h), which no conforming fp32 accumulation can
// exceed in any order; by the precision-class test (precision_class.h),
// which tells fp32 accumulation from coarser arithmetic whose errors stay
// inside the proven bound; and against logitd's own output of the same
// inputs, bit for bit and in units in the last place. The probabilistic
// bound of earlier servers is kept as a figure. Non-finite values follow
// IEEE 754 and what a conforming order may reach (element_judgement.h,
// Fraction); an element outside that lies outside its proven bound.
#pragma once

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "logitd/reference/element_judgement.h"
#include "logitd/reference/precision_class.h"
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
  bool outside_bound = false;      // outside the proven bound
  double class_threshold = 0;      // found by the precision-class test: what it allowed
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
  // The same against the exact value correctly rounded to the dtype, over
  // the elements that have one (not the integer outputs).
  std::int64_t ulp_exact_elements = 0;
  std::int64_t max_ulp_exact = 0;
  std::array<std::int64_t, judgement::kUlpBuckets> ulp_exact_counts{};
  // The first elements outside their probabilistic bound in index order
  // (those outside the proven one among them), at most kReportedOutside:
  // for figures added, at least as many as the check still has room for.
  std::vector<CheckedElement> first_outside;
  // The first element outside its proven bound, when outside > 0.
  CheckedElement first_proven_outside;
  // The precision-class test's rows (element_judgement.h, ClassRow), by
  // row index.
  std::map<std::int64_t, judgement::ClassRow> class_rows;
  // The precision-class test's per-token values (AddValueClass).
  std::vector<ValueClassTerm> value_class;
};

// The precision-class test's inputs for a range of products' elements
// (element_judgement.h, ClassTermsOf): per element the sequential model's
// output and the tensor-core model's error, unscaled (accumulation_models.h);
// `cols` elements make a row.
struct ClassInputs {
  const float* seq = nullptr;
  const double* tc = nullptr;
  std::int64_t cols = 0;
};

class CandidateCheck {
 public:
  // The elements reported (ReportedElements).
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
  // A range of a product's elements: references and bounds from the fp64
  // sums and sums of magnitudes by `rule` (element_judgement.h,
  // ProductBounds), and, when `models` is not null, the precision-class
  // test's terms (its arrays of n, row index = element index / cols).
  void AddProducts(std::int64_t offset, std::int64_t n, const void* candidate, const void* own,
                   const judgement::ProductRule& rule, const double* sum, const double* abs_sum,
                   const ClassInputs* models);

  // The precision-class test's terms of a per-token value already added
  // (Add, AddRange) at `index`: counted when the candidate, the reference
  // and the envelope are finite and the envelope positive (a value of the
  // cross-entropy or LogProbs, JudgeValueClass). A check with such values
  // is judged by them.
  void AddValueClass(std::int64_t index, double candidate, double reference, double envelope,
                     double bound, double own);

  // An element's precision-class terms formed by the caller (the
  // cross-entropy's gradients, whose G the candidate forms itself), into
  // row `row`; the element itself is added as usual (Add, AddRange).
  void AddClassTerms(std::int64_t row, std::int64_t index, const judgement::ClassTerms& terms,
                     double candidate, double own, const judgement::ElementBounds& bounds);

  // What the envelope of rows given by AddClassTerms stands for
  // (PrecisionClassFigures::envelope; empty: the products' own).
  void set_class_envelope(std::string name) {
    class_envelope_ = std::move(name);
    class_.reset();
  }
  // The values a test of per-token values (AddValueClass) drew those
  // added from (PrecisionClassFigures::drawn_from; 0: not drawn).
  void set_class_drawn_from(std::int64_t n) {
    class_drawn_from_ = n;
    class_.reset();
  }

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
  // logitd's own output outside the probabilistic figure: nonzero means
  // the inputs' rounding errors are not independent (constant rows, say).
  std::int64_t own_outside_probabilistic() const { return f_.own_outside_probabilistic; }
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
  // The same against the correctly rounded exact value; −1 when no element
  // has one.
  std::int64_t max_ulp_exact() const { return f_.ulp_exact_elements > 0 ? f_.max_ulp_exact : -1; }
  std::int64_t UlpExactPercentile(double p) const;
  const CheckFigures& figures() const { return f_; }
  // The precision-class test over the rows counted (not tested for
  // outputs added without models).
  const PrecisionClassFigures& precision_class() const;
  // The most independent errors a row and the whole check hold: elements
  // whose operands are equal up to a power of two have the same errors,
  // relative to their scale, in every order, so they count once
  // (DistinctClasses); the default is no limit.
  void LimitIndependent(std::int64_t per_row, std::int64_t total);

  // "outside_bounds" (an element outside its proven bound, or a NaN or
  // infinity no conforming order gives), else "outside_precision_class"
  // (the precision-class test found the errors coarser than fp32
  // accumulation's), else "bitwise_equal_to_logitd" (every element equal
  // to logitd's own) or "within_bounds".
  std::string Verdict() const;
  bool passed() const;
  // "3 of 65536 elements of 'y' outside their proven bound ...; first [0,
  // 17]: candidate ..., fp64 reference ..., bound ..."; empty when it
  // passed.
  std::string Describe(const std::string& name, const std::vector<std::int64_t>& shape) const;
  // The reported elements: those outside the proven bound first (index
  // order), then those the precision-class test found (worst first), then
  // those outside the probabilistic figure; at most kReportedOutside.
  std::vector<CheckedElement> ReportedElements() const;

 private:
  // An element outside its proven or probabilistic bound: counted, and
  // kept among the reported ones while there is room.
  void NoteOutside(const CheckedElement& element, double fraction, double p_fraction);
  // Counts one judged element; `element` is it as reported.
  void Tally(const judgement::Judged& j, const CheckedElement& element);
  // `shown` (when not null) is the element as reported, in place of the
  // values judged.
  void Count(std::int64_t index, double candidate, std::uint32_t candidate_bits, double own,
             std::uint32_t own_bits, const judgement::ElementBounds& bounds,
             const CheckedElement* shown = nullptr);
  // The largest finite value of the dtype.
  double MaxFinite() const;
  // The row's counts of the precision-class test, made when first asked.
  judgement::ClassRow& Row(std::int64_t row);

  DType dtype_;
  CheckFigures f_;
  std::int64_t independent_per_row_ = INT64_MAX;
  std::int64_t independent_total_ = INT64_MAX;
  std::string class_envelope_;
  std::int64_t class_drawn_from_ = 0;
  mutable std::optional<PrecisionClassFigures> class_;
};

}  // namespace logitd

// A candidate output of another implementation, checked element by element
// the way the server's Verify judges it: against its fp64 reference and
// proven bound (bounds.h), and against logitd's own output of the same
// inputs, bit for bit and in units in the last place. Non-finite values
// follow IEEE 754: where the reference is NaN or ±Inf the candidate must be
// the same, and a NaN or infinity where the reference is finite is a
// mismatch; either way the element lies outside its bound.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "logitd/tensor.h"

namespace logitd {

// One element, as reported: where, and its values.
struct CheckedElement {
  std::int64_t index = 0;  // flat
  double candidate = 0;
  double reference = 0;
  double bound = 0;
  double logitd = 0;  // logitd's own value
};

class CandidateCheck {
 public:
  // The elements outside their bound that are reported, the first ones in
  // index order.
  static constexpr int kReportedOutside = 32;
  // |error| / bound is counted in bins: exactly 0, then up to each edge
  // (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1), then over 1 (NaN
  // included): ten bins.
  static constexpr std::array<double, 8> kHistogramEdges = {1e-6, 1e-5, 1e-4, 1e-3,
                                                            1e-2, 0.1,  0.5,  1.0};
  static constexpr int kHistogramBins = 10;
  // ULP distances up to this are counted exactly; larger ones by the power
  // of two above them (p50 and p99 are then that power).
  static constexpr std::int64_t kExactUlp = 64;

  // `dtype` is the candidate's and logitd's output dtype (fp32 or bf16).
  explicit CandidateCheck(DType dtype);

  // Element `index`: the candidate's and logitd's values at it (their bits
  // are the dtype's), the fp64 reference and its bound.
  void Add(std::int64_t index, const void* candidate, const void* own, double reference,
           double bound);
  // A whole range [offset, offset + n) of both tensors (same dtype), with
  // references and bounds given as arrays of n.
  void AddRange(std::int64_t offset, std::int64_t n, const void* candidate, const void* own,
                const double* reference, const double* bound);

  std::int64_t elements() const { return elements_; }
  std::int64_t outside() const { return outside_; }
  double worst_fraction() const { return worst_fraction_; }
  const std::vector<CheckedElement>& first_outside() const { return first_outside_; }
  std::int64_t bitwise_equal() const { return bitwise_equal_; }
  std::int64_t nan_inf_mismatches() const { return nan_inf_mismatches_; }
  const std::array<std::int64_t, kHistogramBins>& histogram() const { return histogram_; }
  // Units in the last place between the candidate and logitd's output:
  // the largest, and the median and 99th percentile (exact up to
  // kExactUlp, else the power of two above); INT64_MAX for a NaN against a
  // number.
  std::int64_t max_ulp() const { return max_ulp_; }
  std::int64_t UlpPercentile(double p) const;

  // "bitwise_equal_to_logitd" (every element equal to logitd's own, and
  // within its bound), "within_bounds" or "outside_bounds".
  std::string Verdict() const;
  // "3 of 65536 elements of 'y' outside their bound; worst 2.5x its bound;
  // first [0, 17]: candidate ..., fp64 reference ..., bound ..."; empty when
  // none is outside.
  std::string Describe(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  void Count(std::int64_t index, double candidate, std::uint32_t candidate_bits, double own,
             std::uint32_t own_bits, double reference, double bound);

  DType dtype_;
  std::int64_t elements_ = 0;
  std::int64_t outside_ = 0;
  double worst_fraction_ = 0;
  std::vector<CheckedElement> first_outside_;
  std::int64_t bitwise_equal_ = 0;
  std::int64_t nan_inf_mismatches_ = 0;
  std::array<std::int64_t, kHistogramBins> histogram_{};
  std::int64_t max_ulp_ = 0;
  // [0, kExactUlp] exactly, then one bucket per power of two up to 2^63.
  std::vector<std::int64_t> ulp_counts_;
};

}  // namespace logitd

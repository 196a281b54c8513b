// Two CandidateChecks that must agree in every figure they report: the
// reference tests compare a check split over threads, rows or an inline
// path with the same elements counted one by one.
#ifndef LOGITD_TESTS_REFERENCE_EXPECT_SAME_COUNTS_H_
#define LOGITD_TESTS_REFERENCE_EXPECT_SAME_COUNTS_H_

#include <cmath>
#include <cstddef>

#include "gtest/gtest.h"
#include "logitd/reference/candidate_check.h"

namespace logitd {

inline void ExpectSameCounts(const CandidateCheck& a, const CandidateCheck& b) {
  EXPECT_EQ(a.elements(), b.elements());
  EXPECT_EQ(a.outside(), b.outside());
  EXPECT_EQ(a.worst_fraction(), b.worst_fraction());
  EXPECT_EQ(a.outside_probabilistic(), b.outside_probabilistic());
  EXPECT_EQ(a.worst_probabilistic_fraction(), b.worst_probabilistic_fraction());
  EXPECT_EQ(a.own_outside_probabilistic(), b.own_outside_probabilistic());
  EXPECT_EQ(a.bitwise_equal(), b.bitwise_equal());
  EXPECT_EQ(a.nan_inf_mismatches(), b.nan_inf_mismatches());
  EXPECT_EQ(a.histogram(), b.histogram());
  EXPECT_EQ(a.max_ulp(), b.max_ulp());
  EXPECT_EQ(a.UlpPercentile(0.5), b.UlpPercentile(0.5));
  EXPECT_EQ(a.UlpPercentile(0.99), b.UlpPercentile(0.99));
  ASSERT_EQ(a.first_outside().size(), b.first_outside().size());
  for (std::size_t i = 0; i < a.first_outside().size(); ++i) {
    EXPECT_EQ(a.first_outside()[i].index, b.first_outside()[i].index) << i;
    // The same value, or both NaN (a candidate's NaN is reported as it came).
    const double x = a.first_outside()[i].candidate, y = b.first_outside()[i].candidate;
    EXPECT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << i << ": " << x << " vs " << y;
  }
  EXPECT_EQ(a.Verdict(), b.Verdict());
  EXPECT_EQ(a.Describe("y", {1, a.elements()}), b.Describe("y", {1, b.elements()}));
}

}  // namespace logitd

#endif  // LOGITD_TESTS_REFERENCE_EXPECT_SAME_COUNTS_H_

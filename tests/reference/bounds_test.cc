// BoundStats, the harness's count of elements against their bounds: the same
// rule for NaN and infinities as Verify's CandidateCheck (a special value is
// right only where a conforming order can give it), and its figures.
#include "logitd/reference/bounds.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "logitd/reference/element_judgement.h"

namespace logitd {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

TEST(BoundStatsTest, FiniteElementsAgainstTheirBounds) {
  BoundStats s;
  s.Add(0, 1.0, 1.0, 0.0);
  s.Add(1, 1.5, 1.0, 1.0);
  s.Add(2, 3.0, 1.0, 1.0);
  EXPECT_EQ(s.checked, 3);
  EXPECT_EQ(s.violations, 1);
  EXPECT_EQ(s.first, 2);
  EXPECT_DOUBLE_EQ(s.worst_fraction, 2.0);
  EXPECT_NE(s.Describe("y", {3}).find("1 of 3 y elements outside"), std::string::npos);
}

TEST(BoundStatsTest, TheSameInfinityAsAnInfiniteReferenceIsRight) {
  // Before: inf − inf is NaN, and the matching infinity counted as outside.
  BoundStats s;
  s.Add(0, kInf, kInf, 0.0);
  s.Add(1, -kInf, -kInf, 0.0);
  s.Add(2, kNan, kNan, 0.0);
  EXPECT_EQ(s.violations, 0);
  s.Add(3, -kInf, kInf, 0.0);
  EXPECT_EQ(s.violations, 1);
  EXPECT_EQ(s.first, 3);
}

TEST(BoundStatsTest, ANanOrAnInfinityForAFiniteValueIsRightOnlyWhereItCanOverflow) {
  BoundStats s;
  s.Add(0, kNan, 1.0, 1.0);
  s.Add(1, kInf, 1.0, 1.0);
  EXPECT_EQ(s.violations, 2);
  // A sum of products (3e38) whose positive products (3.5e38) pass fp32's
  // largest value in some order: +Inf is a conforming result there, −Inf
  // and NaN are not.
  const judgement::ProductRule rule = SumOfProductsRule(2, 1.0, DType::kFp32);
  const judgement::ElementBounds big = judgement::ProductBounds(rule, 3e38, 4e38);
  BoundStats p;
  p.Add(0, kInf, big);
  EXPECT_EQ(p.violations, 0);
  p.Add(1, -kInf, big);
  p.Add(2, kNan, big);
  EXPECT_EQ(p.violations, 2);
}

}  // namespace
}  // namespace logitd

// CandidateCheck: verdicts, ULP statistics against logitd's output, the
// histogram of |error| / bound, and IEEE 754 special values.
#include "logitd/reference/candidate_check.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "expect_same_counts.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

float NextUp(float f, int ulps = 1) {
  for (int i = 0; i < ulps; ++i) f = std::nextafter(f, kInf);
  return f;
}

// Checks fp32 `candidate` against `own` with every reference `reference`
// and bound `bound`.
CandidateCheck CheckAll(const std::vector<float>& candidate, const std::vector<float>& own,
                        const std::vector<double>& reference, const std::vector<double>& bound) {
  CandidateCheck check(DType::kFp32);
  // The probabilistic bound as the proven one, unless a test says otherwise.
  check.AddRange(0, static_cast<std::int64_t>(candidate.size()), candidate.data(), own.data(),
                 reference.data(), bound.data(), bound.data());
  return check;
}

TEST(CandidateCheckTest, SameBitsAsLogitdIsBitwiseEqual) {
  const std::vector<float> y = {1.0f, -2.5f, 0.0f, 3e-20f};
  const CandidateCheck c =
      CheckAll(y, y, {1.0, -2.5, 0.0, double{3e-20f}}, {1e-6, 1e-6, 0.0, 1e-25});
  EXPECT_EQ(c.Verdict(), "bitwise_equal_to_logitd");
  EXPECT_EQ(c.elements(), 4);
  EXPECT_EQ(c.bitwise_equal(), 4);
  EXPECT_EQ(c.outside(), 0);
  EXPECT_EQ(c.max_ulp(), 0);
  EXPECT_EQ(c.histogram()[0], 4);
  EXPECT_EQ(c.Describe("y", {2, 2}), "");
}

TEST(CandidateCheckTest, OneUlpOffInsideTheBoundIsWithinBounds) {
  const std::vector<float> own = {1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<float> candidate = own;
  candidate[2] = NextUp(4.0f);
  const CandidateCheck c = CheckAll(candidate, own, {1.0, 2.0, 4.0, 8.0}, {1e-5, 1e-5, 1e-5, 1e-5});
  EXPECT_EQ(c.Verdict(), "within_bounds");
  EXPECT_EQ(c.bitwise_equal(), 3);
  EXPECT_EQ(c.max_ulp(), 1);
  EXPECT_EQ(c.UlpPercentile(0.5), 0);
  EXPECT_EQ(c.UlpPercentile(1.0), 1);
  // 4 + 2^-21 against a bound of 1e-5: a fraction of about 0.048, in (1e-2, 0.1].
  EXPECT_NEAR(c.worst_fraction(), 0x1p-21 / 1e-5, 1e-12);
  EXPECT_EQ(c.histogram()[6], 1);
  EXPECT_EQ(std::accumulate(c.histogram().begin(), c.histogram().end(), std::int64_t{0}), 4);
}

TEST(CandidateCheckTest, PastTheBoundIsOutsideAndDescribed) {
  const std::vector<float> own = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> candidate = {1.0f, 2.0f, 3.5f, 4.0f};
  const CandidateCheck c = CheckAll(candidate, own, {1.0, 2.0, 3.0, 4.0}, {0.1, 0.1, 0.1, 0.1});
  EXPECT_EQ(c.Verdict(), "outside_bounds");
  EXPECT_EQ(c.outside(), 1);
  ASSERT_EQ(c.first_outside().size(), 1u);
  EXPECT_EQ(c.first_outside()[0].index, 2);
  EXPECT_DOUBLE_EQ(c.first_outside()[0].candidate, 3.5);
  EXPECT_DOUBLE_EQ(c.worst_fraction(), 5.0);
  EXPECT_EQ(c.histogram()[CandidateCheck::kHistogramBins - 1], 1);
  const std::string d = c.Describe("y", {2, 2});
  EXPECT_NE(d.find("1 of 4 elements of 'y' outside their proven bound"), std::string::npos) << d;
  EXPECT_NE(d.find("first [1, 0]"), std::string::npos) << d;
  EXPECT_NE(d.find("worst 5 times"), std::string::npos) << d;
}

TEST(CandidateCheckTest, TheProbabilisticBoundIsAFigureThatDecidesNothing) {
  // Errors of 0.25 against a proven bound of 1 and a probabilistic one of
  // 0.1: inside the proof; the probabilistic figure counts them, but the
  // verdict is the proof's and the precision-class test's (not formed for
  // elements added without models).
  const std::vector<double> reference = {1.0, 2.0, 3.0, 4.0};
  const std::vector<double> bound(4, 1.0), probabilistic(4, 0.1);
  const std::vector<float> own = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> candidate = {1.25f, 2.0f, 3.25f, 4.0f};
  CandidateCheck c(DType::kFp32);
  c.AddRange(0, 4, candidate.data(), own.data(), reference.data(), bound.data(),
             probabilistic.data());
  EXPECT_EQ(c.outside(), 0);
  EXPECT_EQ(c.outside_probabilistic(), 2);
  EXPECT_DOUBLE_EQ(c.worst_probabilistic_fraction(), 2.5);
  EXPECT_FALSE(c.precision_class().tested);
  EXPECT_FALSE(c.precision_class().reason.empty());
  EXPECT_EQ(c.Verdict(), "within_bounds");
  EXPECT_TRUE(c.passed());
  ASSERT_EQ(c.first_outside().size(), 2u);
  EXPECT_EQ(c.first_outside()[1].index, 2);
  EXPECT_DOUBLE_EQ(c.first_outside()[1].probabilistic_bound, 0.1);
  // Reported after any element outside the proven bound.
  EXPECT_EQ(c.ReportedElements().size(), 2u);
  EXPECT_FALSE(c.ReportedElements()[0].outside_bound);
}

TEST(CandidateCheckTest, ElementsOutsideTheProvenBoundAreReportedFirst) {
  const int n = 40;
  std::vector<double> reference(n, 1.0), bound(n, 1.0), probabilistic(n, 0.1);
  std::vector<float> own(n, 1.0f), candidate(n, 1.5f);  // outside the figure only
  candidate[35] = 3.0f;                                 // outside the proof
  CandidateCheck c(DType::kFp32);
  c.AddRange(0, n, candidate.data(), own.data(), reference.data(), bound.data(),
             probabilistic.data());
  EXPECT_EQ(c.Verdict(), "outside_bounds");
  const std::vector<CheckedElement> reported = c.ReportedElements();
  ASSERT_EQ(reported.size(), static_cast<std::size_t>(CandidateCheck::kReportedOutside));
  EXPECT_EQ(reported.front().index, 35);
  EXPECT_TRUE(reported.front().outside_bound);
  EXPECT_FALSE(reported[1].outside_bound);
}

TEST(CandidateCheckTest, UlpFromTheCorrectlyRoundedValue) {
  // 1 + 2^-30 rounds to 1 in fp32; a candidate of 1 + 2^-23 is one ulp
  // from it, whatever logitd's own value.
  const std::vector<double> reference = {1.0 + 0x1p-30, 2.0};
  const std::vector<double> bound(2, 1.0);
  const std::vector<float> own = {1.0f + 0x1p-23f, 2.0f};
  const std::vector<float> candidate = {1.0f + 0x1p-23f, 2.0f};
  CandidateCheck c(DType::kFp32);
  c.AddRange(0, 2, candidate.data(), own.data(), reference.data(), bound.data(), bound.data());
  EXPECT_EQ(c.max_ulp(), 0);
  EXPECT_EQ(c.max_ulp_exact(), 1);
  EXPECT_EQ(c.UlpExactPercentile(0.5), 0);
}

TEST(CandidateCheckTest, ReportsOnlyTheFirstOutsideElements) {
  const int n = 100;
  std::vector<float> own(n, 1.0f), candidate(n, 2.0f);
  const CandidateCheck c =
      CheckAll(candidate, own, std::vector<double>(n, 1.0), std::vector<double>(n, 0.5));
  EXPECT_EQ(c.outside(), n);
  ASSERT_EQ(c.first_outside().size(), static_cast<std::size_t>(CandidateCheck::kReportedOutside));
  EXPECT_EQ(c.first_outside().back().index, CandidateCheck::kReportedOutside - 1);
}

TEST(CandidateCheckTest, NonFiniteValuesFollowIeee754) {
  // Reference NaN: any NaN is right, a number is wrong. Reference +Inf:
  // only +Inf is right. A finite reference: an Inf is right only where the
  // bounded value overflows fp32, with the reference's sign.
  const double max = std::numeric_limits<float>::max();
  const std::vector<double> reference = {std::nan(""), std::nan(""), HUGE_VAL, HUGE_VAL,
                                         1.0,          max,          -max};
  const std::vector<double> bound = {0, 0, 0, 0, 1e-3, max * 1e-6, max * 1e-6};
  const std::vector<float> candidate = {-kNan, 1.0f, kInf, -kInf, kNan, kInf, kInf};
  const std::vector<float> own = {kNan, kNan, kInf, kInf, 1.0f, kInf, -kInf};
  const CandidateCheck c = CheckAll(candidate, own, reference, bound);
  // Wrong: [1] a number for NaN, [3] -Inf for +Inf, [4] NaN for 1, [6] the wrong sign.
  EXPECT_EQ(c.nan_inf_mismatches(), 4);
  EXPECT_EQ(c.outside(), 4);
  std::vector<std::int64_t> where;
  for (const CheckedElement& e : c.first_outside()) where.push_back(e.index);
  EXPECT_EQ(where, (std::vector<std::int64_t>{1, 3, 4, 6}));
  // NaNs of any payload are equal to logitd's NaN; a NaN against a number
  // is infinitely many ULPs away.
  EXPECT_EQ(c.bitwise_equal(), 3);
  EXPECT_EQ(c.max_ulp(), std::numeric_limits<std::int64_t>::max());
}

TEST(CandidateCheckTest, Bf16CandidatesCountBf16Ulps) {
  const std::vector<Bf16Bits> own = {0x3f80, 0x4000, 0x4040};
  const std::vector<Bf16Bits> candidate = {0x3f80, 0x4003, 0x4040};
  const std::vector<double> reference = {1.0, 2.0, 3.0}, bound = {0.01, 0.1, 0.01};
  CandidateCheck c(DType::kBf16);
  c.AddRange(10, 3, candidate.data(), own.data(), reference.data(), bound.data(), bound.data());
  EXPECT_EQ(c.max_ulp(), 3);
  EXPECT_EQ(c.bitwise_equal(), 2);
  // 0x4003 is 2 + 3·2^-6 = 2.046875: within 0.1.
  EXPECT_EQ(c.Verdict(), "within_bounds");
  CandidateCheck one(DType::kBf16);
  one.Add(7, &candidate[1], &own[1], 2.0, 0.01, 0.01);
  EXPECT_EQ(one.outside(), 1);
  EXPECT_EQ(one.first_outside()[0].index, 7);
}

TEST(CandidateCheckTest, UlpPercentilesPastTheExactRangeArePowersOfTwo) {
  std::vector<float> own(100, 1.0f), candidate(100, 1.0f);
  for (int i = 0; i < 99; ++i) candidate[i] = NextUp(1.0f, 3);
  candidate[99] = NextUp(1.0f, 1000);
  const CandidateCheck c =
      CheckAll(candidate, own, std::vector<double>(100, 1.0), std::vector<double>(100, 1.0));
  EXPECT_EQ(c.UlpPercentile(0.5), 3);
  EXPECT_EQ(c.UlpPercentile(0.99), 3);
  EXPECT_EQ(c.max_ulp(), 1000);
  EXPECT_EQ(c.UlpPercentile(1.0), 1000);  // the bucket's 1024, capped by the largest
}

TEST(CandidateCheckTest, ARangeCountsAsItsElementsOneByOne) {
  // fp32 ranges take an inline path for finite values and positive bounds;
  // every figure must be what Add gives element by element, across the
  // cases that leave that path: NaN and infinite values and references,
  // zero and infinite bounds, ±0, and elements outside either bound.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 19);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int n = 20000;
  std::vector<float> cand(n), own(n);
  std::vector<double> ref(n), bound(n), pbound(n);
  for (int i = 0; i < n; ++i) {
    const float r = normal(rng);
    ref[i] = r;
    bound[i] = 1e-3;
    pbound[i] = 2e-4;
    own[i] = r + 1e-5f * normal(rng);
    cand[i] = own[i];
    switch (pick(rng)) {
      case 0:
        cand[i] = nextafterf(own[i], inf);
        break;
      case 1:
        cand[i] = r + 5e-4f;
        break;  // outside the probabilistic bound only
      case 2:
        cand[i] = r + 0.01f;
        break;  // outside both
      case 3:
        cand[i] = nan;
        break;
      case 4:
        cand[i] = -inf;
        break;
      case 5:
        ref[i] = nan;
        break;
      case 6:
        bound[i] = 0;
        break;
      case 7:
        pbound[i] = std::numeric_limits<double>::infinity();
        break;
      case 8:
        own[i] = -0.0f;
        cand[i] = 0.0f;
        ref[i] = 0;
        break;
      case 9:
        own[i] = r + 3e-4f;
        break;  // logitd's own outside the probabilistic bound
      default:
        break;
    }
  }
  CandidateCheck range(DType::kFp32), one(DType::kFp32);
  range.AddRange(0, n, cand.data(), own.data(), ref.data(), bound.data(), pbound.data());
  for (int i = 0; i < n; ++i) one.Add(i, &cand[i], &own[i], ref[i], bound[i], pbound[i]);
  EXPECT_GT(range.outside(), 0);
  EXPECT_GT(range.nan_inf_mismatches(), 0);
  ExpectSameCounts(range, one);
  EXPECT_EQ(range.Describe("y", {n}), one.Describe("y", {n}));
}

TEST(CandidateCheckTest, FiguresCountedInBlocksAddUpToTheWhole) {
  // What a device that judges a block at a time hands back (CheckFigures:
  // its counts, its first outside elements and its first outside the
  // proven bound), added block after block, gives the whole check's
  // figures. The first 40 elements lie outside the probabilistic bound
  // only, so the reported ones all come from the first block while the
  // first element outside the proven bound comes in a later one.
  const int n = 6000, block = 1000;
  std::vector<float> cand(n), own(n);
  std::vector<double> ref(n), bound(n, 1e-3), pbound(n, 2e-4);
  for (int i = 0; i < n; ++i) {
    ref[i] = 0.001 * i;
    own[i] = static_cast<float>(ref[i]);
    cand[i] = own[i];
    if (i < 40) cand[i] = static_cast<float>(ref[i] + 5e-4);
    if (i % 97 == 13) cand[i] = NextUp(own[i], 3);
  }
  cand[4321] = static_cast<float>(ref[4321] + 0.5);
  cand[5555] = kNan;
  CandidateCheck whole(DType::kFp32), blocks(DType::kFp32);
  whole.AddRange(0, n, cand.data(), own.data(), ref.data(), bound.data(), pbound.data());
  for (int b0 = 0; b0 < n; b0 += block) {
    CandidateCheck part(DType::kFp32);
    part.AddRange(b0, block, cand.data() + b0, own.data() + b0, ref.data() + b0, bound.data() + b0,
                  pbound.data() + b0);
    blocks.AddCounted(part.figures());
  }
  EXPECT_EQ(whole.outside(), 2);
  EXPECT_EQ(whole.first_outside().size(),
            static_cast<std::size_t>(CandidateCheck::kReportedOutside));
  EXPECT_NE(whole.Describe("y", {n}).find("first [4321]"), std::string::npos)
      << whole.Describe("y", {n});
  ExpectSameCounts(blocks, whole);
}

}  // namespace
}  // namespace logitd

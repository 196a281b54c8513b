// --compare's arithmetic: ULP distances per dtype and the verdicts.
#include "client/validate/compare.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

std::uint64_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(UlpDistanceTest, FloatsCountPlacesOnTheOrderedLine) {
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(1.0f), Bits(1.0f)), 0u);
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(1.0f), Bits(std::nextafter(1.0f, 2.0f))), 1u);
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(0.0f), Bits(-0.0f)), 0u);
  // Across zero: the smallest subnormals on either side are two places apart.
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(tiny), Bits(-tiny)), 2u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(nan), Bits(nan)), 0u);
  EXPECT_EQ(UlpDistance(DType::kFp32, Bits(nan), Bits(1.0f)),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(UlpDistance(DType::kBf16, FloatToBf16(1.0f), FloatToBf16(1.0078125f)), 1u);
  EXPECT_EQ(UlpDistance(DType::kBf16, 0x8000u, 0x0000u), 0u);
  EXPECT_EQ(UlpDistance(DType::kInt64, static_cast<std::uint64_t>(-3), 4), 7u);
  EXPECT_EQ(UlpDistance(DType::kInt32, static_cast<std::uint32_t>(-3), 4), 7u);
}

std::vector<RecordedOutput> Outputs(const std::vector<float>& values) {
  OutputLog log;
  Tensor t(DType::kFp32, {static_cast<std::int64_t>(values.size())});
  std::memcpy(t.data<float>(), values.data(), values.size() * 4);
  log.Record("s/c", "y", t);
  return log.outputs();
}

std::vector<CaseResult> Results(Verdict verdict, double fraction) {
  CaseResult r;
  r.suite = "s";
  r.name = "c";
  r.verdict = verdict;
  r.figures["worst_bound_fraction"] = fraction;
  return {r};
}

TEST(CompareRunsTest, Verdicts) {
  const auto a = Outputs({1.0f, 2.0f, 3.0f, 4.0f});
  const auto b = Outputs({1.0f, 2.0f, 3.0f, std::nextafter(4.0f, 5.0f)});
  CompareReport same =
      CompareRuns("A", a, Results(Verdict::kPassed, 0.5), "B", a, Results(Verdict::kPassed, 0.5));
  EXPECT_EQ(same.verdict, "identical");
  EXPECT_EQ(same.exit_code, 0);

  CompareReport diff =
      CompareRuns("A", a, Results(Verdict::kPassed, 0.5), "B", b, Results(Verdict::kPassed, 0.7));
  EXPECT_EQ(diff.verdict, "different, both within bounds");
  EXPECT_EQ(diff.exit_code, 0);
  ASSERT_EQ(diff.outputs.size(), 1u);
  EXPECT_DOUBLE_EQ(diff.outputs[0].equal_fraction, 0.75);
  EXPECT_EQ(diff.outputs[0].max_ulp, 1u);
  ASSERT_EQ(diff.cases.size(), 1u);
  EXPECT_DOUBLE_EQ(diff.cases[0].b, 0.7);
  EXPECT_NE(CompareText(diff).find("0 of 1 outputs bitwise equal"), std::string::npos);

  CompareReport bad =
      CompareRuns("A", a, Results(Verdict::kPassed, 0.5), "B", b, Results(Verdict::kFailed, 1.5));
  EXPECT_EQ(bad.verdict, "outside its bounds");
  EXPECT_EQ(bad.exit_code, 1);
}

TEST(OutputLogTest, RepeatedNamesAreNumberedAndLargeOutputsSampled) {
  OutputLog log;
  Tensor small(DType::kFp32, {3});
  log.Record("s/c", "y", small);
  log.Record("s/c", "y", small);
  Tensor big(DType::kBf16, {kMaxRecordedElements * 2 + 1});
  log.Record("s/c", "big", big);
  ASSERT_EQ(log.outputs().size(), 3u);
  EXPECT_EQ(log.outputs()[0].key, "s/c: y");
  EXPECT_EQ(log.outputs()[1].key, "s/c: y #2");
  EXPECT_EQ(log.outputs()[2].stride, 3);
  EXPECT_LE(static_cast<std::int64_t>(log.outputs()[2].bits.size()), kMaxRecordedElements);
}

}  // namespace
}  // namespace logitd::validate

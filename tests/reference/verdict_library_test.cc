// Verify's two error rates on a small scale, in every CI run: every
// conforming implementation of the library passes on every kind of input,
// random and structured, for the logits and both gradients; every defect
// fails at the reduction lengths and call sizes the contract names.
// bench/verdict_rates.cc counts both over many more calls for
// docs/BENCHMARKS.md.
#include "tests/reference/verdict_library.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace logitd::verdicts {
namespace {

struct Shape {
  std::int64_t m, v, k;
};

TEST(VerdictLibraryTest, NoConformingImplementationFailsOnAnyKindOfInput) {
  const std::vector<emulated::Implementation> impls = emulated::ConformingImplementations();
  const std::vector<Shape> shapes = {{3, 40, 1024}, {2, 24, 4096}, {5, 33, 97}};
  int calls = 0;
  for (const std::string& kind : emulated::CaseKinds()) {
    for (const Shape& s : shapes) {
      const CaseInputs in = MakeInputs(kind, s.m, s.v, s.k, 1000 + calls);
      for (const Output output : {Output::kLogits, Output::kGradInput, Output::kGradWeight}) {
        // The gradients on the kinds whose structure reaches them (X's and
        // W's; dY is random) at one shape.
        if (output != Output::kLogits && s.k != 97) continue;
        for (const emulated::Implementation& impl : impls) {
          const Judged j = JudgeImplementation(impl, in, output);
          ++calls;
          EXPECT_TRUE(j.passed) << impl.name << " on " << kind << " [" << s.m << ", " << s.v
                                << ", " << s.k << "] " << OutputName(output) << ": " << j.verdict
                                << ": " << j.describe;
        }
      }
    }
  }
  EXPECT_GT(calls, 1000);
}

TEST(VerdictLibraryTest, EveryDefectIsCaught) {
  for (const std::int64_t k : {1024, 4096}) {
    for (const std::string kind : {"normal", "unit normal"}) {
      // M·V = 4,096: the smallest call the contract names.
      const CaseInputs in = MakeInputs(kind, 16, 256, k, 7 + k);
      for (const emulated::Implementation& impl : emulated::DefectiveImplementations()) {
        const Judged j = JudgeImplementation(impl, in, Output::kLogits);
        EXPECT_FALSE(j.passed) << impl.name << " on " << kind << " at K=" << k << ": "
                               << j.verdict << " (RMS ratio " << j.rms_ratio << ", threshold "
                               << j.threshold << ")";
      }
      const emulated::Implementation base = emulated::ConformingImplementations().front();
      for (const Change change : {Change::kOneElementPlus1Percent, Change::kRowShifted}) {
        const Judged j = JudgeImplementation(base, in, Output::kLogits, change);
        EXPECT_FALSE(j.passed) << ChangeName(change) << " on " << kind << " at K=" << k;
      }
    }
  }
}

TEST(VerdictLibraryTest, GradientsWithoutTheCastAreCaught) {
  // dX sums V products, dW sums M: G's missing bf16 rounding is 2^-9 of
  // each term, far past fp32 accumulation's errors at these lengths.
  const CaseInputs in = MakeInputs("normal", 64, 512, 64, 9);
  const emulated::Implementation base = emulated::ConformingImplementations().front();
  for (const Output output : {Output::kGradInput, Output::kGradWeight}) {
    const Judged j = JudgeImplementation(base, in, output, Change::kMissingCast);
    EXPECT_FALSE(j.passed) << OutputName(output) << ": " << j.verdict << " (RMS ratio "
                           << j.rms_ratio << ")";
    EXPECT_TRUE(JudgeImplementation(base, in, output).passed) << OutputName(output);
  }
}

}  // namespace
}  // namespace logitd::verdicts

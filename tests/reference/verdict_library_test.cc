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
#include <tuple>
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
          EXPECT_TRUE(j.passed) << impl.name << " on " << kind << " [" << s.m << ", " << s.v << ", "
                                << s.k << "] " << OutputName(output) << ": " << j.verdict << ": "
                                << j.describe;
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
        EXPECT_FALSE(j.passed) << impl.name << " on " << kind << " at K=" << k << ": " << j.verdict
                               << " (RMS ratio " << j.rms_ratio << ", threshold " << j.threshold
                               << ")";
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

TEST(VerdictLibraryTest, NoConformingCrossEntropyFailsOnAnyKindOfInput) {
  // Per-token loss and lse from every conforming implementation's logits,
  // by a conforming fp32 softmax with an accurate or a fast exp.
  const std::vector<emulated::Implementation> impls = emulated::ConformingImplementations();
  int calls = 0;
  for (const std::string& kind : emulated::CaseKinds()) {
    const CaseInputs in = MakeInputs(kind, 16, 64, 192, 2000 + calls);
    const std::vector<std::int64_t> targets = MakeTargets(16, 64, 2000 + calls);
    for (const emulated::Implementation& impl : impls) {
      for (const bool fast : {false, true}) {
        const CeJudged j = JudgeCrossEntropy(&impl, in, targets, false, fast);
        ++calls;
        for (const Judged* o : {&j.loss, &j.lse}) {
          EXPECT_TRUE(o->passed) << impl.name << (fast ? " (fast exp)" : "") << " on " << kind
                                 << ": " << o->verdict << ": " << o->describe;
        }
      }
    }
  }
  EXPECT_GT(calls, 500);
}

TEST(VerdictLibraryTest, CrossEntropyFromBf16LogitsIsCaught) {
  // 64 tokens over V = 32,768 with logits of an LM head's spread: the
  // per-token loss and lse of logitd's own logits (OpenBLAS) rounded to
  // bf16, through an otherwise conforming fp32 softmax, fail (outside the
  // proven bound at small K, outside the precision class at any); the same
  // without the rounding passes. (K = 4,096 and more: bench/verdict_rates.)
  for (const std::int64_t k : {64, 1024}) {
    const CaseInputs in = MakeInputs("lm logits", 64, 32768, k, 11 + k);
    const std::vector<std::int64_t> targets = MakeTargets(64, 32768, 11 + k);
    const CeJudged bf16 = JudgeCrossEntropy(nullptr, in, targets, /*bf16_logits=*/true);
    const CeJudged fp32 = JudgeCrossEntropy(nullptr, in, targets);
    for (const auto& [name, bad, good] :
         {std::tuple{"loss", &bf16.loss, &fp32.loss}, std::tuple{"lse", &bf16.lse, &fp32.lse}}) {
      EXPECT_FALSE(bad->passed) << name << " at K=" << k << ": " << bad->verdict;
      EXPECT_GT(bad->rms_ratio, 4 * bad->threshold)
          << name << " at K=" << k << ": " << bad->describe;
      EXPECT_TRUE(good->passed) << name << " at K=" << k << ": " << good->describe;
    }
  }
}

}  // namespace
}  // namespace logitd::verdicts

// Verify's verdicts over the emulated implementations (emulated_kernels.h):
// each implementation's outputs of a case judged by the checks the server
// runs (verify_checks.h) against logitd's own (OpenBLAS sgemm, as the cpu
// backend forms them), so that the false-fail and catch rates of the
// verdicts can be counted, in a test and in bench/verdict_rates.
#ifndef LOGITD_TESTS_REFERENCE_VERDICT_LIBRARY_H_
#define LOGITD_TESTS_REFERENCE_VERDICT_LIBRARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "logitd/reference/candidate_check.h"
#include "tests/reference/emulated_kernels.h"

namespace logitd::verdicts {

enum class Output { kLogits, kGradInput, kGradWeight };
const char* OutputName(Output output);  // "y", "dx", "dw"

// A defect made by changing a conforming output rather than computing it
// another way.
enum class Change {
  kNone,
  kOneElementPlus1Percent,  // the element of median magnitude of row 0, ×1.01
  kRowShifted,              // row 0's values moved one column over
  kMissingCast,             // dX or dW from dY itself, without G = bf16(dY)
};
const char* ChangeName(Change change);

struct Judged {
  std::string verdict;
  bool passed = false;
  bool outside_bound = false;
  double rms_ratio = 0;
  double threshold = 0;
  double effective_bits = 0;
  double class_bits = 0;
  std::string describe;
};

// The case's inputs for the outputs' products: dY [m, v] ~ N(0, 1) fp32
// for the gradients, seeded.
struct CaseInputs {
  emulated::LmHeadCase c;
  std::vector<float> dy;
};
CaseInputs MakeInputs(const std::string& kind, std::int64_t m, std::int64_t v, std::int64_t k,
                      std::uint64_t seed);

// `impl`'s output of `in` (with `change` applied), judged against logitd's
// own; `alpha` for the logits.
Judged JudgeImplementation(const emulated::Implementation& impl, const CaseInputs& in,
                           Output output, Change change = Change::kNone, float alpha = 1.0f);

// Targets [m], seeded, uniform over [0, v).
std::vector<std::int64_t> MakeTargets(std::int64_t m, std::int64_t v, std::uint64_t seed);

// The cross-entropy's per-token outputs (reduction none), judged.
struct CeJudged {
  Judged loss, lse;
};

// The per-token cross-entropy of `impl`'s fp32 logits of `in` (null:
// logitd's own, OpenBLAS sgemm's blocked sums; rounded to bf16 first when
// `bf16_logits`: the defect of a path through bf16 logits), evaluated by a
// conforming fp32 softmax (the largest logit, the sequential fp32 sum of
// expf(z − max), lse = max + logf(sum), loss = lse − z_t; `fast_exp`:
// exp2f(x·log2(e)), as CUDA's __expf), judged as Verify judges it against
// logitd's own (OpenBLAS logits, the same softmax).
CeJudged JudgeCrossEntropy(const emulated::Implementation* impl, const CaseInputs& in,
                           const std::vector<std::int64_t>& targets, bool bf16_logits = false,
                           bool fast_exp = false);

// The cross-entropy's gradients (reduction mean over every token),
// judged: dX and dW.
struct CeGradJudged {
  Judged dx, dw;
};

// How the gradient's G comes about, for JudgeCrossEntropyGradients.
enum class GradientPath {
  kConforming,  // fp32 logits, an fp32 softmax, G = bf16(fp32 g)
  kBf16Logits,  // the logits rounded to bf16 before the softmax
  kScaled,      // g off by a factor (a mean over the wrong count, say)
};

// dX = G·W and dW = Gᵀ·X of the cross-entropy of `logits_impl`'s fp32
// logits of `in` (null: logitd's own, OpenBLAS), G = bf16(g) with g = (p −
// onehot)/M formed in fp32 by the softmax of JudgeCrossEntropy, each product
// summed by `sum_impl` (emulated_kernels.h: GradInput, GradWeight); with
// `path` kScaled, g times (1 + `scale_error`) before the cast. Judged as
// Verify judges them against logitd's own (OpenBLAS logits, the same
// softmax, sgemm).
CeGradJudged JudgeCrossEntropyGradients(const emulated::Implementation* logits_impl,
                                        const emulated::Implementation& sum_impl,
                                        const CaseInputs& in,
                                        const std::vector<std::int64_t>& targets,
                                        GradientPath path = GradientPath::kConforming,
                                        double scale_error = 0, bool fast_exp = false);

}  // namespace logitd::verdicts

#endif  // LOGITD_TESTS_REFERENCE_VERDICT_LIBRARY_H_

// Verify's precision-class test, finished from a candidate's rows as
// counted (element_judgement.h, ClassRow): are the candidate's errors those
// of an fp32-accumulating implementation? Each element's error is measured
// in units of w = 2^-24·|alpha|·Σ|products| and held to the envelope of
// the conforming implementations the server formed on the same inputs
// (the sequential fp32 sum, the tensor-core model, logitd's own output,
// the correctly rounded result). Three tests, each failing a conforming
// candidate with probability at most kClassTestAlpha under the model
// stated in docs/PROTOCOL.md ("The precision-class test"):
//   - the whole tensor's root mean square error against the envelope's,
//   - each row's, the same,
//   - each row's largest error against the row's own conforming scale.
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "logitd/reference/element_judgement.h"

namespace logitd {

// The false-alarm probability of each test made.
inline constexpr double kClassTestAlpha = 1e-12;
// How far the RMS error of a conforming implementation may exceed the
// envelope's (a tensor-core adder of other blocks, another order): the
// spread measured by the library of conforming implementations
// (tests/reference/verdict_library_test.cc) is below it.
inline constexpr double kClassSpread = 2.0;
// The least scale, in units of 2^-24·Σ|products|, an element's error is
// held to by the largest-error test: a sequential round-to-nearest sum in
// an order the products' signs do not favour errs by about
// 0.59·sqrt(n·Σp²)/Σ|p| (0.92 for products of normal values), whatever
// the other elements of the row give.
inline constexpr double kClassElementFloor = 1.0;
// How far an element's error may exceed the sequential sum's there, where
// the inputs' structure (equal products, a dominant term) makes every
// order err alike.
inline constexpr double kClassElementSpread = 4.0;

// The t > 1 at which a mean of `n` squared independent standard normal
// values exceeds t with probability at most alpha by the Chernoff bound
// exp(−(n/2)(t − 1 − ln t)); LowerMeanSquareQuantile the s < 1 it falls
// below s with at most that probability.
double UpperMeanSquareQuantile(double n, double alpha);
double LowerMeanSquareQuantile(double n, double alpha);

// Effective precision of errors whose mean square is `candidate_sq` where
// the sequential sum's is `seq_sq` (both in units of w²): 24 − log2 of their
// RMS ratio, at most 64 (exact).
double EffectiveBits(double candidate_sq, double seq_sq);

struct RowPrecisionFigures {
  std::int64_t row = 0;
  std::int64_t elements = 0;
  double effective_bits = 0;
  double class_bits = 0;
  double rms_ratio = 0;
  double threshold = 0;
  bool outside = false;
};

// An element the largest-error test found outside: |candidate − reference|
// more than `threshold`.
struct ClassOutlier {
  std::int64_t index = 0;
  double candidate = 0;
  double reference = 0;
  double threshold = 0;
  double excess = 0;  // |candidate − reference| / threshold
  double bound = 0;   // its proven bound, probabilistic figure and logitd's value
  double p_bound = 0;
  double logitd = 0;
};

struct PrecisionClassFigures {
  bool tested = false;
  std::string reason;  // when not tested
  bool outside = false;
  double alpha = 0;  // the sum over the tests made
  double effective_bits = 0;
  double class_bits = 0;
  double rms_ratio = 0;
  double threshold = 0;
  std::int64_t elements = 0;
  std::int64_t rows = 0;
  std::int64_t rows_outside = 0;
  std::int64_t elements_outside = 0;
  // The values the tested ones were drawn from, when the test took a
  // sample of them (kClassTokens); 0: every value that qualified.
  std::int64_t drawn_from = 0;
  std::vector<RowPrecisionFigures> worst_rows;  // at most kReportedRows, worst first
  std::vector<ClassOutlier> outliers;           // at most kReportedOutliers, worst first
  // The conforming implementations the envelope stands for (empty: the
  // products', ClassEnvelopeName()).
  std::string envelope;
  static constexpr std::size_t kReportedRows = 8;
  static constexpr std::size_t kReportedOutliers = 32;
};

// A per-token output's element as the precision-class test of those
// outputs counts it (docs/PROTOCOL.md, "The precision-class test of the
// per-token outputs"): the candidate's value, the reference, the
// envelope (the scale of a conforming implementation's error there), and,
// for the report, its proven bound and logitd's value.
struct ValueClassTerm {
  std::int64_t index = 0;
  double candidate = 0;
  double reference = 0;
  double envelope = 0;
  double bound = 0;
  double logitd = 0;
};

// The test of per-token values, each its own row of one element: the
// tensor's RMS of |error|/envelope against kClassSpread·√t with n' = the
// values counted (at most `total` independent ones), and each value's
// against kClassSpread·√t₁ at α₀/n. effective_bits is 24 − log2 of the RMS
// ratio (the envelope's 24).
PrecisionClassFigures JudgeValueClass(const std::vector<ValueClassTerm>& terms,
                                      std::int64_t total = INT64_MAX);

// The test over a candidate's rows (row index → its counts), with at most
// `per_row` independent errors in a row and `total` in all (elements whose
// operands are equal up to a power of two err alike in every order).
PrecisionClassFigures JudgePrecisionClass(const std::map<std::int64_t, judgement::ClassRow>& rows,
                                          std::int64_t per_row = INT64_MAX,
                                          std::int64_t total = INT64_MAX);

// "the sequential fp32 sum (round to nearest), a tensor-core model (blocks
// of 16 truncated), logitd's own output and the correctly rounded result".
std::string ClassEnvelopeName();

}  // namespace logitd

// The fp64 logits y = x·wᵀ of a block of rows of M, shared by the
// cross-entropy and LogProbs references (cross_entropy.cc, logprobs.cc):
// one dgemm of the block's widened rows of X with W (numerics.h:
// ReferenceXWt), so no [M, V] of doubles is held whole. Elements whose
// operands include a NaN or an infinity are formed again one by one, as
// IEEE 754 says they are, which a dgemm need not. Internal to
// logitd_reference.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/verify_checks.h"

namespace logitd::reference_internal {

// Rows of M per block when the caller names none: at most
// kReferenceBlockElements logits.
std::int64_t DefaultBlockRows(std::int64_t v);

// The threads ForRowsInParallel runs `n` rows of `elements` elements of
// work on: one per 2^18 elements, at most one per row, per hardware thread
// and 16.
int RowThreads(std::int64_t n, std::int64_t elements);
// fn(first, last, part) for contiguous parts [first, last) of the rows
// [0, n), part < RowThreads(n, elements), each on a thread of its own when
// there are several. The parts write disjoint rows; what the caller sums
// over rows it sums afterwards in row order, so the results do not depend
// on the threads.
void ForRowsInParallel(std::int64_t n, std::int64_t elements,
                       const std::function<void(std::int64_t, std::int64_t, int)>& fn);
// Whether any of n bf16 values is a NaN or an infinity (exponent all ones).
bool AnyNonFiniteBf16(const Bf16Bits* data, std::int64_t n);
// The rows `rows` of x [M, k] widened to doubles into *out, in that order,
// for an engine that forms their logits on its device; false (and *out not
// to be used) when one of them holds a NaN or an infinity, which the host
// forms.
bool WidenFiniteRows(const Bf16Bits* x, const std::vector<std::int64_t>& rows, std::int64_t k,
                     std::vector<double>* out);

// Rows of M the engine forms together, and whether their class envelopes
// are formed (all of them or none).
struct RowChunk {
  std::vector<std::int64_t> rows;
  bool classed = false;
};

// The rows [0, m) in chunks of at most `size` rows for the engine. Where
// the caller drew rows for the class test (`classed` with class_rows not
// empty), the drawn rows come first, then the others without envelopes:
// the models of the drawn rows are formed in full chunks, rather than a
// few rows in every chunk at the cost of the whole chunk's tiles. Else the
// rows in order, every chunk `classed`.
std::vector<RowChunk> EngineRowChunks(std::int64_t m, bool classed,
                                      const std::vector<std::uint8_t>& class_rows,
                                      std::int64_t size);

// Every row of M formed once: where engine_rows > 0, chunk by chunk on the
// engine (engine(chunk) false: it did not form them), the rows it did not
// form, or every row where engine_rows is 0, on the host by runs of
// consecutive rows in blocks of at most `block` (host(r0, n)). false when
// `stop` said to stop (checked before every chunk and block).
bool FormRows(std::int64_t m, std::int64_t block, std::int64_t engine_rows, bool classed,
              const std::vector<std::uint8_t>& class_rows,
              const std::function<bool(const RowChunk&)>& engine,
              const std::function<void(std::int64_t, std::int64_t)>& host, const StopCheck& stop);

// The rows [r0, r0 + n) of a block whose class envelopes to form: null for
// none (`classed` false), class_rows + r0 where the caller named rows (the
// options' class_rows), else *every_row filled with n ones.
const std::uint8_t* BlockClassRows(bool classed, const std::vector<std::uint8_t>& class_rows,
                                   std::int64_t r0, std::int64_t n,
                                   std::vector<std::uint8_t>* every_row);

class LogitRows {
 public:
  LogitRows(const LmHeadInputs& in, LogitModel model);

  // Rows [row0, row0 + n) of M: y [n, v] and, for LogitModel::kFp32Sum, the
  // bound y_err [n, v] on the server's fp32 logits; y_err is left empty
  // otherwise (the logits are taken as exact). kBf16Rounded rounds y to bf16.
  // With y_class (kFp32Sum only), each logit's precision-class envelope
  // [n, v] too (judgement::LogitClassEnvelope, from the models of
  // accumulation_models.h formed on threads), for the rows r with
  // class_rows[r] non-zero (class_rows null: every row; the others' 0).
  void Compute(std::int64_t row0, std::int64_t n, std::vector<double>* y,
               std::vector<double>* y_err, std::vector<double>* y_class = nullptr,
               const std::uint8_t* class_rows = nullptr) const;

 private:
  // The class envelopes of the block's logits from y and Σ|x·w|, for the
  // rows Compute's class_rows names.
  void ClassEnvelopes(std::int64_t row0, std::int64_t n, const std::vector<double>& y,
                      const std::vector<double>& y_abs, const std::uint8_t* class_rows,
                      std::vector<double>* y_class) const;

  LmHeadInputs in_;
  LogitModel model_;
  std::vector<std::int64_t> bad_w_;  // rows of W with a NaN or an infinity
};

}  // namespace logitd::reference_internal

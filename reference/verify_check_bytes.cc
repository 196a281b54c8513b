// What the checks of verify_checks.h hold in memory while they run: the
// figures Verify's plan reserves before it reads a candidate
// (server/service/call/verify_plan.cc), kept beside the block sizes the
// checks walk with.
#include <algorithm>
#include <cstdint>

#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"
#include "logitd/reference/verify_checks.h"

namespace logitd {

namespace {

constexpr std::uint64_t kDouble = sizeof(double);

// Rows of a block of `cols` columns, as the references walk them.
std::uint64_t RowsPerBlock(std::int64_t limit, std::int64_t cols) {
  return static_cast<std::uint64_t>(std::min(
      limit, std::max<std::int64_t>(1, kReferenceBlockElements / std::max<std::int64_t>(1, cols))));
}

// A block of the weight widened to doubles (numerics.cc: whole rows of at
// most kReferenceBlockElements elements).
std::uint64_t WeightBlockBytes(std::int64_t v, std::int64_t k) {
  return RowsPerBlock(v, k) * static_cast<std::uint64_t>(k) * kDouble;
}

// A block's operand widened when an engine judges it on its device: rows of
// `operand_cols` doubles, as many as Fp64Products::JudgeBlockRows gives for
// blocks of `block_cols` (at most kJudgeBlockElements / block_cols). What
// the host holds then instead of the host's blocks.
std::uint64_t JudgedBlockBytes(std::int64_t rows, std::int64_t block_cols,
                               std::int64_t operand_cols) {
  const std::int64_t n = std::min(
      rows, std::max<std::int64_t>(1, kJudgeBlockElements / std::max<std::int64_t>(1, block_cols)));
  return static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(operand_cols) * kDouble;
}

}  // namespace

// The models of a block of `rows` rows of `cols` outputs, each a sum of n
// products (ModelRows): their outputs twice (a part's and the block's),
// the rows' operands as floats and a panel on each of up to 16 threads.
std::uint64_t ModelBytes(std::uint64_t rows, std::int64_t cols, std::int64_t n) {
  const std::uint64_t c = static_cast<std::uint64_t>(cols), len = static_cast<std::uint64_t>(n);
  return rows * c * 2 * (sizeof(float) + sizeof(double)) + rows * len * sizeof(float) +
         16 * len * static_cast<std::uint64_t>(kModelPanel) * sizeof(float);
}

std::uint64_t LogitsCheckBytes(std::int64_t rows, std::int64_t v, std::int64_t k) {
  // Rows of x and |x| widened, their references and sums of |x·w| and
  // their models (or, judged on a device, a larger block of x), a row's
  // bounds on each of up to 16 threads and the rows of W with a NaN or an
  // infinity.
  const std::uint64_t n = RowsPerBlock(rows, v);
  return std::max(JudgedBlockBytes(rows, v, k),
                  n * static_cast<std::uint64_t>(2 * k + 2 * v) * kDouble + WeightBlockBytes(v, k) +
                      ModelBytes(n, v, k)) +
         static_cast<std::uint64_t>(v) * (16 * 2 * kDouble + sizeof(std::int64_t));
}

std::uint64_t GradInputCheckBytes(std::int64_t rows, std::int64_t v, std::int64_t k) {
  // A block of g widened with its references, sums and models (or, judged
  // on a device, a larger block of g).
  const std::uint64_t n = RowsPerBlock(rows, std::max(v, k));
  return std::max(JudgedBlockBytes(rows, std::max(v, k), v),
                  n * static_cast<std::uint64_t>(2 * v + 2 * k) * kDouble + WeightBlockBytes(v, k) +
                      ModelBytes(n, k, v)) +
         static_cast<std::uint64_t>(k) * (2 * kDouble + sizeof(std::int64_t));
}

std::uint64_t GradWeightCheckBytes(std::int64_t m, std::int64_t v, std::int64_t k) {
  // X widened with its magnitudes, a block of G's columns and a block of
  // dW's references, sums and models (numerics.cc: GtXBlockRows), a row's
  // references and the columns with a NaN or an infinity.
  const std::uint64_t mk = static_cast<std::uint64_t>(m) * static_cast<std::uint64_t>(k);
  const std::uint64_t rows =
      static_cast<std::uint64_t>(std::min<std::int64_t>(v, GtXBlockRows(m, k)));
  return 2 * mk * kDouble + rows * static_cast<std::uint64_t>(m + 2 * k) * kDouble +
         ModelBytes(rows, k, m) + static_cast<std::uint64_t>(3 * k) * kDouble +
         static_cast<std::uint64_t>(v + k);
}

}  // namespace logitd

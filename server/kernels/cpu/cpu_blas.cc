#include "server/kernels/cpu/cpu_blas.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "absl/strings/str_format.h"
#include "server/kernels/cpu/row_walk.h"
#include "server/kernels/fifo_mutex.h"

namespace logitd::kernels::cpu {

absl::StatusOr<FloatBuffer> AllocateFloats(std::int64_t n, bool zeroed, absl::string_view what) {
  constexpr std::int64_t kMaxFloats =
      static_cast<std::int64_t>((std::numeric_limits<std::size_t>::max() - kAlignment) / 4);
  if (n <= 0 || n > kMaxFloats) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot allocate %d fp32 elements", what, n));
  }
  std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: cannot allocate %d bytes of host memory", what, bytes));
  }
  if (zeroed) std::memset(p, 0, bytes);
  return FloatBuffer(static_cast<float*>(p));
}

// The vocabulary chunk of a block of `rows` rows of the row-wise walks
// (CeChunkRows of the block, not of the call), and the floats its logits
// take: with the block's own chunk every block of a cut call walks the
// vocabulary as the same rows of the uncut call do.
std::int64_t BlockChunk(std::int64_t requested, std::int64_t rows, std::int64_t v) {
  return CeChunkRows(requested, rows, v);
}
// Floats of a buffer that holds any block's chunk of logits in a call of
// `m` rows.
std::int64_t BlockChunkFloats(std::int64_t requested, std::int64_t m, std::int64_t v) {
  const std::int64_t full = std::min(m, kBlasRows);
  std::int64_t floats = full * BlockChunk(requested, full, v);
  const std::int64_t rest = m % kBlasRows;
  if (rest != 0) floats = std::max(floats, rest * BlockChunk(requested, rest, v));
  return floats;
}

void Widen(const Bf16Bits* in, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void Narrow(const float* in, std::int64_t n, Bf16Bits* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

namespace {

// OpenBLAS has one process-wide thread pool and already spreads one GEMM over
// every core; running GEMMs one at a time keeps results reproducible, costs
// no throughput, and keeps clear of the races the pthread build has had when
// entered from several threads at once. In the order asked: a call's many
// row blocks queue behind the other calls' instead of barging ahead.
FifoMutex& BlasMutex() {
  static FifoMutex* mu = new FifoMutex;
  return *mu;
}

}  // namespace

void Sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::int64_t m, std::int64_t n, std::int64_t k,
           float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
           float beta, float* c, std::int64_t ldc) {
  std::lock_guard<FifoMutex> lock(BlasMutex());
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void SetBlasThreads(int threads) {
  std::lock_guard<FifoMutex> lock(BlasMutex());
  openblas_set_num_threads(threads);
}

}  // namespace logitd::kernels::cpu

// The cpu backend's pieces shared by its calls (cpu_backend.cc) and its
// vocabulary walks (walks.cc): fp32 buffers, the bf16 widening, the one
// sgemm entry, the row blocks every row-wise call is cut at, and the weight.
#pragma once

#include <cblas.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/gradient_state.h"

namespace logitd::kernels::cpu {

constexpr std::size_t kAlignment = 64;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
// fp32 storage from aligned_alloc: unlike std::vector it is not zero-filled
// (temporaries are written whole by the widening or by sgemm with beta=0),
// and a failed allocation becomes a Status rather than std::bad_alloc.
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

// n floats, 64-byte aligned, zeroed when asked; InvalidArgument or
// ResourceExhausted naming `what` when they cannot be had.
absl::StatusOr<FloatBuffer> AllocateFloats(std::int64_t n, bool zeroed, absl::string_view what);

// Rows per sgemm of the row-wise calls (Logits, LogProbs, the
// cross-entropy's first pass), aligned at the call's first row: OpenBLAS's
// bits for a row depend on the rows beside it (threads' split, edge kernels),
// so a call cut at multiples of it runs the very products of the uncut one.
constexpr std::int64_t kBlasRows = 256;

// The vocabulary chunk of a block of `rows` rows of the row-wise walks
// (CeChunkRows of the block, not of the call), and the floats its logits
// take: with the block's own chunk every block of a cut call walks the
// vocabulary as the same rows of the uncut call do.
std::int64_t BlockChunk(std::int64_t requested, std::int64_t rows, std::int64_t v);
// Floats of a buffer that holds any block's chunk of logits in a call of
// `m` rows.
std::int64_t BlockChunkFloats(std::int64_t requested, std::int64_t m, std::int64_t v);

// bf16 to fp32 (exact) and fp32 to bf16 (round to nearest even), n values.
void Widen(const Bf16Bits* in, std::int64_t n, float* out);
void Narrow(const float* in, std::int64_t n, Bf16Bits* out);

// C = alpha op(A) op(B) + beta C, row-major, one sgemm at a time (see
// BlasMutex in cpu_blas.cc).
void Sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::int64_t m, std::int64_t n, std::int64_t k,
           float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
           float beta, float* c, std::int64_t ldc);

// OpenBLAS's thread count (one pool for the process), set between sgemms.
void SetBlasThreads(int threads);

// W [V, K] kept only as its fp32 widening: every bf16 value is an fp32 value,
// so the bf16 bytes are recoverable exactly and sgemm reads W without a
// per-call conversion.
class CpuWeight final : public Weight {
 public:
  CpuWeight(std::int64_t v, std::int64_t k, FloatBuffer w)
      : Weight(v, k), w_(std::move(w)), gradient_(weight_bytes()) {}

  std::uint64_t weight_bytes() const override {
    return static_cast<std::uint64_t>(v()) * static_cast<std::uint64_t>(k()) * sizeof(float);
  }
  std::uint64_t gradient_bytes() const override { return gradient_.bytes(); }

  const float* data() const { return w_.get(); }
  std::int64_t numel() const { return v() * k(); }

  // [V, K] fp32 in host memory, the same size as the fp32 weight.
  GradientState<FloatBuffer>& gradient() { return gradient_; }

 private:
  FloatBuffer w_;
  GradientState<FloatBuffer> gradient_;
};

// Weights reach a backend through the shared interface; one loaded by
// another backend is a caller error, not a crash.
template <typename W>
auto* AsCpuWeight(W& w) {
  using Target = std::conditional_t<std::is_const_v<W>, const CpuWeight, CpuWeight>;
  return dynamic_cast<Target*>(&w);
}

}  // namespace logitd::kernels::cpu

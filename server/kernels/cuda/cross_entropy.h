// The fused cross-entropy over device buffers: the walk over the vocabulary
// in chunks (cuBLASLt fp32 logits, our row reductions, G, then dX and dW per
// chunk) that the backend runs behind Backend::CrossEntropy and the benchmark
// runs on PyTorch's tensors. Everything is enqueued on one stream; no host
// copies and no synchronization here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace logitd::kernels::cuda {

// An automatically chosen chunk keeps its workspace (fp32 logits, bf16 G and
// any dW staging) within this, or within a quarter of a configured device
// memory budget when that is smaller.
inline constexpr std::uint64_t kCeWorkspaceBytes = 256u << 20;
// Chunks are multiples of this many vocabulary rows (the last one excepted):
// the row reductions' segments then sit at fixed vocabulary positions, so lse
// and loss do not depend on the chunk size; W chunk pointers stay as aligned
// as W itself.
inline constexpr std::int64_t kCeChunkQuantum = 1024;

// Device bytes one call needs besides its inputs and outputs.
struct CeScratchSizes {
  std::size_t logits = 0;  // [m, chunk] fp32
  std::size_t g = 0;       // [m, chunk] bf16; 0 without gradients
  std::size_t rows = 0;    // per-row state and per-segment partials
  std::size_t dx_acc = 0;  // [m, k] fp32 when dX is returned in bf16
  std::size_t total() const { return logits + g + rows + dx_acc; }
};
CeScratchSizes CeScratch(std::int64_t m, std::int64_t k, std::int64_t chunk, bool grads,
                         bool dx_bf16);

// The chunk chosen when the caller leaves it open, a pure function of its
// arguments (so the same request gets the same chunk): the largest multiple
// of kCeChunkQuantum whose workspace, m * (4 + 2 with gradients) bytes plus
// extra_per_vocab_row bytes per vocabulary row, fits in workspace_bytes;
// never below one quantum; all of V when it fits; evened out so that the last
// chunk is not a sliver.
std::int64_t ChooseCeChunk(std::int64_t m, std::int64_t v, bool grads,
                           std::uint64_t extra_per_vocab_row, std::uint64_t workspace_bytes);
// A requested chunk rounded up to a multiple of kCeChunkQuantum, at most V.
std::int64_t RoundCeChunk(std::int64_t requested, std::int64_t v);

struct CeProblem {
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
  // Vocabulary rows per chunk, in [1, v]; a multiple of kCeChunkQuantum
  // keeps lse and loss independent of it.
  std::int64_t chunk = 0;
  std::int64_t ignore_index = -100;
  float z_loss = 0.0f;
  float logit_softcap = 0.0f;
  float grad_scale = 1.0f;
};

// Device pointers.
struct CeBuffers {
  const void* x = nullptr;                // [m, k] bf16
  const void* w = nullptr;                // [v, k] bf16
  const std::int64_t* targets = nullptr;  // [m], each in [0, v) or ignore_index
  float* loss = nullptr;                  // [m]
  float* lse = nullptr;                   // [m] or null
  void* dx = nullptr;                     // [m, k] or null
  bool dx_bf16 = true;
  // Scratch of CeScratch's sizes; g only with gradients, dx_acc only for a
  // bf16 dX (an fp32 dX accumulates in place).
  float* logits = nullptr;
  std::uint16_t* g = nullptr;
  void* rows = nullptr;
  float* dx_acc = nullptr;
};

// Where dW's rows go, chunk by chunk: a device tensor, a weight's gradient
// buffer, or staging on the way to the host.
class CeDwSink {
 public:
  virtual ~CeDwSink() = default;
  // The destination of dW rows [c0, c0 + n): [n, k] fp32, row stride k.
  virtual absl::StatusOr<float*> Begin(std::int64_t c0, std::int64_t n) = 0;
  // 0 overwrites the destination, 1 adds to it.
  virtual float beta() const = 0;
  // The chunk's dW GEMM has been enqueued.
  virtual absl::Status End(std::int64_t c0, std::int64_t n) = 0;
};

// dW rows straight into a device [v, k] fp32 array.
class DeviceDwSink final : public CeDwSink {
 public:
  DeviceDwSink(float* dw, std::int64_t k, float beta) : dw_(dw), k_(k), beta_(beta) {}
  absl::StatusOr<float*> Begin(std::int64_t c0, std::int64_t /*n*/) override {
    return dw_ + c0 * k_;
  }
  float beta() const override { return beta_; }
  absl::Status End(std::int64_t /*c0*/, std::int64_t /*n*/) override { return absl::OkStatus(); }

 private:
  float* dw_;
  std::int64_t k_;
  float beta_;
};

// Enqueues the whole computation on s.stream. Pass 1 walks the chunks in
// order: logits, then per-row max/sum-exp folded into running values and the
// target logit; then loss and lse. Pass 2, when dX or dW is wanted, walks the
// chunks backwards, starting with the last chunk's logits still in the buffer
// and recomputing the others: G, dX += G.W_chunk (fp32, rounded once at the
// end when bf16) and dW rows = G^T.X into the sink. dw may be null.
absl::Status RunCrossEntropy(GemmEngine& engine, const GemmStream& s, const CeProblem& p,
                             const CeBuffers& b, CeDwSink* dw);

}  // namespace logitd::kernels::cuda

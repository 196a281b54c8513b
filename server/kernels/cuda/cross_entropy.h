// The fused cross-entropy over device buffers: a walk over the logits in
// chunks (cuBLASLt fp32 logits, our row reductions, G, then dX and dW per
// chunk) that the backend runs behind Backend::CrossEntropy and the benchmark
// runs on PyTorch's tensors. Everything is enqueued on one stream; no host
// copies and no synchronization here.
//
// Two walks. The vocabulary walk takes chunks of vocabulary rows over every
// token: one pass for loss and lse, then, with gradients, a second that
// recomputes each chunk's logits (8·M·K·V of GEMM work). The token walk takes
// chunks of tokens over the whole vocabulary: each chunk's logits once, G
// written over them in place, dX rows, and dW += Gᵀ·X (6·M·K·V, plus one
// read-modify-write of dW per chunk). Both fold the same segments in the same
// order, so given the same logits they give the same lse, loss and G bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace logitd::kernels::cuda {

// An automatically chosen chunk keeps its workspace (fp32 logits, bf16 G and
// any dW staging) within this, or within a quarter of a configured device
// memory budget when that is smaller.
inline constexpr std::uint64_t kCeWorkspaceBytes = 256u << 20;
// Without gradients (the loss-only walk, and LogProbs, which walks the same
// chunks so that its results are bitwise the cross-entropy's) the chunk's
// logits are read once, right after the GEMM wrote them: chunks of
// kCeStatsChunkBytes or less run faster on the H200 (a 1,024-token call in
// 8,192-column chunks takes 0.84 to 0.90 times as long as in two halves of the
// vocabulary: docs/BENCHMARKS.md) and hold an eighth of the memory. No
// chunk is narrowed below kCeStatsMinColumns for it, which keeps the GEMMs
// wide and the launches few.
inline constexpr std::uint64_t kCeStatsChunkBytes = 32u << 20;
inline constexpr std::int64_t kCeStatsMinColumns = 8192;
// The vocabulary walk's allowance without gradients, before any configured
// workspace or device budget: kCeStatsChunkBytes, or kCeStatsMinColumns of
// m tokens' fp32 logits when that is more; never above kCeWorkspaceBytes.
std::uint64_t CeStatsWorkspace(std::int64_t m);
// Chunks are multiples of this many vocabulary rows (the last one excepted):
// the row reductions' segments then sit at fixed vocabulary positions, so lse
// and loss do not depend on the chunk size; W chunk pointers stay as aligned
// as W itself.
inline constexpr std::int64_t kCeChunkQuantum = 1024;

// Token-walk chunks are multiples of this many tokens (the last one excepted).
inline constexpr std::int64_t kCeTokenQuantum = 64;
// Below this many tokens per chunk the token walk's dW passes (one
// read-modify-write of the fp32 dW per chunk) cost more than the vocabulary
// walk's recomputation, and the vocabulary walk is chosen (on the H200 the
// two tie at 512 tokens: docs/BENCHMARKS.md).
inline constexpr std::int64_t kCeMinTokenChunk = 512;

enum class CeWalk { kVocabulary, kTokens };
const char* CeWalkName(CeWalk walk);

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
// The token walk's scratch for chunks of `chunk` tokens: [chunk, v] fp32
// logits (G goes over them), the per-row state, and a [chunk, k] fp32 dX
// staging when dX is bf16.
CeScratchSizes CeTokenScratch(std::int64_t chunk, std::int64_t v, std::int64_t k, bool dx_bf16);

// The token walk's workspace allowance: kCeTokenWorkspacePercent of the
// gradient outputs it writes (dX and dW), which leaves room for the per-row
// state and the cuBLASLt workspace within 1.5 times them (issue 19's memory
// budget; larger chunks mean fewer read-modify-writes of the fp32 dW, and on
// the H200 the walk at 1,024 to 2,048 tokens runs 1.1 to 1.2 times faster than
// at 512: docs/BENCHMARKS.md); never less than kCeWorkspaceBytes.
inline constexpr std::uint64_t kCeTokenWorkspacePercent = 45;
std::uint64_t CeTokenWorkspace(std::uint64_t gradient_output_bytes);
// Tokens per chunk for the token walk: the largest multiple of
// kCeTokenQuantum whose CeTokenScratch fits in workspace_bytes, all of m
// when it fits, evened out; 0 when fewer than kCeMinTokenChunk tokens (and
// fewer than m) fit, which means: take the vocabulary walk.
std::int64_t ChooseCeTokenChunk(std::int64_t m, std::int64_t v, std::int64_t k, bool dx_bf16,
                                std::uint64_t workspace_bytes);

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

// What a call's plan depends on: its shapes, the outputs it asks for and the
// backend's memory settings.
struct CePlanRequest {
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
  bool want_dx = false;
  bool dx_bf16 = false;        // dX wanted and returned in bf16
  bool want_dw = false;        // dW returned or accumulated
  bool accumulate_dw = false;  // into the weight's buffer on the device
  // The caller's vocabulary rows per chunk; 0 (or less) leaves the walk and
  // the chunk to the plan.
  std::int64_t vocab_chunk = 0;
  // BackendOptions::ce_workspace_bytes (0: the plan's own choice) and
  // BackendOptions::device_memory_budget (0: none).
  std::uint64_t workspace_bytes = 0;
  std::uint64_t device_memory_budget = 0;
};

// The walk, its chunk and the scratch it needs.
struct CePlan {
  CeWalk walk = CeWalk::kVocabulary;
  std::int64_t chunk = 0;
  CeScratchSizes sizes;
  // The allowances the chunk was chosen from, which ShrinkCePlan halves.
  std::uint64_t workspace = 0;        // the vocabulary walk's
  std::uint64_t token_workspace = 0;  // the token walk's; 0 when not considered
};

// The plan a call starts with, a pure function of the request (so the same
// request gets the same chunk): the token walk (each logit computed once)
// when gradients are wanted, the caller did not ask for a vocabulary chunk
// and at least a token chunk fits in the token walk's allowance
// (CeTokenWorkspace of the gradient outputs, or the configured workspace);
// otherwise the vocabulary walk in the caller's chunk (whole quanta) or one
// chosen to fit kCeWorkspaceBytes (or the configured workspace). Both
// allowances are capped at a quarter of the device memory budget.
CePlan PlanCrossEntropy(const CePlanRequest& r);
// The plan to try when `plan`'s scratch could not be allocated: the token
// walk's allowance halved (the vocabulary walk once no token chunk fits in
// it), or the vocabulary walk's allowance halved; nullopt when there is
// nothing smaller to try (the caller's own chunk, or one quantum).
std::optional<CePlan> ShrinkCePlan(const CePlanRequest& r, const CePlan& plan);

struct CeProblem {
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t k = 0;
  CeWalk walk = CeWalk::kVocabulary;
  // Vocabulary walk: vocabulary rows per chunk, in [1, v]; a multiple of
  // kCeChunkQuantum keeps lse and loss independent of it. Token walk: tokens
  // per chunk, in [1, m].
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
  // Scratch of CeScratch's (or CeTokenScratch's) sizes; g only with
  // gradients in the vocabulary walk, dx_acc only for a bf16 dX (an fp32 dX
  // accumulates in place).
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

// Enqueues the whole computation on s.stream. dw may be null.
//
// Vocabulary walk: pass 1 walks the chunks in order: logits, then per-row
// max/sum-exp folded into running values and the target logit; then loss
// and lse. Pass 2, when dX or dW is wanted, walks the chunks backwards,
// starting with the last chunk's logits still in the buffer and recomputing
// the others: G, dX += G.W_chunk (fp32, rounded once at the end when bf16)
// and dW rows = G^T.X into the sink.
//
// Token walk: per chunk of tokens, in order: logits [chunk, v], the same row
// reductions over all of v, loss and lse, G in place, dX rows = G.W (fp32,
// rounded once when bf16), then dW += G^T.X_chunk, the first chunk with the
// sink's beta. The sink must give all of dW at Begin(0, v).
absl::Status RunCrossEntropy(GemmEngine& engine, const GemmStream& s, const CeProblem& p,
                             const CeBuffers& b, CeDwSink* dw);

}  // namespace logitd::kernels::cuda

// LogProbs over device buffers: the cross-entropy's vocabulary walk without
// gradients (cuBLASLt fp32 logits chunk by chunk, the row statistics folded
// as the cross-entropy folds them) plus the entropy's sums and the top-k;
// for the target's rank, a second walk that recomputes each chunk's logits
// and counts the entries ranked before the target. Everything is enqueued on
// one stream; no host copies and no synchronization here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace logitd::kernels::cuda {

// Device bytes one call needs besides x and W: the fp32 logits of a chunk,
// the rows buffer (per-row state, partials, targets and the outputs) and the
// top-k lists with their merge scratch.
struct LpScratchSizes {
  std::size_t logits = 0;
  std::size_t rows = 0;
  std::size_t lists = 0;
  std::size_t total() const { return logits + rows + lists; }
};
LpScratchSizes LpScratch(std::int64_t m, std::int64_t chunk, int top_k);

// Where the targets go and the outputs come from, inside the rows buffer
// (see LpScratch).
struct LpRowsIo {
  std::int64_t* targets = nullptr;   // [m]
  float* logprob = nullptr;          // [m]
  float* lse = nullptr;              // [m]
  float* entropy = nullptr;          // [m]
  std::int64_t* rank = nullptr;      // [m]; -1 for an ignored target
  std::int32_t* topk_ids = nullptr;  // [m, top_k]
  float* topk_logprobs = nullptr;    // [m, top_k]
};
LpRowsIo LpIo(void* rows, std::int64_t m, std::int64_t chunk, int top_k);

struct LpProblem {
  std::int64_t m = 0;
  std::int64_t v = 0;  // vocabulary rows walked: the first v rows of W
  std::int64_t k = 0;
  // Vocabulary rows per chunk, in [1, v]; a multiple of kCeChunkQuantum
  // keeps every result independent of it (given the same logits).
  std::int64_t chunk = 0;
  bool has_targets = false;
  std::int64_t ignore_index = -100;
  float temperature = 1.0f;
  float logit_softcap = 0.0f;
  int top_k = 0;
  bool want_logprob = false;  // these need has_targets
  bool want_rank = false;
  bool want_lse = false;
  bool want_entropy = false;
};

// Device pointers; scratch of LpScratch's sizes.
struct LpBuffers {
  const void* x = nullptr;  // [m, k] bf16
  const void* w = nullptr;  // [>= v, k] bf16
  float* logits = nullptr;
  void* rows = nullptr;
  void* lists = nullptr;  // null when top_k is 0
};

// Enqueues the call on s.stream; the results land in LpIo(b.rows, ...),
// targets being read from there.
absl::Status RunLogProbs(GemmEngine& engine, const GemmStream& s, const LpProblem& p,
                         const LpBuffers& b);

}  // namespace logitd::kernels::cuda

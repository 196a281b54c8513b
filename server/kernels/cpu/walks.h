// The cpu backend's walks over the vocabulary, chunk by chunk, in blocks of
// kBlasRows rows: the cross-entropy's two passes and LogProbs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/kernels/backend.h"
#include "server/kernels/cpu/cpu_blas.h"
#include "server/kernels/cpu/row_walk.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"

namespace logitd::kernels::cpu {

// The cross-entropy's first pass over the vocabulary, in blocks of
// kBlasRows rows and each block chunk by chunk (BlockChunk): each row's
// running max and sum of exponentials, tile by tile, and the target's capped
// logit; the very products LogProbs forms, so that its lse and logprob are
// this pass's bits. `buf` holds a block's chunk of logits.
void CeRowsPass(const CrossEntropyArgs& args, const CpuWeight& w, const float* xf, float* buf,
                std::vector<CeRow>* rows, std::vector<float>* z_target);
// The cross-entropy's second pass, in the first pass's blocks of kBlasRows
// rows with their chunks: G chunk by chunk (the logits again, then
// CeGradChunk), into the block's rows of dX (dx_acc, fp32, written whole by
// the block's first chunk), so that a row's dX depends on its block alone,
// and into dW (every block's G_chunkᵀ.X_block added in turn; returned, or
// added to the weight's gradient buffer under its lock for the whole pass,
// so that FetchGradient never sees part of a call's dW; the call counts
// once). A bf16 dX is rounded once at the end.
absl::Status CeGradientPass(const CrossEntropyArgs& args, CpuWeight& w, const float* xf,
                            const std::vector<float>& lse, float* buf, float* dx_acc);

// LogProbs of at most kBlasRows rows (its kernel cuts a call into such
// blocks): the walk over the vocabulary, then the ranks when asked.
absl::Status LogProbsRows(const CpuWeight& w, const LogProbsArgs& args);

}  // namespace logitd::kernels::cpu

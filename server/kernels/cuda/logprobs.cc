#include "server/kernels/cuda/logprobs.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "logitd/protocol.h"
#include "server/kernels/cuda/cross_entropy_kernels.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/logprobs_kernels.h"

namespace logitd::kernels::cuda {
namespace {

constexpr std::size_t kAlignment = 256;

// Byte offsets of a call's arrays in its rows and lists buffers.
struct LpLayout {
  std::size_t run_max = 0, run_sum = 0, target_z = 0, seg_max = 0, seg_sum = 0;
  std::size_t run_zsum = 0, seg_zsum = 0;
  std::size_t targets = 0, logprob = 0, lse = 0, entropy = 0, rank = 0;
  std::size_t topk_ids = 0, topk_logprobs = 0;
  std::size_t rows_total = 0;
  std::int64_t row_lists = 0;  // segments of the widest chunk + 1
  std::size_t merge = 0;       // in the lists buffer
  std::size_t lists_total = 0;
};

LpLayout MakeLpLayout(std::int64_t m, std::int64_t chunk, int top_k) {
  const auto rows = static_cast<std::size_t>(m);
  const std::int64_t segments = CeSegments(chunk);
  const std::size_t partials = rows * static_cast<std::size_t>(segments);
  const std::size_t topk = rows * static_cast<std::size_t>(top_k);
  LpLayout l;
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t here = at;
    at += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    return here;
  };
  l.run_max = take(rows * sizeof(float));
  l.run_sum = take(rows * sizeof(double));
  l.target_z = take(rows * sizeof(float));
  l.seg_max = take(partials * sizeof(float));
  l.seg_sum = take(partials * sizeof(double));
  l.run_zsum = take(rows * sizeof(double));
  l.seg_zsum = take(partials * sizeof(double));
  l.targets = take(rows * sizeof(std::int64_t));
  l.logprob = take(rows * sizeof(float));
  l.lse = take(rows * sizeof(float));
  l.entropy = take(rows * sizeof(float));
  l.rank = take(rows * sizeof(std::int64_t));
  l.topk_ids = take(topk * sizeof(std::int32_t));
  l.topk_logprobs = take(topk * sizeof(float));
  l.rows_total = at;
  if (top_k > 0) {
    l.row_lists = segments + 1;
    const std::size_t keys = topk * static_cast<std::size_t>(l.row_lists);
    l.merge = (keys * sizeof(std::uint64_t) + kAlignment - 1) / kAlignment * kAlignment;
    l.lists_total = l.merge + static_cast<std::size_t>(LpMergeKeys(m, l.row_lists, top_k)) *
                                  sizeof(std::uint64_t);
  }
  return l;
}

template <typename T>
T* At(void* base, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::byte*>(base) + offset);
}

}  // namespace

LpScratchSizes LpScratch(std::int64_t m, std::int64_t chunk, int top_k) {
  const LpLayout l = MakeLpLayout(m, chunk, top_k);
  LpScratchSizes s;
  s.logits = static_cast<std::size_t>(m) * static_cast<std::size_t>(chunk) * sizeof(float);
  s.rows = l.rows_total;
  s.lists = l.lists_total;
  return s;
}

LpRowsIo LpIo(void* rows, std::int64_t m, std::int64_t chunk, int top_k) {
  const LpLayout l = MakeLpLayout(m, chunk, top_k);
  LpRowsIo io;
  io.targets = At<std::int64_t>(rows, l.targets);
  io.logprob = At<float>(rows, l.logprob);
  io.lse = At<float>(rows, l.lse);
  io.entropy = At<float>(rows, l.entropy);
  io.rank = At<std::int64_t>(rows, l.rank);
  io.topk_ids = At<std::int32_t>(rows, l.topk_ids);
  io.topk_logprobs = At<float>(rows, l.topk_logprobs);
  return io;
}

namespace {

// The problem and its buffers as RunLogProbs needs them; `shape` names it.
absl::Status CheckLpProblem(const LpProblem& p, const LpBuffers& b, const std::string& shape) {
  if (p.m <= 0 || p.v <= 0 || p.k <= 0 || p.chunk <= 0 || p.chunk > p.v || p.top_k < 0 ||
      p.top_k > kMaxTopK || p.top_k > p.v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log probs: expected positive M, V, K, a chunk in [1, V] and top_k in [0, min(V, ",
        kMaxTopK, ")], got ", shape, ",top_k=", p.top_k));
  }
  if ((p.want_logprob || p.want_rank) && !p.has_targets) {
    return absl::InvalidArgumentError("log probs: logprob and rank need targets");
  }
  if (b.x == nullptr || b.w == nullptr || b.logits == nullptr || b.rows == nullptr ||
      (p.top_k > 0 && b.lists == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("log probs: a device buffer is missing (", shape, ")"));
  }
  const std::int64_t segments = CeSegments(p.chunk);
  if (p.m > std::numeric_limits<std::int32_t>::max() / (segments + 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log probs: ", shape, " needs more than 2^31 row segments; use a smaller chunk"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunLogProbs(GemmEngine& engine, const GemmStream& s, const LpProblem& p,
                         const LpBuffers& b) {
  const std::string shape =
      absl::StrCat("M=", p.m, ",V=", p.v, ",K=", p.k, ",vocabulary chunk=", p.chunk);
  LOGITD_CUDA_RETURN_IF_ERROR(CheckLpProblem(p, b, shape));
  const LpLayout l = MakeLpLayout(p.m, p.chunk, p.top_k);
  const LpRowsIo io = LpIo(b.rows, p.m, p.chunk, p.top_k);
  LpRowState state;
  state.ce.run_max = At<float>(b.rows, l.run_max);
  state.ce.run_sum = At<double>(b.rows, l.run_sum);
  state.ce.target_z = At<float>(b.rows, l.target_z);
  state.ce.seg_max = At<float>(b.rows, l.seg_max);
  state.ce.seg_sum = At<double>(b.rows, l.seg_sum);
  state.run_zsum = At<double>(b.rows, l.run_zsum);
  state.seg_zsum = At<double>(b.rows, l.seg_zsum);
  if (p.want_rank) state.above = reinterpret_cast<unsigned long long*>(io.rank);
  LpRowParams params;
  params.targets = p.has_targets ? io.targets : nullptr;
  params.ignore_index = p.ignore_index;
  params.logit_softcap = p.logit_softcap;
  params.temperature = p.temperature;
  params.entropy = p.want_entropy;
  params.top_k = p.top_k;
  LpTopKLists lists;
  if (p.top_k > 0) {
    lists.keys = At<std::uint64_t>(b.lists, 0);
    lists.row_lists = l.row_lists;
    lists.merge = At<std::uint64_t>(b.lists, l.merge);
  }

  const std::int64_t chunks = (p.v + p.chunk - 1) / p.chunk;
  const auto* w = static_cast<const std::uint16_t*>(b.w);
  auto columns = [&](std::int64_t c) { return std::min(p.chunk, p.v - c * p.chunk); };
  // The same product, operands and alignment as the forward Logits path and
  // the cross-entropy's vocabulary walk.
  auto logits = [&](std::int64_t c) {
    return engine.Run(LogitsShape(p.m, columns(c), p.k, CUDA_R_32F),
                      GemmOperands{b.x, w + c * p.chunk * p.k, b.logits, 1.0f, 0.0f}, s);
  };
  RETURN_IF_CUDA_ERROR(LaunchLpInit(p.m, params, state, lists, s.stream),
                       "log probs: init kernel (", shape, ")");
  for (std::int64_t c = 0; c < chunks; ++c) {
    LOGITD_CUDA_RETURN_IF_ERROR(logits(c));
    RETURN_IF_CUDA_ERROR(
        LaunchLpChunkStats(b.logits, p.m, columns(c), c * p.chunk, params, state, lists, s.stream),
        "log probs: row statistics kernel (chunk ", c, " of ", chunks, ", ", shape, ")");
  }
  RETURN_IF_CUDA_ERROR(
      LaunchLpFinalize(p.m, params, state, lists, p.want_logprob ? io.logprob : nullptr,
                       p.want_lse ? io.lse : nullptr, p.want_entropy ? io.entropy : nullptr,
                       io.topk_ids, io.topk_logprobs, s.stream),
      "log probs: finalize kernel (", shape, ")");
  if (!p.want_rank) return absl::OkStatus();
  for (std::int64_t i = 0; i < chunks; ++i) {
    // Backwards: the last chunk's logits are still in the buffer.
    const std::int64_t c = chunks - 1 - i;
    if (i > 0) LOGITD_CUDA_RETURN_IF_ERROR(logits(c));
    RETURN_IF_CUDA_ERROR(
        LaunchLpRank(b.logits, p.m, columns(c), c * p.chunk, params, state, s.stream),
        "log probs: rank kernel (chunk ", c, " of ", chunks, ", ", shape, ")");
  }
  return absl::OkStatus();
}

}  // namespace logitd::kernels::cuda

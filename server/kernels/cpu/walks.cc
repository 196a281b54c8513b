#include "server/kernels/cpu/walks.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_format.h"

namespace logitd::kernels::cpu {

// The cross-entropy's first pass over the vocabulary, in blocks of
// kBlasRows rows and each block chunk by chunk (BlockChunk): each row's
// running max and sum of exponentials, tile by tile, and the target's capped
// logit; the very products LogProbs forms, so that its lse and logprob are
// this pass's bits. `buf` holds a block's chunk of logits.
void CeRowsPass(const CrossEntropyArgs& args, const CpuWeight& w, const float* xf, float* buf,
                std::vector<CeRow>* rows, std::vector<float>* z_target) {
  const std::int64_t m = args.m, v = w.v(), k = w.k();
  for (std::int64_t r0 = 0; r0 < m; r0 += kBlasRows) {
    const std::int64_t mb = std::min(kBlasRows, m - r0);
    const std::int64_t chunk = BlockChunk(args.vocab_chunk, mb, v);
    for (std::int64_t v0 = 0; v0 < v; v0 += chunk) {
      const std::int64_t c = std::min(chunk, v - v0);
      float* y = buf;
      Sgemm(CblasNoTrans, CblasTrans, mb, c, k, 1.0f, xf + r0 * k, k, w.data() + v0 * k, k, 0.0f, y,
            c);
      for (std::int64_t i = r0; i < r0 + mb; ++i) {
        float* z = y + (i - r0) * c;
        CeSoftcap(args.logit_softcap, z, c);
        CeRow& row = (*rows)[static_cast<std::size_t>(i)];
        for (std::int64_t j = 0; j < c; j += kCeTile) {
          float tile_max = 0.0f;
          float tile_sum = 0.0f;
          CeTileMaxSum(z + j, std::min(kCeTile, c - j), &tile_max, &tile_sum);
          row.Fold(tile_max, tile_sum);
        }
        const std::int64_t t = args.targets[i];
        if (t != args.ignore_index && t >= v0 && t < v0 + c) {
          (*z_target)[static_cast<std::size_t>(i)] = z[t - v0];
        }
      }
    }
  }
}

// The cross-entropy's second pass, in the first pass's blocks of kBlasRows
// rows with their chunks: G chunk by chunk (the logits again, then
// CeGradChunk), into the block's rows of dX (dx_acc, fp32, written whole by
// the block's first chunk), so that a row's dX depends on its block alone,
// and into dW (every block's G_chunkᵀ.X_block added in turn; returned, or
// added to the weight's gradient buffer under its lock for the whole pass,
// so that FetchGradient never sees part of a call's dW; the call counts
// once). A bf16 dX is rounded once at the end.
absl::Status CeGradientPass(const CrossEntropyArgs& args, CpuWeight& w, const float* xf,
                            const std::vector<float>& lse, float* buf, float* dx_acc) {
  const std::int64_t m = args.m, v = w.v(), k = w.k();
  const bool want_dx = args.dx != nullptr;
  std::optional<GradientState<FloatBuffer>::Lock> gradient;
  float* dw = args.dw;
  float dw_beta = 0.0f;
  if (args.accumulate_dw) {
    gradient.emplace(w.gradient().Acquire());
    absl::StatusOr<FloatBuffer*> g = gradient->GetOrCreate([&] {
      return AllocateFloats(v * k, /*zeroed=*/true, "cross entropy: fp32 gradient buffer");
    });
    if (!g.ok()) return g.status();
    dw = (*g)->get();
    dw_beta = 1.0f;
  }
  for (std::int64_t r0 = 0; r0 < m; r0 += kBlasRows) {
    const std::int64_t mb = std::min(kBlasRows, m - r0);
    const std::int64_t chunk = BlockChunk(args.vocab_chunk, mb, v);
    CrossEntropyArgs block = args;
    block.m = mb;
    block.targets = args.targets + r0;
    const std::vector<float> block_lse(lse.begin() + r0, lse.begin() + r0 + mb);
    const float* xb = xf + r0 * k;
    for (std::int64_t v0 = 0; v0 < v; v0 += chunk) {
      const std::int64_t c = std::min(chunk, v - v0);
      float* g = buf;
      Sgemm(CblasNoTrans, CblasTrans, mb, c, k, 1.0f, xb, k, w.data() + v0 * k, k, 0.0f, g, c);
      CeGradChunk(block, block_lse, v0, c, g);
      if (want_dx) {
        // dX [mb, K] += G_chunk [mb, c] . W_chunk [c, K]
        Sgemm(CblasNoTrans, CblasNoTrans, mb, k, c, 1.0f, g, c, w.data() + v0 * k, k,
              v0 == 0 ? 0.0f : 1.0f, dx_acc + r0 * k, k);
      }
      if (dw != nullptr) {
        // dW rows [v0, v0 + c) (+)= G_chunkᵀ [c, mb] . X_block [mb, K]
        Sgemm(CblasTrans, CblasNoTrans, c, k, mb, 1.0f, g, c, xb, k, r0 == 0 ? dw_beta : 1.0f,
              dw + v0 * k, k);
      }
    }
  }
  if (args.accumulate_dw) gradient->CountCall();
  if (want_dx && args.dx_dtype == DType::kBf16) {
    Narrow(dx_acc, m * k, static_cast<Bf16Bits*>(args.dx));
  }
  return absl::OkStatus();
}

namespace {

// A LogProbs row's target, or ignore_index when the call gives none.
std::int64_t LpTarget(const LogProbsArgs& args, std::int64_t i) {
  return args.targets != nullptr ? args.targets[i] : args.ignore_index;
}

// LogProbs' per-token outputs from the rows' running sums: lse, entropy,
// the target's log-prob (0 for an ignored token) and the top-k.
void LpWriteRows(const LogProbsArgs& args, const std::vector<LpRow>& rows,
                 const std::vector<float>& z_target, std::vector<LpTopK>* best) {
  for (std::int64_t i = 0; i < args.m; ++i) {
    const auto r = static_cast<std::size_t>(i);
    const double lse = rows[r].lse.Lse();
    if (args.lse != nullptr) args.lse[i] = static_cast<float>(lse);
    if (args.entropy != nullptr) args.entropy[i] = static_cast<float>(rows[r].Entropy());
    if (args.logprob != nullptr) {
      args.logprob[i] = LpTarget(args, i) == args.ignore_index
                            ? 0.0f
                            : static_cast<float>(static_cast<double>(z_target[r]) - lse);
    }
    if (args.top_k > 0) {
      (*best)[r].Write(lse, args.topk_ids + i * args.top_k, args.topk_logprobs + i * args.top_k);
    }
  }
}

// Each target's rank (-1 for an ignored token): a second pass over the
// vocabulary counting the entries before it. logits(v0, c) gives the z of a
// chunk, [m, c].
template <typename Logits>
void LpRanks(const LogProbsArgs& args, std::int64_t chunk, const Logits& logits,
             const std::vector<float>& z_target) {
  const std::int64_t m = args.m, v = args.vocab;
  std::vector<std::int64_t> above(static_cast<std::size_t>(m), 0);
  for (std::int64_t v0 = 0; v0 < v; v0 += chunk) {
    const std::int64_t c = std::min(chunk, v - v0);
    const float* y = logits(v0, c);
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t t = LpTarget(args, i);
      if (t == args.ignore_index) continue;
      const float zt = z_target[static_cast<std::size_t>(i)];
      const float* z = y + i * c;
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < c; ++j) n += LpBefore(z[j], v0 + j, zt, t) ? 1 : 0;
      above[static_cast<std::size_t>(i)] += n;
    }
  }
  for (std::int64_t i = 0; i < m; ++i) {
    args.rank[i] = LpTarget(args, i) == args.ignore_index ? -1 : above[static_cast<std::size_t>(i)];
  }
}

}  // namespace

absl::Status LogProbsRows(const CpuWeight& w, const LogProbsArgs& args) {
  const std::int64_t m = args.m;
  const std::int64_t v = args.vocab;
  const std::int64_t k = w.k();
  const std::int64_t top_k = args.top_k;
  const bool scaled = args.temperature != 1.0f;
  const std::int64_t chunk = BlockChunk(args.vocab_chunk, m, v);
  absl::StatusOr<FloatBuffer> xf = AllocateFloats(m * k, false, "log probs: x widened");
  if (!xf.ok()) return xf.status();
  Widen(args.x, m * k, xf->get());
  absl::StatusOr<FloatBuffer> buf = AllocateFloats(
      m * chunk, false, absl::StrFormat("log probs: fp32 logits of a chunk [%d, %d]", m, chunk));
  if (!buf.ok()) return buf.status();
  // z of a chunk, capped and scaled, row by row.
  const auto logits = [&](std::int64_t v0, std::int64_t c) {
    float* y = buf->get();
    Sgemm(CblasNoTrans, CblasTrans, m, c, k, 1.0f, xf->get(), k, w.data() + v0 * k, k, 0.0f, y, c);
    for (std::int64_t i = 0; i < m; ++i) {
      float* z = y + i * c;
      CeSoftcap(args.logit_softcap, z, c);
      if (scaled) {
        for (std::int64_t j = 0; j < c; ++j) z[j] /= args.temperature;
      }
    }
    return y;
  };
  std::vector<LpRow> rows(static_cast<std::size_t>(m));
  std::vector<LpTopK> best(static_cast<std::size_t>(top_k > 0 ? m : 0), LpTopK(top_k));
  std::vector<float> z_target(static_cast<std::size_t>(m), 0.0f);
  for (std::int64_t v0 = 0; v0 < v; v0 += chunk) {
    const std::int64_t c = std::min(chunk, v - v0);
    const float* y = logits(v0, c);
    for (std::int64_t i = 0; i < m; ++i) {
      const float* z = y + i * c;
      LpRow& row = rows[static_cast<std::size_t>(i)];
      for (std::int64_t j = 0; j < c; j += kCeTile) {
        const std::int64_t n = std::min(kCeTile, c - j);
        float tile_max = 0.0f;
        float tile_sum = 0.0f;
        CeTileMaxSum(z + j, n, &tile_max, &tile_sum);
        row.Fold(tile_max, tile_sum,
                 args.entropy != nullptr ? LpTileZSum(z + j, n, tile_max) : 0.0);
      }
      const std::int64_t t = LpTarget(args, i);
      if (t != args.ignore_index && t >= v0 && t < v0 + c) {
        z_target[static_cast<std::size_t>(i)] = z[t - v0];
      }
      if (top_k == 0) continue;
      for (std::int64_t j = 0; j < c; ++j) best[static_cast<std::size_t>(i)].Offer(z[j], v0 + j);
    }
  }

  LpWriteRows(args, rows, z_target, &best);
  if (args.rank != nullptr) LpRanks(args, chunk, logits, z_target);
  return absl::OkStatus();
}

}  // namespace logitd::kernels::cpu

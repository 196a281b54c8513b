#include "server/kernels/cuda/cross_entropy.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cross_entropy_kernels.h"
#include "server/kernels/cuda/cuda_status.h"

namespace logitd::kernels::cuda {
namespace {

static_assert(kCeChunkQuantum % kCeSegmentColumns == 0,
              "chunks must hold whole segments for lse to be chunk-independent");

constexpr std::size_t kRowAlignment = 256;

std::size_t AlignUp(std::size_t bytes) {
  return (bytes + kRowAlignment - 1) / kRowAlignment * kRowAlignment;
}

// Byte offsets of CeRowState's arrays inside the rows buffer.
struct RowLayout {
  std::size_t run_max = 0;
  std::size_t run_sum = 0;
  std::size_t target_z = 0;
  std::size_t lse = 0;
  std::size_t coef = 0;
  std::size_t seg_max = 0;
  std::size_t seg_sum = 0;
  std::size_t total = 0;
};

RowLayout Layout(std::int64_t m, std::int64_t segments) {
  const auto rows = static_cast<std::size_t>(m);
  const std::size_t partials = rows * static_cast<std::size_t>(segments);
  RowLayout l;
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  l.run_max = take(rows * sizeof(float));
  l.run_sum = take(rows * sizeof(double));
  l.target_z = take(rows * sizeof(float));
  l.lse = take(rows * sizeof(float));
  l.coef = take(rows * sizeof(float));
  l.seg_max = take(partials * sizeof(float));
  l.seg_sum = take(partials * sizeof(double));
  l.total = at;
  return l;
}

CeRowState Carve(void* rows, const RowLayout& l) {
  auto* base = static_cast<std::byte*>(rows);
  CeRowState s;
  s.run_max = reinterpret_cast<float*>(base + l.run_max);
  s.run_sum = reinterpret_cast<double*>(base + l.run_sum);
  s.target_z = reinterpret_cast<float*>(base + l.target_z);
  s.lse = reinterpret_cast<float*>(base + l.lse);
  s.coef = reinterpret_cast<float*>(base + l.coef);
  s.seg_max = reinterpret_cast<float*>(base + l.seg_max);
  s.seg_sum = reinterpret_cast<double*>(base + l.seg_sum);
  return s;
}

}  // namespace

CeScratchSizes CeScratch(std::int64_t m, std::int64_t k, std::int64_t chunk, bool grads,
                         bool dx_bf16) {
  CeScratchSizes s;
  const auto cells = static_cast<std::size_t>(m) * static_cast<std::size_t>(chunk);
  s.logits = cells * sizeof(float);
  s.g = grads ? cells * sizeof(std::uint16_t) : 0;
  s.rows = Layout(m, CeSegments(chunk)).total;
  s.dx_acc =
      dx_bf16 ? static_cast<std::size_t>(m) * static_cast<std::size_t>(k) * sizeof(float) : 0;
  return s;
}

std::int64_t ChooseCeChunk(std::int64_t m, std::int64_t v, bool grads,
                           std::uint64_t extra_per_vocab_row, std::uint64_t workspace_bytes) {
  if (v <= kCeChunkQuantum) return v;
  const std::uint64_t per_row =
      static_cast<std::uint64_t>(std::max<std::int64_t>(m, 1)) * (grads ? 6u : 4u) +
      extra_per_vocab_row;
  const std::uint64_t fits = workspace_bytes / per_row;
  if (fits >= static_cast<std::uint64_t>(v)) return v;
  std::int64_t chunk = static_cast<std::int64_t>(fits) / kCeChunkQuantum * kCeChunkQuantum;
  chunk = std::max(chunk, kCeChunkQuantum);
  if (chunk >= v) return v;
  // Same number of chunks, sizes as equal as the quantum allows.
  const std::int64_t chunks = (v + chunk - 1) / chunk;
  std::int64_t even = (v + chunks - 1) / chunks;
  even = (even + kCeChunkQuantum - 1) / kCeChunkQuantum * kCeChunkQuantum;
  return std::min(even, v);
}

std::uint64_t CeStatsWorkspace(std::int64_t m) {
  const std::uint64_t min_columns =
      static_cast<std::uint64_t>(std::max<std::int64_t>(m, 1)) * 4 * kCeStatsMinColumns;
  return std::min<std::uint64_t>(kCeWorkspaceBytes, std::max(kCeStatsChunkBytes, min_columns));
}

const char* CeWalkName(CeWalk walk) { return walk == CeWalk::kTokens ? "tokens" : "vocabulary"; }

CeScratchSizes CeTokenScratch(std::int64_t chunk, std::int64_t v, std::int64_t k, bool dx_bf16) {
  CeScratchSizes s;
  s.logits = static_cast<std::size_t>(chunk) * static_cast<std::size_t>(v) * sizeof(float);
  s.rows = Layout(chunk, CeSegments(v)).total;
  s.dx_acc = dx_bf16 ? static_cast<std::size_t>(chunk) * static_cast<std::size_t>(k) * 4 : 0;
  return s;
}

std::uint64_t CeTokenWorkspace(std::uint64_t gradient_output_bytes) {
  return std::max<std::uint64_t>(kCeWorkspaceBytes,
                                 gradient_output_bytes / 100 * kCeTokenWorkspacePercent);
}

std::int64_t ChooseCeTokenChunk(std::int64_t m, std::int64_t v, std::int64_t k, bool dx_bf16,
                                std::uint64_t workspace_bytes) {
  if (m <= 0 || v <= 0 || k <= 0) return 0;
  // Per token: its logits row, its row state (rounded up generously for the
  // layout's alignment), its dX staging row.
  const std::uint64_t per_token = static_cast<std::uint64_t>(v) * 4 +
                                  static_cast<std::uint64_t>(CeSegments(v)) * 12 + 64 +
                                  (dx_bf16 ? static_cast<std::uint64_t>(k) * 4 : 0);
  const std::uint64_t fits = workspace_bytes / per_token;
  if (fits >= static_cast<std::uint64_t>(m)) return m;
  std::int64_t chunk = static_cast<std::int64_t>(fits) / kCeTokenQuantum * kCeTokenQuantum;
  if (chunk < kCeMinTokenChunk) return 0;
  const std::int64_t chunks = (m + chunk - 1) / chunk;
  std::int64_t even = (m + chunks - 1) / chunks;
  even = (even + kCeTokenQuantum - 1) / kCeTokenQuantum * kCeTokenQuantum;
  return std::min(even, chunk);
}

std::int64_t RoundCeChunk(std::int64_t requested, std::int64_t v) {
  if (requested >= v) return v;
  const std::int64_t rounded =
      (requested + kCeChunkQuantum - 1) / kCeChunkQuantum * kCeChunkQuantum;
  return std::min(rounded, v);
}

namespace {

bool WantsGradients(const CePlanRequest& r) { return r.want_dx || r.want_dw; }

// The plan's chunk and scratch for its walk and allowances.
CePlan Sized(const CePlanRequest& r, CePlan plan) {
  if (plan.walk == CeWalk::kTokens) {
    plan.chunk = ChooseCeTokenChunk(r.m, r.v, r.k, r.dx_bf16, plan.token_workspace);
    plan.sizes = CeTokenScratch(plan.chunk, r.v, r.k, r.dx_bf16);
    return plan;
  }
  const bool grads = WantsGradients(r);
  // dW returned to the host goes through two staging chunks of [chunk, k] fp32.
  const bool staged_dw = r.want_dw && !r.accumulate_dw;
  const std::uint64_t staging_per_row = staged_dw ? static_cast<std::uint64_t>(2 * r.k) * 4 : 0;
  plan.chunk = r.vocab_chunk > 0 ? RoundCeChunk(r.vocab_chunk, r.v)
                                 : ChooseCeChunk(r.m, r.v, grads, staging_per_row, plan.workspace);
  plan.sizes = CeScratch(r.m, r.k, plan.chunk, grads, r.dx_bf16);
  return plan;
}

}  // namespace

CePlan PlanCrossEntropy(const CePlanRequest& r) {
  const std::uint64_t budget_cap =
      r.device_memory_budget != 0 ? r.device_memory_budget / 4 : ~std::uint64_t{0};
  const std::uint64_t configured = r.workspace_bytes;
  CePlan plan;
  const std::uint64_t automatic = WantsGradients(r) ? kCeWorkspaceBytes : CeStatsWorkspace(r.m);
  plan.workspace = std::min<std::uint64_t>(configured != 0 ? configured : automatic, budget_cap);
  if (WantsGradients(r) && r.vocab_chunk <= 0) {
    const std::uint64_t dx_bytes =
        r.want_dx ? static_cast<std::uint64_t>(r.m * r.k) * (r.dx_bf16 ? 2 : 4) : 0;
    const std::uint64_t outputs =
        dx_bytes + (r.want_dw ? static_cast<std::uint64_t>(r.v * r.k) * 4 : 0);
    plan.token_workspace =
        std::min(configured != 0 ? configured : CeTokenWorkspace(outputs), budget_cap);
    if (ChooseCeTokenChunk(r.m, r.v, r.k, r.dx_bf16, plan.token_workspace) > 0) {
      plan.walk = CeWalk::kTokens;
    }
  }
  return Sized(r, plan);
}

std::optional<CePlan> ShrinkCePlan(const CePlanRequest& r, const CePlan& plan) {
  CePlan next = plan;
  if (plan.walk == CeWalk::kTokens) {
    next.token_workspace /= 2;
    if (ChooseCeTokenChunk(r.m, r.v, r.k, r.dx_bf16, next.token_workspace) == 0) {
      next.walk = CeWalk::kVocabulary;
    }
    return Sized(r, next);
  }
  if (r.vocab_chunk > 0 || plan.chunk <= kCeChunkQuantum) return std::nullopt;
  next.workspace /= 2;
  return Sized(r, next);
}

namespace {

// The token walk; see RunCrossEntropy.
absl::Status RunTokenWalk(GemmEngine& engine, const GemmStream& s, const CeProblem& p,
                          const CeBuffers& b, CeDwSink* dw, const CeRowParams& params,
                          const std::string& shape) {
  const std::int64_t m = p.m;
  const std::int64_t v = p.v;
  const std::int64_t k = p.k;
  const std::int64_t segments = CeSegments(v);
  if (p.chunk > std::numeric_limits<std::int32_t>::max() / segments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cross_entropy: ", shape, " needs more than 2^31 row segments; use a smaller chunk"));
  }
  const CeRowState state = Carve(b.rows, Layout(p.chunk, segments));
  const bool want_dx = b.dx != nullptr;
  const auto* x_all = static_cast<const std::uint16_t*>(b.x);
  const std::int64_t chunks = (m + p.chunk - 1) / p.chunk;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t r0 = c * p.chunk;
    const std::int64_t rows = std::min(p.chunk, m - r0);
    const std::uint16_t* x = x_all + r0 * k;
    CeRowParams rp = params;
    rp.targets = params.targets + r0;
    RETURN_IF_CUDA_ERROR(LaunchCeInit(state, rows, s.stream), "cross_entropy: init kernel (", shape,
                         ")");
    LOGITD_CUDA_RETURN_IF_ERROR(engine.Run(LogitsShape(rows, v, k, CUDA_R_32F),
                                           GemmOperands{x, b.w, b.logits, 1.0f, 0.0f}, s));
    RETURN_IF_CUDA_ERROR(LaunchCeChunkStats(b.logits, rows, v, 0, rp, state, s.stream),
                         "cross_entropy: row statistics kernel (tokens ", r0, "+", rows, ", ",
                         shape, ")");
    RETURN_IF_CUDA_ERROR(LaunchCeFinalize(rows, rp, state, b.loss + r0,
                                          b.lse != nullptr ? b.lse + r0 : nullptr, s.stream),
                         "cross_entropy: loss kernel (", shape, ")");
    if (!want_dx && dw == nullptr) continue;
    RETURN_IF_CUDA_ERROR(LaunchCeGradientInPlace(b.logits, rows, v, rp, state, s.stream),
                         "cross_entropy: gradient kernel (tokens ", r0, "+", rows, ", ", shape,
                         ")");
    // G [rows, v] bf16 over the logits, row stride 2v.
    const void* g = b.logits;
    if (want_dx) {
      GemmShape dx_shape = GradInputShape(rows, v, k, CUDA_R_32F);
      dx_shape.p_ld = 2 * v;
      float* out = b.dx_bf16 ? b.dx_acc : static_cast<float*>(b.dx) + r0 * k;
      LOGITD_CUDA_RETURN_IF_ERROR(engine.Run(dx_shape, GemmOperands{g, b.w, out, 1.0f, 0.0f}, s));
      if (b.dx_bf16) {
        RETURN_IF_CUDA_ERROR(
            LaunchCastFp32ToBf16(b.dx_acc, rows * k, static_cast<std::uint16_t*>(b.dx) + r0 * k,
                                 s.stream),
            "cross_entropy: dx cast kernel (", shape, ")");
      }
    }
    if (dw != nullptr) {
      absl::StatusOr<float*> target = dw->Begin(0, v);
      if (!target.ok()) return target.status();
      GemmShape dw_shape = GradWeightShape(rows, v, k, CUDA_R_32F);
      dw_shape.p_ld = 2 * v;
      LOGITD_CUDA_RETURN_IF_ERROR(
          engine.Run(dw_shape, GemmOperands{g, x, *target, 1.0f, c == 0 ? dw->beta() : 1.0f}, s));
      LOGITD_CUDA_RETURN_IF_ERROR(dw->End(0, v));
    }
  }
  return absl::OkStatus();
}

// The vocabulary walk: every row at once, the vocabulary a chunk of columns
// at a time, forwards for the row statistics and the loss, then backwards
// (the last chunk's logits still in the buffer) for the gradients.
absl::Status RunVocabularyWalk(GemmEngine& engine, const GemmStream& s, const CeProblem& p,
                               const CeBuffers& b, CeDwSink* dw, const CeRowParams& params,
                               const std::string& shape) {
  const bool want_dx = b.dx != nullptr;
  const bool want_dw = dw != nullptr;
  const bool grads = want_dx || want_dw;
  const std::int64_t segments = CeSegments(p.chunk);
  if (p.m > std::numeric_limits<std::int32_t>::max() / segments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cross_entropy: ", shape, " needs more than 2^31 row segments; use a smaller chunk"));
  }
  const CeRowState state = Carve(b.rows, Layout(p.m, segments));

  const std::int64_t m = p.m;
  const std::int64_t k = p.k;
  const std::int64_t chunks = (p.v + p.chunk - 1) / p.chunk;
  const auto* w = static_cast<const std::uint16_t*>(b.w);
  auto columns = [&](std::int64_t c) { return std::min(p.chunk, p.v - c * p.chunk); };
  // The same product, operands and alignment as the forward Logits path.
  auto logits = [&](std::int64_t c) {
    const std::int64_t c0 = c * p.chunk;
    return engine.Run(LogitsShape(m, columns(c), k, CUDA_R_32F),
                      GemmOperands{b.x, w + c0 * k, b.logits, 1.0f, 0.0f}, s);
  };

  RETURN_IF_CUDA_ERROR(LaunchCeInit(state, m, s.stream), "cross_entropy: init kernel (", shape,
                       ")");
  for (std::int64_t c = 0; c < chunks; ++c) {
    LOGITD_CUDA_RETURN_IF_ERROR(logits(c));
    RETURN_IF_CUDA_ERROR(
        LaunchCeChunkStats(b.logits, m, columns(c), c * p.chunk, params, state, s.stream),
        "cross_entropy: row statistics kernel (chunk ", c, " of ", chunks, ", ", shape, ")");
  }
  RETURN_IF_CUDA_ERROR(LaunchCeFinalize(m, params, state, b.loss, b.lse, s.stream),
                       "cross_entropy: loss kernel (", shape, ")");
  if (!grads) return absl::OkStatus();

  float* dx_acc = !want_dx ? nullptr : b.dx_bf16 ? b.dx_acc : static_cast<float*>(b.dx);
  for (std::int64_t i = 0; i < chunks; ++i) {
    // Backwards: the last chunk's logits are still in the buffer.
    const std::int64_t c = chunks - 1 - i;
    const std::int64_t c0 = c * p.chunk;
    const std::int64_t n = columns(c);
    if (i > 0) LOGITD_CUDA_RETURN_IF_ERROR(logits(c));
    RETURN_IF_CUDA_ERROR(LaunchCeGradient(b.logits, m, n, c0, params, state, b.g, s.stream),
                         "cross_entropy: gradient kernel (chunk ", c, " of ", chunks, ", ", shape,
                         ")");
    if (want_dx) {
      LOGITD_CUDA_RETURN_IF_ERROR(
          engine.Run(GradInputShape(m, n, k, CUDA_R_32F),
                     GemmOperands{b.g, w + c0 * k, dx_acc, 1.0f, i == 0 ? 0.0f : 1.0f}, s));
    }
    if (want_dw) {
      absl::StatusOr<float*> target = dw->Begin(c0, n);
      if (!target.ok()) return target.status();
      LOGITD_CUDA_RETURN_IF_ERROR(engine.Run(GradWeightShape(m, n, k, CUDA_R_32F),
                                             GemmOperands{b.g, b.x, *target, 1.0f, dw->beta()}, s));
      LOGITD_CUDA_RETURN_IF_ERROR(dw->End(c0, n));
    }
  }
  if (want_dx && b.dx_bf16) {
    RETURN_IF_CUDA_ERROR(
        LaunchCastFp32ToBf16(b.dx_acc, m * k, static_cast<std::uint16_t*>(b.dx), s.stream),
        "cross_entropy: dx cast kernel (", shape, ")");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCrossEntropy(GemmEngine& engine, const GemmStream& s, const CeProblem& p,
                             const CeBuffers& b, CeDwSink* dw) {
  const bool tokens = p.walk == CeWalk::kTokens;
  const std::string shape =
      absl::StrCat("M=", p.m, ",V=", p.v, ",K=", p.k, ",", CeWalkName(p.walk), " chunk=", p.chunk);
  if (p.m <= 0 || p.v <= 0 || p.k <= 0 || p.chunk <= 0 || p.chunk > (tokens ? p.m : p.v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: expected positive M, V, K and a chunk in [1, ",
                     tokens ? "M" : "V", "], got ", shape));
  }
  const bool want_dx = b.dx != nullptr;
  const bool want_dw = dw != nullptr;
  const bool grads = want_dx || want_dw;
  if (b.x == nullptr || b.w == nullptr || b.targets == nullptr || b.loss == nullptr ||
      b.logits == nullptr || b.rows == nullptr || (grads && !tokens && b.g == nullptr) ||
      (want_dx && b.dx_bf16 && b.dx_acc == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: a device buffer is missing (", shape, ")"));
  }
  CeRowParams params;
  params.targets = b.targets;
  params.ignore_index = p.ignore_index;
  params.logit_softcap = p.logit_softcap;
  params.z_loss = p.z_loss;
  params.grad_scale = p.grad_scale;
  if (tokens) return RunTokenWalk(engine, s, p, b, dw, params, shape);
  return RunVocabularyWalk(engine, s, p, b, dw, params, shape);
}

}  // namespace logitd::kernels::cuda

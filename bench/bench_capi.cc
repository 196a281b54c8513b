// A C entry point to the backend's GEMM engine, fused cross-entropy and
// LogProbs for bench/torch_baseline.py, bench/ce_bench.py and
// bench/logprobs_bench.py, which load it with ctypes so
// that logitd's products and PyTorch's run in one process, on the same
// tensors and the same stream, interleaved: the side-by-side comparison then
// carries no between-process drift.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "server/kernels/cuda/cross_entropy.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/logprobs.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace {

namespace kc = logitd::kernels::cuda;

thread_local std::string last_error;
thread_local std::string last_choice;

struct Engine {
  std::shared_ptr<kc::DeviceMemory> memory;
  kc::LtHandle handle;
  kc::DeviceBuffer workspace;
  std::unique_ptr<kc::GemmEngine> engine;
  // The cross-entropy's scratch, grown as needed and kept between calls, as
  // the backend's stream contexts keep theirs.
  kc::DeviceBuffer ce_logits, ce_g, ce_rows, ce_dx_acc;
  std::int64_t ce_chunk = 0;
  int ce_walk = 0;
  // LogProbs' scratch, kept likewise.
  kc::DeviceBuffer lp_logits, lp_rows, lp_lists;
};

// Grows `buffer` to at least `bytes`; false (with last_error) on failure.
bool Grow(Engine& e, kc::DeviceBuffer& buffer, std::size_t bytes, const char* what) {
  if (bytes == 0 || buffer.size() >= bytes) return true;
  buffer.Reset();
  auto fresh = e.memory->Allocate(bytes, what);
  if (!fresh.ok()) {
    last_error = std::string(fresh.status().message());
    return false;
  }
  buffer = *std::move(fresh);
  return true;
}

kc::GemmShape Shape(int op, std::int64_t m, std::int64_t v, std::int64_t k, int out_bf16) {
  const cudaDataType_t out = out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (op == 0) return kc::LogitsShape(m, v, k, out);
  if (op == 1) return kc::GradInputShape(m, v, k, out);
  return kc::GradWeightShape(m, v, k, out);
}

}  // namespace

extern "C" {

// split_k: 0 off, 1 fp32, 2 any. Returns null on failure (see last_error).
void* logitd_bench_engine_create(int split_k, int autotune) {
  auto e = std::make_unique<Engine>();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    last_error = "cudaGetDevice failed";
    return nullptr;
  }
  e->memory = kc::DeviceMemory::Create(device, 0);
  auto handle = kc::CreateLtHandle();
  if (!handle.ok()) {
    last_error = std::string(handle.status().message());
    return nullptr;
  }
  e->handle = *std::move(handle);
  auto workspace = e->memory->Allocate(32u << 20, "workspace");
  if (!workspace.ok()) {
    last_error = std::string(workspace.status().message());
    return nullptr;
  }
  e->workspace = *std::move(workspace);
  kc::GemmEngineOptions options;
  options.split_k = split_k == 0   ? logitd::kernels::SplitK::kOff
                    : split_k == 1 ? logitd::kernels::SplitK::kFp32
                                   : logitd::kernels::SplitK::kAny;
  options.autotune = autotune != 0;
  e->engine = std::make_unique<kc::GemmEngine>(options, e->memory);
  return e.release();
}

void logitd_bench_engine_destroy(void* engine) { delete static_cast<Engine*>(engine); }

// op: 0 logits (p = X, q = W), 1 dX (p = G, q = W), 2 dW (p = G, q = X);
// m, v, k in the LM head's terms. Device pointers; stream is a cudaStream_t.
// Returns 0, or -1 with last_error set.
int logitd_bench_run(void* engine, int op, std::int64_t m, std::int64_t v, std::int64_t k,
                     int out_bf16, const void* p, const void* q, void* c, void* stream) {
  auto* e = static_cast<Engine*>(engine);
  const kc::GemmStream s{e->handle.get(), static_cast<cudaStream_t>(stream), e->workspace.get(),
                         e->workspace.size()};
  const absl::Status st = e->engine->Run(Shape(op, m, v, k, out_bf16), {p, q, c}, s);
  if (!st.ok()) {
    last_error = std::string(st.message());
    return -1;
  }
  return 0;
}

// The configuration the engine chose for these operands ("" if none yet).
const char* logitd_bench_choice(void* engine, int op, std::int64_t m, std::int64_t v,
                                std::int64_t k, int out_bf16, const void* p, const void* q,
                                void* c) {
  auto* e = static_cast<Engine*>(engine);
  auto choice = e->engine->Cached(Shape(op, m, v, k, out_bf16), {p, q, c}, e->workspace.size());
  last_choice = choice ? choice->ToString() : "";
  return last_choice.c_str();
}

// Fused cross-entropy on device tensors, enqueued on `stream` (no
// synchronization): x [m, k] bf16, w [v, k] bf16, targets [m] int64, loss [m]
// fp32, lse [m] fp32 or null, dx [m, k] (bf16 when dx_bf16, else fp32) or
// null, dw [v, k] fp32 or null (dw_beta 0 overwrites, 1 accumulates). walk:
// 0 as the backend chooses without a memory budget, 1 the vocabulary walk, 2
// the token walk; chunk 0 chooses the chunk as the backend does (vocabulary
// rows or tokens, by walk). Returns 0, or -1 with last_error set.
int logitd_bench_cross_entropy(void* engine, std::int64_t m, std::int64_t v, std::int64_t k,
                               const void* x, const void* w, const std::int64_t* targets,
                               std::int64_t ignore_index, float z_loss, float logit_softcap,
                               float grad_scale, float* loss, float* lse, void* dx, int dx_bf16,
                               float* dw, float dw_beta, std::int64_t chunk, int walk,
                               void* stream) {
  auto* e = static_cast<Engine*>(engine);
  const bool grads = dx != nullptr || dw != nullptr;
  const bool acc = dx != nullptr && dx_bf16 != 0;
  const std::uint64_t outputs =
      (dx != nullptr ? static_cast<std::uint64_t>(m * k) * (dx_bf16 ? 2 : 4) : 0) +
      (dw != nullptr ? static_cast<std::uint64_t>(v * k) * 4 : 0);
  const std::uint64_t token_workspace = kc::CeTokenWorkspace(outputs);
  if (walk == 0) {
    walk = grads && kc::ChooseCeTokenChunk(m, v, k, acc, token_workspace) > 0 ? 2 : 1;
  }
  kc::CeScratchSizes sizes;
  if (walk == 2) {
    if (chunk <= 0) chunk = kc::ChooseCeTokenChunk(m, v, k, acc, token_workspace);
    if (chunk <= 0) chunk = std::min<std::int64_t>(m, kc::kCeMinTokenChunk);
    chunk = std::min(chunk, m);
    sizes = kc::CeTokenScratch(chunk, v, k, acc);
  } else {
    chunk = chunk > 0 ? kc::RoundCeChunk(chunk, v)
                      : kc::ChooseCeChunk(m, v, grads, 0,
                                          grads ? kc::kCeWorkspaceBytes : kc::CeStatsWorkspace(m));
    sizes = kc::CeScratch(m, k, chunk, grads, acc);
  }
  if (!Grow(*e, e->ce_logits, sizes.logits, "cross_entropy: logits chunk") ||
      !Grow(*e, e->ce_g, sizes.g, "cross_entropy: G chunk") ||
      !Grow(*e, e->ce_rows, sizes.rows, "cross_entropy: per-row state") ||
      !Grow(*e, e->ce_dx_acc, sizes.dx_acc, "cross_entropy: dx accumulator")) {
    return -1;
  }
  e->ce_chunk = chunk;
  e->ce_walk = walk;
  kc::CeProblem p;
  p.walk = walk == 2 ? kc::CeWalk::kTokens : kc::CeWalk::kVocabulary;
  p.m = m;
  p.v = v;
  p.k = k;
  p.chunk = chunk;
  p.ignore_index = ignore_index;
  p.z_loss = z_loss;
  p.logit_softcap = logit_softcap;
  p.grad_scale = grad_scale;
  kc::CeBuffers b;
  b.x = x;
  b.w = w;
  b.targets = targets;
  b.loss = loss;
  b.lse = lse;
  b.dx = dx;
  b.dx_bf16 = dx_bf16 != 0;
  b.logits = e->ce_logits.as<float>();
  b.g = e->ce_g.as<std::uint16_t>();
  b.rows = e->ce_rows.get();
  b.dx_acc = e->ce_dx_acc.as<float>();
  kc::DeviceDwSink sink(dw, k, dw_beta);
  const kc::GemmStream s{e->handle.get(), static_cast<cudaStream_t>(stream), e->workspace.get(),
                         e->workspace.size()};
  const absl::Status st = kc::RunCrossEntropy(*e->engine, s, p, b, dw != nullptr ? &sink : nullptr);
  if (!st.ok()) {
    last_error = std::string(st.message());
    return -1;
  }
  return 0;
}

// LogProbs over caller-owned device tensors on `stream` (no synchronization):
// x [m, k] bf16, w [>= v, k] bf16, targets [m] int64 or null. Outputs
// (device, each may be null): logprob, lse, entropy [m] fp32, rank [m] int64,
// topk_ids [m, top_k] int32, topk_logprobs [m, top_k] fp32. chunk 0 chooses
// the vocabulary chunk as the backend does. Returns 0, or -1 with last_error.
int logitd_bench_logprobs(void* engine, std::int64_t m, std::int64_t v, std::int64_t k,
                          const void* x, const void* w, const std::int64_t* targets,
                          float temperature, float logit_softcap, int top_k, float* logprob,
                          float* lse, float* entropy, std::int64_t* rank, std::int32_t* topk_ids,
                          float* topk_logprobs, std::int64_t chunk, void* stream) {
  auto* e = static_cast<Engine*>(engine);
  chunk = chunk > 0 ? kc::RoundCeChunk(chunk, v)
                    : kc::ChooseCeChunk(m, v, false, 0, kc::CeStatsWorkspace(m));
  const kc::LpScratchSizes sizes = kc::LpScratch(m, chunk, top_k);
  if (!Grow(*e, e->lp_logits, sizes.logits, "log probs: logits chunk") ||
      !Grow(*e, e->lp_rows, sizes.rows, "log probs: per-row state") ||
      !Grow(*e, e->lp_lists, sizes.lists, "log probs: top-k lists")) {
    return -1;
  }
  e->ce_chunk = chunk;
  kc::LpProblem p;
  p.m = m;
  p.v = v;
  p.k = k;
  p.chunk = chunk;
  p.has_targets = targets != nullptr;
  p.temperature = temperature;
  p.logit_softcap = logit_softcap;
  p.top_k = top_k;
  p.want_logprob = logprob != nullptr;
  p.want_rank = rank != nullptr;
  p.want_lse = lse != nullptr;
  p.want_entropy = entropy != nullptr;
  kc::LpBuffers b;
  b.x = x;
  b.w = w;
  b.logits = e->lp_logits.as<float>();
  b.rows = e->lp_rows.get();
  b.lists = e->lp_lists.get();
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const kc::LpRowsIo io = kc::LpIo(b.rows, m, chunk, top_k);
  auto copy = [&](void* to, const void* from, std::size_t bytes) {
    return to == nullptr ||
           cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, cs) == cudaSuccess;
  };
  if (targets != nullptr && !copy(io.targets, targets, static_cast<std::size_t>(m) * 8)) {
    last_error = "log probs: copy targets";
    return -1;
  }
  const kc::GemmStream s{e->handle.get(), cs, e->workspace.get(), e->workspace.size()};
  const absl::Status st = kc::RunLogProbs(*e->engine, s, p, b);
  if (!st.ok()) {
    last_error = std::string(st.message());
    return -1;
  }
  const std::size_t rows = static_cast<std::size_t>(m) * 4;
  const std::size_t topk = rows * static_cast<std::size_t>(top_k);
  if (!copy(logprob, io.logprob, rows) || !copy(lse, io.lse, rows) ||
      !copy(entropy, io.entropy, rows) || !copy(rank, io.rank, rows * 2) ||
      (top_k > 0 &&
       (!copy(topk_ids, io.topk_ids, topk) || !copy(topk_logprobs, io.topk_logprobs, topk)))) {
    last_error = "log probs: copy the outputs";
    return -1;
  }
  return 0;
}

// The chunk and the walk (1 vocabulary, 2 tokens) the last cross-entropy
// call used.
std::int64_t logitd_bench_ce_chunk(void* engine) { return static_cast<Engine*>(engine)->ce_chunk; }
int logitd_bench_ce_walk(void* engine) { return static_cast<Engine*>(engine)->ce_walk; }

// Device bytes the engine holds: the cuBLASLt workspace and the
// cross-entropy's scratch (its inputs and outputs are the caller's).
std::uint64_t logitd_bench_device_bytes(void* engine) {
  return static_cast<Engine*>(engine)->memory->bytes_in_use();
}

const char* logitd_bench_last_error(void) { return last_error.c_str(); }

}  // extern "C"

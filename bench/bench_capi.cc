// A C entry point to the backend's GEMM engine for bench/torch_baseline.py,
// which loads it with ctypes so that logitd's products and PyTorch's run in
// one process, on the same tensors and the same stream, interleaved: the
// side-by-side comparison then carries no between-process drift.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace {

namespace kc = logitd::kernels::cuda;

struct Engine {
  std::shared_ptr<kc::DeviceMemory> memory;
  kc::LtHandle handle;
  kc::DeviceBuffer workspace;
  std::unique_ptr<kc::GemmEngine> engine;
};

thread_local std::string last_error;
thread_local std::string last_choice;

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
  options.split_k = split_k == 0   ? kc::SplitKPolicy::kOff
                    : split_k == 1 ? kc::SplitKPolicy::kFp32
                                   : kc::SplitKPolicy::kAny;
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

const char* logitd_bench_last_error(void) { return last_error.c_str(); }

}  // extern "C"

// logitd_cutlass_probe_{logits,dx,dw}: CUTLASS 3.x sm90 GEMM kernels against
// cuBLASLt on one of the fused cross-entropy's three products, in the layout
// the token walk runs it in (row-major, bf16 operands, fp32 accumulation and
// output):
//
//   logits  D[M,N]  = X[M,K] . W[N,K]^T        N = vocabulary, K = hidden
//   dx      D[M,N]  = G[M,K] . W[K,N]          K = vocabulary, N = hidden
//   dw      D[M,N] += G[K,M]^T . X[K,N]        M = vocabulary, K = tokens (beta = 1)
//
// The question it answers: can a GEMM of logitd's own, the base a fused
// epilogue (row statistics beside the logits) would be built on, run as fast
// as the cuBLASLt kernels the engine picks today? It times every algorithm
// cuBLASLt's heuristic offers (up to 8) and a set of CUTLASS collective-builder
// configurations (cooperative and ping-pong, persistent; stream-K on request),
// median of 10 event-timed runs after 2 warm-ups each, and checks each CUTLASS
// result against cuBLASLt's: bit for bit on integer-valued operands (exact in
// fp32), as the largest difference relative to the largest output on random
// ones.
//
// Built only with -DLOGITD_CUTLASS_DIR=<dir holding include/ and
// tools/util/include/> (scripts/fetch-cutlass.sh unpacks PyPI's
// nvidia-cutlass and prints it), for sm_90a; one executable per product
// (LOGITD_PROBE_OP 0, 1, 2).
//
//   usage: logitd_cutlass_probe_logits M N K [--exact] [--stream-k]
//     --exact     integer-valued operands (default: uniform random in (-1, 1))
//     --stream-k  also the stream-K schedules (CUTLASS 4.2's hung on some shapes)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_fill.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#ifndef LOGITD_PROBE_OP
#error "LOGITD_PROBE_OP must be 0 (logits), 1 (dx) or 2 (dw)"
#endif

namespace logitd::bench::cutlass_probe {

constexpr int kOp = LOGITD_PROBE_OP;
constexpr const char* kOpName = kOp == 0 ? "logits" : kOp == 1 ? "dx" : "dw";
constexpr bool kAccumulate = kOp == 2;
constexpr int kWarmups = 2;
constexpr int kSamples = 10;

// CUTLASS's layout tags: A is M x K (RowMajor: K contiguous), B is N x K
// (ColumnMajor: K contiguous, RowMajor: N contiguous).
using LayoutA =
    std::conditional_t<kOp == 2, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
using LayoutB =
    std::conditional_t<kOp == 0, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
using LayoutD = cutlass::layout::RowMajor;

#define CHECK_LT(x)                                                                           \
  do {                                                                                        \
    const cublasStatus_t e_ = (x);                                                            \
    if (e_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)e_); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

template <class Tile, class Cluster, class MainSchedule, class EpilogueSchedule, class Scheduler>
struct Config {
  using Element = cutlass::bfloat16_t;
  using ElementC = std::conditional_t<kAccumulate, float, void>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD, 4, float,
      LayoutD, 4, EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, 8, Element, LayoutB, 8,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Multiples of 1/8 in [-1/2, 1/2]: every product, and every sum of up to
// K = 2^20 of them, is exact in fp32, so any two correct kernels agree bit
// for bit.
__global__ void FillIntegerValued(std::uint16_t* p, std::int64_t n, unsigned seed) {
  for (std::int64_t i = blockIdx.x * 256LL + threadIdx.x; i < n; i += gridDim.x * 256LL) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float value = static_cast<float>(static_cast<int>(h % 9) - 4) / 8.0f;
    p[i] = static_cast<std::uint16_t>(__float_as_uint(value) >> 16);  // exact in bf16
  }
}

// diff[0]: values whose bits differ; diff[1]: max |a - b| as float bits;
// diff[2]: max |b| as float bits (non-negative floats order as integers).
__global__ void Compare(const float* a, const float* b, std::int64_t n, unsigned long long* diff) {
  unsigned long long differ = 0;
  unsigned max_diff = 0, max_ref = 0;
  for (std::int64_t i = blockIdx.x * 256LL + threadIdx.x; i < n; i += gridDim.x * 256LL) {
    differ += __float_as_uint(a[i]) != __float_as_uint(b[i]);
    max_diff = max(max_diff, __float_as_uint(fabsf(a[i] - b[i])));
    max_ref = max(max_ref, __float_as_uint(fabsf(b[i])));
  }
  atomicAdd(&diff[0], differ);
  atomicMax(&diff[1], static_cast<unsigned long long>(max_diff));
  atomicMax(&diff[2], static_cast<unsigned long long>(max_ref));
}

struct Problem {
  int m = 0, n = 0, k = 0;
  bool exact = false;
  const void* a = nullptr;
  const void* b = nullptr;
  float* d = nullptr;          // CUTLASS's output
  const float* ref = nullptr;  // cuBLASLt's (heuristic #0, on a zeroed output)
  cudaStream_t stream = nullptr;
  double flops() const { return 2.0 * m * n * static_cast<double>(k); }
};

double Median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median ms of kSamples runs of `run` after kWarmups.
template <class Run>
double TimeRuns(cudaStream_t s, Run run) {
  cudaEvent_t e0, e1;
  BENCH_CHECK_CUDA(cudaEventCreate(&e0));
  BENCH_CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> samples;
  for (int r = 0; r < kWarmups + kSamples; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(e0, s));
    if (!run()) return -1;
    BENCH_CHECK_CUDA(cudaEventRecord(e1, s));
    BENCH_CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= kWarmups) samples.push_back(ms);
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(e0));
  BENCH_CHECK_CUDA(cudaEventDestroy(e1));
  return Median(samples);
}

void PrintRow(const char* name, double ms, double best_lt_ms, const Problem& p,
              const std::string& check) {
  std::printf("| %-44s | %8.3f | %5.0f | %5.2f | %s |\n", name, ms, p.flops() / ms / 1e9,
              best_lt_ms / ms, check.c_str());
}

template <class C>
void RunCutlass(const char* name, const Problem& p, double best_lt_ms) {
  using Gemm = typename C::Gemm;
  using K = typename Gemm::GemmKernel;
  const auto sa =
      cutlass::make_cute_packed_stride(typename K::StrideA{}, cute::make_shape(p.m, p.k, 1));
  const auto sb =
      cutlass::make_cute_packed_stride(typename K::StrideB{}, cute::make_shape(p.n, p.k, 1));
  const auto sc =
      cutlass::make_cute_packed_stride(typename K::StrideC{}, cute::make_shape(p.m, p.n, 1));
  const auto sd =
      cutlass::make_cute_packed_stride(typename K::StrideD{}, cute::make_shape(p.m, p.n, 1));
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {static_cast<const cutlass::bfloat16_t*>(p.a), sa,
       static_cast<const cutlass::bfloat16_t*>(p.b), sb},
      {{1.0f, kAccumulate ? 1.0f : 0.0f}, kAccumulate ? p.d : nullptr, sc, p.d, sd}};
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    std::printf("| %-44s | cannot implement this shape | | | |\n", name);
    return;
  }
  const std::size_t workspace_bytes = Gemm::get_workspace_size(args);
  void* workspace = nullptr;
  if (workspace_bytes > 0) BENCH_CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  if (gemm.initialize(args, workspace, p.stream) != cutlass::Status::kSuccess) {
    std::printf("| %-44s | initialize failed | | | |\n", name);
    return;
  }
  const auto run = [&] { return gemm.run(p.stream) == cutlass::Status::kSuccess; };
  const double ms = TimeRuns(p.stream, run);
  BENCH_CHECK_CUDA(cudaGetLastError());
  if (ms < 0) {
    std::printf("| %-44s | run failed | | | |\n", name);
    return;
  }
  // One more run on a zeroed output (C = D = 0 when accumulating) for the check.
  BENCH_CHECK_CUDA(cudaMemsetAsync(p.d, 0, static_cast<std::size_t>(p.m) * p.n * 4, p.stream));
  if (!run()) {
    std::printf("| %-44s | run failed | | | |\n", name);
    return;
  }
  unsigned long long* diff = nullptr;
  BENCH_CHECK_CUDA(cudaMallocManaged(&diff, 3 * sizeof(unsigned long long)));
  std::memset(diff, 0, 3 * sizeof(unsigned long long));
  Compare<<<4096, 256, 0, p.stream>>>(p.d, p.ref, static_cast<std::int64_t>(p.m) * p.n, diff);
  BENCH_CHECK_CUDA(cudaStreamSynchronize(p.stream));
  char check[96];
  if (p.exact) {
    std::snprintf(check, sizeof check, "%llu differ", diff[0]);
  } else {
    float max_diff, max_ref;
    const auto d1 = static_cast<unsigned>(diff[1]), d2 = static_cast<unsigned>(diff[2]);
    std::memcpy(&max_diff, &d1, 4);
    std::memcpy(&max_ref, &d2, 4);
    std::snprintf(check, sizeof check, "max diff %.1e of max %.1e", max_diff, max_ref);
  }
  PrintRow(name, ms, best_lt_ms, p, check);
  BENCH_CHECK_CUDA(cudaFree(diff));
  if (workspace != nullptr) BENCH_CHECK_CUDA(cudaFree(workspace));
}

}  // namespace logitd::bench::cutlass_probe

int main(int argc, char** argv) {
  using namespace logitd::bench::cutlass_probe;
  using namespace cute;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a line per kernel, even if a later one hangs
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s M N K [--exact] [--stream-k]\n", argv[0]);
    return 2;
  }
  Problem p;
  p.m = std::atoi(argv[1]);
  p.n = std::atoi(argv[2]);
  p.k = std::atoi(argv[3]);
  bool stream_k = false;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--exact") == 0) {
      p.exact = true;
    } else if (std::strcmp(argv[i], "--stream-k") == 0) {
      stream_k = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) {
    std::fprintf(stderr, "M, N and K must be positive\n");
    return 2;
  }
  const std::int64_t a_elems = static_cast<std::int64_t>(p.m) * p.k;
  const std::int64_t b_elems = static_cast<std::int64_t>(p.n) * p.k;
  const std::size_t d_bytes = static_cast<std::size_t>(p.m) * p.n * 4;
  std::uint16_t *a = nullptr, *b = nullptr;
  float *d = nullptr, *ref = nullptr;
  BENCH_CHECK_CUDA(cudaStreamCreate(&p.stream));
  BENCH_CHECK_CUDA(cudaMalloc(&a, a_elems * 2));
  BENCH_CHECK_CUDA(cudaMalloc(&b, b_elems * 2));
  BENCH_CHECK_CUDA(cudaMalloc(&d, d_bytes));
  BENCH_CHECK_CUDA(cudaMalloc(&ref, d_bytes));
  if (p.exact) {
    FillIntegerValued<<<4096, 256, 0, p.stream>>>(a, a_elems, 1);
    FillIntegerValued<<<4096, 256, 0, p.stream>>>(b, b_elems, 2);
    BENCH_CHECK_CUDA(cudaGetLastError());
  } else {
    BENCH_CHECK_CUDA(logitd::bench::FillRandomBf16(a, a_elems, 1, p.stream));
    BENCH_CHECK_CUDA(logitd::bench::FillRandomBf16(b, b_elems, 2, p.stream));
  }
  BENCH_CHECK_CUDA(cudaMemsetAsync(d, 0, d_bytes, p.stream));
  BENCH_CHECK_CUDA(cudaMemsetAsync(ref, 0, d_bytes, p.stream));
  p.a = a;
  p.b = b;
  p.d = d;
  p.ref = ref;

  // cuBLASLt is column-major: row-major D[M,N] = A.B is column-major
  // D^T[N,M] = B^T.A^T, so its first operand is our B and its second our A.
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  std::size_t lt_workspace_bytes = 32u << 20;
  void* lt_workspace = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&lt_workspace, lt_workspace_bytes));
  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_b = kOp == 0 ? CUBLAS_OP_T : CUBLAS_OP_N;  // W [N,K] for logits
  const cublasOperation_t op_a = kOp == 2 ? CUBLAS_OP_T : CUBLAS_OP_N;  // G [K,M] for dw
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  cublasLtMatrixLayout_t lb, la, lc;
  if (kOp == 0) {
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.k, p.n, p.k));
  } else {
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.n, p.k, p.n));
  }
  if (kOp == 2) {
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.m, p.k, p.m));
  } else {
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.k, p.m, p.k));
  }
  CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, p.n, p.m, p.n));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &lt_workspace_bytes, sizeof lt_workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic[8];
  int offered = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, lb, la, lc, lc, pref, 8, heuristic, &offered));
  if (offered == 0) {
    std::fprintf(stderr, "cuBLASLt offers no algorithm for this product\n");
    return 1;
  }
  const float one = 1.0f, zero = 0.0f, beta = kAccumulate ? 1.0f : 0.0f;
  const auto lt_run = [&](int i, const float* scale_c) {
    CHECK_LT(cublasLtMatmul(lt, desc, &one, b, lb, a, la, scale_c, ref, lc, ref, lc,
                            &heuristic[i].algo, lt_workspace, lt_workspace_bytes, p.stream));
    return true;
  };
  std::vector<double> lt_ms(offered);
  for (int i = 0; i < offered; ++i) lt_ms[i] = TimeRuns(p.stream, [&] { return lt_run(i, &beta); });
  const double best_lt_ms = *std::min_element(lt_ms.begin(), lt_ms.end());
  // The reference: heuristic #0 on a zeroed output, beta 0.
  BENCH_CHECK_CUDA(cudaMemsetAsync(ref, 0, d_bytes, p.stream));
  lt_run(0, &zero);
  BENCH_CHECK_CUDA(cudaStreamSynchronize(p.stream));

  std::printf("%s M=%d N=%d K=%d, %s operands, median of %d runs\n\n", kOpName, p.m, p.n, p.k,
              p.exact ? "integer-valued" : "random", kSamples);
  std::printf("| kernel | ms | TFLOP/s | best cuBLASLt / this | against cuBLASLt #0 |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int i = 0; i < offered; ++i) {
    const std::string name = "cuBLASLt heuristic #" + std::to_string(i);
    PrintRow(name.c_str(), lt_ms[i], best_lt_ms, p, i == 0 ? "reference" : "-");
  }
  using namespace cutlass::gemm;
  using Coop = KernelTmaWarpSpecializedCooperative;
  using Ping = KernelTmaWarpSpecializedPingpong;
  using EpiCoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using EpiPing = cutlass::epilogue::TmaWarpSpecialized;
  RunCutlass<Config<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, EpiCoop, PersistentScheduler>>(
      "CUTLASS cooperative 128x256x64, cluster 2x1", p, best_lt_ms);
  RunCutlass<Config<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, EpiCoop, PersistentScheduler>>(
      "CUTLASS cooperative 256x128x64, cluster 1x2", p, best_lt_ms);
  RunCutlass<Config<Shape<_128, _128, _64>, Shape<_2, _1, _1>, Ping, EpiPing, PersistentScheduler>>(
      "CUTLASS ping-pong 128x128x64, cluster 2x1", p, best_lt_ms);
  RunCutlass<Config<Shape<_64, _256, _64>, Shape<_1, _2, _1>, Ping, EpiPing, PersistentScheduler>>(
      "CUTLASS ping-pong 64x256x64, cluster 1x2", p, best_lt_ms);
  if (stream_k) {
    RunCutlass<Config<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, EpiCoop, StreamKScheduler>>(
        "CUTLASS cooperative 128x256x64 stream-K", p, best_lt_ms);
    RunCutlass<Config<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, EpiCoop, StreamKScheduler>>(
        "CUTLASS cooperative 256x128x64 stream-K", p, best_lt_ms);
  }
  CHECK_LT(cublasLtMatmulPreferenceDestroy(pref));
  CHECK_LT(cublasLtMatrixLayoutDestroy(lc));
  CHECK_LT(cublasLtMatrixLayoutDestroy(la));
  CHECK_LT(cublasLtMatrixLayoutDestroy(lb));
  CHECK_LT(cublasLtMatmulDescDestroy(desc));
  CHECK_LT(cublasLtDestroy(lt));
  BENCH_CHECK_CUDA(cudaFree(lt_workspace));
  BENCH_CHECK_CUDA(cudaFree(ref));
  BENCH_CHECK_CUDA(cudaFree(d));
  BENCH_CHECK_CUDA(cudaFree(b));
  BENCH_CHECK_CUDA(cudaFree(a));
  BENCH_CHECK_CUDA(cudaStreamDestroy(p.stream));
  return 0;
}

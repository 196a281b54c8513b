// logitd_model_sums_bench: the precision-class test's models on the device
// (server/kernels/cuda/model_kernels.h), the part of a Verify of every row
// that grows with M·V·K, against cuBLAS's fp32 SGEMM (pedantic math: fp32
// fused multiply-adds on the CUDA cores, no TF32) on the same packed
// operands: the models do an SGEMM's multiply-adds plus the tensor-core
// model's steps, so the SGEMM is the bar. Verify's own shapes: a block of
// logits rows as Verify judges them (256 rows at V = 128,256), every row at
// once, and a block of dX. Random bf16 operands, median of event-timed
// samples after a warm-up; sampled outputs checked bit for bit against the
// host's ModelSums.
//
//   usage: logitd_model_sums_bench [--reps=N] [--cases=logits-block,logits-all,dx-block]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_fill.h"
#include "logitd/reference/accumulation_models.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/model_kernels.h"

namespace logitd::bench {
namespace {

namespace kc = logitd::kernels::cuda;

#define BENCH_CHECK_CUBLAS(expr)                                         \
  do {                                                                   \
    const cublasStatus_t s_ = (expr);                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cublasGetStatusString(s_));                           \
      std::exit(1);                                                      \
    }                                                                    \
  } while (false)

struct Case {
  const char* name;
  std::int64_t rows, cols, n;
  bool b_terms_unit;  // B(t, j) = b[j·n + t] (logits: W [V, K]) or b[t·cols + j] (dX: W [V, K])
};

constexpr Case kCases[] = {
    {"logits-block", 256, 128256, 4096, true},
    {"logits-all", 4096, 128256, 4096, true},
    {"dx-block", 256, 4096, 128256, false},
};

template <typename T>
T* DeviceAlloc(std::size_t count) {
  void* p = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&p, count * sizeof(T)));
  return static_cast<T*>(p);
}

// n random bf16 values (never zero) widened to doubles on the device.
double* RandomOperand(std::int64_t n, std::uint64_t seed) {
  std::uint16_t* bits = DeviceAlloc<std::uint16_t>(static_cast<std::size_t>(n));
  double* out = DeviceAlloc<double>(static_cast<std::size_t>(n));
  BENCH_CHECK_CUDA(FillRandomBf16(bits, n, seed, nullptr));
  BENCH_CHECK_CUDA(kc::LaunchWidenBf16(bits, n, out, nullptr, nullptr, nullptr));
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  BENCH_CHECK_CUDA(cudaFree(bits));
  return out;
}

// Median milliseconds of `reps` event-timed runs of fn after two warm-ups.
template <typename Fn>
double MedianMs(int reps, Fn fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 2; ++w) fn();
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start));
    fn();
    BENCH_CHECK_CUDA(cudaEventRecord(stop));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
std::vector<T> ToHost(const T* p, std::size_t count) {
  std::vector<T> out(count);
  BENCH_CHECK_CUDA(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// Rows 0 and rows−1 against the first and last 32 columns: the host's
// models of them, compared bit for bit. Returns the elements that differ.
std::int64_t Check(const Case& c, const double* a, const double* b, const float* seq,
                   const double* tc) {
  const std::vector<double> host_a = ToHost(a, static_cast<std::size_t>(c.rows * c.n));
  const std::int64_t width = std::min<std::int64_t>(32, c.cols);
  std::vector<std::int64_t> cols;
  for (std::int64_t j = 0; j < width; ++j) cols.push_back(j);
  for (std::int64_t j = std::max(width, c.cols - width); j < c.cols; ++j) cols.push_back(j);
  // B's chosen columns, [n] each.
  std::vector<std::vector<double>> b_cols;
  for (const std::int64_t j : cols) {
    std::vector<double> col(static_cast<std::size_t>(c.n));
    if (c.b_terms_unit) {
      BENCH_CHECK_CUDA(cudaMemcpy(col.data(), b + j * c.n, col.size() * 8, cudaMemcpyDeviceToHost));
    } else {
      BENCH_CHECK_CUDA(cudaMemcpy2D(col.data(), 8, b + j, static_cast<std::size_t>(c.cols) * 8, 8,
                                    static_cast<std::size_t>(c.n), cudaMemcpyDeviceToHost));
    }
    b_cols.push_back(std::move(col));
  }
  const std::int64_t picked[] = {0, c.rows - 1};
  std::vector<float> rows_a(static_cast<std::size_t>(2 * c.n));
  for (int r = 0; r < 2; ++r) {
    for (std::int64_t t = 0; t < c.n; ++t) {
      rows_a[static_cast<std::size_t>(r * c.n + t)] =
          static_cast<float>(host_a[static_cast<std::size_t>(picked[r] * c.n + t)]);
    }
  }
  const PanelOf panel = [&](std::int64_t j0, std::int64_t count, float* out) {
    for (std::int64_t t = 0; t < c.n; ++t) {
      for (std::int64_t l = 0; l < count; ++l) {
        out[t * count + l] = static_cast<float>(b_cols[static_cast<std::size_t>(j0 + l)][t]);
      }
    }
  };
  const std::int64_t ncols = static_cast<std::int64_t>(cols.size());
  std::vector<float> host_seq(static_cast<std::size_t>(2 * ncols));
  std::vector<double> host_tc(host_seq.size());
  ModelSums(rows_a.data(), 2, ncols, c.n, panel, host_seq.data(), host_tc.data());
  std::int64_t differing = 0;
  for (int r = 0; r < 2; ++r) {
    for (std::int64_t l = 0; l < ncols; ++l) {
      const std::size_t at = static_cast<std::size_t>(picked[r] * c.cols + cols[l]);
      float ds;
      double dt;
      BENCH_CHECK_CUDA(cudaMemcpy(&ds, seq + at, 4, cudaMemcpyDeviceToHost));
      BENCH_CHECK_CUDA(cudaMemcpy(&dt, tc + at, 8, cudaMemcpyDeviceToHost));
      const std::size_t h = static_cast<std::size_t>(r * ncols + l);
      if (std::memcmp(&ds, &host_seq[h], 4) != 0 || std::memcmp(&dt, &host_tc[h], 8) != 0) {
        ++differing;
      }
    }
  }
  return differing;
}

void Run(const Case& c, int reps, cublasHandle_t handle) {
  // A is [rows, n] (its terms along the unit stride, as X and G are).
  double* a = RandomOperand(c.rows * c.n, 11);
  double* b = RandomOperand(c.n * c.cols, 12);
  const std::int64_t sb_j = c.b_terms_unit ? c.n : 1, sb_t = c.b_terms_unit ? 1 : c.cols;
  const kc::ModelPanelShape shape = kc::ModelPanelShapeOf(c.rows, c.cols, c.n);
  float* pa = DeviceAlloc<float>(shape.a_floats());
  float* pb = DeviceAlloc<float>(shape.b_floats());
  const std::size_t elements = static_cast<std::size_t>(c.rows * c.cols);
  float* seq = DeviceAlloc<float>(elements);
  double* tc = DeviceAlloc<double>(elements);
  float* product = DeviceAlloc<float>(static_cast<std::size_t>(shape.rows * shape.cols));

  const double pack_a = MedianMs(reps, [&] {
    BENCH_CHECK_CUDA(
        kc::LaunchPackModelPanel(a, c.n, 1, c.rows, c.n, shape.rows, shape.terms, pa, nullptr));
  });
  const double pack_b = MedianMs(reps, [&] {
    BENCH_CHECK_CUDA(
        kc::LaunchPackModelPanel(b, sb_j, sb_t, c.cols, c.n, shape.cols, shape.terms, pb, nullptr));
  });
  const double models = MedianMs(reps, [&] {
    BENCH_CHECK_CUDA(kc::LaunchModelSums(pa, pb, shape, c.rows, c.cols, c.n, seq, tc, nullptr));
  });
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  const std::int64_t differing = Check(c, a, b, seq, tc);
  // C (column-major [rows, cols]) = A(col [rows, terms])·B(col [cols, terms])ᵀ.
  const float one = 1.0f, zero = 0.0f;
  const double sgemm = MedianMs(reps, [&] {
    BENCH_CHECK_CUBLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(shape.rows),
                                   static_cast<int>(shape.cols), static_cast<int>(shape.terms),
                                   &one, pa, static_cast<int>(shape.rows), pb,
                                   static_cast<int>(shape.cols), &zero, product,
                                   static_cast<int>(shape.rows)));
  });
  const double flops = 2.0 * static_cast<double>(c.rows) * c.cols * c.n;
  std::printf("| %s | %lld×%lld×%lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %s |\n", c.name,
              static_cast<long long>(c.rows), static_cast<long long>(c.cols),
              static_cast<long long>(c.n), pack_a, pack_b, models, sgemm, models / sgemm,
              flops / (models * 1e9), differing == 0 ? "bits equal" : "DIFFER");
  std::fflush(stdout);
  for (void* p : std::initializer_list<void*>{a, b, pa, pb, seq, tc, product}) {
    BENCH_CHECK_CUDA(cudaFree(p));
  }
  if (differing != 0) {
    std::fprintf(stderr, "%s: %lld sampled outputs differ from the host's models\n", c.name,
                 static_cast<long long>(differing));
    std::exit(1);
  }
}

}  // namespace
}  // namespace logitd::bench

int main(int argc, char** argv) {
  int reps = 5;
  std::string cases = "logits-block,logits-all,dx-block";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(arg.c_str() + 7));
    } else if (arg.rfind("--cases=", 0) == 0) {
      cases = arg.substr(8);
    } else {
      std::fprintf(stderr, "usage: %s [--reps=N] [--cases=NAME,...]\n", argv[0]);
      return 2;
    }
  }
  cublasHandle_t handle = nullptr;
  BENCH_CHECK_CUBLAS(cublasCreate(&handle));
  BENCH_CHECK_CUBLAS(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  std::printf(
      "| case | rows×cols×terms | pack A (ms) | pack B (ms) | models (ms) | SGEMM (ms) | "
      "models / SGEMM | models (TFLOP/s of 2·M·N·K) | sampled outputs vs host |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const logitd::bench::Case& c : logitd::bench::kCases) {
    if (("," + cases + ",").find(std::string(",") + c.name + ",") == std::string::npos) continue;
    logitd::bench::Run(c, reps, handle);
  }
  BENCH_CHECK_CUBLAS(cublasDestroy(handle));
  return 0;
}

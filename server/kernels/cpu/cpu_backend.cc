#include "server/kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/kernels/cpu/cpu_backend_class.h"
#include "server/kernels/cpu/cpu_blas.h"
#include "server/kernels/cpu/row_walk.h"
#include "server/kernels/cpu/walks.h"
#include "server/kernels/device_health.h"
#include "server/kernels/gradient_state.h"
#include "server/kernels/host_pool.h"

namespace logitd::kernels::cpu {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
      }
    }
  }
  return "unknown cpu";
}

absl::Status ForeignWeight(absl::string_view op, const Weight& w) {
  return ForeignWeightError(op, "cpu", w);
}

// At least one kAlignment block (so that zero bytes still give a valid
// pointer), rounded up to a multiple of it as aligned_alloc wants.
absl::StatusOr<std::byte*> AllocateAligned(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - kAlignment) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("host buffer of %d bytes cannot be allocated", bytes));
  }
  const std::size_t rounded =
      std::max<std::size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate a host buffer of %d bytes", bytes));
  }
  return static_cast<std::byte*>(p);
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : host_pool_(HostBufferPool::Create(options.pinned_cache_bytes, AllocateAligned,
                                        [](std::byte* p) { std::free(p); })),
      test_device_faults_(options.test_device_faults),
      health_(options.device_timeout, options.events.device_lost) {
  if (options.cpu_threads > 0) {
    SetBlasThreads(options.cpu_threads);
  }
  info_.backend = "cpu";
  info_.device_name = CpuModelName();
  info_.multiprocessor_count = static_cast<int>(std::thread::hardware_concurrency());
  info_.algo_choices = kAlgoChoicesFixed;
}

BackendInfo CpuBackend::Info() const {
  BackendInfo info = info_;
  // Read at call time: the thread count is process-wide and may be changed
  // by another backend instance.
  const char* config = openblas_get_config();
  info.blas_version = absl::StrCat(config != nullptr ? config : "OpenBLAS (unknown config)",
                                   "; threads=", openblas_get_num_threads());
  return info;
}

absl::StatusOr<HostBuffer> CpuBackend::DoAllocateHost(std::size_t bytes) {
  if (bytes >= kPooledBytes) return host_pool_->Get(bytes);
  absl::StatusOr<std::byte*> p = AllocateAligned(bytes);
  if (!p.ok()) return p.status();
  return HostBuffer(*p, bytes, [](std::byte* d) { std::free(d); });
}

absl::StatusOr<std::shared_ptr<Weight>> CpuBackend::DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                                 std::int64_t k) {
  if (v > kMaxBlasDim || k > kMaxBlasDim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "load weight: expected V and K in [1, %d], got [%d, %d]", kMaxBlasDim, v, k));
  }
  const std::int64_t n = v * k;  // < 2^62: both factors are < 2^31
  absl::StatusOr<FloatBuffer> wf =
      AllocateFloats(n, /*zeroed=*/false, absl::StrFormat("load weight [%d, %d]", v, k));
  if (!wf.ok()) return wf.status();
  Widen(w, n, wf->get());
  return std::make_shared<CpuWeight>(v, k, std::move(*wf));
}

absl::Status CpuBackend::LogitsCall(const Weight& weight, const LogitsArgs& args, Timing* timing) {
  const auto start = std::chrono::steady_clock::now();
  const CpuWeight* cw = AsCpuWeight(weight);
  if (cw == nullptr) return ForeignWeight("logits", weight);
  const CpuWeight& w = *cw;
  if (absl::Status s = CheckBlasRows("logits", args.m); !s.ok()) return s;
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  // One sgemm per kBlasRows rows from the first.
  const std::int64_t rows = std::min(m, kBlasRows);
  absl::StatusOr<FloatBuffer> xf = AllocateFloats(rows * k, false, "logits: x widened to fp32");
  if (!xf.ok()) return xf.status();
  // bf16 out goes through an fp32 accumulator so it is rounded exactly once.
  FloatBuffer tmp;
  if (args.out_dtype != DType::kFp32) {
    absl::StatusOr<FloatBuffer> t = AllocateFloats(rows * v, false, "logits: fp32 accumulator");
    if (!t.ok()) return t.status();
    tmp = std::move(*t);
  }
  for (std::int64_t r0 = 0; r0 < m; r0 += rows) {
    const std::int64_t mb = std::min(rows, m - r0);
    Widen(args.x + r0 * k, mb * k, xf->get());
    float* y = args.out_dtype == DType::kFp32 ? static_cast<float*>(args.y) + r0 * v : tmp.get();
    // alpha scales the finished fp32 accumulator once, Y = fl(alpha * acc),
    // as a GEMM epilogue does. Handing alpha to sgemm instead would let
    // OpenBLAS apply it per K block (different rounding), give +0 where
    // alpha * +0 is -0, and skip the product entirely for alpha == 0,
    // where IEEE says 0 * NaN = NaN.
    Sgemm(CblasNoTrans, CblasTrans, mb, v, k, 1.0f, xf->get(), k, w.data(), k, 0.0f, y, v);
    if (args.alpha != 1.0f) {
      const float alpha = args.alpha;
      for (std::int64_t i = 0; i < mb * v; ++i) y[i] *= alpha;
    }
    if (args.out_dtype == DType::kBf16) {
      Narrow(y, mb * v, static_cast<Bf16Bits*>(args.y) + r0 * v);
    }
  }
  SetTiming(timing, start);
  return absl::OkStatus();
}

std::int64_t CpuBackend::LogitsBlockRows(const Weight& /*w*/, std::int64_t m,
                                         DType /*out_dtype*/) const {
  return std::min(m, kBlasRows);
}

std::int64_t CpuBackend::LogProbsBlockRows(const Weight& /*w*/, std::int64_t m) const {
  return std::min(m, kBlasRows);
}

std::int64_t CpuBackend::CrossEntropyBlockRows(const Weight& /*w*/, std::int64_t m) const {
  return std::min(m, kBlasRows);
}

absl::Status CpuBackend::BackwardCall(Weight& weight, const BackwardArgs& args, Timing* timing) {
  const auto start = std::chrono::steady_clock::now();
  CpuWeight* cw = AsCpuWeight(weight);
  if (cw == nullptr) return ForeignWeight("backward", weight);
  CpuWeight& w = *cw;
  if (absl::Status s = CheckBlasRows("backward", args.m); !s.ok()) return s;
  const bool want_dx = args.dx != nullptr;
  const bool want_dw = args.dw != nullptr && !args.accumulate_dw;
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();

  // G = bf16(dY), rounded once; a bf16 dY already is G.
  absl::StatusOr<FloatBuffer> g = AllocateFloats(m * v, false, "backward: G = bf16(dY)");
  if (!g.ok()) return g.status();
  if (args.dy_dtype == DType::kFp32) {
    const float* dy = static_cast<const float*>(args.dy);
    for (std::int64_t i = 0; i < m * v; ++i) (*g)[i] = RoundToBf16(dy[i]);
  } else {
    Widen(static_cast<const Bf16Bits*>(args.dy), m * v, g->get());
  }

  if (want_dx) {
    // dX [m, K] = G [m, V] . W [V, K]
    FloatBuffer tmp;
    float* dx = static_cast<float*>(args.dx);
    if (args.dx_dtype == DType::kBf16) {
      absl::StatusOr<FloatBuffer> t = AllocateFloats(m * k, false, "backward: dX accumulator");
      if (!t.ok()) return t.status();
      tmp = std::move(*t);
      dx = tmp.get();
    }
    Sgemm(CblasNoTrans, CblasNoTrans, m, k, v, 1.0f, g->get(), v, w.data(), k, 0.0f, dx, k);
    if (args.dx_dtype == DType::kBf16) Narrow(dx, m * k, static_cast<Bf16Bits*>(args.dx));
  }

  if (want_dw || args.accumulate_dw) {
    absl::StatusOr<FloatBuffer> xf = AllocateFloats(m * k, false, "backward: x widened to fp32");
    if (!xf.ok()) return xf.status();
    Widen(args.x, m * k, xf->get());
    if (args.accumulate_dw) {
      // dW_buffer [V, K] += G^T [V, m] . X [m, K]
      GradientState<FloatBuffer>::Lock gradient = w.gradient().Acquire();
      absl::StatusOr<FloatBuffer*> buf = gradient.GetOrCreate(
          [&] { return AllocateFloats(v * k, /*zeroed=*/true, "backward: fp32 gradient buffer"); });
      if (!buf.ok()) return buf.status();
      Sgemm(CblasTrans, CblasNoTrans, v, k, m, 1.0f, g->get(), v, xf->get(), k, 1.0f, (*buf)->get(),
            k);
      gradient.CountCall();
    } else {
      FloatBuffer tmp;
      float* dw = static_cast<float*>(args.dw);
      if (args.dw_dtype == DType::kBf16) {
        absl::StatusOr<FloatBuffer> t = AllocateFloats(v * k, false, "backward: dW accumulator");
        if (!t.ok()) return t.status();
        tmp = std::move(*t);
        dw = tmp.get();
      }
      Sgemm(CblasTrans, CblasNoTrans, v, k, m, 1.0f, g->get(), v, xf->get(), k, 0.0f, dw, k);
      if (args.dw_dtype == DType::kBf16) Narrow(dw, v * k, static_cast<Bf16Bits*>(args.dw));
    }
  }
  SetTiming(timing, start);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoReadWeight(const Weight& weight, Bf16Bits* out) {
  const CpuWeight* w = AsCpuWeight(weight);
  if (w == nullptr) return ForeignWeight("read weight", weight);
  if (out == nullptr) return absl::InvalidArgumentError("read weight: out is null");
  // Held widened to fp32, exactly: the top half of each value is its bf16.
  const float* data = w->data();
  for (std::int64_t i = 0; i < w->numel(); ++i) out[i] = FloatToBf16(data[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> CpuBackend::DoFetchGradient(Weight& weight, float* out,
                                                          bool zero_after_fetch) {
  CpuWeight* cw = AsCpuWeight(weight);
  if (cw == nullptr) return ForeignWeight("fetch gradient", weight);
  CpuWeight& w = *cw;
  if (out == nullptr) return absl::InvalidArgumentError("fetch gradient: out is null");
  const std::size_t bytes = static_cast<std::size_t>(w.numel()) * sizeof(float);
  GradientState<FloatBuffer>::Lock gradient = w.gradient().Acquire();
  FloatBuffer* grad = gradient.buffer();
  if (grad == nullptr) {
    std::memset(out, 0, bytes);
    return 0;
  }
  std::memcpy(out, grad->get(), bytes);
  const std::uint64_t count = gradient.calls();
  if (zero_after_fetch) {
    std::memset(grad->get(), 0, bytes);
    gradient.ResetCalls();
  }
  return count;
}

absl::Status CpuBackend::DoZeroGradient(Weight& weight) {
  CpuWeight* cw = AsCpuWeight(weight);
  if (cw == nullptr) return ForeignWeight("zero gradient", weight);
  CpuWeight& w = *cw;
  GradientState<FloatBuffer>::Lock gradient = w.gradient().Acquire();
  if (FloatBuffer* grad = gradient.buffer(); grad != nullptr) {
    std::memset(grad->get(), 0, static_cast<std::size_t>(w.numel()) * sizeof(float));
  }
  gradient.ResetCalls();
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyCall(const CrossEntropyArgs& args, Timing* timing) {
  Weight& weight = *args.weight;
  const auto start = std::chrono::steady_clock::now();
  CpuWeight* cw = AsCpuWeight(weight);
  if (cw == nullptr) return ForeignWeight("cross entropy", weight);
  CpuWeight& w = *cw;
  if (absl::Status s = CheckBlasRows("cross entropy", args.m); !s.ok()) return s;
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  const bool want_dx = args.dx != nullptr;
  const bool return_dw = args.dw != nullptr && !args.accumulate_dw;
  const bool backward = want_dx || return_dw || args.accumulate_dw;

  // Everything is allocated before the gradient buffer is touched, so an
  // accumulating call either adds all of its dW or none of it.
  absl::StatusOr<FloatBuffer> xf = AllocateFloats(m * k, false, "cross entropy: x widened");
  if (!xf.ok()) return xf.status();
  Widen(args.x, m * k, xf->get());
  const std::int64_t buf_floats = BlockChunkFloats(args.vocab_chunk, m, v);
  absl::StatusOr<FloatBuffer> buf = AllocateFloats(
      buf_floats, false,
      absl::StrFormat("cross entropy: fp32 logits of a block's chunk (%d floats)", buf_floats));
  if (!buf.ok()) return buf.status();
  FloatBuffer dx_tmp;
  float* dx_acc = nullptr;
  if (want_dx) {
    // Written whole by the first chunk's sgemm (beta 0), as Backward's is.
    if (args.dx_dtype == DType::kFp32) {
      dx_acc = static_cast<float*>(args.dx);
    } else {
      absl::StatusOr<FloatBuffer> t = AllocateFloats(m * k, false, "cross entropy: dX accumulator");
      if (!t.ok()) return t.status();
      dx_tmp = std::move(*t);
      dx_acc = dx_tmp.get();
    }
  }

  // Pass 1: lse and the target's capped logit, row by row over the tiles.
  std::vector<CeRow> rows(static_cast<std::size_t>(m));
  std::vector<float> z_target(static_cast<std::size_t>(m), 0.0f);
  CeRowsPass(args, w, xf->get(), buf->get(), &rows, &z_target);
  const std::vector<float> lse = CeLosses(args, rows, z_target);

  if (backward) {
    if (absl::Status s = CeGradientPass(args, w, xf->get(), lse, buf->get(), dx_acc); !s.ok()) {
      return s;
    }
  }
  SetTiming(timing, start);
  return absl::OkStatus();
}

#ifdef LOGITD_TEST_FAULTS
absl::Status CpuBackend::TestDeviceFault(std::uint32_t trigger, std::int64_t n) {
  if (trigger == kTestDeviceTrap) {
    health_.MarkLost(
        absl::InternalError(absl::StrCat("cast(", n,
                                         " values): test fault device_trap (simulated device fault "
                                         "on the cpu backend)")));
    return health_.status();
  }
  DeviceHealth::Watch watch = health_.Begin(absl::StrCat("cast(", n, " values)"));
  const auto start = std::chrono::steady_clock::now();
  auto lost_at = std::chrono::steady_clock::time_point::max();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(30) &&
         std::chrono::steady_clock::now() - lost_at < std::chrono::seconds(1)) {
    if (lost_at == std::chrono::steady_clock::time_point::max() && health_.lost()) {
      lost_at = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  absl::Status health = health_.status();
  return health.ok() ? absl::InternalError("test fault device_hang: 30 s passed") : health;
}
#endif  // LOGITD_TEST_FAULTS

std::unique_ptr<Backend> CreateCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace logitd::kernels::cpu

namespace logitd::kernels {

template <>
struct KernelOf<cpu::CpuBackend, CrossEntropyArgs> {
  static absl::Status Run(cpu::CpuBackend& backend, const CrossEntropyArgs& args, Timing* timing) {
    return backend.CrossEntropyCall(args, timing);
  }
};

using cpu::CpuBackend;
LOGITD_KERNEL(CpuBackend, CrossEntropyArgs);

template <>
struct KernelOf<cpu::CpuBackend, LogitsArgs> {
  static absl::Status Run(cpu::CpuBackend& backend, const LogitsArgs& args, Timing* timing) {
    return backend.LogitsCall(*args.weight, args, timing);
  }
};

template <>
struct KernelOf<cpu::CpuBackend, BackwardArgs> {
  static absl::Status Run(cpu::CpuBackend& backend, const BackwardArgs& args, Timing* timing) {
    return backend.BackwardCall(*args.weight, args, timing);
  }
};

LOGITD_KERNEL(CpuBackend, LogitsArgs);
LOGITD_KERNEL(CpuBackend, BackwardArgs);

}  // namespace logitd::kernels

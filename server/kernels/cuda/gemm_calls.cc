// The cuda backend's GEMM calls: Logits in row blocks whose copy overlaps
// the next block's GEMM, Backward with G = bf16(dY) cast on the device,
// the gradient buffer's fetch and zeroing, the cast, and the test-only
// device faults.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_backend_class.h"
#include "server/kernels/cuda/fp64_products.h"
#include "server/kernels/kernel_table.h"

namespace logitd::kernels::cuda {

absl::Status CudaBackend::LogitsCall(const Weight& weight, const LogitsArgs& args, Timing* timing) {
  const auto* w = dynamic_cast<const CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("logits", "cuda", weight);
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(c, absl::StrCat("logits(M=", args.m, ",V=", w->v(), ",K=", w->k(), ")"));
  return LogitsBlocks(*w, args, *c, timing);
}

// Logits' device buffers: X whole, Y in blocks of `rows` rows (two, so that
// one block's copy overlaps the next one's GEMM), and an fp32 accumulator
// when alpha == 0 with bf16 out.
struct LogitsBuffers {
  std::int64_t rows = 0;
  std::int64_t blocks = 0;
  std::size_t row_bytes = 0;
  void* x = nullptr;
  std::array<void*, 2> y{};
  void* acc = nullptr;
};

namespace {

// The rows of Logits' blocks of Y: the GEMMs it runs are of this many rows
// (the last one of the rest), aligned at the call's first row: about
// kLogitsBlockBytes of Y, a multiple of 128 rows and at least kMinBlockRows.
// A call of at most that many rows is one GEMM. The figure depends on the
// row's bytes alone, so a call cut at its multiples runs the same GEMMs.
std::int64_t LogitsRows(std::int64_t m, std::size_t row_bytes) {
  const std::int64_t rows =
      std::max(kMinBlockRows, static_cast<std::int64_t>(kLogitsBlockBytes / row_bytes) / 128 * 128);
  return std::min(m, rows);
}

}  // namespace

// A cut at a multiple of the GEMMs' rows runs the very GEMMs of the uncut
// call: the same shapes (so the same algorithms) on the same rows.
std::int64_t CudaBackend::LogitsBlockRows(const Weight& w, std::int64_t m, DType out_dtype) const {
  if (m <= 0) return m;
  return LogitsRows(m, static_cast<std::size_t>(w.v()) * ElementSize(out_dtype));
}

absl::StatusOr<LogitsBuffers> CudaBackend::AllocateLogits(Context& c, const LogitsArgs& args,
                                                          std::int64_t v, std::int64_t k,
                                                          bool acc_separate) {
  const std::int64_t m = args.m;
  LogitsBuffers b;
  b.row_bytes = static_cast<std::size_t>(v) * ElementSize(args.out_dtype);
  b.rows = LogitsRows(m, b.row_bytes);
  b.blocks = (m + b.rows - 1) / b.rows;
  auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "logits: device x");
  if (!x.ok()) return x.status();
  b.x = *x;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(b.blocks, 2); ++i) {
    auto buffer = Scratch(c, i == 0 ? kY0 : kY1, static_cast<std::size_t>(b.rows) * b.row_bytes,
                          "logits: device y block");
    if (!buffer.ok()) return buffer.status();
    b.y[static_cast<std::size_t>(i)] = *buffer;
  }
  if (acc_separate) {
    auto buffer = Scratch(c, kAcc, static_cast<std::size_t>(b.rows * v) * 4,
                          "logits: device fp32 accumulator");
    if (!buffer.ok()) return buffer.status();
    b.acc = *buffer;
  }
  return b;
}

absl::Status CudaBackend::LogitsBlocks(const CudaWeight& w, const LogitsArgs& args, Context& c,
                                       Timing* timing) {
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  // alpha == 0: the library may skip the product and so lose IEEE's
  // 0 * Inf = NaN; compute with alpha = 1 in fp32 and scale afterwards, as
  // the cpu backend does.
  const bool scale_after = args.alpha == 0.0f;
  const bool acc_separate = scale_after && args.out_dtype == DType::kBf16;
  absl::StatusOr<LogitsBuffers> buffers = AllocateLogits(c, args, v, k, acc_separate);
  if (!buffers.ok()) return buffers.status();
  const LogitsBuffers& lb = *buffers;

  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();
  const std::string shape = absl::StrCat("M=", m, ",N=", v, ",K=", k);
  const StreamTimer timer(c, "logits");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(lb.x, args.x, static_cast<std::size_t>(m * k) * 2,
                                       cudaMemcpyHostToDevice, cs),
                       "logits: copy x [", m, ", ", k, "] to the device");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  const GemmStream gs = c.gemm(GemmRecord(timing));
  auto enqueue_gemm = [&](std::int64_t b) -> absl::Status {
    const std::size_t slot = static_cast<std::size_t>(b % 2);
    const std::int64_t row0 = b * lb.rows;
    const std::int64_t mb = std::min(lb.rows, m - row0);
    if (b >= 2) {
      // The buffer's previous block must have reached the host.
      RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(cs, c.block_copied[slot].get(), 0),
                           "logits: cudaStreamWaitEvent");
    }
    const void* xb = static_cast<const std::byte*>(lb.x) + static_cast<std::size_t>(row0 * k) * 2;
    if (!scale_after) {
      RETURN_IF_ERROR_(engine_.Run(LogitsShape(mb, v, k, CudaType(args.out_dtype)),
                                   GemmOperands{xb, w.data(), lb.y[slot], args.alpha, 0.0f}, gs));
    } else {
      void* target = acc_separate ? lb.acc : lb.y[slot];
      RETURN_IF_ERROR_(engine_.Run(LogitsShape(mb, v, k, CUDA_R_32F),
                                   GemmOperands{xb, w.data(), target, 1.0f, 0.0f}, gs));
      RETURN_IF_CUDA_ERROR(LaunchScale(static_cast<const float*>(target), mb * v, args.alpha,
                                       lb.y[slot], args.out_dtype == DType::kBf16, cs),
                           "logits: scale kernel (", shape, ")");
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_done[slot].get(), cs), "logits: cudaEventRecord");
    if (b == lb.blocks - 1) {
      RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    }
    return absl::OkStatus();
  };

  // The GEMM of block b+1 is queued before the copy of block b, so the two
  // overlap even when the host buffer is pageable (such a copy returns only
  // when done).
  RETURN_IF_ERROR_(enqueue_gemm(0));
  for (std::int64_t b = 0; b < lb.blocks; ++b) {
    const std::size_t slot = static_cast<std::size_t>(b % 2);
    if (b + 1 < lb.blocks) RETURN_IF_ERROR_(enqueue_gemm(b + 1));
    const std::int64_t row0 = b * lb.rows;
    const std::int64_t mb = std::min(lb.rows, m - row0);
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(ss, c.block_done[slot].get(), 0),
                         "logits: cudaStreamWaitEvent");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(
            static_cast<std::byte*>(args.y) + static_cast<std::size_t>(row0) * lb.row_bytes,
            lb.y[slot], static_cast<std::size_t>(mb) * lb.row_bytes, cudaMemcpyDeviceToHost, ss),
        "logits: copy y rows [", row0, ", ", row0 + mb, ") of [", m, ", ", v, "] to the host");
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_copied[slot].get(), ss),
                         "logits: cudaEventRecord");
  }
  RETURN_IF_ERROR_(timer.End(ss, absl::StrCat("logits(", shape, ")")));
  // A failed kernel surfaces here if not before.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "logits(", shape, ")");
  if (timing != nullptr) timer.Fill(timing);
  return absl::OkStatus();
}

namespace {

// G = bf16(dY) into g [m, v], block by block through `staging` (rows of
// fp32 dY at a time) when dY is fp32; x into `x` when it is not null.
absl::Status UploadBackwardInputs(const BackwardArgs& args, std::int64_t v, std::int64_t k,
                                  Bf16Bits* g, void* x, void* staging, std::int64_t staging_rows,
                                  cudaStream_t cs) {
  const std::int64_t m = args.m;
  const std::size_t dy_row_bytes = static_cast<std::size_t>(v) * 4;
  if (args.dy_dtype == DType::kBf16) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(g, args.dy, static_cast<std::size_t>(m * v) * 2,
                                         cudaMemcpyHostToDevice, cs),
                         "backward: copy dy [", m, ", ", v, "] bf16 to the device");
  } else {
    for (std::int64_t row0 = 0; row0 < m; row0 += staging_rows) {
      const std::int64_t rb = std::min(staging_rows, m - row0);
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(staging,
                          static_cast<const std::byte*>(args.dy) +
                              static_cast<std::size_t>(row0) * dy_row_bytes,
                          static_cast<std::size_t>(rb) * dy_row_bytes, cudaMemcpyHostToDevice, cs),
          "backward: copy dy rows [", row0, ", ", row0 + rb, ") of [", m, ", ", v,
          "] to the device");
      RETURN_IF_CUDA_ERROR(
          LaunchCastFp32ToBf16(static_cast<const float*>(staging), rb * v, g + row0 * v, cs),
          "backward: cast kernel (", rb * v, " values)");
    }
  }
  if (x != nullptr) {
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(x, args.x, static_cast<std::size_t>(m * k) * 2, cudaMemcpyHostToDevice, cs),
        "backward: copy x [", m, ", ", k, "] to the device");
  }
  return absl::OkStatus();
}

}  // namespace

// Backward's device buffers: G, X (for dW), the fp32 dY staging rows, dX
// and dW (unless dW accumulates into the weight's gradient buffer); null
// where the call does not need them.
struct BackwardBuffers {
  Bf16Bits* g = nullptr;
  void* x = nullptr;
  void* staging = nullptr;
  std::int64_t staging_rows = 0;
  void* dx = nullptr;
  void* dw = nullptr;
};

absl::StatusOr<BackwardBuffers> CudaBackend::AllocateBackward(Context& c, const BackwardArgs& args,
                                                              std::int64_t v, std::int64_t k) {
  const std::int64_t m = args.m;
  const bool want_dw = args.accumulate_dw || args.dw != nullptr;
  BackwardBuffers b;
  auto g = Scratch(c, kG, static_cast<std::size_t>(m * v) * 2, "backward: device G");
  if (!g.ok()) return g.status();
  b.g = static_cast<Bf16Bits*>(*g);
  if (want_dw) {
    auto buffer = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "backward: device x");
    if (!buffer.ok()) return buffer.status();
    b.x = *buffer;
  }
  if (args.dy_dtype == DType::kFp32) {
    const std::size_t dy_row_bytes = static_cast<std::size_t>(v) * 4;
    b.staging_rows = std::max<std::int64_t>(
        1, std::min<std::int64_t>(m, static_cast<std::int64_t>(kStagingBytes / dy_row_bytes)));
    auto buffer = Scratch(c, kStaging, static_cast<std::size_t>(b.staging_rows) * dy_row_bytes,
                          "backward: device dy staging");
    if (!buffer.ok()) return buffer.status();
    b.staging = *buffer;
  }
  if (args.dx != nullptr) {
    auto buffer = Scratch(c, kDx, static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype),
                          "backward: device dx");
    if (!buffer.ok()) return buffer.status();
    b.dx = *buffer;
  }
  if (want_dw && !args.accumulate_dw) {
    auto buffer = Scratch(c, kDw, static_cast<std::size_t>(v * k) * ElementSize(args.dw_dtype),
                          "backward: device dw");
    if (!buffer.ok()) return buffer.status();
    b.dw = *buffer;
  }
  return b;
}

absl::Status CudaBackend::BackwardCall(Weight& weight, const BackwardArgs& args, Timing* timing) {
  auto* w = dynamic_cast<CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("backward", "cuda", weight);
  const bool want_dx = args.dx != nullptr;
  const bool want_dw = args.accumulate_dw || args.dw != nullptr;
  const std::int64_t m = args.m;
  const std::int64_t v = w->v();
  const std::int64_t k = w->k();
  RETURN_IF_ERROR_(UseDevice(options_.device));
  const std::string shape = absl::StrCat("M=", m, ",V=", v, ",K=", k);
  ACQUIRE_OR_RETURN_(lease, absl::StrCat("backward(", shape, ")"));
  Context& c = *lease;
  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();
  absl::StatusOr<BackwardBuffers> buffers = AllocateBackward(c, args, v, k);
  if (!buffers.ok()) return buffers.status();
  Bf16Bits* const g = buffers->g;
  void* const x = buffers->x;
  void* const dx = buffers->dx;
  void* const dw = buffers->dw;

  // Inputs: G = bf16(dY) block by block through the staging buffer.
  const StreamTimer timer(c, "backward");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_ERROR_(
      UploadBackwardInputs(args, v, k, g, x, buffers->staging, buffers->staging_rows, cs));
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  const GemmStream gs = c.gemm(GemmRecord(timing));
  if (want_dx) {
    RETURN_IF_ERROR_(engine_.Run(GradInputShape(m, v, k, CudaType(args.dx_dtype)),
                                 GemmOperands{g, w->data(), dx, 1.0f, 0.0f}, gs));
    // dX goes home while dW computes.
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_done[0].get(), cs), "backward: cudaEventRecord");
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(ss, c.block_done[0].get(), 0),
                         "backward: cudaStreamWaitEvent");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(args.dx, dx, static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype),
                        cudaMemcpyDeviceToHost, ss),
        "backward: copy dx [", m, ", ", k, "] to the host");
  }
  if (args.accumulate_dw) {
    // One accumulation at a time per weight; held until the stream is done.
    GradientState<DeviceBuffer>::Lock gradient = w->gradient().Acquire();
    // Nothing of this call may still write the gradient once the lock goes,
    // on failure too.
    const auto drained = [&](absl::Status status) {
      for (cudaStream_t stream : {cs, ss}) {
        if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
      }
      return status;
    };
    absl::StatusOr<float*> buffer = GradientBuffer(gradient, *w, cs, "backward");
    if (!buffer.ok()) return drained(buffer.status());
    if (absl::Status run = engine_.Run(GradWeightShape(m, v, k, CUDA_R_32F),
                                       GemmOperands{g, x, *buffer, 1.0f, 1.0f}, gs);
        !run.ok()) {
      return drained(std::move(run));
    }
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "backward(", shape, "): accumulate dw");
    gradient.CountCall();
  } else if (want_dw) {
    RETURN_IF_ERROR_(engine_.Run(GradWeightShape(m, v, k, CudaType(args.dw_dtype)),
                                 GemmOperands{g, x, dw, 1.0f, 0.0f}, gs));
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(args.dw, dw, static_cast<std::size_t>(v * k) * ElementSize(args.dw_dtype),
                        cudaMemcpyDeviceToHost, cs),
        "backward: copy dw [", v, ", ", k, "] to the host");
  } else {
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
  }
  // The end is when both streams are done.
  RETURN_IF_ERROR_(timer.EndOfBothStreams(absl::StrCat("backward(", shape, ")")));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ss), "backward(", shape, ")");
  if (timing != nullptr) timer.Fill(timing);
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> CudaBackend::DoFetchGradient(Weight& weight, float* out,
                                                           bool zero_after_fetch) {
  auto* w = dynamic_cast<CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("fetch gradient", "cuda", weight);
  if (out == nullptr) return absl::InvalidArgumentError("fetch gradient: out is null");
  const std::size_t bytes = static_cast<std::size_t>(w->v() * w->k()) * 4;
  RETURN_IF_ERROR_(UseDevice(options_.device));
  // Lease before the gradient lock, as Backward does.
  ACQUIRE_OR_RETURN_(c, absl::StrCat("gradient fetch [", w->v(), ", ", w->k(), "]"));
  GradientState<DeviceBuffer>::Lock gradient = w->gradient().Acquire();
  const std::uint64_t count = gradient.calls();
  const DeviceBuffer* buffer = gradient.buffer();
  if (buffer == nullptr) {
    std::memset(out, 0, bytes);
    return count;
  }
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(out, buffer->get(), bytes, cudaMemcpyDeviceToHost, c->compute.get()),
      "gradient: copy [", w->v(), ", ", w->k(), "] fp32 to the host");
  if (zero_after_fetch) {
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(buffer->get(), 0, bytes, c->compute.get()),
                         "gradient: zero");
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(c->compute.get()), "gradient: fetch");
  if (zero_after_fetch) gradient.ResetCalls();
  return count;
}

absl::Status CudaBackend::DoReadWeight(const Weight& weight, Bf16Bits* out) {
  const auto* w = dynamic_cast<const CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("read weight", "cuda", weight);
  if (out == nullptr) return absl::InvalidArgumentError("read weight: out is null");
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(c, absl::StrCat("weight read [", w->v(), ", ", w->k(), "]"));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(out, w->data(), w->weight_bytes(), cudaMemcpyDeviceToHost, c->compute.get()),
      "weight: copy [", w->v(), ", ", w->k(), "] bf16 to the host");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(c->compute.get()), "weight: read");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Fp64Products>> CudaBackend::DoReferenceProducts(
    const Weight& weight) {
  const auto* w = dynamic_cast<const CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("reference products", "cuda", weight);
  absl::StatusOr<std::unique_ptr<CudaFp64Products>> engine = CudaFp64Products::Create(
      w->data(), w->v(), w->k(), options_.device, memory_, info_.device_name);
  if (!engine.ok()) return engine.status();
  (*engine)->set_weight_memo(w->memo());
  return std::shared_ptr<Fp64Products>(*std::move(engine));
}

absl::Status CudaBackend::DoZeroGradient(Weight& weight) {
  auto* w = dynamic_cast<CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("zero gradient", "cuda", weight);
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(c, absl::StrCat("gradient zero [", w->v(), ", ", w->k(), "]"));
  GradientState<DeviceBuffer>::Lock gradient = w->gradient().Acquire();
  if (const DeviceBuffer* buffer = gradient.buffer(); buffer != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(buffer->get(), 0, buffer->size(), c->compute.get()),
                         "gradient: zero");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(c->compute.get()), "gradient: zero");
  }
  gradient.ResetCalls();
  return absl::OkStatus();
}

#ifdef LOGITD_TEST_FAULTS
absl::Status CudaBackend::TestDeviceFault(std::uint32_t trigger, Context& c) {
  cudaStream_t cs = c.compute.get();
  if (trigger == kTestDeviceTrap) {
    RETURN_IF_CUDA_ERROR(LaunchTestTrap(cs), "test fault device_trap: launch");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "test fault device_trap");
    return absl::InternalError("test fault device_trap: the trapping kernel returned");
  }
  RETURN_IF_CUDA_ERROR(LaunchTestSpin(30.0, cs), "test fault device_hang: launch");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "test fault device_hang");
  return absl::OkStatus();
}
#endif  // LOGITD_TEST_FAULTS

}  // namespace logitd::kernels::cuda

namespace logitd::kernels {

template <>
struct KernelOf<cuda::CudaBackend, LogitsArgs> {
  static absl::Status Run(cuda::CudaBackend& backend, const LogitsArgs& args, Timing* timing) {
    return backend.LogitsCall(*args.weight, args, timing);
  }
};

template <>
struct KernelOf<cuda::CudaBackend, BackwardArgs> {
  static absl::Status Run(cuda::CudaBackend& backend, const BackwardArgs& args, Timing* timing) {
    return backend.BackwardCall(*args.weight, args, timing);
  }
};

using cuda::CudaBackend;
LOGITD_KERNEL(CudaBackend, LogitsArgs);
LOGITD_KERNEL(CudaBackend, BackwardArgs);

}  // namespace logitd::kernels

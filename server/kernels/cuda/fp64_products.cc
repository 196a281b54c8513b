#include "server/kernels/cuda/fp64_products.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_status.h"

namespace logitd::kernels::cuda {

absl::StatusOr<std::unique_ptr<CudaFp64Products>> CudaFp64Products::Create(
    const void* w, std::int64_t v, std::int64_t k, int device,
    const std::shared_ptr<DeviceMemory>& memory, std::string device_name) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device));
  std::unique_ptr<CudaFp64Products> e(
      new CudaFp64Products(v, k, device, memory, std::move(device_name)));
  absl::StatusOr<Stream> stream = CreateStream();
  if (!stream.ok()) return stream.status();
  e->stream_ = *std::move(stream);
  cublasHandle_t handle = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasCreate(&handle), "reference products: cublasCreate");
  e->handle_ = CublasHandle(handle);
  RETURN_IF_CUBLAS_ERROR(cublasSetStream(handle, e->stream_.get()),
                         "reference products: cublasSetStream");
  RETURN_IF_CUBLAS_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                         "reference products: cublasSetMathMode");
  const std::int64_t n = v * k;
  const std::string what = absl::StrCat("reference products: weight [", v, ", ", k, "] as fp64");
  absl::StatusOr<DeviceBuffer> w64 = memory->Allocate(static_cast<std::size_t>(n) * 8, what);
  if (!w64.ok()) return w64.status();
  e->w_ = *std::move(w64);
  absl::StatusOr<DeviceBuffer> w64_abs =
      memory->Allocate(static_cast<std::size_t>(n) * 8, what + " magnitudes");
  if (!w64_abs.ok()) return w64_abs.status();
  e->w_abs_ = *std::move(w64_abs);
  RETURN_IF_CUDA_ERROR(LaunchWidenBf16(static_cast<const std::uint16_t*>(w), n, e->w_.as<double>(),
                                       e->w_abs_.as<double>(), e->stream_.get()),
                       "reference products: widen the weight");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(e->stream_.get()),
                       "reference products: widen the weight");
  return e;
}

absl::Status CudaFp64Products::Reserve(DeviceBuffer* buffer, std::int64_t doubles,
                                       const char* what) {
  const std::size_t bytes = static_cast<std::size_t>(doubles) * 8;
  if (buffer->size() >= bytes) return absl::OkStatus();
  buffer->Reset();
  absl::StatusOr<DeviceBuffer> b =
      memory_->Allocate(bytes, absl::StrCat("reference products: ", what));
  if (!b.ok()) return b.status();
  *buffer = *std::move(b);
  return absl::OkStatus();
}

absl::Status CudaFp64Products::ReservePinned(PinnedBuffer* buffer, std::size_t bytes) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  *buffer = PinnedBuffer();
  absl::StatusOr<PinnedBuffer> b = PinnedBuffer::Allocate(bytes, "reference products: staging");
  if (!b.ok()) return b.status();
  *buffer = *std::move(b);
  return absl::OkStatus();
}

namespace {

// memcpy on up to 8 threads for copies of 64 MiB and more.
void CopyOut(void* to, const void* from, std::size_t bytes) {
  constexpr std::size_t kPerThread = std::size_t{8} << 20;
  const std::size_t threads =
      std::min<std::size_t>({8, std::max(1u, std::thread::hardware_concurrency()),
                             std::max<std::size_t>(1, bytes / kPerThread)});
  if (threads <= 1) {
    std::memcpy(to, from, bytes);
    return;
  }
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const std::size_t a = bytes * t / threads, b = bytes * (t + 1) / threads;
      std::memcpy(static_cast<char*>(to) + a, static_cast<const char*>(from) + a, b - a);
    });
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

absl::Status CudaFp64Products::Product(bool transposed, const double* a, std::int64_t m,
                                       double* out, double* out_abs) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  const std::int64_t cols = transposed ? k_ : v_;
  const std::int64_t out_cols = transposed ? v_ : k_;
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_, m * cols, "operand"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_, m * out_cols, "product"));
  if (out_abs != nullptr) {
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_abs_, m * cols, "operand magnitudes"));
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_abs_, m * out_cols, "product of magnitudes"));
  }
  cudaStream_t s = stream_.get();
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(a_.get(), a, static_cast<std::size_t>(m * cols) * 8,
                                       cudaMemcpyHostToDevice, s),
                       "reference products: copy the operand [", m, ", ", cols, "]");
  // Row-major out [m, out_cols] is column-major [out_cols, m]: W's
  // column-major view is [K, V] with leading dimension K, so out = a·Wᵀ is
  // Wᵀ(col)·a(col) and out = a·W is W(col)·a(col).
  const double one = 1.0, zero = 0.0;
  const auto gemm = [&](const double* w, const double* op, double* c) {
    return transposed ? cublasDgemm_64(handle_.get(), CUBLAS_OP_T, CUBLAS_OP_N, v_, m, k_, &one, w,
                                       k_, op, k_, &zero, c, v_)
                      : cublasDgemm_64(handle_.get(), CUBLAS_OP_N, CUBLAS_OP_N, k_, m, v_, &one, w,
                                       k_, op, v_, &zero, c, k_);
  };
  RETURN_IF_CUBLAS_ERROR(gemm(w_.as<double>(), a_.as<double>(), out_.as<double>()),
                         "reference products: DGEMM [", m, ", ", out_cols, "]");
  if (out_abs != nullptr) {
    RETURN_IF_CUDA_ERROR(LaunchAbsDouble(a_.as<double>(), m * cols, a_abs_.as<double>(), s),
                         "reference products: magnitudes");
    RETURN_IF_CUBLAS_ERROR(gemm(w_abs_.as<double>(), a_abs_.as<double>(), out_abs_.as<double>()),
                           "reference products: DGEMM of magnitudes [", m, ", ", out_cols, "]");
  }
  const std::size_t out_bytes = static_cast<std::size_t>(m * out_cols) * 8;
  LOGITD_CUDA_RETURN_IF_ERROR(ReservePinned(&host_out_, out_bytes));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host_out_.get(), out_.get(), out_bytes, cudaMemcpyDeviceToHost, s),
      "reference products: copy the product to the host");
  if (out_abs != nullptr) {
    LOGITD_CUDA_RETURN_IF_ERROR(ReservePinned(&host_out_abs_, out_bytes));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host_out_abs_.get(), out_abs_.get(), out_bytes, cudaMemcpyDeviceToHost, s),
        "reference products: copy the product of magnitudes to the host");
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "reference products: DGEMM");
  CopyOut(out, host_out_.get(), out_bytes);
  if (out_abs != nullptr) CopyOut(out_abs, host_out_abs_.get(), out_bytes);
  return absl::OkStatus();
}

bool CudaFp64Products::XWt(const double* x, std::int64_t m, double* y, double* y_abs) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Status s = Product(/*transposed=*/true, x, m, y, y_abs);
  if (!s.ok() && error_.empty()) error_ = std::string(s.message());
  return s.ok();
}

bool CudaFp64Products::GW(const double* g, std::int64_t m, double* dx, double* dx_abs) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Status s = Product(/*transposed=*/false, g, m, dx, dx_abs);
  if (!s.ok() && error_.empty()) error_ = std::string(s.message());
  return s.ok();
}

std::string CudaFp64Products::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace logitd::kernels::cuda

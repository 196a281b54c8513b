// The references' fp64 products on the device (logitd/reference/
// fp64_products.h): cuBLAS DGEMM of the weight widened to fp64 once per
// engine, with the operands' magnitudes for the Σ|x·w| sums. The math mode
// is set to CUBLAS_DEFAULT_MATH explicitly, so no environment variable can
// turn on cuBLAS's fixed-point emulation of fp64: the sums are fp64 sums of
// exact products in some order, which is all the bounds assume.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/reference/fp64_products.h"
#include "server/kernels/cuda/cuda_handles.h"

namespace logitd::kernels::cuda {

using CublasHandle = UniqueHandle<cublasHandle_t, &cublasDestroy>;

class CudaFp64Products final : public Fp64Products {
 public:
  // W [v, k] bf16 on `device` (a registered weight's memory, which the
  // caller keeps alive while the engine lives), widened into device memory
  // counted by `memory`: ResourceExhausted naming the bytes when it cannot
  // hold 16·V·K of them.
  static absl::StatusOr<std::unique_ptr<CudaFp64Products>> Create(
      const void* w, std::int64_t v, std::int64_t k, int device,
      const std::shared_ptr<DeviceMemory>& memory, std::string device_name);

  bool XWt(const double* x, std::int64_t m, double* y, double* y_abs) override;
  bool GW(const double* g, std::int64_t m, double* dx, double* dx_abs) override;
  std::string error() const override;
  std::string name() const override { return "cuBLAS DGEMM on " + device_name_; }

 private:
  CudaFp64Products(std::int64_t v, std::int64_t k, int device, std::shared_ptr<DeviceMemory> memory,
                   std::string device_name)
      : v_(v),
        k_(k),
        device_(device),
        memory_(std::move(memory)),
        device_name_(std::move(device_name)) {}
  // a [m, cols] to the device with its magnitudes, out = a·Wᵀ (transposed:
  // cols = K, out [m, V]) or a·W (cols = V, out [m, K]), and the same of
  // the magnitudes into out_abs when it is not null, then both to the host.
  absl::Status Product(bool transposed, const double* a, std::int64_t m, double* out,
                       double* out_abs);
  // Device buffers of at least these many doubles, kept between products.
  absl::Status Reserve(DeviceBuffer* buffer, std::int64_t doubles, const char* what);
  // Page-locked host buffers the products are copied into before the
  // caller's memory (a copy from the device into pageable memory runs at a
  // fraction of the link's rate).
  absl::Status ReservePinned(PinnedBuffer* buffer, std::size_t bytes);

  std::int64_t v_;
  std::int64_t k_;
  int device_;
  std::shared_ptr<DeviceMemory> memory_;
  std::string device_name_;
  Stream stream_;
  CublasHandle handle_;
  DeviceBuffer w_, w_abs_, a_, a_abs_, out_, out_abs_;
  PinnedBuffer host_out_, host_out_abs_;
  mutable std::mutex mu_;  // one product at a time; error_
  std::string error_;
};

}  // namespace logitd::kernels::cuda

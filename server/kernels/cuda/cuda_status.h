// Turns CUDA runtime and cuBLASLt return codes into absl::Status carrying the
// call's context, so a device failure reaches the service as a Status (device
// out-of-memory as ResourceExhausted) and nothing exits or throws.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace logitd::kernels::cuda {

// An error after which the CUDA context cannot be used again (a kernel
// fault, an uncorrectable ECC error, ...): every later call returns it too.
bool IsStickyError(cudaError_t error);

// The payload that marks a Status made from a sticky error.
inline constexpr char kDeviceLostPayload[] = "logitd.kernels/device-lost";
// True for a Status CudaErrorToStatus made from a sticky error.
bool IsDeviceLost(const absl::Status& status);

// A sticky error -> Unavailable carrying kDeviceLostPayload;
// cudaErrorMemoryAllocation -> ResourceExhausted; no device or no driver ->
// FailedPrecondition; anything else -> Internal. Clears the thread's
// non-sticky error so the next call starts clean.
absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context);

// CUBLAS_STATUS_ALLOC_FAILED -> ResourceExhausted; NOT_INITIALIZED ->
// FailedPrecondition; NOT_SUPPORTED -> Unimplemented; else Internal.
absl::Status CublasErrorToStatus(cublasStatus_t status, absl::string_view context);

}  // namespace logitd::kernels::cuda

// RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(...), "logits: copy X (", bytes, " bytes)")
// The context arguments go to absl::StrCat and are only evaluated on failure.
#define RETURN_IF_CUDA_ERROR(expr, ...)                                               \
  do {                                                                                \
    const cudaError_t logitd_cuda_error_ = (expr);                                    \
    if (logitd_cuda_error_ != cudaSuccess) {                                          \
      return ::logitd::kernels::cuda::CudaErrorToStatus(logitd_cuda_error_,           \
                                                        ::absl::StrCat(__VA_ARGS__)); \
    }                                                                                 \
  } while (false)

#define RETURN_IF_CUBLAS_ERROR(expr, ...)                                               \
  do {                                                                                  \
    const cublasStatus_t logitd_cublas_status_ = (expr);                                \
    if (logitd_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                               \
      return ::logitd::kernels::cuda::CublasErrorToStatus(logitd_cublas_status_,        \
                                                          ::absl::StrCat(__VA_ARGS__)); \
    }                                                                                   \
  } while (false)

// Propagates a non-OK absl::Status (this layer's own RETURN_IF_ERROR).
#define LOGITD_CUDA_RETURN_IF_ERROR(expr)            \
  do {                                               \
    ::absl::Status logitd_status_ = (expr);          \
    if (!logitd_status_.ok()) return logitd_status_; \
  } while (false)

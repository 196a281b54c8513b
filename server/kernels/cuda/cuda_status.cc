#include "server/kernels/cuda/cuda_status.h"

namespace logitd::kernels::cuda {

bool IsStickyError(cudaError_t error) {
  switch (error) {
    // A kernel faulted: the context is corrupt and every later call fails.
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorTensorMemoryLeak:
    // The device or its memory failed.
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDeviceUninitialized:
    case cudaErrorExternalDevice:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

bool IsDeviceLost(const absl::Status& status) {
  return status.GetPayload(kDeviceLostPayload).has_value();
}

absl::Status CudaErrorToStatus(cudaError_t error, absl::string_view context) {
  // Reading the last error resets a non-sticky one (an allocation failure,
  // say), so a later unrelated call does not report it again.
  (void)cudaGetLastError();
  const std::string message =
      absl::StrCat(context, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  if (IsStickyError(error)) {
    absl::Status lost = absl::UnavailableError(message);
    lost.SetPayload(kDeviceLostPayload, absl::Cord(cudaGetErrorName(error)));
    return lost;
  }
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasErrorToStatus(cublasStatus_t status, absl::string_view context) {
  const std::string message = absl::StrCat(context, ": ", cublasLtGetStatusName(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::FailedPreconditionError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace logitd::kernels::cuda

#include "server/kernels/cuda/cuda_handles.h"

#include "absl/strings/str_cat.h"
#include "server/kernels/cuda/cuda_status.h"

namespace logitd::kernels::cuda {

absl::StatusOr<Stream> CreateStream() {
  cudaStream_t stream = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
  return Stream(stream);
}

absl::StatusOr<Event> CreateEvent(bool timing) {
  cudaEvent_t event = nullptr;
  RETURN_IF_CUDA_ERROR(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming),
      "cudaEventCreateWithFlags");
  return Event(event);
}

absl::StatusOr<LtHandle> CreateLtHandle() {
  cublasLtHandle_t handle = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasLtCreate(&handle), "cublasLtCreate");
  return LtHandle(handle);
}

absl::Status UseDevice(int device) {
  int current = -1;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "cudaSetDevice(", device, ")");
  }
  return absl::OkStatus();
}

std::shared_ptr<DeviceMemory> DeviceMemory::Create(int device, std::uint64_t budget) {
  return std::shared_ptr<DeviceMemory>(new DeviceMemory(device, budget));
}

absl::StatusOr<DeviceBuffer> DeviceMemory::Allocate(std::size_t bytes, absl::string_view what) {
  if (bytes == 0) bytes = 1;  // a valid, distinct pointer even for empty tensors
  // Reserve first so that concurrent allocations cannot both slip under the
  // budget.
  const std::uint64_t before = in_use_.fetch_add(bytes, std::memory_order_relaxed);
  if (budget_ != 0 && before + bytes > budget_) {
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": ", bytes, " bytes of device memory requested, ", before,
                     " of the budget of ", budget_, " bytes already in use"));
  }
  absl::Status status = UseDevice(device_);
  void* ptr = nullptr;
  if (status.ok()) {
    const cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error != cudaSuccess) {
      status = CudaErrorToStatus(error, absl::StrCat(what, ": cudaMalloc(", bytes, " bytes)"));
    }
  }
  if (!status.ok()) {
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
    return status;
  }
  return DeviceBuffer(ptr, bytes, shared_from_this());
}

void DeviceMemory::Release(void* ptr, std::size_t bytes) {
  (void)UseDevice(device_);
  (void)cudaFree(ptr);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr && owner_ != nullptr) owner_->Release(ptr_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
  owner_.reset();
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(std::size_t bytes, absl::string_view what) {
  if (bytes == 0) bytes = 1;
  void* ptr = nullptr;
  RETURN_IF_CUDA_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), what, ": cudaHostAlloc(",
                       bytes, " bytes)");
  return PinnedBuffer(ptr, bytes);
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace logitd::kernels::cuda

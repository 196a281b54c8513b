// Move-only owners for every CUDA and cuBLASLt object the backend creates:
// streams, events, cuBLASLt handles and descriptors, device and pinned
// buffers. Each frees itself on every path, including early error returns.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::kernels::cuda {

// Owns one raw handle and releases it with Destroy. Copies are deleted:
// two owners of one handle would free it twice.
template <typename T, auto Destroy>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(T handle) : handle_(handle) {}
  UniqueHandle(UniqueHandle&& o) noexcept : handle_(std::exchange(o.handle_, T{})) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      Reset();
      handle_ = std::exchange(o.handle_, T{});
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { Reset(); }

  T get() const { return handle_; }
  explicit operator bool() const { return handle_ != T{}; }

 private:
  void Reset() {
    // A destructor cannot report; a failed destroy only leaks the handle.
    if (handle_ != T{}) (void)Destroy(handle_);
    handle_ = T{};
  }
  T handle_{};
};

using Stream = UniqueHandle<cudaStream_t, &cudaStreamDestroy>;
using Event = UniqueHandle<cudaEvent_t, &cudaEventDestroy>;
using LtHandle = UniqueHandle<cublasLtHandle_t, &cublasLtDestroy>;
using LtMatmulDesc = UniqueHandle<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using LtLayout = UniqueHandle<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using LtPreference = UniqueHandle<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;

// A non-blocking stream: the legacy default stream would serialize contexts.
absl::StatusOr<Stream> CreateStream();
// timing=false makes a cheaper event for ordering only.
absl::StatusOr<Event> CreateEvent(bool timing);
absl::StatusOr<LtHandle> CreateLtHandle();

// Makes `device` current on the calling thread. Every public entry point of
// the backend calls it: gRPC threads start on device 0.
absl::Status UseDevice(int device);

class DeviceBuffer;

// Counts the device bytes the backend holds and enforces its budget. Shared
// by the backend and every buffer, so a weight released after the backend
// still accounts correctly.
class DeviceMemory : public std::enable_shared_from_this<DeviceMemory> {
 public:
  // budget 0 means "whatever the device has".
  static std::shared_ptr<DeviceMemory> Create(int device, std::uint64_t budget);

  // ResourceExhausted when the budget or the device cannot hold `bytes`.
  // `what` names the buffer in the error ("weight [32768, 4096] bf16").
  absl::StatusOr<DeviceBuffer> Allocate(std::size_t bytes, absl::string_view what);

  std::uint64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  std::uint64_t budget() const { return budget_; }
  int device() const { return device_; }

 private:
  friend class DeviceBuffer;
  DeviceMemory(int device, std::uint64_t budget) : device_(device), budget_(budget) {}
  void Release(void* ptr, std::size_t bytes);

  int device_;
  std::uint64_t budget_;
  std::atomic<std::uint64_t> in_use_{0};
};

// cudaMalloc'd memory, returned to the device (and the count) on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      owner_ = std::move(o.owner_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }
  void Reset();

 private:
  friend class DeviceMemory;
  DeviceBuffer(void* ptr, std::size_t bytes, std::shared_ptr<DeviceMemory> owner)
      : ptr_(ptr), bytes_(bytes), owner_(std::move(owner)) {}

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::shared_ptr<DeviceMemory> owner_;
};

// Page-locked host memory (cudaHostAlloc), freed on destruction.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(std::size_t bytes, absl::string_view what);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  // Gives up ownership; the caller frees with cudaFreeHost.
  void* Release() {
    bytes_ = 0;
    return std::exchange(ptr_, nullptr);
  }

 private:
  PinnedBuffer(void* ptr, std::size_t bytes) : ptr_(ptr), bytes_(bytes) {}
  void Reset();

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace logitd::kernels::cuda

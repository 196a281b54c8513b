// The cuda backend: weights in device memory, cuBLASLt for every GEMM, the
// backend's own cast kernel for G = bf16(dY). A request takes one stream
// context (two streams, a cuBLASLt handle, a workspace and scratch buffers)
// from a pool, so concurrent requests run side by side and each result
// depends only on its inputs. An error that poisons the CUDA context, or a
// request whose device work outlives --device_timeout, marks the device lost
// (DeviceHealth): from then on every call fails at once with Unavailable.
// This file: the pool, start-up and weights; the calls are in gemm_calls.cc
// and walk_calls.cc.
#include "server/kernels/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "logitd/tensor.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cross_entropy.h"
#include "server/kernels/cuda/cuda_backend_class.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/logprobs.h"
#include "server/kernels/cuda/lt_gemm.h"
#include "server/kernels/device_health.h"
#include "server/kernels/gradient_state.h"
#include "server/kernels/host_pool.h"

namespace logitd::kernels::cuda {
namespace {

std::string VersionString(int v) {  // 13000 -> "13.0"
  return absl::StrCat(v / 1000, ".", (v % 1000) / 10);
}

// The kernel driver's release ("580.159.04"), when the system exposes it.
std::string DriverRelease() {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>", or
  // "... UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...":
  // the release is the first word made of digits and dots with a dot in it.
  std::ifstream in("/proc/driver/nvidia/version");
  std::string word;
  while (in >> word) {
    const bool version_like = word.find('.') != std::string::npos &&
                              std::isdigit(static_cast<unsigned char>(word[0])) &&
                              word.find_first_not_of("0123456789.") == std::string::npos;
    if (version_like) return word;
  }
  return "";
}

}  // namespace

Lease::~Lease() {
  if (backend_ != nullptr) backend_->Return(context_);
}

absl::StatusOr<Lease> CudaBackend::Acquire(std::string what) {
  // Calls take contexts in the order they asked (a call in row blocks asks
  // once a block): only the first in line waits on the pool.
  std::lock_guard<FifoMutex> turn(pool_turns_);
  absl::MutexLock lock(&pool_mu_);
  // Looks at the device's health every 100 ms while it waits: a call queued
  // behind a hung one must not wait for it forever.
  for (;;) {
    absl::Status health = health_.status();
    if (!health.ok()) return health;
    if (!free_.empty()) break;
    pool_cv_.WaitWithTimeout(&pool_mu_, absl::Milliseconds(100));
  }
  Context* c = free_.back();
  free_.pop_back();
  return Lease(this, c, health_.Begin(std::move(what)));
}

void CudaBackend::Return(Context* c) {
  // A failed request has reported its own error; what is found here is a
  // fault it did not see (a kernel that failed after its last check), which
  // a sticky error makes the device's.
  (void)UseDevice(options_.device);
  for (cudaStream_t stream : {c->compute.get(), c->copy.get()}) {
    const cudaError_t error = cudaStreamSynchronize(stream);
    if (error == cudaSuccess) continue;
    const absl::Status status = CudaErrorToStatus(error, "after a call: cudaStreamSynchronize");
    if (IsDeviceLost(status)) health_.MarkLost(status);
  }
  for (auto& buffer : c->scratch) {
    if (buffer.size() > kRetainBytes) buffer.Reset();
  }
  {
    absl::MutexLock lock(&pool_mu_);
    free_.push_back(c);
  }
  pool_cv_.Signal();
}

absl::StatusOr<void*> CudaBackend::Scratch(Context& c, Slot slot, std::size_t bytes,
                                           const char* what) {
  DeviceBuffer& buffer = c.scratch[slot];
  if (buffer.size() < bytes) {
    buffer.Reset();  // the context's streams are idle: nothing uses it
    auto fresh = memory_->Allocate(bytes, what);
    if (!fresh.ok()) return fresh.status();
    buffer = *std::move(fresh);
  }
  return buffer.get();
}

absl::Status CudaBackend::Init() {
  RETURN_IF_ERROR_(UseDevice(options_.device));
  RETURN_IF_ERROR_(ReadDeviceInfo());
  for (int i = 0; i < kContexts; ++i) {
    auto c = CreateContext();
    if (!c.ok()) return c.status();
    free_.push_back(c->get());
    contexts_.push_back(*std::move(c));
  }
  info_.algo_choices = kAlgoChoicesPerProcess;
  if (!options_.algo_cache.empty()) UseAlgoCache();
  return SelfTestCast();
}

absl::Status CudaBackend::ReadDeviceInfo() {
  cudaDeviceProp prop{};
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, options_.device),
                       "cuda backend: cudaGetDeviceProperties(", options_.device, ")");
  if (prop.major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: device ", options_.device, " (", prop.name, ") has compute capability ",
        prop.major, ".", prop.minor, "; bf16 GEMMs need 8.0 or newer"));
  }
  int driver = 0;
  int runtime = 0;
  RETURN_IF_CUDA_ERROR(cudaDriverGetVersion(&driver), "cuda backend: cudaDriverGetVersion");
  RETURN_IF_CUDA_ERROR(cudaRuntimeGetVersion(&runtime), "cuda backend: cudaRuntimeGetVersion");
  const std::size_t lt = cublasLtGetVersion();
  info_.backend = "cuda";
  info_.device_name = prop.name;
  info_.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
  info_.multiprocessor_count = prop.multiProcessorCount;
  device_bytes_total_ = static_cast<std::uint64_t>(prop.totalGlobalMem);
  const std::string release = DriverRelease();
  info_.driver_version = release.empty()
                             ? VersionString(driver)
                             : absl::StrCat(release, " (CUDA ", VersionString(driver), ")");
  info_.cuda_runtime_version = VersionString(runtime);
  info_.cublaslt_version = absl::StrCat(lt / 10000, ".", (lt / 100) % 100, ".", lt % 100);
  info_.blas_version = absl::StrCat("cuBLASLt ", info_.cublaslt_version);
  info_.split_k = SplitKName(options_.split_k);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Context>> CudaBackend::CreateContext() {
  auto c = std::make_unique<Context>();
  auto compute = CreateStream();
  if (!compute.ok()) return compute.status();
  c->compute = *std::move(compute);
  auto copy = CreateStream();
  if (!copy.ok()) return copy.status();
  c->copy = *std::move(copy);
  auto handle = CreateLtHandle();
  if (!handle.ok()) return handle.status();
  c->handle = *std::move(handle);
  auto workspace = memory_->Allocate(kWorkspaceBytes, "cuda backend: cuBLASLt workspace");
  if (!workspace.ok()) return workspace.status();
  c->workspace = *std::move(workspace);
  for (auto& e : c->timing) {
    auto event = CreateEvent(true);
    if (!event.ok()) return event.status();
    e = *std::move(event);
  }
  for (auto* events : {&c->block_done, &c->block_copied}) {
    for (auto& e : *events) {
      auto event = CreateEvent(false);
      if (!event.ok()) return event.status();
      e = *std::move(event);
    }
  }
  return c;
}

void CudaBackend::UseAlgoCache() {
  std::string summary;
  const absl::Status cache = engine_.UseCacheFile(
      options_.algo_cache,
      AlgoCachePlatform(info_.device_name, info_.multiprocessor_count, info_.driver_version,
                        info_.cuda_runtime_version, info_.cublaslt_version, kWorkspaceBytes,
                        options_.split_k),
      contexts_.front()->gemm(), &summary);
  if (cache.ok()) {
    info_.algo_choices = kAlgoChoicesKept;
    info_.algo_cache_path = options_.algo_cache;
    if (options_.events.info) options_.events.info(summary);
  } else if (options_.events.warning) {
    options_.events.warning(absl::StrCat(
        cache.message(),
        ": GEMM algorithms are chosen anew in this process only, so a restarted server may "
        "choose others and give other bits (give --algo_cache a writable file)"));
  }
}

// A device whose architecture the build has no code for fails here, at
// start, rather than on the first request; the values cover rounding, ties,
// overflow and NaN.
absl::Status CudaBackend::SelfTestCast() {
  const std::array<float, 8> probe = {1.0f,
                                      -2.5f,
                                      BitsToFloat(0x3f808000u),
                                      BitsToFloat(0x3f818000u),
                                      BitsToFloat(0x7f7fffffu),
                                      BitsToFloat(0xff800000u),
                                      BitsToFloat(0x7fa00001u),
                                      BitsToFloat(0x00000001u)};
  std::array<Bf16Bits, 8> got{};
  absl::Status probe_status = Kernel(CastArgs{probe.data(), 8, got.data()}, nullptr);
  if (!probe_status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: self-test cast failed: ", probe_status.message()));
  }
  for (std::size_t i = 0; i < probe.size(); ++i) {
    if (got[i] != FloatToBf16(probe[i])) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cuda backend: self-test cast of 0x%08x gave 0x%04x, expected 0x%04x",
                          FloatBits(probe[i]), got[i], FloatToBf16(probe[i])));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HostBuffer> CudaBackend::DoAllocateHost(std::size_t bytes) {
  RETURN_IF_ERROR_(UseDevice(options_.device));
  return host_pool_->Get(bytes);
}

absl::StatusOr<std::shared_ptr<void>> CudaBackend::DoPinHostMemory(void* data, std::size_t bytes) {
  RETURN_IF_ERROR_(UseDevice(options_.device));
  RETURN_IF_CUDA_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterDefault), "page-lock ", bytes,
                       " bytes of host memory");
  const int device = options_.device;
  return std::shared_ptr<void>(data, [device](void* p) {
    // Nothing to tell anyone at this point: the memory is being unmapped.
    if (UseDevice(device).ok()) (void)cudaHostUnregister(p);
  });
}

absl::StatusOr<std::shared_ptr<Weight>> CudaBackend::DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                                  std::int64_t k) {
  const std::size_t bytes = static_cast<std::size_t>(v * k) * 2;
  RETURN_IF_ERROR_(UseDevice(options_.device));
  // Device memory first: a weight that cannot fit is refused before any of
  // its bytes are read.
  auto buffer = memory_->Allocate(bytes, absl::StrCat("weight ", ShapeString({v, k}), " bf16"));
  if (!buffer.ok()) return buffer.status();
  {
    ACQUIRE_OR_RETURN_(c, absl::StrCat("weight upload ", ShapeString({v, k})));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(buffer->get(), w, bytes, cudaMemcpyHostToDevice, c->copy.get()),
        "weight: copy ", ShapeString({v, k}), " to the device");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(c->copy.get()), "weight: copy ", ShapeString({v, k}),
                         " to the device");
  }
  return std::make_shared<CudaWeight>(v, k, *std::move(buffer));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  // Options are checked first: a bad flag is reported the same with or
  // without a GPU.
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: expected a device ordinal >= 0, got ", options.device));
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(error), " (",
        cudaGetErrorString(error), ")"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "cuda backend: no CUDA device is visible (cudaGetDeviceCount returned 0)");
  }
  if (options.device >= count) {
    // A flag error, not a missing GPU: --backend=auto must not hide it by
    // falling back to the cpu backend.
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: --device=", options.device, " requested, but only ", count,
                     " device(s) are visible (ordinals 0..", count - 1, ")"));
  }
  auto backend = std::make_unique<CudaBackend>(options);
  absl::Status status = backend->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace logitd::kernels::cuda

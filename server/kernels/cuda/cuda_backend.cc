// The cuda backend: weights in device memory, cuBLASLt for every GEMM, the
// backend's own cast kernel for G = bf16(dY). A request takes one stream
// context (two streams, a cuBLASLt handle, a workspace and scratch buffers)
// from a pool, so concurrent requests run side by side and each result
// depends only on its inputs. An error that poisons the CUDA context, or a
// request whose device work outlives --device_timeout, marks the device lost
// (DeviceHealth): from then on every call fails at once with Unavailable.
#include "server/kernels/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <condition_variable>
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
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/logprobs.h"
#include "server/kernels/cuda/lt_gemm.h"
#include "server/kernels/device_health.h"
#include "server/kernels/gradient_state.h"
#include "server/kernels/host_pool.h"

namespace logitd::kernels::cuda {
namespace {

// Concurrent requests beyond this wait for a context. Four keep the device
// busy while one request copies and another computes.
constexpr int kContexts = 4;
// cuBLAS's recommendation for Hopper; identical in every context, which its
// reproducibility guarantee requires.
constexpr std::size_t kWorkspaceBytes = 32u << 20;
// Logits are computed and copied back in row blocks of about this size, so
// the copy of one block overlaps the GEMM of the next and device scratch
// stays bounded for any M.
constexpr std::size_t kLogitsBlockBytes = 128u << 20;
constexpr std::int64_t kMinBlockRows = 256;
// dY travels and is cast block by block through a staging buffer this size.
constexpr std::size_t kStagingBytes = 64u << 20;
// Scratch buffers up to this size stay with their context between requests;
// larger ones are returned after the request.
constexpr std::size_t kRetainBytes = 256u << 20;

#define RETURN_IF_ERROR_(expr) LOGITD_CUDA_RETURN_IF_ERROR(expr)
// Lease& NAME = a context for the call `what`, or return why there is none.
#define ACQUIRE_OR_RETURN_(name, what)                          \
  absl::StatusOr<Lease> name##_acquired_ = Acquire(what);       \
  if (!name##_acquired_.ok()) return name##_acquired_.status(); \
  Lease& name = *name##_acquired_

std::int64_t MicrosBetween(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(ms * 1000.0f + 0.5f);
}

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

cudaDataType_t CudaType(DType t) { return t == DType::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }

class CudaWeight final : public Weight {
 public:
  CudaWeight(std::int64_t v, std::int64_t k, DeviceBuffer data)
      : Weight(v, k),
        data_(std::move(data)),
        gradient_(static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(k) * 4) {}

  std::uint64_t weight_bytes() const override { return data_.size(); }
  std::uint64_t gradient_bytes() const override { return gradient_.bytes(); }
  const void* data() const { return data_.get(); }

  // [V, K] fp32 in device memory. Its lock is always taken after a context
  // lease, so that a call holding it never waits for a context.
  GradientState<DeviceBuffer>& gradient() { return gradient_; }

 private:
  DeviceBuffer data_;
  GradientState<DeviceBuffer> gradient_;
};

// Scratch slots of a context. The cross-entropy uses kX (x), kY0 (a logits
// chunk), kG (a G chunk), kAcc (the fp32 dX), kDx (dX out), kDw and kY1 (dW
// staging) and kRows (targets, per-row state, loss and lse).
enum Slot { kX, kY0, kY1, kAcc, kG, kStaging, kDx, kDw, kCastIn, kCastOut, kRows, kSlotCount };

struct Context {
  Stream compute;
  Stream copy;
  LtHandle handle;
  DeviceBuffer workspace;
  std::array<Event, 4> timing;      // start, after input, after compute, end
  std::array<Event, 2> block_done;  // GEMM of a row block finished
  std::array<Event, 2> block_copied;
  std::array<DeviceBuffer, kSlotCount> scratch;

  // `record` (may be null) collects the GEMM configurations run.
  GemmStream gemm(std::vector<std::string>* record = nullptr) const {
    return GemmStream{handle.get(), compute.get(), workspace.get(), workspace.size(), record};
  }
};

// Where a call's time went, from its context's four timing events: recorded
// at its start, once its inputs are on the device, once its compute is done
// and at its end, each on the stream whose work it follows. `call` ("logits")
// prefixes the errors.
class StreamTimer {
 public:
  enum Mark { kStart = 0, kInputs = 1, kComputed = 2, kEnd = 3 };

  StreamTimer(const Context& c, const char* call) : c_(c), call_(call) {}

  absl::Status Record(Mark mark, cudaStream_t stream) const {
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.timing[mark].get(), stream), call_,
                         ": cudaEventRecord");
    return absl::OkStatus();
  }
  // Records the end on `stream` and waits for it; `what` names the call in
  // the error.
  absl::Status End(cudaStream_t stream, absl::string_view what) const {
    RETURN_IF_ERROR_(Record(kEnd, stream));
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(c_.timing[kEnd].get()), what);
    return absl::OkStatus();
  }
  // End, once both streams have done what is enqueued on them so far: the
  // compute stream waits for the copy stream (through block_copied[0]) and
  // records the end.
  absl::Status EndOfBothStreams(absl::string_view what) const {
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.block_copied[0].get(), c_.copy.get()), call_,
                         ": cudaEventRecord");
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(c_.compute.get(), c_.block_copied[0].get(), 0), call_,
                         ": cudaStreamWaitEvent");
    return End(c_.compute.get(), what);
  }
  // Sets t's times from the marks, once End has returned OK; the rest of t
  // (the GEMMs run, the plan) is left as it is.
  void Fill(Timing* t) const {
    t->h2d_us = MicrosBetween(c_.timing[kStart].get(), c_.timing[kInputs].get());
    t->compute_us = MicrosBetween(c_.timing[kInputs].get(), c_.timing[kComputed].get());
    t->d2h_us = MicrosBetween(c_.timing[kComputed].get(), c_.timing[kEnd].get());
    t->transfers_measured = true;
  }

 private:
  const Context& c_;
  const char* call_;
};

// Where a call's GEMM configurations are reported, if it asked for timing.
std::vector<std::string>* GemmRecord(Timing* timing) {
  return timing != nullptr ? &timing->gemms : nullptr;
}

class CudaBackend;
struct CeScratchSet;

// A context taken from the pool, and the watchdog's watch over the call's
// device work. Returning it waits for its streams, so no work of a finished
// (or failed) request can still touch its buffers or the caller's host
// memory.
class Lease {
 public:
  Lease(CudaBackend* backend, Context* context, DeviceHealth::Watch watch)
      : backend_(backend), context_(context), watch_(std::move(watch)) {}
  Lease(Lease&& o) noexcept
      : backend_(o.backend_), context_(o.context_), watch_(std::move(o.watch_)) {
    o.backend_ = nullptr;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Lease& operator=(Lease&&) = delete;
  ~Lease();
  Context& operator*() const { return *context_; }
  Context* operator->() const { return context_; }

 private:
  CudaBackend* backend_;
  Context* context_;
  DeviceHealth::Watch watch_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options)
      : options_(options),
        health_(options.device_timeout, options.events.device_lost),
        memory_(DeviceMemory::Create(options.device, options.device_memory_budget)),
        engine_(EngineOptions(options), memory_),
        // Page-locked response buffers are reused across calls: allocating
        // and freeing them costs more than the GEMM for large outputs.
        host_pool_(HostBufferPool::Create(
            options.pinned_cache_bytes,
            [](std::size_t bytes) -> absl::StatusOr<std::byte*> {
              auto pinned = PinnedBuffer::Allocate(bytes, "cuda backend: host buffer");
              if (!pinned.ok()) return pinned.status();
              return static_cast<std::byte*>(pinned->Release());
            },
            [](std::byte* p) { (void)cudaFreeHost(p); })) {}

  absl::Status Init();

  BackendInfo Info() const override { return info_; }
  absl::Status Health() const override { return health_.status(); }
  std::uint64_t DeviceBytesInUse() const override { return memory_->bytes_in_use(); }
  std::uint64_t DeviceBytesTotal() const override { return device_bytes_total_; }
  // Every entry point goes through Guard, which turns a failure into the
  // device's lost status once the device is lost (marking it so first when
  // the failure is a sticky error).
  absl::StatusOr<HostBuffer> AllocateHost(std::size_t bytes) override {
    return Guard(DoAllocateHost(bytes));
  }
  absl::StatusOr<std::shared_ptr<void>> PinHostMemory(void* data, std::size_t bytes) override {
    return Guard(DoPinHostMemory(data, bytes));
  }
  absl::StatusOr<std::shared_ptr<Weight>> LoadWeight(const Bf16Bits* w, std::int64_t v,
                                                     std::int64_t k) override {
    return Guard(DoLoadWeight(w, v, k));
  }
  absl::Status Logits(const Weight& w, const LogitsArgs& args, Timing* timing) override {
    return Guard(DoLogits(w, args, timing));
  }
  absl::Status Backward(Weight& w, const BackwardArgs& args, Timing* timing) override {
    return Guard(DoBackward(w, args, timing));
  }
  absl::StatusOr<std::uint64_t> FetchGradient(Weight& w, float* out,
                                              bool zero_after_fetch) override {
    return Guard(DoFetchGradient(w, out, zero_after_fetch));
  }
  absl::Status ZeroGradient(Weight& w) override { return Guard(DoZeroGradient(w)); }
  absl::Status CastToBf16(const float* in, std::int64_t n, Bf16Bits* out, Timing* timing) override {
    return Guard(DoCastToBf16(in, n, out, timing));
  }
  absl::Status CrossEntropy(Weight& w, const CrossEntropyArgs& args, Timing* timing) override {
    return Guard(DoCrossEntropy(w, args, timing));
  }
  absl::Status LogProbs(const Weight& w, const LogProbsArgs& args, Timing* timing) override {
    return Guard(DoLogProbs(w, args, timing));
  }

  void Return(Context* context);

 private:
  static GemmEngineOptions EngineOptions(const BackendOptions& options) {
    GemmEngineOptions o;
    o.split_k = options.split_k;
    o.warn = options.events.warning;
    return o;
  }
  absl::Status Guard(absl::Status status) {
    if (status.ok()) return status;
    if (IsDeviceLost(status)) health_.MarkLost(status);
    absl::Status lost = health_.status();
    return lost.ok() ? status : lost;
  }
  template <typename T>
  absl::StatusOr<T> Guard(absl::StatusOr<T> result) {
    if (result.ok()) return result;
    return Guard(result.status());
  }
  absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t bytes);
  absl::StatusOr<std::shared_ptr<void>> DoPinHostMemory(void* data, std::size_t bytes);
  absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                       std::int64_t k);
  absl::Status DoLogits(const Weight& w, const LogitsArgs& args, Timing* timing);
  absl::Status DoBackward(Weight& w, const BackwardArgs& args, Timing* timing);
  absl::StatusOr<std::uint64_t> DoFetchGradient(Weight& w, float* out, bool zero_after_fetch);
  absl::Status DoZeroGradient(Weight& w);
  absl::Status DoCastToBf16(const float* in, std::int64_t n, Bf16Bits* out, Timing* timing);
  absl::Status DoCrossEntropy(Weight& w, const CrossEntropyArgs& args, Timing* timing);
  absl::Status DoLogProbs(const Weight& w, const LogProbsArgs& args, Timing* timing);
  // The weight's fp32 gradient buffer, allocated and zeroed on first use;
  // `call` names the call in errors.
  absl::StatusOr<float*> GradientBuffer(GradientState<DeviceBuffer>::Lock& gradient,
                                        const CudaWeight& w, cudaStream_t cs, const char* call);
  // Runs allocate() until it succeeds, shrinking the plan (ShrinkCePlan) and
  // freeing `slots` each time it fails for want of device memory.
  absl::Status AllocateShrinking(Context& c, const CePlanRequest& request, CePlan* plan,
                                 std::initializer_list<Slot> slots,
                                 const std::function<absl::Status()>& allocate);
  absl::Status AllocateCrossEntropy(Context& c, const CudaWeight& w, const CrossEntropyArgs& args,
                                    const CePlanRequest& request, CePlan* plan, CeScratchSet* out);
  absl::Status EnqueueCrossEntropy(Context& c, const CrossEntropyArgs& args, const CeProblem& p,
                                   const CeScratchSet& scratch, float* gradient_buffer,
                                   const StreamTimer& timer, Timing* timing);
  absl::Status AllocateLogProbs(Context& c, std::int64_t m, std::int64_t k, int top_k,
                                std::int64_t chunk, LpBuffers* b);
  // The test-only device faults (see kTestDeviceTrap) on context c.
  absl::Status TestDeviceFault(std::uint32_t trigger, Context& c);

  // A free context, once one is; Unavailable when the device is lost
  // (before or while waiting). `what` names the call for the watchdog.
  absl::StatusOr<Lease> Acquire(std::string what);
  absl::StatusOr<void*> Scratch(Context& c, Slot slot, std::size_t bytes, const char* what);
  absl::Status LogitsBlocks(const CudaWeight& w, const LogitsArgs& args, Context& c,
                            Timing* timing);

  BackendOptions options_;
  DeviceHealth health_;
  std::shared_ptr<DeviceMemory> memory_;
  GemmEngine engine_;
  std::shared_ptr<HostBufferPool> host_pool_;
  BackendInfo info_;
  std::uint64_t device_bytes_total_ = 0;

  std::vector<std::unique_ptr<Context>> contexts_;
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<Context*> free_;
};

Lease::~Lease() {
  if (backend_ != nullptr) backend_->Return(context_);
}

absl::StatusOr<Lease> CudaBackend::Acquire(std::string what) {
  std::unique_lock<std::mutex> lock(pool_mu_);
  // Looks at the device's health every 100 ms while it waits: a call queued
  // behind a hung one must not wait for it forever.
  for (;;) {
    absl::Status health = health_.status();
    if (!health.ok()) return health;
    if (!free_.empty()) break;
    pool_cv_.wait_for(lock, std::chrono::milliseconds(100));
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
    std::lock_guard<std::mutex> lock(pool_mu_);
    free_.push_back(c);
  }
  pool_cv_.notify_one();
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

  for (int i = 0; i < kContexts; ++i) {
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
    free_.push_back(c.get());
    contexts_.push_back(std::move(c));
  }
  info_.algo_choices = kAlgoChoicesPerProcess;
  if (!options_.algo_cache.empty()) {
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
  const std::array<float, 8> probe = {1.0f,
                                      -2.5f,
                                      BitsToFloat(0x3f808000u),
                                      BitsToFloat(0x3f818000u),
                                      BitsToFloat(0x7f7fffffu),
                                      BitsToFloat(0xff800000u),
                                      BitsToFloat(0x7fa00001u),
                                      BitsToFloat(0x00000001u)};
  std::array<Bf16Bits, 8> got{};
  absl::Status probe_status = CastToBf16(probe.data(), 8, got.data(), nullptr);
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
  RETURN_IF_ERROR_(CheckLoadWeightArgs(w, v, k));
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

absl::Status CudaBackend::DoLogits(const Weight& weight, const LogitsArgs& args, Timing* timing) {
  const auto* w = dynamic_cast<const CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("logits", "cuda", weight);
  RETURN_IF_ERROR_(CheckLogitsArgs(*w, args));
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(c, absl::StrCat("logits(M=", args.m, ",V=", w->v(), ",K=", w->k(), ")"));
  return LogitsBlocks(*w, args, *c, timing);
}

absl::Status CudaBackend::LogitsBlocks(const CudaWeight& w, const LogitsArgs& args, Context& c,
                                       Timing* timing) {
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  const std::size_t out_size = ElementSize(args.out_dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(v) * out_size;
  std::int64_t rows = m;
  if (static_cast<std::size_t>(m) * row_bytes > kLogitsBlockBytes) {
    rows = static_cast<std::int64_t>(kLogitsBlockBytes / row_bytes) / 128 * 128;
    rows = std::min(m, std::max(kMinBlockRows, rows));
  }
  const std::int64_t blocks = (m + rows - 1) / rows;
  const std::size_t block_bytes = static_cast<std::size_t>(rows) * row_bytes;
  // alpha == 0: the library may skip the product and so lose IEEE's
  // 0 * Inf = NaN; compute with alpha = 1 in fp32 and scale afterwards, as
  // the cpu backend does.
  const bool scale_after = args.alpha == 0.0f;
  const bool acc_separate = scale_after && args.out_dtype == DType::kBf16;

  auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "logits: device x");
  if (!x.ok()) return x.status();
  std::array<void*, 2> y{};
  for (std::int64_t b = 0; b < std::min<std::int64_t>(blocks, 2); ++b) {
    auto buffer = Scratch(c, b == 0 ? kY0 : kY1, block_bytes, "logits: device y block");
    if (!buffer.ok()) return buffer.status();
    y[static_cast<std::size_t>(b)] = *buffer;
  }
  void* acc = nullptr;
  if (acc_separate) {
    auto buffer =
        Scratch(c, kAcc, static_cast<std::size_t>(rows * v) * 4, "logits: device fp32 accumulator");
    if (!buffer.ok()) return buffer.status();
    acc = *buffer;
  }

  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();
  const std::string shape = absl::StrCat("M=", m, ",N=", v, ",K=", k);
  const StreamTimer timer(c, "logits");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(*x, args.x, static_cast<std::size_t>(m * k) * 2, cudaMemcpyHostToDevice, cs),
      "logits: copy x [", m, ", ", k, "] to the device");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  const GemmStream gs = c.gemm(GemmRecord(timing));
  auto enqueue_gemm = [&](std::int64_t b) -> absl::Status {
    const std::size_t slot = static_cast<std::size_t>(b % 2);
    const std::int64_t row0 = b * rows;
    const std::int64_t mb = std::min(rows, m - row0);
    if (b >= 2) {
      // The buffer's previous block must have reached the host.
      RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(cs, c.block_copied[slot].get(), 0),
                           "logits: cudaStreamWaitEvent");
    }
    const void* xb = static_cast<const std::byte*>(*x) + static_cast<std::size_t>(row0 * k) * 2;
    if (!scale_after) {
      RETURN_IF_ERROR_(engine_.Run(LogitsShape(mb, v, k, CudaType(args.out_dtype)),
                                   GemmOperands{xb, w.data(), y[slot], args.alpha, 0.0f}, gs));
    } else {
      void* target = acc_separate ? acc : y[slot];
      RETURN_IF_ERROR_(engine_.Run(LogitsShape(mb, v, k, CUDA_R_32F),
                                   GemmOperands{xb, w.data(), target, 1.0f, 0.0f}, gs));
      RETURN_IF_CUDA_ERROR(LaunchScale(static_cast<const float*>(target), mb * v, args.alpha,
                                       y[slot], args.out_dtype == DType::kBf16, cs),
                           "logits: scale kernel (", shape, ")");
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_done[slot].get(), cs), "logits: cudaEventRecord");
    if (b == blocks - 1) {
      RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    }
    return absl::OkStatus();
  };

  // The GEMM of block b+1 is queued before the copy of block b, so the two
  // overlap even when the host buffer is pageable (such a copy returns only
  // when done).
  RETURN_IF_ERROR_(enqueue_gemm(0));
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t slot = static_cast<std::size_t>(b % 2);
    if (b + 1 < blocks) RETURN_IF_ERROR_(enqueue_gemm(b + 1));
    const std::int64_t row0 = b * rows;
    const std::int64_t mb = std::min(rows, m - row0);
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(ss, c.block_done[slot].get(), 0),
                         "logits: cudaStreamWaitEvent");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(
            static_cast<std::byte*>(args.y) + static_cast<std::size_t>(row0) * row_bytes, y[slot],
            static_cast<std::size_t>(mb) * row_bytes, cudaMemcpyDeviceToHost, ss),
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

absl::Status CudaBackend::DoBackward(Weight& weight, const BackwardArgs& args, Timing* timing) {
  auto* w = dynamic_cast<CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("backward", "cuda", weight);
  RETURN_IF_ERROR_(CheckBackwardArgs(*w, args));
  const bool want_dx = args.dx != nullptr;
  const bool want_dw = args.accumulate_dw || args.dw != nullptr;
  const std::int64_t m = args.m;
  const std::int64_t v = w->v();
  const std::int64_t k = w->k();
  const std::size_t x_bytes = static_cast<std::size_t>(m * k) * 2;
  RETURN_IF_ERROR_(UseDevice(options_.device));
  const std::string shape = absl::StrCat("M=", m, ",V=", v, ",K=", k);
  ACQUIRE_OR_RETURN_(lease, absl::StrCat("backward(", shape, ")"));
  Context& c = *lease;
  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();

  auto g = Scratch(c, kG, static_cast<std::size_t>(m * v) * 2, "backward: device G");
  if (!g.ok()) return g.status();
  void* x = nullptr;
  if (want_dw) {
    auto buffer = Scratch(c, kX, x_bytes, "backward: device x");
    if (!buffer.ok()) return buffer.status();
    x = *buffer;
  }
  const std::size_t dy_row_bytes = static_cast<std::size_t>(v) * 4;
  std::int64_t staging_rows = 0;
  void* staging = nullptr;
  if (args.dy_dtype == DType::kFp32) {
    staging_rows = std::max<std::int64_t>(
        1, std::min<std::int64_t>(m, static_cast<std::int64_t>(kStagingBytes / dy_row_bytes)));
    auto buffer = Scratch(c, kStaging, static_cast<std::size_t>(staging_rows) * dy_row_bytes,
                          "backward: device dy staging");
    if (!buffer.ok()) return buffer.status();
    staging = *buffer;
  }
  void* dx = nullptr;
  if (want_dx) {
    auto buffer = Scratch(c, kDx, static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype),
                          "backward: device dx");
    if (!buffer.ok()) return buffer.status();
    dx = *buffer;
  }
  void* dw = nullptr;
  if (want_dw && !args.accumulate_dw) {
    auto buffer = Scratch(c, kDw, static_cast<std::size_t>(v * k) * ElementSize(args.dw_dtype),
                          "backward: device dw");
    if (!buffer.ok()) return buffer.status();
    dw = *buffer;
  }

  // Inputs: G = bf16(dY) block by block through the staging buffer.
  const StreamTimer timer(c, "backward");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_ERROR_(
      UploadBackwardInputs(args, v, k, static_cast<Bf16Bits*>(*g), x, staging, staging_rows, cs));
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  const GemmStream gs = c.gemm(GemmRecord(timing));
  if (want_dx) {
    RETURN_IF_ERROR_(engine_.Run(GradInputShape(m, v, k, CudaType(args.dx_dtype)),
                                 GemmOperands{*g, w->data(), dx, 1.0f, 0.0f}, gs));
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
    absl::StatusOr<float*> buffer = GradientBuffer(gradient, *w, cs, "backward");
    if (!buffer.ok()) return buffer.status();
    RETURN_IF_ERROR_(engine_.Run(GradWeightShape(m, v, k, CUDA_R_32F),
                                 GemmOperands{*g, x, *buffer, 1.0f, 1.0f}, gs));
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "backward(", shape, "): accumulate dw");
    gradient.CountCall();
  } else if (want_dw) {
    RETURN_IF_ERROR_(engine_.Run(GradWeightShape(m, v, k, CudaType(args.dw_dtype)),
                                 GemmOperands{*g, x, dw, 1.0f, 0.0f}, gs));
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

absl::Status CudaBackend::DoCastToBf16(const float* in, std::int64_t n, Bf16Bits* out,
                                       Timing* timing) {
  RETURN_IF_ERROR_(CheckCastArgs(in, n, out));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(lease, absl::StrCat("cast(", n, " values)"));
  Context& c = *lease;
  cudaStream_t cs = c.compute.get();
  if (options_.test_device_faults) {
    const std::uint32_t first = FloatBits(in[0]);
    if (first == kTestDeviceTrap || first == kTestDeviceHang) return TestDeviceFault(first, c);
  }
  const std::int64_t block = std::min<std::int64_t>(n, kStagingBytes / 4 * 2);
  auto din = Scratch(c, kCastIn, static_cast<std::size_t>(block) * 4, "cast: device input");
  if (!din.ok()) return din.status();
  auto dout = Scratch(c, kCastOut, static_cast<std::size_t>(block) * 2, "cast: device output");
  if (!dout.ok()) return dout.status();
  const StreamTimer timer(c, "cast");
  Timing total;
  for (std::int64_t i0 = 0; i0 < n; i0 += block) {
    const std::int64_t nb = std::min(block, n - i0);
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(*din, in + i0, static_cast<std::size_t>(nb) * 4,
                                         cudaMemcpyHostToDevice, cs),
                         "cast: copy ", nb, " values to the device");
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));
    RETURN_IF_CUDA_ERROR(LaunchCastFp32ToBf16(static_cast<const float*>(*din), nb,
                                              static_cast<Bf16Bits*>(*dout), cs),
                         "cast: cast kernel (", nb, " values)");
    RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out + i0, *dout, static_cast<std::size_t>(nb) * 2,
                                         cudaMemcpyDeviceToHost, cs),
                         "cast: copy ", nb, " values to the host");
    RETURN_IF_ERROR_(timer.End(cs, absl::StrCat("cast (", nb, " values)")));
    Timing block_timing;
    timer.Fill(&block_timing);
    total.h2d_us += block_timing.h2d_us;
    total.compute_us += block_timing.compute_us;
    total.d2h_us += block_timing.d2h_us;
    total.transfers_measured = true;
  }
  if (timing != nullptr) *timing = total;
  return absl::OkStatus();
}

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

// dW rows on their way to the host: two staging chunks on the device, each
// copied home on the copy stream while the next chunk computes. A chunk's
// copy is enqueued only after the next chunk's work, so the two overlap even
// when the host buffer is pageable (such a copy returns only when done).
class HostDwSink final : public CeDwSink {
 public:
  HostDwSink(Context& c, std::array<void*, 2> staging, float* host, std::int64_t v, std::int64_t k)
      : c_(c), staging_(staging), host_(host), v_(v), k_(k) {}

  absl::StatusOr<float*> Begin(std::int64_t /*c0*/, std::int64_t /*n*/) override {
    const std::size_t slot = count_ % 2;
    if (count_ >= 2) {
      // The slot's previous rows must have reached the host.
      RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(c_.compute.get(), c_.block_copied[slot].get(), 0),
                           "cross_entropy: cudaStreamWaitEvent");
    }
    return static_cast<float*>(staging_[slot]);
  }
  float beta() const override { return 0.0f; }
  absl::Status End(std::int64_t c0, std::int64_t n) override {
    const std::size_t slot = count_ % 2;
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.block_done[slot].get(), c_.compute.get()),
                         "cross_entropy: cudaEventRecord");
    RETURN_IF_ERROR_(Flush());
    pending_ = Pending{true, slot, c0, n};
    ++count_;
    return absl::OkStatus();
  }
  // Enqueues the copy still held back, if any.
  absl::Status Flush() {
    if (!pending_.valid) return absl::OkStatus();
    const Pending p = pending_;
    pending_.valid = false;
    cudaStream_t ss = c_.copy.get();
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(ss, c_.block_done[p.slot].get(), 0),
                         "cross_entropy: cudaStreamWaitEvent");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host_ + p.c0 * k_, staging_[p.slot], static_cast<std::size_t>(p.n * k_) * 4,
                        cudaMemcpyDeviceToHost, ss),
        "cross_entropy: copy dw rows [", p.c0, ", ", p.c0 + p.n, ") of [", v_, ", ", k_,
        "] to the host");
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.block_copied[p.slot].get(), ss),
                         "cross_entropy: cudaEventRecord");
    return absl::OkStatus();
  }

 private:
  struct Pending {
    bool valid = false;
    std::size_t slot = 0;
    std::int64_t c0 = 0;
    std::int64_t n = 0;
  };
  Context& c_;
  std::array<void*, 2> staging_;
  float* host_;
  std::int64_t v_;
  std::int64_t k_;
  std::size_t count_ = 0;
  Pending pending_;
};

// A cross-entropy's device scratch: the walk's buffers and the dW staging.
struct CeScratchSet {
  CeBuffers b;
  std::array<void*, 2> staging{};
  std::byte* row_base = nullptr;  // targets, loss and lse, then the row state
};

// Byte offsets in a cross-entropy's rows buffer: the targets (int64), loss
// and lse, then the per-row state.
struct CeRowOffsets {
  std::size_t loss = 0;
  std::size_t lse = 0;
  std::size_t state = 0;
};
CeRowOffsets CeRows(std::int64_t m) {
  auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t row_bytes = static_cast<std::size_t>(m) * 4;
  CeRowOffsets o;
  o.loss = align(static_cast<std::size_t>(m) * 8);
  o.lse = o.loss + align(row_bytes);
  o.state = o.lse + align(row_bytes);
  return o;
}

absl::StatusOr<float*> CudaBackend::GradientBuffer(GradientState<DeviceBuffer>::Lock& gradient,
                                                   const CudaWeight& w, cudaStream_t cs,
                                                   const char* call) {
  absl::StatusOr<DeviceBuffer*> buffer =
      gradient.GetOrCreate([&]() -> absl::StatusOr<DeviceBuffer> {
        auto fresh = memory_->Allocate(
            static_cast<std::size_t>(w.v() * w.k()) * 4,
            absl::StrCat(call, ": gradient ", ShapeString({w.v(), w.k()}), " fp32"));
        if (!fresh.ok()) return fresh.status();
        RETURN_IF_CUDA_ERROR(cudaMemsetAsync(fresh->get(), 0, fresh->size(), cs), call,
                             ": zero the gradient buffer");
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), call, ": zero the gradient buffer");
        return fresh;
      });
  if (!buffer.ok()) return buffer.status();
  return (*buffer)->as<float>();
}

absl::Status CudaBackend::AllocateShrinking(Context& c, const CePlanRequest& request, CePlan* plan,
                                            std::initializer_list<Slot> slots,
                                            const std::function<absl::Status()>& allocate) {
  // Only when the device cannot hold the plan's scratch does an automatic
  // chunk shrink (ShrinkCePlan) until it fits.
  for (;;) {
    absl::Status allocated = allocate();
    if (allocated.ok()) return allocated;
    if (allocated.code() != absl::StatusCode::kResourceExhausted) return allocated;
    std::optional<CePlan> smaller = ShrinkCePlan(request, *plan);
    if (!smaller.has_value()) return allocated;
    // Nothing is enqueued yet: the context's buffers can go.
    for (Slot slot : slots) c.scratch[slot].Reset();
    *plan = *smaller;
  }
}

absl::Status CudaBackend::AllocateCrossEntropy(Context& c, const CudaWeight& w,
                                               const CrossEntropyArgs& args,
                                               const CePlanRequest& request, CePlan* plan,
                                               CeScratchSet* out) {
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  const bool staged_dw = request.want_dw && !request.accumulate_dw;
  const CeRowOffsets offsets = CeRows(m);
  auto allocate = [&]() -> absl::Status {
    const bool tokens = plan->walk == CeWalk::kTokens;
    const CeScratchSizes& sizes = plan->sizes;
    auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "cross_entropy: device x");
    if (!x.ok()) return x.status();
    auto rows =
        Scratch(c, kRows, offsets.state + sizes.rows, "cross_entropy: device per-row state");
    if (!rows.ok()) return rows.status();
    auto logits = Scratch(c, kY0, sizes.logits, "cross_entropy: device logits chunk");
    if (!logits.ok()) return logits.status();
    *out = CeScratchSet{};
    CeBuffers& b = out->b;
    out->row_base = static_cast<std::byte*>(*rows);
    b.x = *x;
    b.w = w.data();
    b.targets = reinterpret_cast<const std::int64_t*>(out->row_base);
    b.loss = reinterpret_cast<float*>(out->row_base + offsets.loss);
    b.lse = args.lse != nullptr ? reinterpret_cast<float*>(out->row_base + offsets.lse) : nullptr;
    b.dx_bf16 = request.dx_bf16;
    b.logits = static_cast<float*>(*logits);
    b.rows = out->row_base + offsets.state;
    if (sizes.g > 0) {
      auto g = Scratch(c, kG, sizes.g, "cross_entropy: device G chunk");
      if (!g.ok()) return g.status();
      b.g = static_cast<std::uint16_t*>(*g);
    }
    if (request.dx_bf16) {
      auto acc = Scratch(c, kAcc, sizes.dx_acc, "cross_entropy: device fp32 dx staging");
      if (!acc.ok()) return acc.status();
      b.dx_acc = static_cast<float*>(*acc);
    }
    if (request.want_dx) {
      auto dx = Scratch(c, kDx, static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype),
                        "cross_entropy: device dx");
      if (!dx.ok()) return dx.status();
      b.dx = *dx;
    }
    // The token walk adds every chunk to all of dW: it is whole on the
    // device. The vocabulary walk stages dW rows on their way home.
    const std::size_t staging_bytes = static_cast<std::size_t>((tokens ? v : plan->chunk) * k) * 4;
    for (std::size_t i = 0; staged_dw && i < (tokens ? 1u : 2u); ++i) {
      auto buffer = Scratch(c, i == 0 ? kDw : kY1, staging_bytes, "cross_entropy: device dw");
      if (!buffer.ok()) return buffer.status();
      out->staging[i] = *buffer;
    }
    return absl::OkStatus();
  };
  return AllocateShrinking(c, request, plan, {kX, kRows, kY0, kG, kAcc, kDx, kDw, kY1}, allocate);
}

absl::Status CudaBackend::EnqueueCrossEntropy(Context& c, const CrossEntropyArgs& args,
                                              const CeProblem& p, const CeScratchSet& scratch,
                                              float* gradient_buffer, const StreamTimer& timer,
                                              Timing* timing) {
  const std::int64_t m = p.m;
  const std::int64_t v = p.v;
  const std::int64_t k = p.k;
  const CeBuffers& b = scratch.b;
  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();
  const bool staged_dw = args.dw != nullptr && !args.accumulate_dw;
  const bool tokens = p.walk == CeWalk::kTokens;
  const std::size_t row_bytes = static_cast<std::size_t>(m) * 4;
  const std::size_t dx_bytes = static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype);
  const std::string shape =
      absl::StrCat("M=", m, ",V=", v, ",K=", k, ",", CeWalkName(p.walk), " chunk=", p.chunk);

  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(const_cast<void*>(b.x), args.x, static_cast<std::size_t>(m * k) * 2,
                      cudaMemcpyHostToDevice, cs),
      "cross_entropy: copy x [", m, ", ", k, "] to the device");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(scratch.row_base, args.targets,
                                       static_cast<std::size_t>(m) * 8, cudaMemcpyHostToDevice, cs),
                       "cross_entropy: copy targets [", m, "] to the device");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  HostDwSink host_sink(c, scratch.staging, args.dw, v, k);
  std::optional<DeviceDwSink> device_sink;
  CeDwSink* sink = nullptr;
  if (args.accumulate_dw) {
    device_sink.emplace(gradient_buffer, k, 1.0f);  // under the gradient's lock
    sink = &*device_sink;
  } else if (staged_dw && tokens) {
    device_sink.emplace(static_cast<float*>(scratch.staging[0]), k, 0.0f);
    sink = &*device_sink;
  } else if (staged_dw) {
    sink = &host_sink;
  }
  RETURN_IF_ERROR_(RunCrossEntropy(engine_, c.gemm(GemmRecord(timing)), p, b, sink));
  RETURN_IF_ERROR_(host_sink.Flush());
  if (staged_dw && tokens) {
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(args.dw, scratch.staging[0], static_cast<std::size_t>(v * k) * 4,
                        cudaMemcpyDeviceToHost, cs),
        "cross_entropy: copy dw [", v, ", ", k, "] to the host");
  }
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));

  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.loss, b.loss, row_bytes, cudaMemcpyDeviceToHost, cs),
                       "cross_entropy: copy loss [", m, "] to the host");
  if (args.lse != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.lse, b.lse, row_bytes, cudaMemcpyDeviceToHost, cs),
                         "cross_entropy: copy lse [", m, "] to the host");
  }
  if (args.dx != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.dx, b.dx, dx_bytes, cudaMemcpyDeviceToHost, cs),
                         "cross_entropy: copy dx [", m, ", ", k, "] to the host");
  }
  // The end is when both streams are done.
  RETURN_IF_ERROR_(timer.EndOfBothStreams(absl::StrCat("cross_entropy(", shape, ")")));
  // A failed kernel surfaces here if not before.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "cross_entropy(", shape, ")");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ss), "cross_entropy(", shape, ")");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCrossEntropy(Weight& weight, const CrossEntropyArgs& args,
                                         Timing* timing) {
  auto* w = dynamic_cast<CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("cross entropy", "cuda", weight);
  RETURN_IF_ERROR_(CheckCrossEntropyArgs(*w, args));
  const std::int64_t m = args.m;
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(lease, absl::StrCat("cross_entropy(M=", m, ",V=", w->v(), ",K=", w->k(), ")"));
  Context& c = *lease;
  cudaStream_t cs = c.compute.get();

  // Accumulations into the weight's buffer go one at a time. The lock is
  // taken before any scratch, so that the buffer's first allocation is not
  // crowded out by this call's own workspace, and held until the call's work
  // has left the streams, on failure too.
  std::optional<GradientState<DeviceBuffer>::Lock> gradient;
  float* gradient_buffer = nullptr;
  if (args.accumulate_dw) {
    gradient.emplace(w->gradient().Acquire());
    absl::StatusOr<float*> buffer = GradientBuffer(*gradient, *w, cs, "cross_entropy");
    if (!buffer.ok()) return buffer.status();
    gradient_buffer = *buffer;
  }

  // The walk and its chunk (see PlanCrossEntropy), a pure function of the
  // request and the configured memory, so the same request gets the same
  // chunk unless the device cannot hold it.
  CePlanRequest request;
  request.m = m;
  request.v = w->v();
  request.k = w->k();
  request.want_dx = args.dx != nullptr;
  request.dx_bf16 = request.want_dx && args.dx_dtype == DType::kBf16;
  request.want_dw = args.accumulate_dw || args.dw != nullptr;
  request.accumulate_dw = args.accumulate_dw;
  request.vocab_chunk = args.vocab_chunk;
  request.workspace_bytes = options_.ce_workspace_bytes;
  request.device_memory_budget = options_.device_memory_budget;
  CePlan plan = PlanCrossEntropy(request);
  CeScratchSet scratch;
  RETURN_IF_ERROR_(AllocateCrossEntropy(c, *w, args, request, &plan, &scratch));

  CeProblem p;
  p.m = m;
  p.v = w->v();
  p.k = w->k();
  p.walk = plan.walk;
  p.chunk = plan.chunk;
  p.ignore_index = args.ignore_index;
  p.z_loss = args.z_loss;
  p.logit_softcap = args.logit_softcap;
  p.grad_scale = args.grad_scale;
  const StreamTimer timer(c, "cross_entropy");
  absl::Status status = EnqueueCrossEntropy(c, args, p, scratch, gradient_buffer, timer, timing);
  if (!status.ok()) {
    // Nothing of this call may still write the gradient once the lock goes.
    for (cudaStream_t stream : {cs, c.copy.get()}) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
    }
    return status;
  }
  if (args.accumulate_dw) gradient->CountCall();
  if (timing != nullptr) {
    timer.Fill(timing);
    timing->plan = absl::StrCat(CeWalkName(plan.walk), " walk, chunk ", plan.chunk);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateLogProbs(Context& c, std::int64_t m, std::int64_t k, int top_k,
                                           std::int64_t chunk, LpBuffers* b) {
  const LpScratchSizes sizes = LpScratch(m, chunk, top_k);
  auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "log probs: device x");
  if (!x.ok()) return x.status();
  auto logits = Scratch(c, kY0, sizes.logits, "log probs: device logits chunk");
  if (!logits.ok()) return logits.status();
  auto rows = Scratch(c, kRows, sizes.rows, "log probs: device per-row state");
  if (!rows.ok()) return rows.status();
  b->x = *x;
  b->logits = static_cast<float*>(*logits);
  b->rows = *rows;
  b->lists = nullptr;
  if (sizes.lists > 0) {
    auto lists = Scratch(c, kG, sizes.lists, "log probs: device top-k lists");
    if (!lists.ok()) return lists.status();
    b->lists = *lists;
  }
  return absl::OkStatus();
}

absl::Status CopyLogProbsHome(const LogProbsArgs& args, const LpRowsIo& io, cudaStream_t cs) {
  const auto home = [&](void* to, const void* from, std::size_t bytes,
                        const char* name) -> absl::Status {
    if (to == nullptr) return absl::OkStatus();
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, cs),
                         "log probs: copy ", name, " [", args.m, "] to the host");
    return absl::OkStatus();
  };
  const std::size_t rows = static_cast<std::size_t>(args.m);
  const std::size_t topk = rows * static_cast<std::size_t>(args.top_k);
  RETURN_IF_ERROR_(home(args.logprob, io.logprob, rows * 4, "logprob"));
  RETURN_IF_ERROR_(home(args.lse, io.lse, rows * 4, "lse"));
  RETURN_IF_ERROR_(home(args.entropy, io.entropy, rows * 4, "entropy"));
  RETURN_IF_ERROR_(home(args.rank, io.rank, rows * 8, "rank"));
  if (topk == 0) return absl::OkStatus();
  RETURN_IF_ERROR_(home(args.topk_ids, io.topk_ids, topk * 4, "topk_ids"));
  return home(args.topk_logprobs, io.topk_logprobs, topk * 4, "topk_logprobs");
}

absl::Status CudaBackend::DoLogProbs(const Weight& weight, const LogProbsArgs& args,
                                     Timing* timing) {
  const auto* w = dynamic_cast<const CudaWeight*>(&weight);
  if (w == nullptr) return ForeignWeightError("log probs", "cuda", weight);
  RETURN_IF_ERROR_(CheckLogProbsArgs(*w, args));
  const std::int64_t m = args.m;
  const std::int64_t v = args.vocab;
  const std::int64_t k = w->k();
  const int top_k = static_cast<int>(args.top_k);
  const std::size_t x_bytes = static_cast<std::size_t>(m * k) * 2;
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(lease, absl::StrCat("log_probs(M=", m, ",V=", v, ",K=", k, ")"));
  Context& c = *lease;
  cudaStream_t cs = c.compute.get();

  // The cross-entropy's chunk without gradients, so that the same request
  // walks the same GEMM shapes and lse and logprob are bitwise
  // CrossEntropy's; shrunk as it is when the device cannot hold the scratch.
  CePlanRequest request;
  request.m = m;
  request.v = v;
  request.k = k;
  request.vocab_chunk = args.vocab_chunk;
  request.workspace_bytes = options_.ce_workspace_bytes;
  request.device_memory_budget = options_.device_memory_budget;
  CePlan plan = PlanCrossEntropy(request);
  LpBuffers b;
  b.w = w->data();
  RETURN_IF_ERROR_(AllocateShrinking(c, request, &plan, {kX, kY0, kRows, kG}, [&]() {
    return AllocateLogProbs(c, m, k, top_k, plan.chunk, &b);
  }));

  LpProblem p;
  p.m = m;
  p.v = v;
  p.k = k;
  p.chunk = plan.chunk;
  p.has_targets = args.targets != nullptr;
  p.ignore_index = args.ignore_index;
  p.temperature = args.temperature;
  p.logit_softcap = args.logit_softcap;
  p.top_k = top_k;
  p.want_logprob = args.logprob != nullptr;
  p.want_rank = args.rank != nullptr;
  p.want_lse = args.lse != nullptr;
  p.want_entropy = args.entropy != nullptr;
  const LpRowsIo io = LpIo(b.rows, m, plan.chunk, top_k);
  const std::string shape = absl::StrCat("M=", m, ",V=", v, ",K=", k, ",chunk=", plan.chunk);
  const StreamTimer timer(c, "log_probs");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(const_cast<void*>(b.x), args.x, x_bytes, cudaMemcpyHostToDevice, cs),
      "log probs: copy x [", m, ", ", k, "] to the device");
  if (args.targets != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(io.targets, args.targets, static_cast<std::size_t>(m) * 8,
                                         cudaMemcpyHostToDevice, cs),
                         "log probs: copy targets [", m, "] to the device");
  }
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));
  RETURN_IF_ERROR_(RunLogProbs(engine_, c.gemm(GemmRecord(timing)), p, b));
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
  RETURN_IF_ERROR_(CopyLogProbsHome(args, io, cs));
  RETURN_IF_ERROR_(timer.End(cs, absl::StrCat("log_probs(", shape, ")")));
  // A failed kernel surfaces here if not before.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "log_probs(", shape, ")");
  if (timing != nullptr) {
    timer.Fill(timing);
    timing->plan = absl::StrCat("vocabulary walk, chunk ", plan.chunk,
                                p.want_rank ? ", logits twice for the rank" : "");
  }
  return absl::OkStatus();
}

}  // namespace

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

// The cuda backend's class and the per-call machinery its files share: the
// stream contexts a call leases from a pool, their scratch slots, the timer
// over a context's events, and the weight as the device holds it. The
// backend's calls are implemented in cuda_backend.cc (the pool, start-up,
// weights), gemm_calls.cc (Logits, Backward, gradients, Cast) and
// walk_calls.cc (CrossEntropy and LogProbs, the vocabulary walks).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/kernels/backend.h"
#include "server/kernels/cuda/cross_entropy.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/logprobs.h"
#include "server/kernels/cuda/lt_gemm.h"
#include "server/kernels/device_health.h"
#include "server/kernels/fifo_mutex.h"
#include "server/kernels/gradient_state.h"
#include "server/kernels/host_pool.h"
#include "server/kernels/kernel_table.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"

namespace logitd::kernels::cuda {

// Concurrent requests beyond this wait for a context. Four keep the device
// busy while one request copies and another computes.
inline constexpr int kContexts = 4;
// cuBLAS's recommendation for Hopper; identical in every context, which its
// reproducibility guarantee requires.
inline constexpr std::size_t kWorkspaceBytes = 32u << 20;
// Logits are computed and copied back in row blocks of about this size, so
// the copy of one block overlaps the GEMM of the next and device scratch
// stays bounded for any M.
inline constexpr std::size_t kLogitsBlockBytes = 128u << 20;
inline constexpr std::int64_t kMinBlockRows = 256;
// LogProbs and CrossEntropy without dW walk the vocabulary in row blocks of
// this many rows (the last block what is left), each block planned as a call
// of its own rows, so that a call cut at its multiples (the service's row
// blocks, a client's parts) runs the very products of the uncut call.
inline constexpr std::int64_t kWalkBlockRows = 1024;
// dY travels and is cast block by block through a staging buffer this size.
inline constexpr std::size_t kStagingBytes = 64u << 20;
// Scratch buffers up to this size stay with their context between requests;
// larger ones are returned after the request.
inline constexpr std::size_t kRetainBytes = 256u << 20;

#define RETURN_IF_ERROR_(expr) LOGITD_CUDA_RETURN_IF_ERROR(expr)
// Lease& NAME = a context for the call `what`, or return why there is none.
#define ACQUIRE_OR_RETURN_(name, what)                          \
  absl::StatusOr<Lease> name##_acquired_ = Acquire(what);       \
  if (!name##_acquired_.ok()) return name##_acquired_.status(); \
  Lease& name = *name##_acquired_

inline std::int64_t MicrosBetween(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(ms * 1000.0f + 0.5f);
}

inline cudaDataType_t CudaType(DType t) { return t == DType::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }

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
inline std::vector<std::string>* GemmRecord(Timing* timing) {
  return timing != nullptr ? &timing->gemms : nullptr;
}

class CudaBackend;
struct CeScratchSet;
struct LogitsBuffers;
struct BackwardBuffers;

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
  void Return(Context* context);

 private:
  // The operations' kernels (kernel_table.h), each in a file of its own.
  template <typename B, typename Args>
  friend struct ::logitd::kernels::KernelOf;

  static GemmEngineOptions EngineOptions(const BackendOptions& options) {
    GemmEngineOptions o;
    o.split_k = options.split_k;
    o.warn = options.events.warning;
    return o;
  }
  // Init's parts: the device's properties and versions into info_; one
  // context of the pool; the --algo_cache file (a warning when unusable); a
  // cast of rounding, tie, overflow and NaN values against the host's.
  absl::Status ReadDeviceInfo();
  absl::StatusOr<std::unique_ptr<Context>> CreateContext();
  void UseAlgoCache();
  absl::Status SelfTestCast();
  absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t bytes) override;
  absl::StatusOr<std::shared_ptr<void>> DoPinHostMemory(void* data, std::size_t bytes) override;
  absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                       std::int64_t k) override;
  absl::Status DoReadWeight(const Weight& w, Bf16Bits* out) override;
  absl::StatusOr<std::shared_ptr<Fp64Products>> DoReferenceProducts(const Weight& w) override;
  std::int64_t LogitsBlockRows(const Weight& w, std::int64_t m, DType out_dtype) const override;
  absl::StatusOr<std::uint64_t> DoFetchGradient(Weight& w, float* out,
                                                bool zero_after_fetch) override;
  absl::Status DoZeroGradient(Weight& w) override;
  absl::Status DoKernel(const KernelOp& op, const void* args, Timing* timing) override {
    return KernelTable<CudaBackend>::Get().Run(*this, op, args, timing);
  }
  // The Logits and Backward kernels (KernelOf<CudaBackend, LogitsArgs>,
  // KernelOf<CudaBackend, BackwardArgs>, gemm_calls.cc), of args.weight.
  absl::Status LogitsCall(const Weight& w, const LogitsArgs& args, Timing* timing);
  absl::Status BackwardCall(Weight& w, const BackwardArgs& args, Timing* timing);
  // The cross-entropy's kernel (KernelOf<CudaBackend, CrossEntropyArgs>,
  // walk_calls.cc).
  absl::Status CrossEntropyCall(const CrossEntropyArgs& args, Timing* timing);
  // LogProbs' kernel (KernelOf<CudaBackend, LogProbsArgs>, walk_calls.cc):
  // row blocks on one context, the next block's X uploaded while this one
  // computes.
  absl::Status LogProbsCall(const LogProbsArgs& args, Timing* timing);
  std::int64_t LogProbsBlockRows(const Weight& w, std::int64_t m) const override;
  std::int64_t CrossEntropyBlockRows(const Weight& w, std::int64_t m) const override;
  // A sticky CUDA error marks the device lost (see Backend).
  void NoteFailure(const absl::Status& failure) override {
    if (IsDeviceLost(failure)) health_.MarkLost(failure);
  }
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
  // One walk over all of args' rows on context c, planned for them alone
  // and finished (both streams idle) when it returns.
  absl::Status CrossEntropyRows(Context& c, CudaWeight& w, const CrossEntropyArgs& args,
                                Timing* timing);
  // LogProbs' row blocks on one context: the next block's X (`prefetch`,
  // may be null) is uploaded into kStaging on the copy stream while this
  // block computes, and this block takes its own from there when the block
  // before staged it. Neither stream holds a copy of the caller's memory
  // once LogProbsCall returns.
  struct XPrefetch {
    const void* next = nullptr;  // the next block's X; null: none
    std::size_t next_bytes = 0;
    bool staged = false;  // this block's X waits in kStaging
  };
  absl::Status LogProbsRows(Context& c, const CudaWeight& w, const LogProbsArgs& args,
                            Timing* timing, XPrefetch* prefetch = nullptr);
  // LogProbsRows' steps: this block's X [m, k] into dst on the compute
  // stream (from `staging` when the block before staged it; staging free
  // again after it when `stage_next`), and the next block's X into staging
  // on the copy stream.
  absl::Status LpBlockX(Context& c, XPrefetch* prefetch, void* staging, bool stage_next,
                        const void* x, void* dst, std::int64_t m, std::int64_t k);
  absl::Status LpStageNextX(Context& c, XPrefetch* prefetch, void* staging);
#ifdef LOGITD_TEST_FAULTS
  // The test-only device faults (see kTestDeviceTrap) on context c.
  absl::Status TestDeviceFault(std::uint32_t trigger, Context& c);
#endif

  // A free context, once one is; Unavailable when the device is lost
  // (before or while waiting). `what` names the call for the watchdog.
  absl::StatusOr<Lease> Acquire(std::string what);
  absl::StatusOr<void*> Scratch(Context& c, Slot slot, std::size_t bytes, const char* what);
  absl::Status LogitsBlocks(const CudaWeight& w, const LogitsArgs& args, Context& c,
                            Timing* timing);
  absl::StatusOr<LogitsBuffers> AllocateLogits(Context& c, const LogitsArgs& args, std::int64_t v,
                                               std::int64_t k, bool acc_separate);
  absl::StatusOr<BackwardBuffers> AllocateBackward(Context& c, const BackwardArgs& args,
                                                   std::int64_t v, std::int64_t k);

  BackendOptions options_;
  DeviceHealth health_;
  std::shared_ptr<DeviceMemory> memory_;
  GemmEngine engine_;
  std::shared_ptr<HostBufferPool> host_pool_;
  BackendInfo info_;
  std::uint64_t device_bytes_total_ = 0;

  std::vector<std::unique_ptr<Context>> contexts_;
  FifoMutex pool_turns_;  // taken before pool_mu_
  absl::Mutex pool_mu_;
  absl::CondVar pool_cv_;
  std::vector<Context*> free_ ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace logitd::kernels::cuda

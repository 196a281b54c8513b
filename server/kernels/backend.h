// The one interface between the service layer and the arithmetic. A backend
// holds weights (on its device), computes the LM head's GEMMs with bf16
// operands and fp32 accumulation, and owns any device state. No gRPC here;
// the cuda implementation keeps every CUDA header behind this interface.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/bf16.h"
#include "logitd/protocol.h"
#include "logitd/tensor.h"
#include "server/kernels/kernel.h"
#include "server/kernels/ops/backward.h"
#include "server/kernels/ops/logits.h"
#include "server/kernels/weight.h"

namespace logitd {
class Fp64Products;  // logitd/reference/fp64_products.h
class WeightMemo;    // logitd/reference/fp64_products.h
}  // namespace logitd

namespace logitd::kernels {

// What the backend runs on; mirrored into logitd.v1.ServerInfo.
struct BackendInfo {
  std::string backend;  // "cpu" or "cuda"
  std::string device_name;
  std::string compute_capability;  // "9.0"; empty on cpu
  int multiprocessor_count = 0;    // SMs, or hardware threads on cpu
  std::string driver_version;
  std::string cuda_runtime_version;
  std::string cublaslt_version;
  std::string blas_version;
  std::string split_k;  // SplitKName: "off" | "fp32" | "any"; empty on cpu
  // How long the backend's GEMM algorithm choices last, which decides whether
  // a restarted server gives the same bits: one of kAlgoChoices*.
  std::string algo_choices;
  // The file the choices are kept in (kAlgoChoicesKept); empty otherwise.
  std::string algo_cache_path;
};

// BackendInfo::algo_choices (and logitd.v1.ServerInfo.algo_choices):
// "fixed": the backend has one algorithm per shape in every process (cpu:
//   OpenBLAS's kernels for this CPU and thread count);
// "kept": chosen by timing once per platform and kept in a file that every
//   later process on this machine reads (--algo_cache);
// "per_process": chosen by timing in each process, so a restart may run
//   other algorithms and give other bits (--algo_cache=none, or a file that
//   cannot be written).
inline constexpr char kAlgoChoicesFixed[] = "fixed";
inline constexpr char kAlgoChoicesKept[] = "kept";
inline constexpr char kAlgoChoicesPerProcess[] = "per_process";

// Where a call's time went, microseconds.
struct Timing {
  std::int64_t h2d_us = 0;
  std::int64_t compute_us = 0;
  std::int64_t d2h_us = 0;
  // True when h2d_us and d2h_us were measured (a backend with device copies);
  // false leaves them out of the call's timing trailer.
  bool transfers_measured = false;
  // How the backend carried the call out where it had a choice (the fused
  // cross-entropy's walk and chunk, say), for logs and tests; may be empty.
  std::string plan;
  // The GEMMs the call ran, one "shape: configuration" line per distinct
  // product (cuda: the cuBLASLt algorithm), so that a result that changed
  // between runs can be traced to an algorithm that changed; may be empty.
  std::vector<std::string> gemms;
};

// The rows of the block that starts at row r0 when a call of m rows is cut
// into blocks of `block_rows` (Backend::LogitsBlockRows), the last block
// taking the rest: block_rows, or all that is left once less than two
// blocks are.
inline std::int64_t BlockRowsAt(std::int64_t m, std::int64_t r0, std::int64_t block_rows) {
  return m - r0 < 2 * block_rows ? m - r0 : block_rows;
}

// A host buffer the backend copies from and to efficiently (page-locked on
// cuda). Move-only; frees itself.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::byte* data, std::size_t size, std::function<void(std::byte*)> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      size_ = o.size_;
      release_ = std::move(o.release_);
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { Reset(); }

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
    size_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::function<void(std::byte*)> release_;
};

// The checks every backend makes of LoadWeight's arguments before it
// touches their memory; an operation's are its CheckArgs (ops/<op>.h), in
// the same wording for all backends ("<call>: x is null", "<call>: expected
// m (rows of x) >= 1, got 0", ...). What only one backend cannot do (the cpu
// backend's 32-bit BLAS dimensions) it checks itself, after these.
absl::Status CheckLoadWeightArgs(const Bf16Bits* w, std::int64_t v, std::int64_t k);
// InvalidArgument for a weight that `backend` ("cpu", "cuda") did not load,
// which reaches it through the shared interface: "<call>: expected a weight
// loaded by the cpu backend, got one [V, K] from another backend".
absl::Status ForeignWeightError(absl::string_view call, absl::string_view backend, const Weight& w);

// All methods are thread-safe. Shapes and dtypes arrive validated by the
// service layer; a backend still returns InvalidArgument rather than crash if
// they do not agree with the weight.
//
// The entry points are not virtual: each makes the checks every backend
// makes, in one place, and then calls the backend's Do* method (for an
// operation's kernel, Kernel and DoKernel: kernel.h). In order:
//   1. the call's arguments (CheckLoadWeightArgs, an
//      operation's CheckArgs), so every backend words a bad argument alike
//      and no Do* method or kernel sees one;
//   2. the device's health: once Health() is not OK every call fails with
//      that status at once, before it touches the device;
//   3. the Do* method; a failure goes to NoteFailure, where a backend marks
//      itself lost when the failure is one that loses the device (a sticky
//      CUDA error), and once the device is lost the call returns the lost
//      status instead of its own, so that every caller sees one cause.
// What only one backend checks (its own weight type, the cpu backend's 32-bit
// BLAS dimensions) its Do* method checks, after these.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendInfo Info() const = 0;
  // OK while the device can serve calls. Once it cannot (an error that
  // poisons the device context, or device work that did not finish within
  // BackendOptions::device_timeout): Unavailable naming the cause, for good;
  // every call then fails with that status at once.
  virtual absl::Status Health() const { return absl::OkStatus(); }
  // Bytes of device memory the backend holds now (0 on cpu).
  virtual std::uint64_t DeviceBytesInUse() const = 0;
  // Bytes of memory of the device it runs on; 0 when it has none (cpu).
  virtual std::uint64_t DeviceBytesTotal() const { return 0; }

  // A host buffer for inputs or outputs of at least `bytes`.
  absl::StatusOr<HostBuffer> AllocateHost(std::size_t bytes) {
    return Guard(DoAllocateHost(bytes));
  }

  // Makes [data, data + bytes) of host memory the caller keeps mapped (a
  // shared-memory region) faster for the device's copies: page-locked and
  // registered with the device on cuda. The memory stays so until the
  // returned token goes, which must be before the memory is unmapped. Null
  // where there is nothing to gain (cpu).
  absl::StatusOr<std::shared_ptr<void>> PinHostMemory(void* data, std::size_t bytes) {
    return Guard(DoPinHostMemory(data, bytes));
  }

  // Copies W [v, k] bf16 into backend storage (device memory on cuda).
  // ResourceExhausted when the device cannot hold it.
  absl::StatusOr<std::shared_ptr<Weight>> LoadWeight(const Bf16Bits* w, std::int64_t v,
                                                     std::int64_t k) {
    return Run(CheckLoadWeightArgs(w, v, k), [&] { return DoLoadWeight(w, v, k); });
  }

  // Copies the weight's values into out [V, K] as bf16, exactly as the
  // backend holds them (device to host on cuda): what a check of another
  // implementation's outputs forms its references from.
  absl::Status ReadWeight(const Weight& w, Bf16Bits* out) {
    return Run(
        out == nullptr ? absl::InvalidArgumentError("read weight: out is null") : absl::OkStatus(),
        [&] { return DoReadWeight(w, out); });
  }

  // An engine for the fp64 products of the references that judge other
  // implementations' outputs of weight `w` (Verify), on the backend's
  // device: the weight widened to fp64 there while the engine lives. Null
  // where the backend has none (cpu), whose references are formed by
  // OpenBLAS on the host; ResourceExhausted when the device cannot hold the
  // widened weight (the caller may then form them on the host).
  absl::StatusOr<std::shared_ptr<Fp64Products>> ReferenceProducts(const Weight& w) {
    return Run(absl::OkStatus(), [&] { return DoReferenceProducts(w); });
  }

  // Y[m, V] = alpha * X[m, K] . W[V, K]^T, bf16 operands, fp32 accumulation;
  // fp32 out, or rounded to bf16 once (RNE).
  // The Logits kernel (ops/logits.h) of weight `w`.
  absl::Status Logits(const Weight& w, LogitsArgs args, Timing* timing) {
    args.weight = &w;
    return Kernel(args, timing);
  }

  // The rows a Logits call of `m` rows may be cut into, one call a block
  // (the service's row blocks), with every element the bits of the uncut
  // call's: blocks of this many rows, the last one taking the rest. `m`
  // where the backend computes those m rows in one product, so that any cut
  // could change bits.
  virtual std::int64_t LogitsBlockRows(const Weight& /*w*/, std::int64_t m,
                                       DType /*out_dtype*/) const {
    return m;
  }

  // The rows a LogProbs call of `m` rows may be cut into, one call a block
  // (LogProbsRowsOf), with every output the bits of the uncut call's; as
  // LogitsBlockRows. `m` where the backend's products span all the rows.
  virtual std::int64_t LogProbsBlockRows(const Weight& /*w*/, std::int64_t m) const { return m; }
  // The same for a CrossEntropy call without dW (loss, lse, dX): every
  // block's a call of its own with the whole call's grad_scale.
  virtual std::int64_t CrossEntropyBlockRows(const Weight& /*w*/, std::int64_t m) const {
    return m;
  }

  // G = bf16(dY) (RNE, once); dX = G.W [m, K]; dW = G^T.X [V, K]; fp32
  // accumulation, outputs rounded once to their dtype.
  // The Backward kernel (ops/backward.h) of weight `w`.
  absl::Status Backward(Weight& w, BackwardArgs args, Timing* timing) {
    args.weight = &w;
    return Kernel(args, timing);
  }

  // Copies the weight's fp32 gradient buffer into out [V, K] (zeros if never
  // accumulated), and zeroes it afterwards when asked. Returns the number of
  // accumulating Backward calls since it was last zeroed.
  absl::StatusOr<std::uint64_t> FetchGradient(Weight& w, float* out, bool zero_after_fetch) {
    return Run(out == nullptr ? absl::InvalidArgumentError("fetch gradient: out is null")
                              : absl::OkStatus(),
               [&] { return DoFetchGradient(w, out, zero_after_fetch); });
  }
  absl::Status ZeroGradient(Weight& w) {
    return Run(absl::OkStatus(), [&] { return DoZeroGradient(w); });
  }

  // An operation's kernel (kernel.h), named by its arguments' type
  // (server/kernels/ops/): the arguments' CheckArgs, the device's health,
  // then the kernel this backend registered for them (kernel_table.h);
  // Unimplemented where it has none.
  template <typename Args>
  absl::Status Kernel(const Args& args, Timing* timing) {
    return RunKernel(KernelOpOf<Args>(), &args, timing);
  }
  // The same with the arguments' type erased: what a backend in front of
  // another forwards.
  absl::Status RunKernel(const KernelOp& op, const void* args, Timing* timing) {
    return Run(op.check(args), [&] { return DoKernel(op, args, timing); });
  }

 protected:
  // The backend's side of the entry points above, called with checked
  // arguments on a device that was healthy when the call began.
  virtual absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t bytes) = 0;
  virtual absl::StatusOr<std::shared_ptr<void>> DoPinHostMemory(void* /*data*/,
                                                                std::size_t /*bytes*/) {
    return nullptr;
  }
  virtual absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                               std::int64_t k) = 0;
  virtual absl::Status DoReadWeight(const Weight& /*w*/, Bf16Bits* /*out*/) {
    return absl::UnimplementedError(
        absl::StrCat(Info().backend, " backend cannot read a weight back"));
  }
  virtual absl::StatusOr<std::shared_ptr<Fp64Products>> DoReferenceProducts(const Weight& /*w*/) {
    return std::shared_ptr<Fp64Products>();
  }
  virtual absl::StatusOr<std::uint64_t> DoFetchGradient(Weight& w, float* out,
                                                        bool zero_after_fetch) = 0;
  virtual absl::Status DoZeroGradient(Weight& w) = 0;
  // The backend's kernel of `op` (KernelTable<B>::Run, kernel_table.h).
  virtual absl::Status DoKernel(const KernelOp& op, const void* args, Timing* timing) = 0;

  // Every failed status of a Do* method, before the call returns: a backend
  // whose failure can lose the device marks itself lost here (Health then
  // says so). Called from any thread.
  virtual void NoteFailure(const absl::Status& /*failure*/) {}

 private:
  // A failure, or the device's lost status once the device is lost.
  absl::Status Guard(absl::Status status) {
    if (status.ok()) return status;
    NoteFailure(status);
    absl::Status health = Health();
    return health.ok() ? status : health;
  }
  template <typename T>
  absl::StatusOr<T> Guard(absl::StatusOr<T> result) {
    if (result.ok()) return result;
    return Guard(result.status());
  }
  // The checks, then the call.
  template <typename Call>
  auto Run(const absl::Status& checked, const Call& call) -> decltype(call()) {
    if (!checked.ok()) return checked;
    if (absl::Status health = Health(); !health.ok()) return health;
    return Guard(call());
  }
};

enum class BackendKind { kAuto, kCuda, kCpu };

// Which split-K GEMM algorithms the cuda backend may run. kFp32 allows
// splitting the reduction only when every partial sum and the final
// reduction stay in fp32; kOff forbids it; kAny accepts whatever the library
// offers (bf16 partials included).
enum class SplitK { kOff, kFp32, kAny };
// "off", "fp32" or "any", any case; InvalidArgument naming them otherwise.
absl::StatusOr<SplitK> ParseSplitK(absl::string_view name);
// "off", "fp32" or "any": what --split_k, BackendInfo::split_k and the
// algorithm cache file's platform say.
const char* SplitKName(SplitK split_k);

// What a backend tells the process, from any of its threads. Unset members
// are skipped.
struct BackendEvents {
  // Lines for the operator's log.
  std::function<void(const std::string&)> info;
  std::function<void(const std::string&)> warning;
  // The device can no longer be used (see Backend::Health); called once,
  // with the cause.
  std::function<void(const absl::Status&)> device_lost;
};

// Test-only device faults (BackendOptions::test_device_faults): a Cast whose
// first input value has one of these bit patterns (NaNs no real input uses
// by accident) makes the device fail instead of casting. kTestDeviceTrap runs
// a kernel that traps, which poisons the CUDA context as a real fault would
// (the cpu backend marks itself lost); kTestDeviceHang runs a kernel that
// does not finish for 30 s (the cpu backend sleeps as long), for the
// device_timeout watchdog. The triggers are compiled into the backends only
// in builds with LOGITD_ENABLE_TEST_FAULTS; elsewhere such a value is cast
// like any other NaN.
inline constexpr std::uint32_t kTestDeviceTrap = 0x7fbadbadu;
inline constexpr std::uint32_t kTestDeviceHang = 0x7fbadbacu;
absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name);

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  int device = 0;                          // cuda device ordinal
  SplitK split_k = SplitK::kFp32;          // cuda
  int cpu_threads = 0;                     // cpu: BLAS threads, 0 = library default
  std::uint64_t device_memory_budget = 0;  // cuda: bytes for workspaces+weights, 0 = all free
  // cuda: device bytes a fused cross-entropy call may use for its chunk of
  // logits (more: larger chunks, faster; 0: the backend's choice, which keeps
  // peak memory within 1.5 times the gradients it returns).
  std::uint64_t ce_workspace_bytes = 0;
  // cuda: bytes of page-locked host buffers (the tensor calls' inputs and outputs)
  // kept for reuse between calls instead of being freed; 0 frees every one.
  // cpu: the same cap for host buffers of 8 MiB and more.
  std::uint64_t pinned_cache_bytes = std::uint64_t{8} << 30;
  // Device work of one call that has not finished after this long means a
  // hung device: the backend reports it lost. Zero turns the watchdog off.
  absl::Duration device_timeout = absl::Seconds(60);
  // cuda: file the GEMM engine keeps its chosen algorithms in (see
  // GemmEngine::UseCacheFile), so that a restarted server gives the same
  // bits; empty keeps them in memory only. The server passes the per-user
  // state file unless told otherwise (server/state_dir.h).
  std::string algo_cache;
  // Honour the kTestDevice* triggers (builds with test faults only).
  bool test_device_faults = false;
  BackendEvents events;
};

// Creates the backend `options.kind` names. kAuto tries cuda when it was
// built in and a device is visible, else cpu; `why` (when given) receives a
// sentence saying which was chosen and why.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options,
                                                       std::string* why = nullptr);

}  // namespace logitd::kernels

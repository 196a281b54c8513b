// The cpu backend's class, for the files that define its kernels
// (kernel_table.h: cast.cc, ...); cpu_backend.cc defines the rest.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/kernels/backend.h"
#include "server/kernels/device_health.h"
#include "server/kernels/host_pool.h"
#include "server/kernels/kernel_table.h"
#include "server/kernels/ops/cross_entropy.h"

namespace logitd::kernels::cpu {

// cblas takes 32-bit dimensions (blasint); element offsets inside OpenBLAS
// are 64-bit, so only each single dimension has to fit.
inline constexpr std::int64_t kMaxBlasDim = std::numeric_limits<int>::max();

// The BLAS's limit on m, past the interface's own checks (m >= 1).
inline absl::Status CheckBlasRows(absl::string_view op, std::int64_t m) {
  if (m > kMaxBlasDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected m (rows of x) in [1, %d], got %d", op, kMaxBlasDim, m));
  }
  return absl::OkStatus();
}

inline std::int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// A call's timing on the cpu: all of it compute, since `start`.
inline void SetTiming(Timing* timing, std::chrono::steady_clock::time_point start) {
  if (timing == nullptr) return;
  *timing = Timing{};
  timing->compute_us = MicrosSince(start);
}

class CpuBackend final : public Backend {
 public:
  // Host buffers at least this large come from the pool.
  static constexpr std::size_t kPooledBytes = std::size_t{8} << 20;

  explicit CpuBackend(const BackendOptions& options);

  BackendInfo Info() const override;

  absl::Status Health() const override { return health_.status(); }

  std::uint64_t DeviceBytesInUse() const override { return 0; }

 protected:
  // Buffers of kPooledBytes and more are kept for reuse between calls (up
  // to --pinned_cache_bytes): a fresh one faults every page in on first
  // write, which for a 512 MiB dW costs more than the copy into it. Smaller
  // ones come and go with the call.
  absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t bytes) override;

  absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                       std::int64_t k) override;

  std::int64_t LogitsBlockRows(const Weight& /*w*/, std::int64_t m,
                               DType /*out_dtype*/) const override;

  std::int64_t LogProbsBlockRows(const Weight& /*w*/, std::int64_t m) const override;
  std::int64_t CrossEntropyBlockRows(const Weight& /*w*/, std::int64_t m) const override;

  absl::Status DoReadWeight(const Weight& weight, Bf16Bits* out) override;

  absl::StatusOr<std::uint64_t> DoFetchGradient(Weight& weight, float* out,
                                                bool zero_after_fetch) override;

  absl::Status DoZeroGradient(Weight& weight) override;

  absl::Status DoKernel(const KernelOp& op, const void* args, Timing* timing) override {
    return KernelTable<CpuBackend>::Get().Run(*this, op, args, timing);
  }

  // The Logits and Backward kernels (KernelOf<CpuBackend, LogitsArgs>,
  // KernelOf<CpuBackend, BackwardArgs>), of args.weight.
  absl::Status LogitsCall(const Weight& weight, const LogitsArgs& args, Timing* timing);
  absl::Status BackwardCall(Weight& weight, const BackwardArgs& args, Timing* timing);
  // The cross-entropy's kernel (KernelOf<CpuBackend, CrossEntropyArgs>).
  absl::Status CrossEntropyCall(const CrossEntropyArgs& args, Timing* timing);

 private:
  // The operations' kernels (kernel_table.h), each in a file of its own.
  template <typename B, typename Args>
  friend struct ::logitd::kernels::KernelOf;

#ifdef LOGITD_TEST_FAULTS
  // The test-only device faults on a machine without one: a trap marks the
  // backend lost as a sticky CUDA error would; a hang sleeps 30 s (or until
  // the watchdog has marked the backend lost and 1 s more has passed).
  absl::Status TestDeviceFault(std::uint32_t trigger, std::int64_t n);
#endif

  BackendInfo info_;
  std::shared_ptr<HostBufferPool> host_pool_;
  [[maybe_unused]] const bool test_device_faults_;  // read only in test-fault builds
  DeviceHealth health_;
};

}  // namespace logitd::kernels::cpu

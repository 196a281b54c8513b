// The cast on the cpu: one pass of round-to-nearest-even narrowing
// (cpu_blas.h's Narrow), the same bits as the cuda kernel's.
#include "server/kernels/ops/cast.h"

#include <chrono>
#include <cstdint>

#include "logitd/bf16.h"
#include "server/kernels/cpu/cpu_backend_class.h"
#include "server/kernels/cpu/cpu_blas.h"
#include "server/kernels/kernel_table.h"

namespace logitd::kernels {

using cpu::CpuBackend;

template <>
struct KernelOf<CpuBackend, CastArgs> {
  static absl::Status Run(CpuBackend& backend, const CastArgs& args, Timing* timing) {
    const auto start = std::chrono::steady_clock::now();
#ifdef LOGITD_TEST_FAULTS
    if (backend.test_device_faults_ && args.n > 0) {
      const std::uint32_t first = FloatBits(args.in[0]);
      if (first == kTestDeviceTrap || first == kTestDeviceHang) {
        return backend.TestDeviceFault(first, args.n);
      }
    }
#else
    (void)backend;
#endif
    cpu::Narrow(args.in, args.n, args.out);
    cpu::SetTiming(timing, start);
    return absl::OkStatus();
  }
};

LOGITD_KERNEL(CpuBackend, CastArgs);

}  // namespace logitd::kernels

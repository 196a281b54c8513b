// The cast on the device: the fp32 input in blocks of the staging size,
// each copied in, cast by the kernel of cast_kernels.cu and copied home on
// one context's compute stream.
#include "server/kernels/ops/cast.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_backend_class.h"
#include "server/kernels/kernel_table.h"

namespace logitd::kernels {

using cuda::CudaBackend;

template <>
struct KernelOf<CudaBackend, CastArgs> {
  static absl::Status Run(CudaBackend& b, const CastArgs& args, Timing* timing);
};

absl::Status KernelOf<CudaBackend, CastArgs>::Run(CudaBackend& b, const CastArgs& args,
                                                  Timing* timing) {
  const float* in = args.in;
  const std::int64_t n = args.n;
  Bf16Bits* out = args.out;
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR_(cuda::UseDevice(b.options_.device));
  absl::StatusOr<cuda::Lease> lease = b.Acquire(absl::StrCat("cast(", n, " values)"));
  if (!lease.ok()) return lease.status();
  cuda::Context& c = **lease;
  cudaStream_t cs = c.compute.get();
#ifdef LOGITD_TEST_FAULTS
  if (b.options_.test_device_faults) {
    const std::uint32_t first = FloatBits(in[0]);
    if (first == kTestDeviceTrap || first == kTestDeviceHang) return b.TestDeviceFault(first, c);
  }
#endif
  const std::int64_t block = std::min<std::int64_t>(n, cuda::kStagingBytes / 4 * 2);
  auto din = b.Scratch(c, cuda::kCastIn, static_cast<std::size_t>(block) * 4, "cast: device input");
  if (!din.ok()) return din.status();
  auto dout =
      b.Scratch(c, cuda::kCastOut, static_cast<std::size_t>(block) * 2, "cast: device output");
  if (!dout.ok()) return dout.status();
  const cuda::StreamTimer timer(c, "cast");
  Timing total;
  for (std::int64_t i0 = 0; i0 < n; i0 += block) {
    const std::int64_t nb = std::min(block, n - i0);
    RETURN_IF_ERROR_(timer.Record(cuda::StreamTimer::kStart, cs));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(*din, in + i0, static_cast<std::size_t>(nb) * 4,
                                         cudaMemcpyHostToDevice, cs),
                         "cast: copy ", nb, " values to the device");
    RETURN_IF_ERROR_(timer.Record(cuda::StreamTimer::kInputs, cs));
    RETURN_IF_CUDA_ERROR(cuda::LaunchCastFp32ToBf16(static_cast<const float*>(*din), nb,
                                                    static_cast<Bf16Bits*>(*dout), cs),
                         "cast: cast kernel (", nb, " values)");
    RETURN_IF_ERROR_(timer.Record(cuda::StreamTimer::kComputed, cs));
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

LOGITD_KERNEL(CudaBackend, CastArgs);

}  // namespace logitd::kernels

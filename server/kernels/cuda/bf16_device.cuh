// Device-side bf16 rounding shared by the backend's kernels: the same bit
// operations as logitd::FloatToBf16 (include/logitd/bf16.h), so device and
// host agree on all 2^32 inputs.
#pragma once

#include <cstdint>

namespace logitd::kernels::cuda {

// Round to nearest even; NaN stays NaN (quieted, sign and top payload bits
// kept); overflow to +-Inf. The hardware cvt.rn.bf16.f32 would return a
// canonical NaN instead.
__device__ __forceinline__ std::uint32_t ToBf16Bits(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

}  // namespace logitd::kernels::cuda

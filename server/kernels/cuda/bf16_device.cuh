// Device-side bf16 rounding shared by the backend's kernels: the same bit
// operations as logitd::FloatToBf16 (include/logitd/bf16.h), so device and
// host agree on all 2^32 inputs.
#pragma once

#include <cuda_bf16.h>

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

// ToBf16Bits of two values, lo in the low half, in one conversion: the
// hardware's cvt.rn.bf16x2.f32 rounds to nearest even and overflows to +-Inf
// as ToBf16Bits does; only its canonical NaN is replaced by ToBf16Bits' bits.
__device__ __forceinline__ std::uint32_t ToBf16x2Bits(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  std::uint32_t bits = static_cast<std::uint32_t>(__bfloat16_as_ushort(h.x)) |
                       (static_cast<std::uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
  if (isnan(lo)) bits = (bits & 0xffff0000u) | ToBf16Bits(lo);
  if (isnan(hi)) bits = (bits & 0x0000ffffu) | (ToBf16Bits(hi) << 16);
  return bits;
}

}  // namespace logitd::kernels::cuda

// bfloat16 conversions shared by the client, the server and the harness.
// Widening is exact; narrowing rounds to nearest, ties to even, like
// torch.Tensor.to(torch.bfloat16) and __float2bfloat16_rn.
#pragma once

#include <cstdint>
#include <cstring>

namespace logitd {

// Raw bits of a bfloat16 value.
using Bf16Bits = std::uint16_t;

inline std::uint32_t FloatBits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsToFloat(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Exact: every bf16 value is an fp32 value.
inline float Bf16ToFloat(Bf16Bits b) { return BitsToFloat(static_cast<std::uint32_t>(b) << 16); }

// Round to nearest even. NaN stays NaN (quiet, sign kept); values past the
// largest finite bf16 round to +-Inf as IEEE 754 says; fp32 subnormals round
// like any other value (bf16 shares fp32's exponent range).
inline Bf16Bits FloatToBf16(float f) {
  std::uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<Bf16Bits>((u >> 16) | 0x0040u);  // quiet the NaN
  }
  const std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<Bf16Bits>(u >> 16);
}

// The value f rounded to bf16 precision, as an fp32.
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace logitd

// Tests of the bf16 conversions in logitd/bf16.h: RNE narrowing on the
// edges IEEE 754 cares about, and exact widening of every bf16 pattern.
#include "logitd/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace logitd {
namespace {

Bf16Bits Narrow(std::uint32_t fp32_bits) { return FloatToBf16(BitsToFloat(fp32_bits)); }

// The bf16 value of a pattern computed from its fields in double, without
// the shift the implementation uses.
double DecodeBf16(Bf16Bits b) {
  const int sign = (b >> 15) & 1;
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -126 - 7);
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  }
  return sign != 0 ? -magnitude : magnitude;
}

// Round to nearest even by comparing distances to the two bf16 neighbours
// in double: an independent statement of what FloatToBf16 must return for a
// finite input.
Bf16Bits ReferenceRne(float f) {
  const std::uint32_t u = FloatBits(f);
  const Bf16Bits lo = static_cast<Bf16Bits>(u >> 16);  // truncation: toward zero
  const Bf16Bits hi = static_cast<Bf16Bits>(lo + 1);   // next away from zero (may be Inf)
  if ((u & 0xffffu) == 0) return lo;
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - std::fabs(DecodeBf16(lo));
  // The bf16 pattern after the largest finite one is Inf; as a rounding
  // target it stands for 2^128, where the next binade would start.
  const double hi_value =
      (hi & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128) : std::fabs(DecodeBf16(hi));
  const double dhi = hi_value - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) == 0 ? lo : hi;
}

TEST(Bf16, TiesRoundToEvenUpAndDown) {
  // 1 + 2^-8 lies halfway between 1 (even mantissa) and 1 + 2^-7: down.
  EXPECT_EQ(Narrow(0x3f808000u), 0x3f80);
  // 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(Narrow(0x3f818000u), 0x3f82);
  // The same for negative values: the magnitude rounds the same way.
  EXPECT_EQ(Narrow(0xbf808000u), 0xbf80);
  EXPECT_EQ(Narrow(0xbf818000u), 0xbf82);
  // One ulp either side of a tie is not a tie.
  EXPECT_EQ(Narrow(0x3f808001u), 0x3f81);
  EXPECT_EQ(Narrow(0x3f807fffu), 0x3f80);
  EXPECT_EQ(Narrow(0x3f817fffu), 0x3f81);
  // A tie that carries into the exponent: (2 - 2^-8) rounds up to 2.
  EXPECT_EQ(Narrow(0x3fff8000u), 0x4000);
}

TEST(Bf16, NanStaysQuietNanWithSign) {
  // Signalling NaN with only low payload bits: truncation would give Inf.
  EXPECT_EQ(Narrow(0x7f800001u), 0x7fc0);
  EXPECT_EQ(Narrow(0xff800001u), 0xffc0);
  // Quiet NaN unchanged.
  EXPECT_EQ(Narrow(0x7fc00000u), 0x7fc0);
  EXPECT_EQ(Narrow(0xffc00000u), 0xffc0);
  // All-ones payload: adding a rounding bias would wrap to the other sign.
  EXPECT_EQ(Narrow(0x7fffffffu), 0x7fff);
  EXPECT_EQ(Narrow(0xffffffffu), 0xffff);
  // High payload bits are kept, the quiet bit set.
  EXPECT_EQ(Narrow(0x7fa00000u), 0x7fe0);
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::signaling_NaN())));
}

TEST(Bf16, InfinitiesAndOverflow) {
  EXPECT_EQ(Narrow(0x7f800000u), 0x7f80);
  EXPECT_EQ(Narrow(0xff800000u), 0xff80);
  // bf16 max (0x7f7f = (2 - 2^-7) * 2^127) is exact.
  EXPECT_EQ(Narrow(0x7f7f0000u), 0x7f7f);
  EXPECT_EQ(Bf16ToFloat(0x7f7f), std::ldexp(2.0f - std::ldexp(1.0f, -7), 127));
  // Below the halfway point to 2^128 stays at max; at and past it rounds to Inf.
  EXPECT_EQ(Narrow(0x7f7f7fffu), 0x7f7f);
  EXPECT_EQ(Narrow(0x7f7f8000u), 0x7f80);
  EXPECT_EQ(Narrow(0xff7f8000u), 0xff80);
  // FLT_MAX is past bf16 max + half an ulp.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::lowest()), 0xff80);
}

TEST(Bf16, Fp32SubnormalsRoundLikeNormals) {
  EXPECT_EQ(Narrow(0x00000001u), 0x0000);  // 2^-149 rounds to zero
  EXPECT_EQ(Narrow(0x00008000u), 0x0000);  // tie, even is zero
  EXPECT_EQ(Narrow(0x00008001u), 0x0001);
  EXPECT_EQ(Narrow(0x00018000u), 0x0002);  // tie between 1 (odd) and 2
  EXPECT_EQ(Narrow(0x80018000u), 0x8002);
  // The largest fp32 subnormal rounds up to the smallest normal.
  EXPECT_EQ(Narrow(0x007fffffu), 0x0080);
}

TEST(Bf16, Bf16SubnormalsWidenExactly) {
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(Bf16ToFloat(0x007f), std::ldexp(127.0f, -133));
  EXPECT_EQ(Bf16ToFloat(0x8001), -std::ldexp(1.0f, -133));
  EXPECT_EQ(FloatToBf16(std::ldexp(1.0f, -133)), 0x0001);
}

TEST(Bf16, NegativeZeroKeepsSign) {
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_TRUE(std::signbit(Bf16ToFloat(0x8000)));
  EXPECT_EQ(Bf16ToFloat(0x8000), 0.0f);
  // A negative value too small for bf16 rounds to -0, not +0.
  EXPECT_EQ(Narrow(0x80000001u), 0x8000);
}

TEST(Bf16, WideningIsExactAndRoundTripsForAll65536Patterns) {
  for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
    const auto b = static_cast<Bf16Bits>(i);
    const float f = Bf16ToFloat(b);
    const double expected = DecodeBf16(b);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (i & 0x8000u) != 0) << std::hex << i;
      // Signalling NaNs come back quieted, quiet ones unchanged.
      ASSERT_EQ(FloatToBf16(f), b | 0x0040u) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), expected) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (i & 0x8000u) != 0) << std::hex << i;
      ASSERT_EQ(FloatToBf16(f), b) << std::hex << i;
    }
  }
}

TEST(Bf16, NarrowingMatchesNearestEvenReferenceOnRandomPatterns) {
  std::mt19937 rng(20240611);
  int checked = 0;
  for (int n = 0; n < 1000000; ++n) {
    const std::uint32_t u = rng();
    const float f = BitsToFloat(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), ReferenceRne(f)) << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 990000);
}

}  // namespace
}  // namespace logitd

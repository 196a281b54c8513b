// The rule that picks OpenBLAS kernels for a CPU OpenBLAS did not
// recognise, and what the real binaries do with it on this machine.
#include "logitd/reference/blas_kernels.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <string>

namespace logitd {
namespace {

TEST(BetterBlasCore, OldKernelsOnANewerCpuGetTheNewest) {
  EXPECT_EQ(BetterBlasCore("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Nehalem", true, true), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Haswell", true, true), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Prescott", true, false), "Haswell");
  EXPECT_EQ(BetterBlasCore("Sandybridge", true, false), "Haswell");
}

TEST(BetterBlasCore, LeavesAGoodOrUnknownChoiceAlone) {
  EXPECT_EQ(BetterBlasCore("SkylakeX", true, true), "");
  EXPECT_EQ(BetterBlasCore("Cooperlake", true, true), "");
  EXPECT_EQ(BetterBlasCore("Haswell", true, false), "");
  EXPECT_EQ(BetterBlasCore("Prescott", false, false), "");  // an SSE3-only CPU
  EXPECT_EQ(BetterBlasCore("Zen", true, false), "");        // AMD's are left alone
  EXPECT_EQ(BetterBlasCore("", true, true), "");
}

#if defined(__x86_64__)
// This test's process made no call: OpenBLAS's own choice, which the rule
// would change on this CPU or not; either way the rule never picks kernels
// the CPU cannot run.
TEST(BetterBlasCore, NeverAsksForWhatThisCpuLacks) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const std::string pick = BetterBlasCore(openblas_get_corename(), avx2, avx512);
  if (pick == "SkylakeX") {
    EXPECT_TRUE(avx512);
  }
  if (pick == "Haswell") {
    EXPECT_TRUE(avx2);
  }
}
#endif

}  // namespace
}  // namespace logitd

// The fp32 -> bf16 cast kernel against logitd::FloatToBf16 on every one of
// the 2^32 fp32 bit patterns, and the launcher's vector/scalar split on
// misaligned pointers and ragged lengths.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/ops/cast.h"

namespace logitd::kernels::testing {
namespace {

class CastKernelTest : public CudaFixture {};

TEST_F(CastKernelTest, AllFp32BitPatternsMatchHostRounding) {
  constexpr std::int64_t kBatch = std::int64_t{1} << 28;  // 1 GiB in, 512 MiB out
  auto in = backend()->AllocateHost(static_cast<std::size_t>(kBatch) * 4);
  auto out = backend()->AllocateHost(static_cast<std::size_t>(kBatch) * 2);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(out.ok()) << out.status();
  auto* bits = in->as<std::uint32_t>();
  auto* got = out->as<Bf16Bits>();
  std::atomic<std::int64_t> mismatches{0};
  std::atomic<std::uint64_t> first_bad{~0ull};
  Timing total;
  for (std::uint64_t base = 0; base < (std::uint64_t{1} << 32);
       base += static_cast<std::uint64_t>(kBatch)) {
    ParallelFor(kBatch, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        bits[i] = static_cast<std::uint32_t>(base + static_cast<std::uint64_t>(i));
      }
      std::memset(got + b, 0xa5, static_cast<std::size_t>(e - b) * 2);  // poison
    });
    Timing timing;
    ASSERT_TRUE(backend()->Kernel(kernels::CastArgs{in->as<float>(), kBatch, got}, &timing).ok());
    total.h2d_us += timing.h2d_us;
    total.compute_us += timing.compute_us;
    total.d2h_us += timing.d2h_us;
    ParallelFor(kBatch, [&](std::int64_t b, std::int64_t e) {
      std::int64_t bad = 0;
      for (std::int64_t i = b; i < e; ++i) {
        if (got[i] != FloatToBf16(BitsToFloat(bits[i]))) {
          if (bad++ == 0) {
            std::uint64_t expected = first_bad.load();
            const std::uint64_t mine = bits[i];
            while (mine < expected && !first_bad.compare_exchange_weak(expected, mine)) {
            }
          }
        }
      }
      mismatches += bad;
    });
  }
  EXPECT_EQ(mismatches.load(), 0) << "first mismatching input 0x" << std::hex << first_bad.load()
                                  << ": expected 0x"
                                  << FloatToBf16(
                                         BitsToFloat(static_cast<std::uint32_t>(first_bad.load())));
  std::cout << "2^32 inputs: h2d " << total.h2d_us / 1000 << " ms, kernel "
            << total.compute_us / 1000 << " ms, d2h " << total.d2h_us / 1000 << " ms\n";
}

TEST_F(CastKernelTest, LauncherHandlesMisalignmentAndRaggedTails) {
  auto memory = cuda::DeviceMemory::Create(0, 0);
  constexpr std::int64_t kMax = 1000003;
  auto din = memory->Allocate((kMax + 16) * 4, "test input");
  auto dout = memory->Allocate((kMax + 16) * 2, "test output");
  ASSERT_TRUE(din.ok() && dout.ok());
  std::vector<float> host = RandomFp32(kMax + 16, 7, 3e38f);
  host[5] = BitsToFloat(0x7f800001u);
  host[6] = BitsToFloat(0xff7fffffu);
  ASSERT_EQ(cudaMemcpy(din->get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  for (std::int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 1000003}) {
    for (int in_off : {0, 1, 3, 4}) {
      for (int out_off : {0, 1, 2, 8}) {
        ASSERT_EQ(cudaMemset(dout->get(), 0xff, static_cast<std::size_t>(kMax + 16) * 2),
                  cudaSuccess);
        const float* in = din->as<float>() + in_off;
        Bf16Bits* out = dout->as<Bf16Bits>() + out_off;
        ASSERT_EQ(cuda::LaunchCastFp32ToBf16(in, n, out, nullptr), cudaSuccess);
        std::vector<Bf16Bits> got(static_cast<std::size_t>(n) + 1);
        ASSERT_EQ(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (std::int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[static_cast<std::size_t>(i)],
                    FloatToBf16(host[static_cast<std::size_t>(i + in_off)]))
              << "n=" << n << " in+" << in_off << " out+" << out_off << " i=" << i;
        }
        EXPECT_EQ(got[static_cast<std::size_t>(n)], 0xffff) << "wrote past the end, n=" << n;
      }
    }
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

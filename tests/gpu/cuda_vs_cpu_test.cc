// The two backends agree bit for bit wherever the contract makes the result
// unique: integer operands (exact sums), and the fp32 -> bf16 cast. Both are
// made through the public factory, as the server makes them.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/ops/cast.h"

namespace logitd::kernels::testing {
namespace {

using CudaVsCpuTest = CudaAndCpuTest;

TEST(BackendFactory, AutoPicksCudaExactlyWhenADeviceIsVisible) {
  BackendOptions options;
  options.kind = BackendKind::kCuda;
  const bool have_cuda = CreateBackend(options).ok();
  options.kind = BackendKind::kAuto;
  std::string why;
  auto b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Info().backend, have_cuda ? "cuda" : "cpu") << why;
  EXPECT_FALSE(why.empty());
}

TEST_F(CudaVsCpuTest, LogitsAgreeBitwiseOnIntegers) {
  const std::int64_t m = 33, v = 4099, k = 2048;
  const auto x = IntegerBf16(m * k, 1);
  const auto w = IntegerBf16(v * k, 2);
  auto wg = cuda_->LoadWeight(w.data(), v, k);
  auto wc = cpu_->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(wg.ok() && wc.ok());
  for (DType out : {DType::kFp32, DType::kBf16}) {
    for (float alpha : {1.0f, -2.0f}) {
      const std::size_t bytes = static_cast<std::size_t>(m * v) * ElementSize(out);
      std::vector<std::byte> yg(bytes, std::byte{0xff});
      std::vector<std::byte> yc(bytes, std::byte{0x7f});
      LogitsArgs args;
      args.x = x.data();
      args.m = m;
      args.alpha = alpha;
      args.out_dtype = out;
      args.y = yg.data();
      ASSERT_TRUE(cuda_->Logits(**wg, args, nullptr).ok());
      args.y = yc.data();
      ASSERT_TRUE(cpu_->Logits(**wc, args, nullptr).ok());
      EXPECT_EQ(std::memcmp(yg.data(), yc.data(), bytes), 0)
          << DTypeName(out) << " alpha " << alpha;
    }
  }
}

TEST_F(CudaVsCpuTest, BackwardAgreesBitwiseOnIntegers) {
  const std::int64_t m = 40, v = 3001, k = 640;
  const auto x = IntegerBf16(m * k, 3);
  const auto w = IntegerBf16(v * k, 4);
  const auto dy = IntegerFp32(m * v, 5);
  auto wg = cuda_->LoadWeight(w.data(), v, k);
  auto wc = cpu_->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(wg.ok() && wc.ok());
  for (DType dx_type : {DType::kBf16, DType::kFp32}) {
    for (DType dw_type : {DType::kFp32, DType::kBf16}) {
      const std::size_t dx_bytes = static_cast<std::size_t>(m * k) * ElementSize(dx_type);
      const std::size_t dw_bytes = static_cast<std::size_t>(v * k) * ElementSize(dw_type);
      std::vector<std::byte> dxg(dx_bytes, std::byte{0xff}), dxc(dx_bytes, std::byte{0x7f});
      std::vector<std::byte> dwg(dw_bytes, std::byte{0xff}), dwc(dw_bytes, std::byte{0x7f});
      BackwardArgs args;
      args.dy = dy.data();
      args.x = x.data();
      args.m = m;
      args.dx_dtype = dx_type;
      args.dw_dtype = dw_type;
      args.dx = dxg.data();
      args.dw = dwg.data();
      ASSERT_TRUE(cuda_->Backward(**wg, args, nullptr).ok());
      args.dx = dxc.data();
      args.dw = dwc.data();
      ASSERT_TRUE(cpu_->Backward(**wc, args, nullptr).ok());
      EXPECT_EQ(std::memcmp(dxg.data(), dxc.data(), dx_bytes), 0) << DTypeName(dx_type);
      EXPECT_EQ(std::memcmp(dwg.data(), dwc.data(), dw_bytes), 0) << DTypeName(dw_type);
    }
  }
  // Accumulation: two calls, fetched from both.
  for (int call = 0; call < 2; ++call) {
    BackwardArgs args;
    args.dy = dy.data();
    args.x = x.data();
    args.m = m;
    args.accumulate_dw = true;
    ASSERT_TRUE(cuda_->Backward(**wg, args, nullptr).ok());
    ASSERT_TRUE(cpu_->Backward(**wc, args, nullptr).ok());
  }
  std::vector<float> gg(static_cast<std::size_t>(v * k)), gc(static_cast<std::size_t>(v * k));
  auto ng = cuda_->FetchGradient(**wg, gg.data(), true);
  auto nc = cpu_->FetchGradient(**wc, gc.data(), true);
  ASSERT_TRUE(ng.ok() && nc.ok());
  EXPECT_EQ(*ng, *nc);
  EXPECT_EQ(std::memcmp(gg.data(), gc.data(), gg.size() * 4), 0);
}

TEST_F(CudaVsCpuTest, CastAgreesBitwise) {
  std::vector<float> in = RandomFp32(1 << 20, 9, 1e30f);
  for (std::uint32_t bits : {0x7f800001u, 0xffc12345u, 0x7f7fffffu, 0x00000001u, 0x80000000u}) {
    in.push_back(BitsToFloat(bits));
  }
  std::vector<Bf16Bits> a(in.size(), 0), b(in.size(), 1);
  ASSERT_TRUE(
      cuda_
          ->Kernel(kernels::CastArgs{in.data(), static_cast<std::int64_t>(in.size()), a.data()},
                   nullptr)
          .ok());
  ASSERT_TRUE(
      cpu_->Kernel(kernels::CastArgs{in.data(), static_cast<std::int64_t>(in.size()), b.data()},
                   nullptr)
          .ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 2), 0);
}

}  // namespace
}  // namespace logitd::kernels::testing

// The cuda backend's engine for the references' fp64 products (cuBLAS DGEMM
// of the weight widened on the device) against OpenBLAS's on the host:
// bitwise on integer operands, whose sums are exact in any order; within
// the two engines' fp64 rounding of each other on random ones; its device
// memory returned when it goes.
#include "server/kernels/cuda/fp64_products.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"
#include "server/kernels/backend.h"

namespace logitd::kernels::testing {
namespace {

std::vector<double> Widen(const std::vector<Bf16Bits>& b) {
  std::vector<double> out(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) out[i] = Bf16ToFloat(b[i]);
  return out;
}

class Fp64ProductsTest : public CudaFixture {
 protected:
  std::shared_ptr<Fp64Products> Engine(const Weight& w) {
    absl::StatusOr<std::shared_ptr<Fp64Products>> e = backend()->ReferenceProducts(w);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *e : nullptr;
  }
};

TEST_F(Fp64ProductsTest, IntegerOperandsGiveTheHostsBits) {
  const std::int64_t m = 37, v = 1003, k = 520;
  const std::vector<Bf16Bits> x = IntegerBf16(m * k, 1), w = IntegerBf16(v * k, 2);
  auto weight = backend()->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::shared_ptr<Fp64Products> engine = Engine(**weight);
  ASSERT_NE(engine, nullptr);
  EXPECT_NE(engine->name().find("cuBLAS DGEMM"), std::string::npos) << engine->name();
  const Bf16Matrix wm{w.data(), v, k};

  const std::vector<double> xd = Widen(x);
  std::vector<double> y(m * v, -1), y_abs(m * v, -1), hy(m * v), hy_abs(m * v);
  ASSERT_TRUE(engine->XWt(xd.data(), m, y.data(), y_abs.data())) << engine->error();
  ReferenceXWt(xd, m, wm, hy.data(), hy_abs.data());
  EXPECT_EQ(y, hy);
  EXPECT_EQ(y_abs, hy_abs);

  // G·W with integer G [m, V].
  const std::vector<double> g = Widen(IntegerBf16(m * v, 3));
  std::vector<double> dx(m * k, -1), dx_abs(m * k, -1), hdx(m * k), hdx_abs(m * k);
  ASSERT_TRUE(engine->GW(g.data(), m, dx.data(), dx_abs.data())) << engine->error();
  ReferenceGW(g, m, wm, hdx.data(), hdx_abs.data());
  EXPECT_EQ(dx, hdx);
  EXPECT_EQ(dx_abs, hdx_abs);
  // Without the magnitudes, and a second, smaller block reusing the buffers.
  std::vector<double> y1(3 * v, -1);
  ASSERT_TRUE(engine->XWt(xd.data() + 5 * k, 3, y1.data(), nullptr)) << engine->error();
  EXPECT_EQ(std::vector<double>(hy.begin() + 5 * v, hy.begin() + 8 * v), y1);
  EXPECT_TRUE(engine->error().empty());
}

TEST_F(Fp64ProductsTest, RandomOperandsAgreeWithTheHostWithinFp64Rounding) {
  const std::int64_t m = 64, v = 4096, k = 1536;
  const std::vector<Bf16Bits> x = RandomBf16(m * k, 4), w = RandomBf16(v * k, 5);
  auto weight = backend()->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::shared_ptr<Fp64Products> engine = Engine(**weight);
  ASSERT_NE(engine, nullptr);
  const std::vector<double> xd = Widen(x);
  std::vector<double> y(m * v), y_abs(m * v), hy(m * v), hy_abs(m * v);
  ASSERT_TRUE(engine->XWt(xd.data(), m, y.data(), y_abs.data())) << engine->error();
  ReferenceXWt(xd, m, Bf16Matrix{w.data(), v, k}, hy.data(), hy_abs.data());
  // Each is within γ_K(fp64)·Σ|x·w| of the exact sum, so within twice that
  // of the other.
  const double gamma = 2 * logitd::Gamma(k, kFp64UnitRoundoff);
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    ASSERT_LE(std::fabs(y[i] - hy[i]), gamma * hy_abs[i]) << i;
    ASSERT_LE(std::fabs(y_abs[i] - hy_abs[i]), gamma * hy_abs[i]) << i;
    differ += y[i] != hy[i];
  }
  // Not a copy of the host's: the device sums in its own order.
  RecordProperty("elements_differing_from_host", static_cast<int>(differ));
}

TEST_F(Fp64ProductsTest, TheWidenedWeightIsFreedWithTheEngine) {
  const std::int64_t v = 2048, k = 1024;
  const std::vector<Bf16Bits> w = RandomBf16(v * k, 6);
  auto weight = backend()->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  const std::uint64_t before = backend()->DeviceBytesInUse();
  {
    std::shared_ptr<Fp64Products> engine = Engine(**weight);
    ASSERT_NE(engine, nullptr);
    EXPECT_GE(backend()->DeviceBytesInUse(), before + 16 * v * k);
    std::vector<double> xd(3 * k, 0.5), y(3 * v);
    ASSERT_TRUE(engine->XWt(xd.data(), 3, y.data(), nullptr)) << engine->error();
  }
  EXPECT_EQ(backend()->DeviceBytesInUse(), before);
}

}  // namespace
}  // namespace logitd::kernels::testing

// The cuda backend's engine for the references' fp64 products (cuBLAS DGEMM
// of the weight widened on the device) against OpenBLAS's on the host:
// bitwise on integer operands, whose sums are exact in any order; within
// the two engines' fp64 rounding of each other on random ones; its device
// memory returned when it goes. Its judgement of candidates on the device
// counts what the host's counts from the same products, figure for figure.
#include "server/kernels/cuda/fp64_products.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/reference/bounds.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/logprobs.h"
#include "logitd/reference/numerics.h"
#include "logitd/reference/verify_checks.h"
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
  // W [v, k] loaded on the device (kept for the test, as an engine needs)
  // and its engine; null, with the failure recorded, when either fails.
  std::shared_ptr<Fp64Products> EngineOf(const std::vector<Bf16Bits>& w, std::int64_t v,
                                         std::int64_t k) {
    absl::StatusOr<std::shared_ptr<Weight>> weight = backend()->LoadWeight(w.data(), v, k);
    EXPECT_TRUE(weight.ok()) << weight.status();
    if (!weight.ok()) return nullptr;
    weights_.push_back(*weight);
    return Engine(**weight);
  }

 private:
  std::vector<std::shared_ptr<Weight>> weights_;
};

TEST_F(Fp64ProductsTest, IntegerOperandsGiveTheHostsBits) {
  const std::int64_t m = 37, v = 1003, k = 520;
  const std::vector<Bf16Bits> x = IntegerBf16(m * k, 1), w = IntegerBf16(v * k, 2);
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
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
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
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

// The device engine's products, judged on the host: what CheckLogits and
// CheckGradInput do when an engine cannot judge (every other method keeps
// Fp64Products' default: judges nowhere, sees no finite weight).
class HostJudging : public Fp64Products {
 public:
  explicit HostJudging(Fp64Products* device) : device_(device) {}
  bool XWt(const double* x, std::int64_t m, double* y, double* y_abs) override {
    return device_->XWt(x, m, y, y_abs);
  }
  bool GW(const double* g, std::int64_t m, double* dx, double* dx_abs) override {
    return device_->GW(g, m, dx, dx_abs);
  }
  std::string error() const override { return device_->error(); }
  std::string name() const override { return "host judging"; }

 protected:
  Fp64Products* device_;
};

// The device engine with its row sums, counting their calls.
class CountingRowSums final : public HostJudging {
 public:
  using HostJudging::HostJudging;
  bool CeRowSums(const double* x, std::int64_t m, const std::int64_t* targets, double gamma,
                 double absolute, double cap, const std::uint8_t* class_rows,
                 judgement::CeRowSums* sums) override {
    ++row_sums_calls_;
    return device_->CeRowSums(x, m, targets, gamma, absolute, cap, class_rows, sums);
  }
  bool LpRowSums(const double* x, std::int64_t m, const LpRowsRequest& request,
                 const LpRowsResult& result) override {
    ++lp_row_sums_calls_;
    return device_->LpRowSums(x, m, request, result);
  }
  std::int64_t JudgeBlockRows(std::int64_t cols) const override {
    return device_->JudgeBlockRows(cols);
  }
  bool WeightFinite() const override { return device_->WeightFinite(); }
  std::string name() const override { return device_->name(); }
  int row_sums_calls() const { return row_sums_calls_; }
  int lp_row_sums_calls() const { return lp_row_sums_calls_; }

 private:
  int row_sums_calls_ = 0;
  int lp_row_sums_calls_ = 0;
};

// Equal, or both NaN (a NaN in an input makes the reference and its
// bounds NaN on both sides).
bool Same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void ExpectSameElement(const CheckedElement& a, const CheckedElement& b) {
  EXPECT_EQ(a.index, b.index);
  EXPECT_TRUE(Same(a.candidate, b.candidate))
      << a.index << ": " << a.candidate << " " << b.candidate;
  EXPECT_TRUE(Same(a.reference, b.reference))
      << a.index << ": " << a.reference << " " << b.reference;
  EXPECT_TRUE(Same(a.bound, b.bound)) << a.index << ": " << a.bound << " " << b.bound;
  EXPECT_TRUE(Same(a.probabilistic_bound, b.probabilistic_bound))
      << a.index << ": " << a.probabilistic_bound << " " << b.probabilistic_bound;
  EXPECT_TRUE(Same(a.logitd, b.logitd)) << a.index << ": " << a.logitd << " " << b.logitd;
}

void ExpectSameFigures(const CandidateCheck& device, const CandidateCheck& host) {
  const CheckFigures& d = device.figures();
  const CheckFigures& h = host.figures();
  EXPECT_EQ(d.elements, h.elements);
  EXPECT_EQ(d.outside, h.outside);
  EXPECT_EQ(d.worst_fraction, h.worst_fraction);
  EXPECT_EQ(d.outside_probabilistic, h.outside_probabilistic);
  EXPECT_EQ(d.worst_probabilistic_fraction, h.worst_probabilistic_fraction);
  EXPECT_EQ(d.own_outside_probabilistic, h.own_outside_probabilistic);
  EXPECT_EQ(d.bitwise_equal, h.bitwise_equal);
  EXPECT_EQ(d.nan_inf_mismatches, h.nan_inf_mismatches);
  EXPECT_EQ(d.histogram, h.histogram);
  EXPECT_EQ(d.max_ulp, h.max_ulp);
  EXPECT_EQ(d.ulp_counts, h.ulp_counts);
  EXPECT_EQ(d.ulp_exact_elements, h.ulp_exact_elements);
  EXPECT_EQ(d.max_ulp_exact, h.max_ulp_exact);
  EXPECT_EQ(d.ulp_exact_counts, h.ulp_exact_counts);
  // The precision-class test's rows: the same elements, models and largest
  // errors; sums of squares formed in another order on the device, so equal
  // to a few units of fp64 rounding.
  ASSERT_EQ(d.class_rows.size(), h.class_rows.size());
  const auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-12 * std::fabs(b); };
  for (const auto& [row, hr] : h.class_rows) {
    ASSERT_EQ(d.class_rows.count(row), 1u) << row;
    const judgement::ClassRow& dr = d.class_rows.at(row);
    EXPECT_EQ(dr.n, hr.n) << row;
    EXPECT_TRUE(near(dr.candidate_sq, hr.candidate_sq)) << row;
    EXPECT_TRUE(near(dr.seq_sq, hr.seq_sq)) << row << ": " << dr.seq_sq << " " << hr.seq_sq;
    EXPECT_TRUE(near(dr.envelope_sq, hr.envelope_sq)) << row;
    EXPECT_EQ(dr.envelope_max, hr.envelope_max) << row;
    EXPECT_EQ(dr.top1, hr.top1) << row;
    EXPECT_EQ(dr.top2, hr.top2) << row;
    EXPECT_EQ(dr.top1_index, hr.top1_index) << row;
    EXPECT_EQ(dr.top1_seq, hr.top1_seq) << row;
  }
  EXPECT_EQ(device.precision_class().tested, host.precision_class().tested);
  EXPECT_EQ(device.precision_class().outside, host.precision_class().outside);
  ASSERT_EQ(d.first_outside.size(), h.first_outside.size());
  for (std::size_t i = 0; i < d.first_outside.size(); ++i) {
    ExpectSameElement(d.first_outside[i], h.first_outside[i]);
  }
  if (h.outside > 0) ExpectSameElement(d.first_proven_outside, h.first_proven_outside);
  EXPECT_EQ(device.Verdict(), host.Verdict());
}

// Candidate values near `reference` (the fp32 rounding of an fp64 product)
// with every kind of element the check tells apart: equal, one ulp and a
// few ulps off, outside the bounds (more than are reported, in several
// rows, the first proven one after the first reported ones), NaN and both
// infinities; `own` the reference rounded, one ulp off now and then.
void Perturb(const std::vector<double>& reference, std::int64_t cols, bool bf16,
             std::vector<std::uint8_t>* candidate, std::vector<std::uint8_t>* own) {
  const std::size_t n = reference.size(), size = bf16 ? 2 : 4;
  candidate->assign(n * size, 0);
  own->assign(n * size, 0);
  const auto put = [&](std::vector<std::uint8_t>* out, std::size_t i, float f) {
    if (bf16) {
      const Bf16Bits b = FloatToBf16(f);
      std::memcpy(out->data() + i * 2, &b, 2);
    } else {
      std::memcpy(out->data() + i * 4, &f, 4);
    }
  };
  const float step = bf16 ? 0x1p-7f : 0x1p-22f;
  for (std::size_t i = 0; i < n; ++i) {
    const float r = static_cast<float>(reference[i]);
    put(own, i, i % 97 == 5 ? r * (1 + step) : r);
    float c = r;
    if (i % 11 == 3) c = r * (1 + step);
    if (i % 53 == 7) c = r * (1 + 9 * step);
    put(candidate, i, c);
  }
  // Outside: a few in row 1 (probabilistic and proven), dozens in row 2,
  // NaN and infinities in row 3, the first proven-only one late in row 4.
  const auto at = [&](std::int64_t row, std::int64_t col) {
    return static_cast<std::size_t>(row * cols + col);
  };
  for (std::int64_t c = 0; c < cols; c += cols / 5) {
    put(candidate, at(1, c), static_cast<float>(reference[at(1, c)] * 1.001 + 1e-3));
  }
  for (std::int64_t c = 1; c < cols; c += 7) {
    put(candidate, at(2, c), static_cast<float>(reference[at(2, c)] + 0.25));
  }
  put(candidate, at(3, 2), std::nanf(""));
  put(candidate, at(3, 4), std::numeric_limits<float>::infinity());
  put(candidate, at(3, 6), -std::numeric_limits<float>::infinity());
  put(own, at(3, 8), std::nanf(""));
  put(candidate, at(4, cols - 1), static_cast<float>(reference[at(4, cols - 1)] + 1.0));
}

TEST_F(Fp64ProductsTest, JudgingOnTheDeviceCountsWhatTheHostCounts) {
  const std::int64_t m = 150, v = 3001, k = 640;
  const std::vector<Bf16Bits> x = RandomBf16(m * k, 7), w = RandomBf16(v * k, 8);
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
  ASSERT_NE(engine, nullptr);
  HostJudging host(engine.get());
  std::vector<double> ref(m * v), ref_abs(m * v);
  ReferenceXWt(Widen(x), m, Bf16Matrix{w.data(), v, k}, ref.data(), ref_abs.data());
  LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), m, v, k);

  for (const bool bf16 : {false, true}) {
    const DType dtype = bf16 ? DType::kBf16 : DType::kFp32;
    std::vector<std::uint8_t> candidate, own;
    Perturb(ref, v, bf16, &candidate, &own);
    for (const float alpha : {1.0f, -0.375f}) {
      for (const CheckedRows& rows : {CheckedRows{}, CheckedRows{0, 2, 3, 4, 5, 9, 77, 149}}) {
        SCOPED_TRACE(::testing::Message()
                     << "bf16 " << bf16 << " alpha " << alpha << " rows " << rows.size());
        CandidateCheck on_device(dtype), on_host(dtype);
        in.products = engine.get();
        ASSERT_TRUE(CheckLogits(in, alpha, rows, candidate.data(), own.data(), dtype, &on_device));
        in.products = &host;
        ASSERT_TRUE(CheckLogits(in, alpha, rows, candidate.data(), own.data(), dtype, &on_host));
        EXPECT_TRUE(engine->error().empty()) << engine->error();
        ExpectSameFigures(on_device, on_host);
        // Not a vacuous comparison: every kind of element is there.
        EXPECT_GT(on_host.outside(), CandidateCheck::kReportedOutside);
        EXPECT_GT(on_host.nan_inf_mismatches(), 0);
        EXPECT_GT(on_host.max_ulp(), 1);
      }
    }
    // Every element outside: the reported ones all in the first row.
    std::vector<std::uint8_t> wrong(candidate.size(), 0x4b);  // 1.3e7 a value
    CandidateCheck on_device(dtype), on_host(dtype);
    in.products = engine.get();
    ASSERT_TRUE(CheckLogits(in, 1.0f, {}, wrong.data(), own.data(), dtype, &on_device));
    in.products = &host;
    ASSERT_TRUE(CheckLogits(in, 1.0f, {}, wrong.data(), own.data(), dtype, &on_host));
    ExpectSameFigures(on_device, on_host);
    EXPECT_EQ(on_host.outside(), m * v);
  }

  // A weight with an infinity: the engine says so, and the blocks are
  // judged on the host, with the same figures.
  EXPECT_TRUE(engine->WeightFinite());
  std::vector<Bf16Bits> w_inf = w;
  w_inf[17 * k + 3] = 0x7f80;  // +Inf
  std::shared_ptr<Fp64Products> engine_inf = EngineOf(w_inf, v, k);
  ASSERT_NE(engine_inf, nullptr);
  EXPECT_FALSE(engine_inf->WeightFinite());
  {
    std::vector<std::uint8_t> candidate, own;
    Perturb(ref, v, false, &candidate, &own);
    HostJudging host_inf(engine_inf.get());
    LmHeadInputs in_inf = LmHeadInputs::Forward(x.data(), w_inf.data(), m, v, k);
    CandidateCheck on_device(DType::kFp32), on_host(DType::kFp32);
    in_inf.products = engine_inf.get();
    ASSERT_TRUE(
        CheckLogits(in_inf, 1.0f, {}, candidate.data(), own.data(), DType::kFp32, &on_device));
    in_inf.products = &host_inf;
    ASSERT_TRUE(
        CheckLogits(in_inf, 1.0f, {}, candidate.data(), own.data(), DType::kFp32, &on_host));
    ExpectSameFigures(on_device, on_host);
    // Row 17 of W is infinite in every row of Y.
    EXPECT_GE(on_host.nan_inf_mismatches(), m);
  }

  // dX = G·W from an fp32 dY.
  const std::vector<Bf16Bits> dy_bits = RandomBf16(m * v, 9);
  std::vector<float> dy(m * v);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = Bf16ToFloat(dy_bits[i]) * 1.3f;
  in.dy = dy.data();
  in.dy_dtype = DType::kFp32;
  std::vector<double> g(m * v);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = RoundToBf16(dy[i]);
  std::vector<double> dx_ref(m * k), dx_abs(m * k);
  ReferenceGW(g, m, Bf16Matrix{w.data(), v, k}, dx_ref.data(), dx_abs.data());
  for (const bool bf16 : {false, true}) {
    const DType dtype = bf16 ? DType::kBf16 : DType::kFp32;
    std::vector<std::uint8_t> candidate, own;
    Perturb(dx_ref, k, bf16, &candidate, &own);
    CandidateCheck on_device(dtype), on_host(dtype);
    in.products = engine.get();
    ASSERT_TRUE(CheckGradInput(in, {}, candidate.data(), own.data(), dtype, &on_device));
    in.products = &host;
    ASSERT_TRUE(CheckGradInput(in, {}, candidate.data(), own.data(), dtype, &on_host));
    ExpectSameFigures(on_device, on_host);
    EXPECT_GT(on_host.outside(), 0);
  }
  EXPECT_TRUE(engine->error().empty()) << engine->error();

  // dX judged from dY as sent, G rounded on the device (JudgeGWOfDy): an
  // fp32 dY (whose rounding the reference needs: dy is G·1.3), a bf16 one,
  // sampled rows; one NaN in a row of dY leaves its block to the host,
  // which counts the same, and is not the engine's error.
  std::vector<float> dy_nan = dy;
  dy_nan[77 * v + 11] = std::nanf("");
  for (const int kind : {0, 1, 2}) {
    for (const CheckedRows& rows : {CheckedRows{}, CheckedRows{0, 2, 3, 4, 5, 9, 77, 149}}) {
      SCOPED_TRACE(::testing::Message() << "dY kind " << kind << " rows " << rows.size());
      const bool dy_bf16 = kind == 1;
      in.dy = dy_bf16 ? static_cast<const void*>(dy_bits.data())
                      : (kind == 2 ? dy_nan.data() : dy.data());
      in.dy_dtype = dy_bf16 ? DType::kBf16 : DType::kFp32;
      std::vector<std::uint8_t> candidate, own;
      Perturb(dx_ref, k, false, &candidate, &own);
      CandidateCheck direct(DType::kFp32), on_device(DType::kFp32), on_host(DType::kFp32);
      const CheckedRows walk = rows.empty() ? [&] {
        CheckedRows all(m);
        for (std::int64_t i = 0; i < m; ++i) all[i] = i;
        return all;
      }() : rows;
      CheckFigures figures;
      const judgement::ProductRule rule = SumOfProductsRule(v, 1.0, DType::kFp32);
      const bool judged =
          engine->JudgeGWOfDy(in.dy, dy_bf16, walk.data(), static_cast<std::int64_t>(walk.size()),
                              candidate.data(), own.data(), rule, &figures);
      EXPECT_EQ(judged, kind != 2) << engine->error();
      in.products = engine.get();
      ASSERT_TRUE(CheckGradInput(in, rows, candidate.data(), own.data(), DType::kFp32, &on_device));
      in.products = &host;
      ASSERT_TRUE(CheckGradInput(in, rows, candidate.data(), own.data(), DType::kFp32, &on_host));
      ExpectSameFigures(on_device, on_host);
      if (judged) {
        direct.AddCounted(figures);
        ExpectSameFigures(direct, on_host);
      }
      EXPECT_EQ(on_host.elements(), static_cast<std::int64_t>(walk.size()) * k);
      EXPECT_GT(on_host.outside(), 0);
      EXPECT_TRUE(engine->error().empty()) << engine->error();
    }
  }
}

// dW = Gᵀ·X judged on the device, block after block of its rows, counts
// what the host's OpenBLAS walk counts: integer operands make both sums
// exact, so every figure is equal. dY in fp32 carries a perturbation that
// only G's bf16 rounding removes, so a device that skipped the rounding
// would get other references. A NaN in dY or X leaves it to the host.
TEST_F(Fp64ProductsTest, TheWeightsGradientJudgedOnTheDeviceCountsWhatTheHostCounts) {
  // 66,000 rows of M: blocks of 384 rows of dW (within 2^25 doubles of G's
  // columns), three of them for V = 1,000.
  const std::int64_t m = 66000, v = 1000, k = 96;
  const std::vector<Bf16Bits> x = IntegerBf16(m * k, 21), w = RandomBf16(v * k, 22);
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
  ASSERT_NE(engine, nullptr);
  ASSERT_LT(engine->JudgeBlockRows(m), v / 2);

  const std::vector<Bf16Bits> g_bits = IntegerBf16(m * v, 23);
  std::vector<float> dy32(g_bits.size());
  for (std::size_t i = 0; i < dy32.size(); ++i) dy32[i] = Bf16ToFloat(g_bits[i]) * (1 + 0x1p-12f);
  std::vector<double> dw(v * k), dw_abs(v * k);
  ReferenceGtX(Widen(g_bits), Widen(x), m, v, k, true,
               [&](std::int64_t row0, std::int64_t rows, const double* value, const double* abs) {
                 std::copy(value, value + rows * k, dw.begin() + row0 * k);
                 std::copy(abs, abs + rows * k, dw_abs.begin() + row0 * k);
               });
  const double gamma32 = logitd::Gamma(m, kFp32StepError);
  const double p_gamma32 = std::min(ProbabilisticGamma(m, kFp32UnitRoundoff), gamma32);
  // A 66,000-term sum's fp32 bound is wide (about 0.4% of Σ|g·x|), wider
  // than Perturb's fixed steps: in fp32 a dozen elements of row 5 go past
  // the proven bound, and a dozen of row 6 between the probabilistic and
  // the proven one (their geometric mean).
  const auto past_the_bounds = [&](std::vector<std::uint8_t>* candidate) {
    for (std::int64_t c = 0; c < 12; ++c) {
      const std::size_t past = 5 * k + c, between = 6 * k + c;
      const float far = static_cast<float>(dw[past] + 2 * gamma32 * dw_abs[past] + 1);
      const float mid =
          static_cast<float>(dw[between] + std::sqrt(gamma32 * p_gamma32) * dw_abs[between]);
      std::memcpy(candidate->data() + past * 4, &far, 4);
      std::memcpy(candidate->data() + between * 4, &mid, 4);
    }
  };
  for (const bool dy_bf16 : {false, true}) {
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dY bf16 " << dy_bf16 << " dW bf16 " << bf16);
      const DType dtype = bf16 ? DType::kBf16 : DType::kFp32;
      std::vector<std::uint8_t> candidate, own;
      Perturb(dw, k, bf16, &candidate, &own);
      if (!bf16) past_the_bounds(&candidate);
      LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
      in.dy = dy_bf16 ? static_cast<const void*>(g_bits.data()) : dy32.data();
      in.dy_dtype = dy_bf16 ? DType::kBf16 : DType::kFp32;
      const judgement::ProductRule rule = SumOfProductsRule(m, 1.0, dtype);
      CandidateCheck direct(dtype), through(dtype), on_host(dtype);
      ASSERT_TRUE(engine->JudgeGtX(in.dy, dy_bf16, x.data(), m, candidate.data(), own.data(), rule,
                                   &direct, {}))
          << engine->error();
      in.products = engine.get();
      ASSERT_TRUE(CheckGradWeight(in, candidate.data(), own.data(), dtype, &through));
      in.products = nullptr;
      ASSERT_TRUE(CheckGradWeight(in, candidate.data(), own.data(), dtype, &on_host));
      ExpectSameFigures(direct, on_host);
      ExpectSameFigures(through, on_host);
      // Not a vacuous comparison: elements outside each bound, reported
      // ones among them (a NaN too), and NaN and infinity mismatches.
      EXPECT_EQ(on_host.elements(), v * k);
      EXPECT_GT(on_host.outside(), 0);
      EXPECT_GT(on_host.figures().outside_probabilistic, on_host.outside());
      EXPECT_GT(on_host.figures().first_outside.size(), 10u);
      EXPECT_GT(on_host.nan_inf_mismatches(), 0);
    }
  }
  EXPECT_TRUE(engine->error().empty()) << engine->error();

  // A stop asked for ends the walk; a NaN in G (late in the last block) or
  // an infinity in X leaves dW to the host, which gets the same figures as
  // without an engine; neither is the engine's error.
  std::vector<std::uint8_t> candidate, own;
  Perturb(dw, k, false, &candidate, &own);
  LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
  in.dy = dy32.data();
  in.products = engine.get();
  CandidateCheck stopped(DType::kFp32);
  EXPECT_FALSE(CheckGradWeight(in, candidate.data(), own.data(), DType::kFp32, &stopped,
                               [] { return true; }));
  std::vector<float> dy_nan = dy32;
  dy_nan[(m - 3) * v + v - 2] = std::nanf("");
  std::vector<Bf16Bits> x_inf = x;
  x_inf[17 * k + 5] = 0xff80;  // -Inf
  for (const bool in_x : {false, true}) {
    SCOPED_TRACE(in_x ? "infinity in X" : "NaN in dY");
    LmHeadInputs bad = in;
    if (in_x) {
      bad.x = x_inf.data();
    } else {
      bad.dy = dy_nan.data();
    }
    CandidateCheck scratch(DType::kFp32), through(DType::kFp32), on_host(DType::kFp32);
    EXPECT_FALSE(engine->JudgeGtX(bad.dy, false, bad.x, m, candidate.data(), own.data(),
                                  judgement::ProductRule{}, &scratch, {}));
    ASSERT_TRUE(CheckGradWeight(bad, candidate.data(), own.data(), DType::kFp32, &through));
    bad.products = nullptr;
    ASSERT_TRUE(CheckGradWeight(bad, candidate.data(), own.data(), DType::kFp32, &on_host));
    ExpectSameFigures(through, on_host);
    EXPECT_GT(on_host.nan_inf_mismatches(), 0);
  }
  EXPECT_TRUE(engine->error().empty()) << engine->error();
}

// |a − b| within `rel` of |b| (and of 1e-300 near zero).
void ExpectClose(double a, double b, double rel, const char* what, std::size_t i) {
  EXPECT_LE(std::fabs(a - b), rel * std::max(std::fabs(b), 1e-300)) << what << " " << i;
}

TEST_F(Fp64ProductsTest, TheCrossEntropysSoftmaxSumsOnTheDeviceAreTheHostsWithinFp64Rounding) {
  const std::int64_t m = 70, v = 5003, k = 384;
  const std::vector<Bf16Bits> x = RandomBf16(m * k, 10), w = RandomBf16(v * k, 11);
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
  ASSERT_NE(engine, nullptr);
  HostJudging host(engine.get());
  CountingRowSums counting(engine.get());
  std::vector<std::int64_t> targets(m);
  for (std::int64_t i = 0; i < m; ++i) targets[i] = i % 9 == 4 ? -100 : (i * 7919) % v;
  LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
  // Every row's envelopes, then a draw of 23 rows' (the device gathers
  // their rows of X and maps each row to its models).
  for (const auto& [cap, drawn] :
       {std::pair{0.0f, false}, std::pair{3.0f, false}, std::pair{3.0f, true}}) {
    SCOPED_TRACE(::testing::Message() << "softcap " << cap << (drawn ? ", 23 rows drawn" : ""));
    CeReferenceOptions o;
    o.logit_softcap = cap;
    o.z_loss = 1e-3f;
    o.class_envelope = true;
    if (drawn) o.class_rows = ClassTokenRows(targets.data(), m, -100, 23, 7);
    const auto picked = [&](std::size_t i) { return !drawn || o.class_rows[i] != 0; };
    CrossEntropyReference on_device, on_host;
    const int calls_before = counting.row_sums_calls();
    in.products = &counting;
    ASSERT_TRUE(ReferenceCrossEntropy(in, targets.data(), o, LogitModel::kFp32Sum, &on_device));
    in.products = &host;
    ASSERT_TRUE(ReferenceCrossEntropy(in, targets.data(), o, LogitModel::kFp32Sum, &on_host));
    EXPECT_TRUE(engine->error().empty()) << engine->error();
    // The same sums in another order, with the device's exp, log and tanh:
    // values within a few fp64 ulps, bounds (sums of small terms) closer
    // than a millionth.
    for (std::size_t i = 0; i < static_cast<std::size_t>(m); ++i) {
      ExpectClose(on_device.lse[i], on_host.lse[i], 1e-13, "lse", i);
      ExpectClose(on_device.loss[i], on_host.loss[i], 1e-12, "loss", i);
      ExpectClose(on_device.lse_bound[i], on_host.lse_bound[i], 1e-6, "lse bound", i);
      ExpectClose(on_device.loss_bound[i], on_host.loss_bound[i], 1e-6, "loss bound", i);
      // The precision-class envelopes: the models' bits are the host's, the
      // sums in another order; none for a row not drawn.
      if (!picked(i)) {
        EXPECT_EQ(on_host.lse_class[i], 0.0) << i;
        EXPECT_EQ(on_device.lse_class[i], 0.0) << i;
        EXPECT_EQ(on_device.loss_class[i], 0.0) << i;
        continue;
      }
      ASSERT_GT(on_host.lse_class[i], 0.0) << i;
      ExpectClose(on_device.lse_class[i], on_host.lse_class[i], 1e-6, "lse class", i);
      ExpectClose(on_device.loss_class[i], on_host.loss_class[i], 1e-6, "loss class", i);
      if (targets[i] == -100) {
        EXPECT_EQ(on_device.loss[i], 0.0) << i;
        EXPECT_EQ(on_device.loss_class[i], 0.0) << i;
      }
    }
    ExpectClose(on_device.mean, on_host.mean, 1e-12, "mean", 0);
    ExpectClose(on_device.mean_bound, on_host.mean_bound, 1e-6, "mean bound", 0);
    // The device formed them: one chunk of sums, or two with a draw (the
    // drawn rows, then the others).
    EXPECT_EQ(counting.row_sums_calls(), calls_before + (drawn ? 2 : 1));
  }
}

// LogProbs' rows formed on the device (sums, order, the targets' ranks and
// the ids' z) are the host's from the same logits: the values within fp64
// rounding of sums in another order (and the device's exp, log and tanh),
// the order, ranks and invalid ids exactly. The vocabulary that counts is
// shorter than V, some tokens are ignored, and the ids include one out of
// range, a negative one and a repeat.
TEST_F(Fp64ProductsTest, LogProbsRowsOnTheDeviceAreTheHostsWithinFp64Rounding) {
  const std::int64_t m = 70, v = 5003, k = 384, vocab = 5000, top_k = 5;
  const std::vector<Bf16Bits> x = RandomBf16(m * k, 12), w = RandomBf16(v * k, 13);
  std::shared_ptr<Fp64Products> engine = EngineOf(w, v, k);
  ASSERT_NE(engine, nullptr);
  HostJudging host(engine.get());
  CountingRowSums counting(engine.get());
  std::vector<std::int64_t> targets(m), ids(m * top_k);
  for (std::int64_t i = 0; i < m; ++i) {
    targets[i] = i % 9 == 4 ? -100 : (i * 7919) % vocab;
    for (std::int64_t p = 0; p < top_k; ++p) ids[i * top_k + p] = (i * 31 + p * 977) % vocab;
  }
  ids[3 * top_k + 1] = vocab + 1;
  ids[5 * top_k + 2] = -1;
  ids[7 * top_k + 4] = ids[7 * top_k + 1];
  LmHeadInputs in = LmHeadInputs::Forward(x.data(), w.data(), m, v, k);
  for (const auto& [cap, temperature, drawn] :
       {std::tuple{0.0f, 1.0f, false}, std::tuple{3.0f, 0.7f, false},
        std::tuple{0.0f, 1.0f, true}}) {
    SCOPED_TRACE(::testing::Message() << "softcap " << cap << " temperature " << temperature
                                      << (drawn ? ", 23 rows drawn" : ""));
    LpReferenceOptions o;
    o.logit_softcap = cap;
    o.temperature = temperature;
    o.top_k = top_k;
    o.vocab_size = vocab;
    o.class_envelope = true;
    if (drawn) o.class_rows = ClassTokenRows(targets.data(), m, -100, 23, 7);
    LogProbsReference on_device, on_host;
    std::vector<double> z_device(ids.size()), z_host(ids.size());
    const int calls_before = counting.lp_row_sums_calls();
    in.products = &counting;
    ASSERT_TRUE(ReferenceLogProbs(in, targets.data(), o, LogitModel::kFp32Sum, &on_device, {}, {},
                                  0, LpIdsZ{ids.data(), top_k, z_device.data()}));
    in.products = &host;
    ASSERT_TRUE(ReferenceLogProbs(in, targets.data(), o, LogitModel::kFp32Sum, &on_host, {}, {}, 0,
                                  LpIdsZ{ids.data(), top_k, z_host.data()}));
    EXPECT_TRUE(engine->error().empty()) << engine->error();
    EXPECT_EQ(counting.lp_row_sums_calls(), calls_before + (drawn ? 2 : 1));
    ASSERT_EQ(on_device.order_cols, top_k + 1);
    EXPECT_EQ(on_device.order, on_host.order);
    EXPECT_EQ(on_device.rank, on_host.rank);
    EXPECT_EQ(on_device.rank_low, on_host.rank_low);
    EXPECT_EQ(on_device.rank_high, on_host.rank_high);
    for (std::size_t i = 0; i < static_cast<std::size_t>(m); ++i) {
      ExpectClose(on_device.lse[i], on_host.lse[i], 1e-13, "lse", i);
      ExpectClose(on_device.logprob[i], on_host.logprob[i], 1e-12, "logprob", i);
      ExpectClose(on_device.entropy[i], on_host.entropy[i], 1e-12, "entropy", i);
      ExpectClose(on_device.z_bound[i], on_host.z_bound[i], 1e-12, "B", i);
      ExpectClose(on_device.lse_bound[i], on_host.lse_bound[i], 1e-6, "lse bound", i);
      ExpectClose(on_device.logprob_bound[i], on_host.logprob_bound[i], 1e-6, "logprob bound", i);
      ExpectClose(on_device.entropy_bound[i], on_host.entropy_bound[i], 1e-6, "entropy bound", i);
      if (drawn && o.class_rows[i] == 0) {
        EXPECT_EQ(on_host.lse_class[i], 0.0) << i;
        EXPECT_EQ(on_device.lse_class[i], 0.0) << i;
        EXPECT_EQ(on_device.entropy_class[i], 0.0) << i;
      }
      if (!drawn || o.class_rows[i] != 0) {
        ASSERT_GT(on_host.lse_class[i], 0.0) << i;
      }
      ExpectClose(on_device.lse_class[i], on_host.lse_class[i], 1e-6, "lse class", i);
      ExpectClose(on_device.logprob_class[i], on_host.logprob_class[i], 1e-6, "logprob class", i);
      ExpectClose(on_device.entropy_class[i], on_host.entropy_class[i], 1e-6, "entropy class", i);
      if (targets[i] == -100) {
        EXPECT_EQ(on_device.logprob[i], 0.0) << i;
        EXPECT_EQ(on_device.rank[i], -1) << i;
      } else {
        EXPECT_GE(on_device.rank[i], 0) << i;
      }
    }
    for (std::size_t j = 0; j < on_device.order_z.size(); ++j) {
      ExpectClose(on_device.order_z[j], on_host.order_z[j], 1e-13, "order z", j);
    }
    for (std::size_t j = 0; j < ids.size(); ++j) {
      if (std::isnan(z_host[j])) {
        EXPECT_TRUE(std::isnan(z_device[j])) << j;
      } else {
        ExpectClose(z_device[j], z_host[j], 1e-13, "ids' z", j);
      }
    }
    EXPECT_TRUE(std::isnan(z_device[3 * top_k + 1]));
    EXPECT_TRUE(std::isnan(z_device[5 * top_k + 2]));
    EXPECT_TRUE(std::isnan(z_device[7 * top_k + 4]));
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

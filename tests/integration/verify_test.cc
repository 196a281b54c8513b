// Verify through the real server and the client library (cpu backend; with
// LOGITD_TEST_BACKEND=cuda in the environment, as ctest runs the cuda.
// variant, the same tests against --backend=cuda, skipped where no device
// is visible): a
// team's outputs of the LM head's products, computed here the ways kernels
// compute them, right and wrong. A conforming fp32 kernel (another order of
// summation) passes; logitd's own outputs are bitwise equal to logitd; one
// ulp off passes and is counted; bf16 logits passed off as fp32, a
// transposed weight, a NaN where none belongs and a missing gradient cast
// are refused with the element, its reference and bound named, or (bf16
// rounding inside the proven bound at large K) by the precision-class test
// with its figures. Sampled rows, evenly spaced or drawn by a seed, give
// the "_sampled" verdicts. Bad requests get the operation's own statuses.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/stub_calls.h"

namespace logitd::testing {
namespace {

const std::string kBackend = TestBackend();

using client::CandidateVerdict;
using client::PrecisionClass;
using client::VerifyArgs;
using client::VerifyOperation;
using client::VerifyResult;
using ::testing::HasSubstr;

// Y = alpha·X·Wᵀ in fp32, each dot product summed from its last term to its
// first (products of bf16 values are exact in fp32): a conforming kernel
// whose order differs from logitd's.
Tensor ReverseOrderLogits(const Tensor& x, const Tensor& w, float alpha = 1.0f) {
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  Tensor y(DType::kFp32, {m, v});
  const Bf16Bits* xp = x.data<Bf16Bits>();
  const Bf16Bits* wp = w.data<Bf16Bits>();
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      float s = 0;
      for (std::int64_t t = k - 1; t >= 0; --t) {
        s += Bf16ToFloat(xp[i * k + t]) * Bf16ToFloat(wp[j * k + t]);
      }
      y.data<float>()[i * v + j] = alpha * s;
    }
  }
  return y;
}

// dX = G·W in fp32 with G = bf16(dY), or dY itself when `cast` is false.
Tensor GradInput(const Tensor& dy, const Tensor& w, bool cast) {
  const std::int64_t m = dy.dim(0), v = dy.dim(1), k = w.dim(1);
  Tensor dx(DType::kFp32, {m, k});
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t c = 0; c < k; ++c) {
      float s = 0;
      for (std::int64_t j = 0; j < v; ++j) {
        const float g = dy.data<float>()[i * v + j];
        s += (cast ? RoundToBf16(g) : g) * Bf16ToFloat(w.data<Bf16Bits>()[j * k + c]);
      }
      dx.data<float>()[i * k + c] = s;
    }
  }
  return dx;
}

Tensor Copy(const Tensor& t) {
  Tensor out(t.dtype(), t.shape());
  std::memcpy(out.bytes(), t.bytes(), t.nbytes());
  return out;
}

// The first `rows` rows of t (its first dimension), a copy.
Tensor FirstRows(const Tensor& t, std::int64_t rows) {
  std::vector<std::int64_t> shape = t.shape();
  const std::size_t row_bytes = t.nbytes() / static_cast<std::size_t>(shape[0]);
  shape[0] = rows;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.bytes(), t.bytes(), row_bytes * static_cast<std::size_t>(rows));
  return out;
}

class VerifyTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() { StartSharedServer({std::string("--backend=") + kBackend}); }
  void SetUp() override {
    if (server_ == nullptr && kBackend == "cuda") {
      GTEST_SKIP() << "no cuda backend here: " << *start_error_;
    }
    SharedServerTest::SetUp();
  }
  static VerifyArgs LogitsArgs(const std::string& handle, const Tensor& x, const Tensor& y) {
    VerifyArgs args;
    args.operation = VerifyOperation::kLogits;
    args.weight_handle = handle;
    args.x = x;
    args.candidates["y"] = y;
    return args;
  }
  // A cross-entropy or LogProbs Verify of x and targets, its options set by
  // the caller, its candidates added after.
  static VerifyArgs PerTokenArgs(VerifyOperation operation, const std::string& handle,
                                 const Tensor& x, const Tensor& targets) {
    VerifyArgs args;
    args.operation = operation;
    args.weight_handle = handle;
    args.x = x;
    args.targets = targets;
    return args;
  }
  // w registered as `name`, logitd's per-token loss and lse of x and
  // targets into *own (left empty on failure), and a Verify of them.
  static VerifyArgs OwnLossAndLse(const Tensor& w, const Tensor& x, const Tensor& targets,
                                  const std::string& name,
                                  std::optional<client::CrossEntropyResult>* own) {
    const std::string handle = Register(w, name);
    client::CrossEntropyOptions o;
    o.reduction = client::Reduction::kNone;
    o.want_lse = true;
    absl::StatusOr<client::CrossEntropyResult> r = client().CrossEntropy(x, targets, handle, o);
    EXPECT_TRUE(r.ok()) << r.status();
    VerifyArgs args = PerTokenArgs(VerifyOperation::kCrossEntropy, handle, x, targets);
    args.cross_entropy = o;
    if (!r.ok()) return args;
    *own = *std::move(r);
    args.candidates["loss"] = (*own)->loss;
    args.candidates["lse"] = *(*own)->lse;
    return args;
  }
  static VerifyResult Verified(const VerifyArgs& args) {
    absl::StatusOr<VerifyResult> r = client().Verify(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : VerifyResult();
  }
};

TEST_F(VerifyTest, AConformingFp32KernelIsWithinBoundsAndLogitdsOwnIsBitwiseEqual) {
  const Tensor w = NormalBf16({200, 640}, 1);
  const Tensor x = NormalBf16({12, 640}, 2);
  const std::string handle = Register(w, "verify-conforming");

  const VerifyResult theirs = Verified(LogitsArgs(handle, x, ReverseOrderLogits(x, w)));
  EXPECT_TRUE(theirs.passed()) << theirs.verdict;
  ASSERT_EQ(theirs.candidates.size(), 1u);
  const CandidateVerdict& c = theirs.candidates[0];
  EXPECT_EQ(c.name, "y");
  EXPECT_EQ(c.shape, (std::vector<std::int64_t>{12, 200}));
  EXPECT_EQ(c.elements, 12 * 200);
  EXPECT_EQ(c.outside_bound, 0);
  EXPECT_LE(c.worst_bound_fraction, 1.0);
  ASSERT_EQ(c.error_histogram.size(), 10u);
  std::int64_t counted = 0;
  for (std::int64_t n : c.error_histogram) counted += n;
  EXPECT_EQ(counted, c.elements);
  EXPECT_EQ(c.error_histogram.back(), 0);
  // Another order of fp32 accumulation is in the class, and a few ulps from
  // the correctly rounded value at most.
  EXPECT_EQ(theirs.verdict, "within_bounds");
  EXPECT_TRUE(c.precision_class.tested) << c.precision_class.reason;
  EXPECT_FALSE(c.precision_class.outside);
  EXPECT_LE(c.precision_class.rms_ratio, c.precision_class.threshold);
  EXPECT_EQ(c.precision_class.elements, 12 * 200);
  EXPECT_EQ(c.precision_class.rows, 12);
  EXPECT_EQ(c.precision_class.rows_outside, 0);
  EXPECT_GE(c.max_ulp_exact, c.p99_ulp_exact);
  EXPECT_GE(c.p99_ulp_exact, c.p50_ulp_exact);
  EXPECT_GE(c.p50_ulp_exact, 0);
  // No sample: no rows listed, all of them counted.
  EXPECT_TRUE(theirs.rows_checked.empty());
  EXPECT_EQ(theirs.rows_total, 12);
  EXPECT_EQ(theirs.sample_seed, 0u);

  absl::StatusOr<Tensor> own = client().Logits(x, handle);
  ASSERT_TRUE(own.ok()) << own.status();
  const VerifyResult ours = Verified(LogitsArgs(handle, x, *own));
  EXPECT_EQ(ours.verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(ours.candidates[0].bitwise_equal_fraction, 1.0);
  EXPECT_EQ(ours.candidates[0].max_ulp, 0);
  // The same inputs, the same key for a golden baseline.
  EXPECT_EQ(ours.inputs_xxh3, theirs.inputs_xxh3);
  EXPECT_NE(ours.inputs_xxh3, 0u);
  EXPECT_GE(ours.reference_us, 0);
  // The cuda backend forms the fp64 products on its device, the cpu backend
  // with OpenBLAS.
  EXPECT_EQ(ours.reference_engine.rfind(
                kBackend == "cuda" ? "cuBLAS DGEMM on " : "OpenBLAS dgemm on the host", 0),
            0u)
      << ours.reference_engine;
}

TEST_F(VerifyTest, TensorsGivenAsTemporariesAreKeptForTheCall) {
  // args.x = <a temporary>: the argument keeps the tensor, so the call
  // streams its bytes, not memory freed and reused since (ASan reports a
  // read of freed memory; here the verdict would be wrong).
  const Tensor w = NormalBf16({48, 128}, 31);
  const Tensor x = NormalBf16({5, 128}, 32);
  const std::string handle = Register(w, "verify-temporaries");
  VerifyArgs args;
  args.operation = VerifyOperation::kLogits;
  args.weight_handle = handle;
  args.x = Copy(x);
  args.candidates["y"] = ReverseOrderLogits(x, w);
  // Memory of the same sizes, allocated and written after the temporaries
  // went out of scope.
  std::vector<Tensor> churn;
  for (int i = 0; i < 8; ++i) {
    churn.push_back(Copy(x));
    std::memset(churn.back().bytes(), 0x7f, churn.back().nbytes());
    churn.emplace_back(DType::kFp32, std::vector<std::int64_t>{5, 48});
    std::memset(churn.back().bytes(), 0x7f, churn.back().nbytes());
  }
  const VerifyResult r = Verified(args);
  EXPECT_TRUE(r.passed()) << r.verdict;
  // The candidate the server judged is the one given: its digest.
  const Tensor y = ReverseOrderLogits(x, w);
  EXPECT_EQ(r.candidates[0].xxh3, y.Digest());
}

TEST_F(VerifyTest, OneUlpOffIsWithinBoundsAndCountedAgainstLogitd) {
  const Tensor w = NormalBf16({64, 256}, 3);
  const Tensor x = NormalBf16({8, 256}, 4);
  const std::string handle = Register(w, "verify-ulp");
  absl::StatusOr<Tensor> own = client().Logits(x, handle);
  ASSERT_TRUE(own.ok()) << own.status();
  Tensor y = Copy(*own);
  float* p = y.data<float>();
  p[77] = std::nextafter(p[77], INFINITY);
  const VerifyResult r = Verified(LogitsArgs(handle, x, y));
  EXPECT_EQ(r.verdict, "within_bounds");
  const CandidateVerdict& c = r.candidates[0];
  EXPECT_EQ(c.max_ulp, 1);
  EXPECT_EQ(c.p50_ulp, 0);
  EXPECT_DOUBLE_EQ(c.bitwise_equal_fraction, 1.0 - 1.0 / (8 * 64));
}

TEST_F(VerifyTest, Bf16LogitsPassedOffAsFp32AreOutsideTheirBound) {
  const Tensor w = NormalBf16({96, 1024}, 5);
  const Tensor x = NormalBf16({6, 1024}, 6);
  const std::string handle = Register(w, "verify-bf16");
  Tensor y = ReverseOrderLogits(x, w);
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = RoundToBf16(y.data<float>()[i]);
  const VerifyResult r = Verified(LogitsArgs(handle, x, y));
  EXPECT_EQ(r.verdict, "outside_bounds");
  const CandidateVerdict& c = r.candidates[0];
  EXPECT_FALSE(c.passed());
  EXPECT_GT(c.outside_bound, c.elements / 10);
  EXPECT_GT(c.worst_bound_fraction, 2.0);
  EXPECT_GE(c.outside_probabilistic_bound, c.outside_bound);
  EXPECT_EQ(c.logitd_outside_probabilistic_bound, 0);
  ASSERT_EQ(c.first_outside.size(), 32u);
  const client::VerifyElement& e = c.first_outside[0];
  // Those outside the proven bound come first, each flagged.
  EXPECT_TRUE(e.outside_bound);
  EXPECT_GT(std::fabs(e.candidate - e.reference), e.bound);
  ASSERT_EQ(e.index.size(), 2u);
  const std::int64_t flat = e.index[0] * 96 + e.index[1];
  EXPECT_EQ(e.candidate, y.data<float>()[flat]);
  EXPECT_GT(std::fabs(e.candidate - e.reference), e.probabilistic_bound);
  EXPECT_LE(e.probabilistic_bound, e.bound);
  // logitd's own value there is inside the same bounds.
  EXPECT_LE(std::fabs(e.logitd - e.reference), e.probabilistic_bound);
}

TEST_F(VerifyTest, AtK4096Bf16LogitsAreOutsideThePrecisionClass) {
  // The seed's hidden size: the proven bound grows as K and holds bf16
  // rounding of the result (growing as √K), so no element is wrong for
  // certain; the precision-class test finds the errors those of an 8-bit
  // significand, not of fp32 accumulation.
  const Tensor w = NormalBf16({64, 4096}, 18);
  const Tensor x = NormalBf16({4, 4096}, 19);
  const std::string handle = Register(w, "verify-k4096");
  absl::StatusOr<Tensor> own = client().Logits(x, handle);
  ASSERT_TRUE(own.ok()) << own.status();
  const VerifyResult ours = Verified(LogitsArgs(handle, x, *own));
  EXPECT_EQ(ours.verdict, "bitwise_equal_to_logitd");
  EXPECT_TRUE(ours.candidates[0].precision_class.tested);
  EXPECT_FALSE(ours.candidates[0].precision_class.outside);
  // A conforming fp32 sum in another order.
  const VerifyResult reversed = Verified(LogitsArgs(handle, x, ReverseOrderLogits(x, w)));
  EXPECT_EQ(reversed.verdict, "within_bounds");
  EXPECT_FALSE(reversed.candidates[0].precision_class.outside);

  Tensor y = Copy(*own);
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = RoundToBf16(y.data<float>()[i]);
  const VerifyResult r = Verified(LogitsArgs(handle, x, y));
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.verdict, "outside_precision_class");
  ASSERT_EQ(r.candidates.size(), 1u);
  const CandidateVerdict& c = r.candidates[0];
  EXPECT_EQ(c.verdict, "outside_precision_class");
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.outside_bound, 0);
  EXPECT_LE(c.worst_bound_fraction, 1.0);
  const PrecisionClass& p = c.precision_class;
  ASSERT_TRUE(p.tested) << p.reason;
  EXPECT_TRUE(p.outside);
  EXPECT_GT(p.rms_ratio, p.threshold);
  EXPECT_GT(p.threshold, 1.0);
  // About 8 bits plus half of log2(K) for bf16 rounding of the result;
  // fp32 accumulation's are near 24.
  EXPECT_LT(p.effective_bits, 16.0);
  EXPECT_GT(p.class_bits, p.effective_bits + 2);
  EXPECT_GT(p.alpha, 0.0);
  EXPECT_LT(p.alpha, 1e-6);
  EXPECT_EQ(p.elements, 4 * 64);
  EXPECT_EQ(p.rows, 4);
  EXPECT_GT(p.rows_outside, 0);
  ASSERT_FALSE(p.worst_rows.empty());
  EXPECT_LE(p.worst_rows.size(), 8u);
  EXPECT_TRUE(p.worst_rows[0].outside);
  EXPECT_GT(p.worst_rows[0].rms_ratio, p.worst_rows[0].threshold);
  EXPECT_EQ(p.worst_rows[0].elements, 64);
  EXPECT_FALSE(p.envelope.empty());
  // Rounding to bf16 moves the result by up to half a bf16 ulp: many fp32
  // ulps from the correctly rounded value.
  EXPECT_GT(c.max_ulp_exact, 1000);
  EXPECT_GE(c.max_ulp_exact, c.p50_ulp_exact);
  // The elements listed: none outside the proven bound; those the test
  // found (with the threshold they exceed) before the probabilistic
  // figure's.
  bool class_listed = true;
  for (const client::VerifyElement& e : c.first_outside) {
    EXPECT_FALSE(e.outside_bound);
    if (e.class_threshold > 0) {
      EXPECT_TRUE(class_listed) << "a class outlier after the probabilistic figure's";
      EXPECT_GT(std::fabs(e.candidate - e.reference), e.class_threshold);
    } else {
      class_listed = false;
      EXPECT_LE(std::fabs(e.candidate - e.reference), e.bound);
    }
  }
  // Still a figure beside the verdict.
  EXPECT_GT(c.outside_probabilistic_bound, 0);
}

TEST_F(VerifyTest, ATransposedWeightAndAStrayNanAreOutside) {
  const Tensor w = NormalBf16({128, 128}, 7);
  const Tensor x = NormalBf16({4, 128}, 8);
  const std::string handle = Register(w, "verify-square");
  // W read as [K, V]: the logits of Wᵀ.
  Tensor wt(DType::kBf16, {128, 128});
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) {
      wt.data<Bf16Bits>()[r * 128 + c] = w.data<Bf16Bits>()[c * 128 + r];
    }
  }
  const VerifyResult transposed = Verified(LogitsArgs(handle, x, ReverseOrderLogits(x, wt)));
  EXPECT_EQ(transposed.verdict, "outside_bounds");
  EXPECT_GT(transposed.candidates[0].outside_bound, 4 * 128 * 9 / 10);

  Tensor y = ReverseOrderLogits(x, w);
  y.data<float>()[2 * 128 + 5] = NAN;
  const VerifyResult nan = Verified(LogitsArgs(handle, x, y));
  const CandidateVerdict& c = nan.candidates[0];
  EXPECT_EQ(c.outside_bound, 1);
  EXPECT_EQ(c.nan_inf_mismatches, 1);
  ASSERT_EQ(c.first_outside.size(), 1u);
  EXPECT_EQ(c.first_outside[0].index, (std::vector<std::int64_t>{2, 5}));
}

TEST_F(VerifyTest, AlphaAndBf16CandidatesAndSampledRows) {
  const Tensor w = NormalBf16({40, 300}, 9);
  const Tensor x = NormalBf16({50, 300}, 10);
  const std::string handle = Register(w, "verify-options");
  const Tensor scaled_y = ReverseOrderLogits(x, w, 0.5f);
  VerifyArgs args = LogitsArgs(handle, x, scaled_y);
  args.alpha = 0.5f;
  EXPECT_TRUE(Verified(args).passed());
  // The unscaled logits are not alpha's.
  const Tensor unscaled_y = ReverseOrderLogits(x, w);
  VerifyArgs unscaled = LogitsArgs(handle, x, unscaled_y);
  unscaled.alpha = 0.5f;
  EXPECT_EQ(Verified(unscaled).verdict, "outside_bounds");

  client::LogitsOptions bf16;
  bf16.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> own = client().Logits(x, handle, bf16);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(Verified(LogitsArgs(handle, x, *own)).verdict, "bitwise_equal_to_logitd");

  // Row 3 is wrong but not among the 5 rows checked: 0, 12, 24, 36, 49.
  Tensor y = ReverseOrderLogits(x, w);
  y.data<float>()[3 * 40 + 1] += 1.0f;
  VerifyArgs sampled = LogitsArgs(handle, x, y);
  sampled.sample_rows = 5;
  const VerifyResult r = Verified(sampled);
  EXPECT_EQ(r.rows_checked, (std::vector<std::int64_t>{0, 12, 24, 36, 49}));
  EXPECT_EQ(r.rows_total, 50);
  EXPECT_EQ(r.sample_seed, 0u);
  EXPECT_EQ(r.candidates[0].elements, 5 * 40);
  EXPECT_TRUE(r.passed());
  // A pass of some rows says so.
  EXPECT_EQ(r.verdict, "within_bounds_sampled");
  EXPECT_EQ(r.candidates[0].verdict, "within_bounds_sampled");
  EXPECT_TRUE(r.candidates[0].passed());
  EXPECT_EQ(Verified(LogitsArgs(handle, x, y)).verdict, "outside_bounds");
}

TEST_F(VerifyTest, RowsSampledEvenlyOrDrawnByASeed) {
  const Tensor w = NormalBf16({24, 128}, 45);
  const Tensor x = NormalBf16({40, 128}, 46);
  const std::string handle = Register(w, "verify-seeded");
  absl::StatusOr<Tensor> own = client().Logits(x, handle);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto sampled = [&](const Tensor& y, std::int64_t rows, std::uint64_t seed) {
    VerifyArgs args = LogitsArgs(handle, x, y);
    args.sample_rows = rows;
    args.sample_seed = seed;
    return Verified(args);
  };
  // Evenly spaced: one row or two give the first and the last.
  for (std::int64_t n : {1, 2}) {
    const VerifyResult r = sampled(*own, n, 0);
    EXPECT_EQ(r.rows_checked, (std::vector<std::int64_t>{0, 39})) << n;
    EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd_sampled") << n;
    EXPECT_EQ(r.candidates[0].elements, 2 * 24);
  }
  const std::vector<std::int64_t> lattice = sampled(*own, 6, 0).rows_checked;
  ASSERT_EQ(lattice.size(), 6u);

  // Drawn by a seed: six distinct rows in order, reported with the seed,
  // the same for the same seed, off the lattice.
  const VerifyResult a = sampled(*own, 6, 20261206);
  EXPECT_EQ(a.sample_seed, 20261206u);
  EXPECT_EQ(a.rows_total, 40);
  EXPECT_EQ(a.verdict, "bitwise_equal_to_logitd_sampled");
  ASSERT_EQ(a.rows_checked.size(), 6u);
  EXPECT_TRUE(std::is_sorted(a.rows_checked.begin(), a.rows_checked.end()));
  EXPECT_EQ(std::adjacent_find(a.rows_checked.begin(), a.rows_checked.end()), a.rows_checked.end());
  for (std::int64_t row : a.rows_checked) {
    EXPECT_GE(row, 0);
    EXPECT_LT(row, 40);
  }
  EXPECT_NE(a.rows_checked, lattice);
  EXPECT_EQ(sampled(*own, 6, 20261206).rows_checked, a.rows_checked);
  EXPECT_NE(sampled(*own, 6, 7).rows_checked, a.rows_checked);

  // A wrong row the lattice misses and the seeded sample draws.
  std::int64_t off_lattice = -1;
  for (std::int64_t row : a.rows_checked) {
    if (std::find(lattice.begin(), lattice.end(), row) == lattice.end()) off_lattice = row;
  }
  ASSERT_GE(off_lattice, 0);
  Tensor y = Copy(*own);
  y.data<float>()[off_lattice * 24 + 3] += 1.0f;
  EXPECT_EQ(sampled(y, 6, 0).verdict, "bitwise_equal_to_logitd_sampled");
  const VerifyResult found = sampled(y, 6, 20261206);
  EXPECT_EQ(found.verdict, "outside_bounds");
  EXPECT_FALSE(found.passed());
  ASSERT_FALSE(found.candidates[0].first_outside.empty());
  EXPECT_EQ(found.candidates[0].first_outside[0].index,
            (std::vector<std::int64_t>{off_lattice, 3}));

  // A seed without a sample is refused.
  VerifyArgs unsampled = LogitsArgs(handle, x, *own);
  unsampled.sample_seed = 5;
  const absl::Status s = client().Verify(unsampled).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("sample_seed: given without sample_rows"));
}

TEST_F(VerifyTest, BackwardHoldsTheGradientCastContract) {
  const Tensor w = NormalBf16({384, 40}, 11);
  const Tensor x = NormalBf16({24, 40}, 12);
  const Tensor dy = NormalFp32({24, 384}, 13);
  const std::string handle = Register(w, "verify-backward");

  client::BackwardOptions fp32;
  fp32.dx_dtype = DType::kFp32;
  absl::StatusOr<client::BackwardResult> own = client().Backward(dy, x, handle, fp32);
  ASSERT_TRUE(own.ok()) << own.status();
  VerifyArgs args;
  args.operation = VerifyOperation::kBackward;
  args.weight_handle = handle;
  args.x = x;
  args.dy = dy;
  args.candidates["dx"] = *own->dx;
  args.candidates["dw"] = *own->dw;
  const VerifyResult ours = Verified(args);
  EXPECT_EQ(ours.verdict, "bitwise_equal_to_logitd");
  ASSERT_EQ(ours.candidates.size(), 2u);
  ASSERT_NE(ours.Find("dw"), nullptr);
  EXPECT_EQ(ours.Find("dw")->elements, 384 * 40);
  // Rows sampled: dX's, while dW, which every row feeds, is checked whole.
  VerifyArgs some_rows = args;
  some_rows.sample_rows = 4;
  const VerifyResult sampled = Verified(some_rows);
  EXPECT_EQ(sampled.verdict, "bitwise_equal_to_logitd_sampled");
  ASSERT_NE(sampled.Find("dx"), nullptr);
  EXPECT_EQ(sampled.Find("dx")->verdict, "bitwise_equal_to_logitd_sampled");
  EXPECT_EQ(sampled.Find("dx")->elements, 4 * 40);
  ASSERT_NE(sampled.Find("dw"), nullptr);
  EXPECT_EQ(sampled.Find("dw")->verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(sampled.Find("dw")->elements, 384 * 40);

  // dY used as it came, without the cast to bf16.
  const Tensor uncast = GradInput(dy, w, /*cast=*/false);
  VerifyArgs wrong = args;
  wrong.candidates.clear();
  wrong.candidates["dx"] = uncast;
  const VerifyResult r = Verified(wrong);
  EXPECT_EQ(r.verdict, "outside_bounds");
  // With the cast, the same loop conforms.
  const Tensor cast = GradInput(dy, w, /*cast=*/true);
  wrong.candidates["dx"] = cast;
  EXPECT_TRUE(Verified(wrong).passed());
}

TEST_F(VerifyTest, AStreamedWeightGivesTheRegisteredOnesVerdictAndKeepsNothing) {
  const Tensor w = NormalBf16({72, 160}, 14);
  const Tensor x = NormalBf16({5, 160}, 15);
  const Tensor y = ReverseOrderLogits(x, w);
  const std::string handle = Register(w, "verify-streamed");
  const VerifyResult registered = Verified(LogitsArgs(handle, x, y));
  absl::StatusOr<std::vector<client::WeightInfo>> before = client().ListWeights();
  ASSERT_TRUE(before.ok());

  VerifyArgs streamed = LogitsArgs("", x, y);
  streamed.w = w;
  const VerifyResult r = Verified(streamed);
  EXPECT_EQ(r.verdict, registered.verdict);
  EXPECT_EQ(r.candidates[0].worst_bound_fraction, registered.candidates[0].worst_bound_fraction);
  EXPECT_EQ(r.inputs_xxh3, registered.inputs_xxh3);
  absl::StatusOr<std::vector<client::WeightInfo>> after = client().ListWeights();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), before->size());
}

TEST_F(VerifyTest, BadRequestsGetTheOperationsStatuses) {
  const Tensor w = NormalBf16({32, 64}, 16);
  const Tensor x = NormalBf16({4, 64}, 17);
  const std::string handle = Register(w, "verify-bad");
  const auto status = [](const VerifyArgs& args) { return client().Verify(args).status(); };
  const Tensor y = NormalFp32({4, 32}, 1);

  absl::Status s = status(LogitsArgs(handle, x, NormalFp32({32, 4}, 1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("y: expected shape [4, 32]"));

  s = status(LogitsArgs(handle, x, IntBf16({4, 32}, 1)));
  EXPECT_TRUE(s.ok()) << s;  // bf16 logits are a dtype logits can give

  VerifyArgs int_candidate = LogitsArgs(handle, x, y);
  Tensor ints(DType::kInt32, {4, 32});
  int_candidate.candidates["y"] = ints;
  s = status(int_candidate);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("y: expected dtype FP32 or BF16"));

  VerifyArgs unknown_name = LogitsArgs(handle, x, y);
  unknown_name.candidates["dx"] = unknown_name.candidates["y"];
  s = status(unknown_name);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'dx' is not an output of VERIFY_LOGITS"));

  s = status(LogitsArgs("w-0000000000000000-32x64", x, y));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);

  VerifyArgs both = LogitsArgs(handle, x, y);
  both.w = w;
  s = status(both);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("expected exactly one"));

  VerifyArgs no_candidates = LogitsArgs(handle, x, y);
  no_candidates.candidates.clear();
  s = status(no_candidates);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("candidates: expected at least one"));

  VerifyArgs no_dy;
  no_dy.operation = VerifyOperation::kBackward;
  no_dy.weight_handle = handle;
  no_dy.x = x;
  Tensor dx(DType::kFp32, {4, 64});
  no_dy.candidates["dx"] = dx;
  s = status(no_dy);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dy"));
}

// Targets in [0, v), every fifth one ignored (-100).
Tensor Targets(std::int64_t m, std::int64_t v) {
  Tensor t(DType::kInt64, {m});
  for (std::int64_t i = 0; i < m; ++i) {
    t.data<std::int64_t>()[i] = i % 5 == 4 ? -100 : (i * 37 + 11) % v;
  }
  return t;
}

// The cross-entropy of fp32 logits from the reverse-order sums, formed in
// double and rounded once: another implementation, within the bounds.
Tensor OtherCrossEntropyLoss(const Tensor& x, const Tensor& w, const Tensor& targets) {
  const Tensor y = ReverseOrderLogits(x, w);
  const std::int64_t m = y.dim(0), v = y.dim(1);
  Tensor loss(DType::kFp32, {m});
  for (std::int64_t i = 0; i < m; ++i) {
    const float* row = y.data<float>() + i * v;
    double mx = row[0];
    for (std::int64_t j = 1; j < v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
    const std::int64_t t = targets.data<std::int64_t>()[i];
    loss.data<float>()[i] = t < 0 ? 0.0f : static_cast<float>(mx + std::log(s) - row[t]);
  }
  return loss;
}

TEST_F(VerifyTest, CrossEntropyLossAndLseOfAnotherImplementationAndLogitdsOwn) {
  const Tensor w = NormalBf16({300, 256}, 31);
  const Tensor x = NormalBf16({20, 256}, 32);
  const Tensor targets = Targets(20, 300);
  std::optional<client::CrossEntropyResult> own;
  VerifyArgs args = OwnLossAndLse(w, x, targets, "verify-ce", &own);
  ASSERT_TRUE(own.has_value());
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  ASSERT_EQ(r.candidates.size(), 2u);
  for (const CandidateVerdict& c : r.candidates) {
    EXPECT_EQ(c.elements, 20) << c.name;
    EXPECT_EQ(c.shape, (std::vector<std::int64_t>{20})) << c.name;
  }

  // Another implementation's losses: within the bounds, not bitwise.
  const Tensor other = OtherCrossEntropyLoss(x, w, targets);
  args.candidates.erase("lse");
  args.candidates["loss"] = other;
  r = Verified(args);
  EXPECT_TRUE(r.passed()) << r.verdict;
  EXPECT_EQ(r.candidates[0].outside_bound, 0);

  // One token's loss off by 0.01: outside, named, with its reference.
  Tensor off = Copy(other);
  off.data<float>()[3] += 0.01f;
  args.candidates["loss"] = off;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
  ASSERT_EQ(r.candidates[0].first_outside.size(), 1u);
  EXPECT_EQ(r.candidates[0].first_outside[0].index, (std::vector<std::int64_t>{3}));
  EXPECT_NEAR(r.candidates[0].first_outside[0].reference, other.data<float>()[3], 1e-4);

  // An ignored token's loss is 0 exactly.
  Tensor ignored = Copy(own->loss);
  ignored.data<float>()[4] = 1e-30f;
  args.candidates["loss"] = ignored;
  EXPECT_EQ(Verified(args).verdict, "outside_bounds");
}

TEST_F(VerifyTest, CrossEntropyReducedLossIsOneElement) {
  const Tensor w = NormalBf16({100, 128}, 33);
  const Tensor x = NormalBf16({9, 128}, 34);
  const Tensor targets = Targets(9, 100);
  const std::string handle = Register(w, "verify-ce-mean");
  for (client::Reduction reduction : {client::Reduction::kMean, client::Reduction::kSum}) {
    client::CrossEntropyOptions o;
    o.reduction = reduction;
    o.z_loss = 1e-3f;
    o.logit_softcap = 15.0f;
    absl::StatusOr<client::CrossEntropyResult> own = client().CrossEntropy(x, targets, handle, o);
    ASSERT_TRUE(own.ok()) << own.status();
    VerifyArgs args = PerTokenArgs(VerifyOperation::kCrossEntropy, handle, x, targets);
    args.cross_entropy = o;
    args.candidates["loss"] = own->loss;
    const VerifyResult r = Verified(args);
    EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd") << client::ReductionName(reduction);
    ASSERT_EQ(r.candidates.size(), 1u);
    EXPECT_EQ(r.candidates[0].shape, (std::vector<std::int64_t>{1}));
  }
}

// The mean cross-entropy's dX and dW formed another way: fp32 logits summed
// in reverse order, the softmax in double, g = (p − onehot)/counted cast to
// bf16 once, then G·W and Gᵀ·X summed in fp32. `scale` multiplies g (1 for
// the mean; `counted` gives the sum's gradient by mistake).
std::pair<Tensor, Tensor> OtherCrossEntropyGradients(const Tensor& x, const Tensor& w,
                                                     const Tensor& targets, double scale) {
  const Tensor y = ReverseOrderLogits(x, w);
  const std::int64_t m = y.dim(0), v = y.dim(1), k = x.dim(1);
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < m; ++i) counted += targets.data<std::int64_t>()[i] >= 0;
  std::vector<float> g(static_cast<std::size_t>(m * v), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t t = targets.data<std::int64_t>()[i];
    if (t < 0) continue;
    const float* row = y.data<float>() + i * v;
    double mx = row[0], s = 0;
    for (std::int64_t j = 1; j < v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
    for (std::int64_t j = 0; j < v; ++j) {
      const double p = std::exp(row[j] - mx) / s;
      g[static_cast<std::size_t>(i * v + j)] =
          RoundToBf16(static_cast<float>((p - (j == t ? 1.0 : 0.0)) * scale / counted));
    }
  }
  Tensor dx(DType::kFp32, {m, k});
  Tensor dw(DType::kFp32, {v, k});
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t c = 0; c < k; ++c) {
      float s = 0;
      for (std::int64_t j = v - 1; j >= 0; --j) {
        s += g[static_cast<std::size_t>(i * v + j)] * Bf16ToFloat(w.data<Bf16Bits>()[j * k + c]);
      }
      dx.data<float>()[i * k + c] = s;
    }
  }
  for (std::int64_t j = 0; j < v; ++j) {
    for (std::int64_t c = 0; c < k; ++c) {
      float s = 0;
      for (std::int64_t i = m - 1; i >= 0; --i) {
        s += g[static_cast<std::size_t>(i * v + j)] * Bf16ToFloat(x.data<Bf16Bits>()[i * k + c]);
      }
      dw.data<float>()[j * k + c] = s;
    }
  }
  return {std::move(dx), std::move(dw)};
}

TEST_F(VerifyTest, CrossEntropyGradientsOfLogitdAndOfAnotherImplementation) {
  const Tensor w = NormalBf16({300, 96}, 41);
  const Tensor x = NormalBf16({20, 96}, 42);
  const Tensor targets = Targets(20, 300);
  const std::string handle = Register(w, "verify-ce-grads");
  client::CrossEntropyOptions o;
  o.reduction = client::Reduction::kMean;
  o.want_dx = true;
  o.want_dw = true;
  o.dx_dtype = DType::kFp32;
  absl::StatusOr<client::CrossEntropyResult> own = client().CrossEntropy(x, targets, handle, o);
  ASSERT_TRUE(own.ok()) << own.status();

  VerifyArgs args = PerTokenArgs(VerifyOperation::kCrossEntropy, handle, x, targets);
  args.cross_entropy = o;
  args.candidates["loss"] = own->loss;
  args.candidates["dx"] = *own->dx;
  args.candidates["dw"] = *own->dw;
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  ASSERT_NE(r.Find("dx"), nullptr);
  ASSERT_NE(r.Find("dw"), nullptr);
  EXPECT_EQ(r.Find("dx")->elements, 20 * 96);
  EXPECT_EQ(r.Find("dw")->elements, 300 * 96);
  EXPECT_EQ(r.Find("dw")->shape, (std::vector<std::int64_t>{300, 96}));

  // Another implementation: within the bounds.
  auto [dx, dw] = OtherCrossEntropyGradients(x, w, targets, 1.0);
  args.candidates.erase("loss");
  args.candidates["dx"] = dx;
  args.candidates["dw"] = dw;
  r = Verified(args);
  EXPECT_TRUE(r.passed()) << r.verdict;
  EXPECT_EQ(r.Find("dx")->outside_bound, 0);
  EXPECT_EQ(r.Find("dw")->outside_bound, 0);
  // Not bitwise logitd's, so the bound was used, and not trivially.
  EXPECT_GT(r.Find("dx")->worst_bound_fraction, 0.0);
  EXPECT_GT(r.Find("dw")->worst_bound_fraction, 0.0);
  std::cerr << "other dx worst " << r.Find("dx")->worst_bound_fraction << " dw worst "
            << r.Find("dw")->worst_bound_fraction << "\n";
  // The precision-class test of the gradients holds it too.
  for (const char* name : {"dx", "dw"}) {
    const auto& p = r.Find(name)->precision_class;
    EXPECT_TRUE(p.tested) << name << ": " << p.reason;
    EXPECT_FALSE(p.outside) << name << ": " << p.rms_ratio << " / " << p.threshold;
    EXPECT_GT(p.rms_ratio, 0.0) << name;
    EXPECT_NE(p.envelope.find("bf16(g)"), std::string::npos) << p.envelope;
  }

  // g 2% off (a count of tokens off by one in 50, say): both fail.
  {
    auto [dx_off, dw_off] = OtherCrossEntropyGradients(x, w, targets, 1.02);
    VerifyArgs off_args = args;
    off_args.candidates["dx"] = dx_off;
    off_args.candidates["dw"] = dw_off;
    const VerifyResult off_r = Verified(off_args);
    EXPECT_FALSE(off_r.Find("dx")->passed()) << off_r.Find("dx")->verdict;
    EXPECT_FALSE(off_r.Find("dw")->passed()) << off_r.Find("dw")->verdict;
  }

  // One element of dW 1% off: outside, named.
  Tensor off = Copy(dw);
  off.data<float>()[7 * 96 + 5] *= 1.01f;
  args.candidates["dw"] = off;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
  ASSERT_EQ(r.Find("dw")->first_outside.size(), 1u);
  EXPECT_EQ(r.Find("dw")->first_outside[0].index, (std::vector<std::int64_t>{7, 5}));
  EXPECT_EQ(r.Find("dx")->outside_bound, 0);

  // The sum's gradient passed off as the mean's: every dX element outside.
  auto [dx_sum, dw_sum] = OtherCrossEntropyGradients(x, w, targets, 16.0);
  args.candidates["dx"] = dx_sum;
  args.candidates["dw"] = dw_sum;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
  EXPECT_GT(r.Find("dx")->outside_bound, 20 * 96 / 2);

  // A bf16 dX: logitd's own is bitwise its own.
  o.dx_dtype = DType::kBf16;
  o.want_dw = false;
  own = client().CrossEntropy(x, targets, handle, o);
  ASSERT_TRUE(own.ok()) << own.status();
  args.cross_entropy = o;
  args.candidates.clear();
  args.candidates["dx"] = *own->dx;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(r.Find("dx")->dtype, DType::kBf16);
}

TEST_F(VerifyTest, LogProbsOwnOutputsAndAWrongTemperature) {
  const Tensor w = NormalBf16({400, 192}, 35);
  const Tensor x = NormalBf16({16, 192}, 36);
  const Tensor targets = Targets(16, 400);
  const std::string handle = Register(w, "verify-lp");
  client::LogProbsOptions o;
  o.temperature = 0.7f;
  o.want_lse = true;
  o.want_entropy = true;
  absl::StatusOr<client::LogProbsResult> own = client().LogProbs(x, &targets, handle, o);
  ASSERT_TRUE(own.ok()) << own.status();
  VerifyArgs args = PerTokenArgs(VerifyOperation::kLogProbs, handle, x, targets);
  args.logprobs = o;
  args.candidates["logprob"] = *own->logprob;
  args.candidates["lse"] = *own->lse;
  args.candidates["entropy"] = *own->entropy;
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(r.candidates.size(), 3u);

  // The same outputs judged as if computed at temperature 1: outside.
  args.logprobs.temperature = 1.0f;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
}

TEST_F(VerifyTest, LogProbsTopKAndRanksOfLogitdAndWrongOnes) {
  const Tensor w = NormalBf16({400, 192}, 41);
  const Tensor x = NormalBf16({12, 192}, 42);
  const Tensor targets = Targets(12, 400);
  const std::string handle = Register(w, "verify-lp-topk");
  client::LogProbsOptions o;
  o.top_k = 5;
  o.want_rank = true;
  absl::StatusOr<client::LogProbsResult> own = client().LogProbs(x, &targets, handle, o);
  ASSERT_TRUE(own.ok()) << own.status();
  VerifyArgs args = PerTokenArgs(VerifyOperation::kLogProbs, handle, x, targets);
  args.logprobs = o;
  args.candidates["topk_ids"] = *own->topk_ids;
  args.candidates["topk_logprobs"] = *own->topk_logprobs;
  args.candidates["rank"] = *own->rank;
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  ASSERT_EQ(r.candidates.size(), 3u);
  for (const client::CandidateVerdict& c : r.candidates)
    EXPECT_EQ(c.elements, c.name == "rank" ? 12 : 60) << c.name;

  // Ids as int64, ranks as int32: the same verdicts.
  Tensor ids64(DType::kInt64, {12, 5});
  Tensor rank32(DType::kInt32, {12});
  for (std::int64_t i = 0; i < 60; ++i) {
    ids64.data<std::int64_t>()[i] = own->topk_ids->data<std::int32_t>()[i];
  }
  for (std::int64_t i = 0; i < 12; ++i) {
    rank32.data<std::int32_t>()[i] = static_cast<std::int32_t>(own->rank->data<std::int64_t>()[i]);
  }
  args.candidates["topk_ids"] = ids64;
  args.candidates["rank"] = rank32;
  EXPECT_EQ(Verified(args).verdict, "bitwise_equal_to_logitd");

  // Row 3's first and last places swapped, an id repeated in row 7, one out
  // of the vocabulary in row 9: three elements outside, the first at [3, 0].
  Tensor ids = Copy(ids64);
  std::int64_t* id = ids.data<std::int64_t>();
  std::swap(id[3 * 5], id[3 * 5 + 4]);
  id[7 * 5 + 2] = id[7 * 5 + 1];
  id[9 * 5] = 400;
  args.candidates["topk_ids"] = ids;
  // Row 2's target counted one place too low, row 5's log-prob 0.01 high.
  Tensor rank = Copy(rank32);
  rank.data<std::int32_t>()[2] += 1;
  args.candidates["rank"] = rank;
  Tensor lps = Copy(*own->topk_logprobs);
  lps.data<float>()[5 * 5 + 1] += 0.01f;
  args.candidates["topk_logprobs"] = lps;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
  const client::CandidateVerdict* c = r.Find("topk_ids");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->outside_bound, 4);  // both swapped places, the repeat and the stranger
  EXPECT_EQ(c->nan_inf_mismatches, 2);
  ASSERT_FALSE(c->first_outside.empty());
  EXPECT_EQ(c->first_outside[0].index, (std::vector<std::int64_t>{3, 0}));
  EXPECT_EQ(c->first_outside[0].candidate, static_cast<double>(id[3 * 5]));
  EXPECT_EQ(c->first_outside[0].reference, static_cast<double>(id[3 * 5 + 4]));
  EXPECT_EQ(r.Find("rank")->outside_bound, 1);
  EXPECT_EQ(r.Find("rank")->first_outside[0].index, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(r.Find("topk_logprobs")->outside_bound, 1);
  EXPECT_EQ(r.Find("topk_logprobs")->first_outside[0].index, (std::vector<std::int64_t>{5, 1}));
}

TEST_F(VerifyTest, SampledRowsOfTheCrossEntropyAndLogProbs) {
  const Tensor w = NormalBf16({300, 96}, 43);
  const Tensor x = NormalBf16({20, 96}, 44);
  const Tensor targets = Targets(20, 300);
  const std::string handle = Register(w, "verify-sampled");
  // The mean's gradients: their scale counts every row, sampled or not.
  client::CrossEntropyOptions o;
  o.reduction = client::Reduction::kMean;
  o.want_lse = true;
  o.want_dx = true;
  o.dx_dtype = DType::kFp32;
  absl::StatusOr<client::CrossEntropyResult> own = client().CrossEntropy(x, targets, handle, o);
  ASSERT_TRUE(own.ok()) << own.status();
  VerifyArgs args = PerTokenArgs(VerifyOperation::kCrossEntropy, handle, x, targets);
  args.cross_entropy = o;
  args.sample_rows = 3;
  args.candidates["lse"] = *own->lse;
  Tensor dx = Copy(*own->dx);
  // Row 5 is not among the rows checked (0, 9, 19): a wrong value there
  // goes unseen; one in row 9 is named.
  dx.data<float>()[5 * 96 + 1] += 1.0f;
  args.candidates["dx"] = dx;
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.rows_checked, (std::vector<std::int64_t>{0, 9, 19}));
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd_sampled");
  EXPECT_EQ(r.Find("dx")->verdict, "bitwise_equal_to_logitd_sampled");
  EXPECT_EQ(r.Find("lse")->elements, 3);
  EXPECT_EQ(r.Find("dx")->elements, 3 * 96);
  dx.data<float>()[9 * 96 + 2] += 0.01f;
  r = Verified(args);
  EXPECT_EQ(r.verdict, "outside_bounds");
  ASSERT_FALSE(r.Find("dx")->first_outside.empty());
  EXPECT_EQ(r.Find("dx")->first_outside[0].index, (std::vector<std::int64_t>{9, 2}));
  // A reduced loss needs every row.
  args.candidates["loss"] = own->loss;
  absl::Status s = client().Verify(args).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'loss' sums every row"));

  // LogProbs' per-token outputs, row 0's log-prob off.
  client::LogProbsOptions lo;
  lo.want_lse = true;
  absl::StatusOr<client::LogProbsResult> lp = client().LogProbs(x, &targets, handle, lo);
  ASSERT_TRUE(lp.ok()) << lp.status();
  VerifyArgs la = PerTokenArgs(VerifyOperation::kLogProbs, handle, x, targets);
  la.logprobs = lo;
  la.sample_rows = 3;
  la.candidates["lse"] = *lp->lse;
  Tensor logprob = Copy(*lp->logprob);
  la.candidates["logprob"] = logprob;
  EXPECT_EQ(Verified(la).verdict, "bitwise_equal_to_logitd_sampled");
  logprob.data<float>()[0] += 0.01f;
  r = Verified(la);
  EXPECT_EQ(r.verdict, "outside_bounds");
  EXPECT_EQ(r.Find("logprob")->first_outside[0].index, (std::vector<std::int64_t>{0}));

  // A seeded sample of one row: that row's value against that row's
  // reference (not row 0's), for both operations, and a wrong value there
  // named at its row.
  logprob.data<float>()[0] -= 0.01f;
  std::vector<std::int64_t> rows_seen;
  for (VerifyArgs* a : {&args, &la}) {
    a->candidates.erase("loss");
    a->candidates.erase("dx");
    a->sample_rows = 1;
    for (const std::uint64_t seed : {5u, 6u, 7u}) {
      a->sample_seed = seed;
      r = Verified(*a);
      ASSERT_EQ(r.rows_checked.size(), 1u);
      const std::int64_t row = r.rows_checked[0];
      rows_seen.push_back(row);
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", row " << row);
      EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd_sampled");
      EXPECT_EQ(r.Find("lse")->elements, 1);
      Tensor lse = Copy(a == &args ? *own->lse : *lp->lse);
      lse.data<float>()[row] += 0.01f;
      a->candidates["lse"] = lse;
      r = Verified(*a);
      EXPECT_EQ(r.verdict, "outside_bounds");
      ASSERT_FALSE(r.Find("lse")->first_outside.empty());
      EXPECT_EQ(r.Find("lse")->first_outside[0].index, (std::vector<std::int64_t>{row}));
      a->candidates["lse"] = a == &args ? *own->lse : *lp->lse;
    }
  }
  EXPECT_GT(*std::max_element(rows_seen.begin(), rows_seen.end()), 0);
}

// More tokens than the per-token outputs' precision-class test takes
// (512): it draws 512 of them (counted targets first), says how many it drew
// from, draws the same ones for the same inputs, and the proven bound still
// holds every token.
TEST_F(VerifyTest, ThePerTokenClassTestDrawsAtMost512Tokens) {
  const std::int64_t m = 700;
  const Tensor w = NormalBf16({200, 64}, 45);
  const Tensor x = NormalBf16({m, 64}, 46);
  const Tensor targets = Targets(m, 200);  // 560 counted
  std::optional<client::CrossEntropyResult> own;
  VerifyArgs args = OwnLossAndLse(w, x, targets, "verify-class-draw", &own);
  ASSERT_TRUE(own.has_value());
  const std::string handle = args.weight_handle;
  VerifyResult r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  for (const char* name : {"loss", "lse"}) {
    const CandidateVerdict* c = r.Find(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->elements, m) << name;
    EXPECT_TRUE(c->precision_class.tested) << name;
    EXPECT_EQ(c->precision_class.drawn_from, m) << name;
    EXPECT_EQ(c->precision_class.rows, 512) << name;
  }
  const double rms = r.Find("loss")->precision_class.rms_ratio;
  EXPECT_EQ(Verified(args).Find("loss")->precision_class.rms_ratio, rms) << "the same draw";

  // Every token is still held to its proven bound: each of a few, off by
  // 0.01, is found whether the draw took it or not.
  for (const std::int64_t i : {0, 1, 2, 3, 5, 6, 7, 8, 698}) {
    Tensor off = Copy(own->loss);
    off.data<float>()[i] += 0.01f;
    args.candidates["loss"] = off;
    r = Verified(args);
    EXPECT_EQ(r.verdict, "outside_bounds") << i;
    ASSERT_FALSE(r.Find("loss")->first_outside.empty()) << i;
    EXPECT_EQ(r.Find("loss")->first_outside[0].index, (std::vector<std::int64_t>{i}));
  }

  // LogProbs draws as the cross-entropy does; 64 tokens are all tested.
  client::LogProbsOptions lo;
  absl::StatusOr<client::LogProbsResult> lp = client().LogProbs(x, &targets, handle, lo);
  ASSERT_TRUE(lp.ok()) << lp.status();
  VerifyArgs la = PerTokenArgs(VerifyOperation::kLogProbs, handle, x, targets);
  la.logprobs = lo;
  la.candidates["logprob"] = *lp->logprob;
  r = Verified(la);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(r.Find("logprob")->precision_class.drawn_from, m);
  EXPECT_EQ(r.Find("logprob")->precision_class.rows, 512);
  args.candidates.erase("lse");
  args.x = FirstRows(x, 64);
  args.targets = FirstRows(targets, 64);
  args.candidates["loss"] = FirstRows(own->loss, 64);
  r = Verified(args);
  EXPECT_EQ(r.verdict, "bitwise_equal_to_logitd");
  EXPECT_EQ(r.Find("loss")->precision_class.drawn_from, 0);
  EXPECT_EQ(r.Find("loss")->precision_class.rows, 64 - 64 / 5);
}

TEST_F(VerifyTest, CrossEntropyAndLogProbsBadRequests) {
  const Tensor w = NormalBf16({50, 64}, 37);
  const Tensor x = NormalBf16({4, 64}, 38);
  const Tensor targets = Targets(4, 50);
  const std::string handle = Register(w, "verify-ce-bad");
  VerifyArgs args;
  args.operation = VerifyOperation::kCrossEntropy;
  args.weight_handle = handle;
  args.x = x;
  args.cross_entropy.reduction = client::Reduction::kNone;
  const Tensor loss(DType::kFp32, {4});
  args.candidates["loss"] = loss;
  absl::Status s = client().Verify(args).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("targets"));
  args.targets = targets;
  const Tensor dw_bf16(DType::kBf16, {50, 64});
  args.candidates["dw"] = dw_bf16;
  s = client().Verify(args).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dw: expected dtype FP32"));
  args.candidates.erase("dw");
  const Tensor dx_wrong(DType::kFp32, {4, 50});
  args.candidates["dx"] = dx_wrong;
  s = client().Verify(args).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dx: expected shape [4, 64]"));
  args.candidates.erase("dx");
  Tensor bad_targets = Copy(targets);
  bad_targets.data<std::int64_t>()[2] = 50;
  args.targets = bad_targets;
  s = client().Verify(args).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("targets[2] = 50"));
}

}  // namespace
}  // namespace logitd::testing

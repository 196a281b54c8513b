// The logprobs suite's checks, without a server: an fp32 emulation of
// LogProbs (fp32 logits and z, an fp64 log-sum-exp of them) must pass them,
// and each deliberately wrong variant of it must fail the check meant to
// catch it. Also: the suite is registered under its name and runs before
// golden and determinism.
#include "client/validate/logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "client/validate/random.h"
#include "client/validate/suites.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

enum class Doctor {
  kNone,
  kLseOff,          // lse (and so the log-probs) off by 1e-2
  kEntropyOff,      // entropy 1% too high
  kIgnoredNegZero,  // ignored tokens' logprob −0
  kTopKSwap,        // the first two top-k places swapped
  kTiesToHigherId,  // ties broken to the higher id
  kRankOff,         // every counted rank 10 too high
  kBf16Logits,      // logits rounded to bf16 first
};

// LogProbs as a straightforward fp32 server would compute it.
client::LogProbsResult Emulate(const Tensor& x, const Tensor& w, const LpRequest& rq,
                               Doctor doctor = Doctor::kNone) {
  const std::int64_t m = x.dim(0), k = x.dim(1);
  const std::int64_t v = rq.vocab_size > 0 ? rq.vocab_size : w.dim(0);
  const std::int64_t top = rq.top_k;
  client::LogProbsResult res;
  res.logprob.emplace(DType::kFp32, std::vector<std::int64_t>{m});
  res.lse.emplace(DType::kFp32, std::vector<std::int64_t>{m});
  res.entropy.emplace(DType::kFp32, std::vector<std::int64_t>{m});
  res.topk_ids.emplace(DType::kInt32, std::vector<std::int64_t>{m, top});
  res.topk_logprobs.emplace(DType::kFp32, std::vector<std::int64_t>{m, top});
  res.rank.emplace(DType::kInt64, std::vector<std::int64_t>{m});
  std::vector<float> z(static_cast<std::size_t>(v));
  std::vector<std::int64_t> ids(z.size());
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      float y = 0;
      for (std::int64_t c = 0; c < k; ++c) {
        y += static_cast<float>(x.At(i * k + c)) * static_cast<float>(w.At(j * k + c));
      }
      if (doctor == Doctor::kBf16Logits) y = RoundToBf16(y);
      float zj = y;
      if (rq.logit_softcap > 0) zj = rq.logit_softcap * std::tanh(y / rq.logit_softcap);
      z[static_cast<std::size_t>(j)] = zj / rq.temperature;
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0, zs = 0;
    for (float zj : z) s += std::exp(zj - mx), zs += std::exp(zj - mx) * (zj - mx);
    const double lse = mx + std::log(s) + (doctor == Doctor::kLseOff ? 1e-2 : 0.0);
    const double h = (std::log(s) - zs / s) * (doctor == Doctor::kEntropyOff ? 1.01 : 1.0);
    res.lse->data<float>()[i] = static_cast<float>(lse);
    res.entropy->data<float>()[i] = static_cast<float>(h);
    const bool higher = doctor == Doctor::kTiesToHigherId;
    auto before = [&](std::int64_t a, std::int64_t b) {
      const float za = z[static_cast<std::size_t>(a)], zb = z[static_cast<std::size_t>(b)];
      return za != zb ? za > zb : (higher ? a > b : a < b);
    };
    std::iota(ids.begin(), ids.end(), std::int64_t{0});
    std::sort(ids.begin(), ids.end(), before);
    if (doctor == Doctor::kTopKSwap) std::swap(ids[0], ids[1]);
    for (std::int64_t p = 0; p < top; ++p) {
      const std::int64_t id = ids[static_cast<std::size_t>(p)];
      res.topk_ids->data<std::int32_t>()[i * top + p] = static_cast<std::int32_t>(id);
      res.topk_logprobs->data<float>()[i * top + p] =
          static_cast<float>(z[static_cast<std::size_t>(id)] - lse);
    }
    if (rq.Ignored(i)) {
      res.logprob->data<float>()[i] = doctor == Doctor::kIgnoredNegZero ? -0.0f : 0.0f;
      res.rank->data<std::int64_t>()[i] = -1;
      continue;
    }
    const std::int64_t t = rq.targets[static_cast<std::size_t>(i)];
    res.logprob->data<float>()[i] = static_cast<float>(z[static_cast<std::size_t>(t)] - lse);
    std::int64_t rank = 0;
    for (std::int64_t j = 0; j < v; ++j) rank += j != t && before(j, t) ? 1 : 0;
    res.rank->data<std::int64_t>()[i] = rank + (doctor == Doctor::kRankOff ? 10 : 0);
  }
  return res;
}

std::string Failures(const CaseResult& r) { return absl::StrJoin(r.failures, "\n"); }

class LogProbsCheckTest : public ::testing::Test {
 protected:
  // Normal data, logits of standard deviation about 3.
  void SetUp() override {
    Rng rng = Rng::Stream(7, "logprobs_test");
    x_ = RandomNormal(DType::kBf16, {12, 200}, 1.0, rng);
    w_ = RandomNormal(DType::kBf16, {301, 200}, 3.0 / std::sqrt(200.0), rng);
    rq_.temperature = 0.7f;
    rq_.logit_softcap = 30.0f;
    rq_.vocab_size = 290;
    rq_.top_k = 8;
    for (std::int64_t i = 0; i < 12; ++i) rq_.targets.push_back(i % 5 == 3 ? -100 : 17 * i + 3);
    ref_ = ComputeLogProbsReference(x_, w_, rq_);
  }

  // Runs the check on a doctored emulation; returns its failures.
  std::string Check(Doctor doctor, const LpReference& ref, const LpRequest& rq, const Tensor& x,
                    const Tensor& w) {
    CaseResult r;
    CheckLogProbs(ref, rq, Emulate(x, w, rq, doctor), r, "lp");
    return Failures(r);
  }
  std::string Check(Doctor doctor) { return Check(doctor, ref_, rq_, x_, w_); }

  Tensor x_, w_;
  LpRequest rq_;
  LpReference ref_;
};

TEST_F(LogProbsCheckTest, Fp32EmulationPasses) {
  CaseResult r;
  const LpErrors e = CheckLogProbs(ref_, rq_, Emulate(x_, w_, rq_), r, "lp");
  EXPECT_TRUE(r.failures.empty()) << Failures(r);
  EXPECT_EQ(e.violations, 0);
  EXPECT_EQ(e.topk_places, 12 * 8);
  // Logits of spread 3 leave most places decided.
  EXPECT_GT(e.topk_decided, e.topk_places / 2);
  EXPECT_LT(e.lse_worst_fraction, 1.0);
  EXPECT_TRUE(r.figures.contains("lp")) << r.figures.dump();
}

TEST_F(LogProbsCheckTest, EachWrongVariantFailsItsCheck) {
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kLseOff), "lp lse:")) << Check(Doctor::kLseOff);
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kLseOff), "lp logprob:"));
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kEntropyOff), "lp entropy:"));
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kIgnoredNegZero), "ignored tokens are not +0"));
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kTopKSwap), "decided places differ"))
      << Check(Doctor::kTopKSwap);
  EXPECT_TRUE(absl::StrContains(Check(Doctor::kRankOff), "lp rank:")) << Check(Doctor::kRankOff);
  const std::string bf16 = Check(Doctor::kBf16Logits);
  EXPECT_TRUE(absl::StrContains(bf16, "lp logprob:")) << bf16;
}

// Integer data: exact logits with ties, which must go to the lower id.
TEST_F(LogProbsCheckTest, ExactDataComparesIdsAndRanksExactly) {
  Rng rng = Rng::Stream(7, "logprobs_test/exact");
  const Tensor x = RandomIntegers(DType::kBf16, {9, 8}, -2, 2, rng);
  const Tensor w = RandomIntegers(DType::kBf16, {97, 8}, -2, 2, rng);
  LpRequest rq;
  rq.temperature = 2.0f;
  rq.top_k = 20;
  for (std::int64_t i = 0; i < 9; ++i) rq.targets.push_back(i == 4 ? -100 : 11 * i);
  const LpReference ref = ComputeLogProbsReference(x, w, rq, LogitModel::kExact);
  ASSERT_TRUE(ref.exact);
  EXPECT_EQ(Check(Doctor::kNone, ref, rq, x, w), "");
  const std::string ties = Check(Doctor::kTiesToHigherId, ref, rq, x, w);
  EXPECT_TRUE(absl::StrContains(ties, "decided places differ")) << ties;
  EXPECT_TRUE(absl::StrContains(ties, "lp rank:")) << ties;
}

TEST(LogProbsSuiteTest, IsRegisteredBeforeGoldenAndDeterminism) {
  const std::vector<std::string>& names = AllSuiteNames();
  const auto at = std::find(names.begin(), names.end(), "logprobs");
  ASSERT_NE(at, names.end());
  EXPECT_LT(at, std::find(names.begin(), names.end(), "golden"));
  EXPECT_LT(at, std::find(names.begin(), names.end(), "determinism"));
  ASSERT_NE(MakeSuite("logprobs"), nullptr);
  EXPECT_EQ(MakeSuite("logprobs")->name(), "logprobs");
  Options quick;
  quick.quick = true;
  std::vector<std::string> cases;
  for (const Case& c : MakeSuite("logprobs")->Cases(quick)) cases.push_back(c.name);
  EXPECT_EQ(cases, (std::vector<std::string>{"bounds", "bounds_scaled_capped", "exact",
                                             "cross_entropy_bitwise", "bf16_head_mismatch"}));
}

}  // namespace
}  // namespace logitd::validate

// The cross_entropy suite's checks, without a server: an fp32 emulation of
// the fused cross-entropy (the formulas of logitd.v1.CrossEntropyHeader, in
// the plainest order) must pass them, and each deliberately wrong variant
// of it (a missing or wrong cast, a forgotten factor, an off lse, bf16
// logits, a flipped bit) must fail the check meant to catch it.
#include "client/validate/cross_entropy.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "client/validate/random.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

enum class Doctor {
  kNone,
  kNoCast,             // G kept in fp32
  kTruncate,           // G cut to bf16 towards zero
  kCastBeforeScale,    // bf16(dL/dy), then times the scale
  kNoZLossInGrad,      // dL/dz without the (1 + 2 z_loss lse) factor
  kNoSoftcapFactor,    // dL/dy without (1 - (z/cap)^2)
  kMeanOverAllTokens,  // mean's scale divided by M instead of the counted tokens
  kLseOff,             // lse (and so the loss) off by 1e-3 relative
  kIgnoredLoss,        // ignored tokens get lse as their loss
  kBf16Logits,         // logits rounded to bf16 before anything else
  kDxBit,              // lowest bit of dX[0] flipped
};

// The fused cross-entropy in fp32, as a straightforward server would do it.
client::CrossEntropyResult Emulate(const Tensor& x, const Tensor& w, const CeRequest& rq,
                                   const CeWants& wants, Doctor doctor = Doctor::kNone) {
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  const float cap = rq.logit_softcap;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < m; ++i) counted += rq.Ignored(i) ? 0 : 1;
  float scale = rq.grad_scale;
  if (rq.reduction == client::Reduction::kMean) {
    scale = rq.grad_scale / static_cast<float>(doctor == Doctor::kMeanOverAllTokens
                                                   ? m
                                                   : std::max<std::int64_t>(counted, 1));
  }
  std::vector<float> g(static_cast<std::size_t>(m * v));
  std::vector<float> loss(static_cast<std::size_t>(m)), lse(static_cast<std::size_t>(m));
  std::vector<float> z(static_cast<std::size_t>(v)), f(z.size());
  for (std::int64_t i = 0; i < m; ++i) {
    float mx = -INFINITY;
    for (std::int64_t j = 0; j < v; ++j) {
      float y = 0;
      for (std::int64_t c = 0; c < k; ++c) {
        y += static_cast<float>(x.At(i * k + c)) * static_cast<float>(w.At(j * k + c));
      }
      if (doctor == Doctor::kBf16Logits) y = RoundToBf16(y);
      float zj = y, fj = 1;
      if (cap > 0) {
        const float t = std::tanh(y / cap);
        zj = cap * t;
        fj = (1 - t) * (1 + t);
      }
      z[static_cast<std::size_t>(j)] = zj;
      f[static_cast<std::size_t>(j)] = fj;
      mx = std::max(mx, zj);
    }
    float s = 0;
    for (float zj : z) s += std::exp(zj - mx);
    float l = mx + std::log(s);
    if (doctor == Doctor::kLseOff) l *= 1.001f;
    lse[static_cast<std::size_t>(i)] = l;
    const std::int64_t t = rq.targets[static_cast<std::size_t>(i)];
    const bool ignored = rq.Ignored(i);
    loss[static_cast<std::size_t>(i)] =
        ignored ? (doctor == Doctor::kIgnoredLoss ? l : 0.0f)
                : l - z[static_cast<std::size_t>(t)] + rq.z_loss * l * l;
    const float coef = doctor == Doctor::kNoZLossInGrad ? 1.0f : 1 + 2 * rq.z_loss * l;
    for (std::int64_t j = 0; j < v; ++j) {
      float d = 0;
      if (!ignored) {
        d = std::exp(z[static_cast<std::size_t>(j)] - l) * coef - (j == t ? 1.0f : 0.0f);
        if (cap > 0 && doctor != Doctor::kNoSoftcapFactor) d *= f[static_cast<std::size_t>(j)];
        if (doctor != Doctor::kCastBeforeScale) d *= scale;
      }
      float gj = RoundToBf16(d);
      if (doctor == Doctor::kNoCast) gj = d;
      if (doctor == Doctor::kTruncate) gj = BitsToFloat(FloatBits(d) & 0xffff0000u);
      if (doctor == Doctor::kCastBeforeScale) gj *= scale;
      g[static_cast<std::size_t>(i * v + j)] = gj;
    }
  }
  client::CrossEntropyResult out;
  out.counted_tokens = counted;
  if (rq.reduction == client::Reduction::kNone) {
    out.loss = Tensor(DType::kFp32, {m});
    std::memcpy(out.loss.bytes(), loss.data(), out.loss.nbytes());
  } else {
    float sum = 0;
    for (std::int64_t i = 0; i < m; ++i) sum += loss[static_cast<std::size_t>(i)];
    out.loss = Tensor(DType::kFp32, {1});
    out.loss.data<float>()[0] = rq.reduction == client::Reduction::kSum
                                    ? sum
                                    : (counted > 0 ? sum / static_cast<float>(counted) : NAN);
  }
  if (wants.lse) {
    out.lse = Tensor(DType::kFp32, {m});
    std::memcpy(out.lse->bytes(), lse.data(), out.lse->nbytes());
  }
  if (wants.dx) {
    std::vector<float> dx(static_cast<std::size_t>(m * k), 0.0f);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < v; ++j) {
        const float gij = g[static_cast<std::size_t>(i * v + j)];
        for (std::int64_t c = 0; c < k; ++c) {
          dx[static_cast<std::size_t>(i * k + c)] += gij * static_cast<float>(w.At(j * k + c));
        }
      }
    }
    if (doctor == Doctor::kDxBit) dx[0] = BitsToFloat(FloatBits(dx[0]) ^ 1u);
    out.dx = Tensor(wants.dx_dtype, {m, k});
    for (std::int64_t i = 0; i < m * k; ++i) {
      if (wants.dx_dtype == DType::kFp32) {
        out.dx->data<float>()[i] = dx[static_cast<std::size_t>(i)];
      } else {
        out.dx->data<Bf16Bits>()[i] = FloatToBf16(dx[static_cast<std::size_t>(i)]);
      }
    }
  }
  if (wants.dw) {
    out.dw = Tensor(DType::kFp32, {v, k});
    float* dw = out.dw->data<float>();
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < v; ++j) {
        const float gij = g[static_cast<std::size_t>(i * v + j)];
        for (std::int64_t c = 0; c < k; ++c) {
          dw[j * k + c] += gij * static_cast<float>(x.At(i * k + c));
        }
      }
    }
  }
  return out;
}

std::string Failures(const CaseResult& r) { return absl::StrJoin(r.failures, "\n"); }

bool Mentions(const CaseResult& r, const std::string& what) {
  for (const std::string& f : r.failures) {
    if (absl::StrContains(f, what)) return true;
  }
  return false;
}

struct Normal {
  Tensor x, w;
  CeRequest rq;
};

Normal MakeNormal(float z_loss, float softcap, double logit_std, client::Reduction reduction) {
  constexpr std::int64_t m = 12, k = 64, v = 384;
  Rng rng(77);
  Normal n;
  n.x = RandomNormal(DType::kBf16, {m, k}, 1.0, rng);
  n.w = RandomNormal(DType::kBf16, {v, k}, logit_std / 8.0, rng);
  n.rq.targets.resize(m);
  for (std::int64_t i = 0; i < m; ++i) {
    n.rq.targets[static_cast<std::size_t>(i)] = i % 5 == 4 ? -100 : rng.UniformInt(0, v - 1);
  }
  n.rq.z_loss = z_loss;
  n.rq.logit_softcap = softcap;
  n.rq.reduction = reduction;
  n.rq.grad_scale = 0.75f;
  return n;
}

constexpr CeWants kAll{true, true, true, DType::kFp32};

CaseResult Check(const Normal& n, Doctor doctor, const CeWants& wants = kAll) {
  CaseResult r;
  const CeReference ref = ComputeReference(n.x, n.w, n.rq);
  const client::CrossEntropyResult got = Emulate(n.x, n.w, n.rq, wants, doctor);
  CheckAgainstReference(ref, n.rq, n.x, n.w, got, wants, r, "t");
  return r;
}

TEST(CrossEntropyCheckTest, Fp32EmulationPassesEveryReduction) {
  for (client::Reduction red :
       {client::Reduction::kNone, client::Reduction::kSum, client::Reduction::kMean}) {
    for (const auto& [zl, cap, std] :
         {std::tuple{0.0f, 0.0f, 2.0}, std::tuple{1e-3f, 0.0f, 2.0}, std::tuple{0.0f, 10.0f, 8.0},
          std::tuple{1e-4f, 15.0f, 6.0}}) {
      const Normal n = MakeNormal(zl, cap, std, red);
      const CaseResult r = Check(n, Doctor::kNone);
      EXPECT_TRUE(r.failures.empty()) << Failures(r);
      const CaseResult b = Check(n, Doctor::kNone, {true, true, false, DType::kBf16});
      EXPECT_TRUE(b.failures.empty()) << Failures(b);
    }
  }
}

TEST(CrossEntropyCheckTest, ReductionsAgreeWithPerTokenLosses) {
  Normal n = MakeNormal(1e-3f, 0.0f, 2.0, client::Reduction::kNone);
  const client::CrossEntropyResult none = Emulate(n.x, n.w, n.rq, {});
  for (client::Reduction red : {client::Reduction::kSum, client::Reduction::kMean}) {
    n.rq.reduction = red;
    client::CrossEntropyResult reduced = Emulate(n.x, n.w, n.rq, {});
    CaseResult r;
    CheckReductionConsistency(none.loss, reduced, red, none.counted_tokens, r, "c");
    EXPECT_TRUE(r.failures.empty()) << Failures(r);
    // A sum that lost one token's loss.
    reduced.loss.data<float>()[0] -=
        none.loss.data<float>()[0] / (red == client::Reduction::kMean ? none.counted_tokens : 1);
    CaseResult bad;
    CheckReductionConsistency(none.loss, reduced, red, none.counted_tokens, bad, "c");
    EXPECT_TRUE(Mentions(bad, "per-token losses")) << Failures(bad);
  }
}

TEST(CrossEntropyCheckTest, DoctoredResultsFail) {
  struct Expect {
    Doctor doctor;
    float z_loss, softcap;
    double logit_std;
    client::Reduction reduction;
    const char* message;
  };
  const Expect expects[] = {
      {Doctor::kNoZLossInGrad, 1e-2f, 0, 2.0, client::Reduction::kNone, "dX fp32"},
      {Doctor::kNoZLossInGrad, 1e-2f, 0, 2.0, client::Reduction::kNone, "dW fp32"},
      {Doctor::kNoSoftcapFactor, 0, 10, 8.0, client::Reduction::kNone, "dX fp32"},
      {Doctor::kMeanOverAllTokens, 0, 0, 2.0, client::Reduction::kMean, "dW fp32"},
      {Doctor::kLseOff, 0, 0, 2.0, client::Reduction::kNone, "lse"},
      {Doctor::kLseOff, 0, 0, 2.0, client::Reduction::kNone, "loss"},
      {Doctor::kIgnoredLoss, 0, 0, 2.0, client::Reduction::kNone, "ignored tokens is not 0"},
      {Doctor::kIgnoredLoss, 0, 0, 2.0, client::Reduction::kSum, "loss"},
  };
  for (const Expect& e : expects) {
    const Normal n = MakeNormal(e.z_loss, e.softcap, e.logit_std, e.reduction);
    const CaseResult r = Check(n, e.doctor);
    EXPECT_TRUE(Mentions(r, e.message)) << "doctor " << static_cast<int>(e.doctor)
                                        << ": no failure mentions '" << e.message << "' in:\n"
                                        << Failures(r);
  }
}

TEST(CrossEntropyCheckTest, Bf16LogitsAreTold) {
  const Normal n = MakeNormal(0, 0, 2.0, client::Reduction::kNone);
  const CeReference ref = ComputeReference(n.x, n.w, n.rq);
  const CeReference ref16 = ComputeReference(n.x, n.w, n.rq, LogitModel::kBf16Rounded);
  const CeWants lse{true, false, false, DType::kBf16};
  CaseResult good;
  CheckFp32LogitsShow(ref, ref16, Emulate(n.x, n.w, n.rq, lse), n.rq, 50, good, "b");
  EXPECT_TRUE(good.failures.empty()) << Failures(good);
  CaseResult bad;
  CheckFp32LogitsShow(ref, ref16, Emulate(n.x, n.w, n.rq, lse, Doctor::kBf16Logits), n.rq, 50, bad,
                      "b");
  EXPECT_TRUE(Mentions(bad, "bf16-rounded logits")) << Failures(bad);
}

TEST(CrossEntropyCheckTest, Bf16RoundingIsDecidedOnlyAwayFromBoundaries) {
  float rounded = 0;
  EXPECT_TRUE(Bf16RoundingIsDecided(1.0, 1e-6, &rounded));
  EXPECT_EQ(rounded, 1.0f);
  // 1/3 rounds up (its next bits are 1010...); truncation would round down.
  EXPECT_TRUE(Bf16RoundingIsDecided(1.0 / 3, 1e-7, &rounded));
  EXPECT_EQ(FloatToBf16(rounded), 0x3eab);
  // The midpoint between 1 and 1 + 2^-7, and values just around it.
  EXPECT_FALSE(Bf16RoundingIsDecided(1 + 0x1p-8, 1e-9, &rounded));
  EXPECT_FALSE(Bf16RoundingIsDecided(1 + 0x1p-8 + 1e-9, 2e-9, &rounded));
  EXPECT_TRUE(Bf16RoundingIsDecided(1 + 0x1p-8 + 1e-6, 1e-7, &rounded));
  EXPECT_EQ(rounded, 1 + 0x1p-7f);
  EXPECT_TRUE(Bf16RoundingIsDecided(0.0, 0.0, &rounded));
  EXPECT_EQ(rounded, 0.0f);
}

struct Exact {
  ExactData data;
  CeRequest rq;
  ExactGradients want;
};

Exact MakeExact(client::Reduction reduction, float grad_scale, float z_loss, float softcap) {
  Exact e;
  e.rq.reduction = reduction;
  e.rq.grad_scale = grad_scale;
  e.rq.z_loss = z_loss;
  e.rq.logit_softcap = softcap;
  absl::StatusOr<ExactData> d = MakeExactData(99, "test", 16, 96, 32, &e.rq);
  EXPECT_TRUE(d.ok()) << d.status();
  e.data = *std::move(d);
  const CeReference ref = ComputeReference(e.data.x, e.data.w, e.rq, LogitModel::kExact);
  absl::StatusOr<ExactGradients> want = PredictExactGradients(ref, e.data.x, e.data.w);
  EXPECT_TRUE(want.ok()) << want.status();
  e.want = *std::move(want);
  return e;
}

CaseResult CheckExact(const Exact& e, Doctor doctor, const CeWants& wants) {
  CaseResult r;
  CheckExactGradients(e.want, Emulate(e.data.x, e.data.w, e.rq, wants, doctor), wants, r, "x");
  return r;
}

TEST(CrossEntropyCheckTest, ExactGradientsCatchEveryCastMistake) {
  const CeWants fp32{false, true, true, DType::kFp32};
  const CeWants bf16{false, true, false, DType::kBf16};
  for (const Exact& e : {MakeExact(client::Reduction::kSum, 1.0f, 0, 0),
                         MakeExact(client::Reduction::kMean, 2.0f, 1e-3f, 20.0f)}) {
    int ignored = 0;
    for (std::size_t i = 0; i < e.rq.targets.size(); ++i) ignored += e.rq.Ignored(i) ? 1 : 0;
    EXPECT_GT(ignored, 0);
    const CaseResult clean = CheckExact(e, Doctor::kNone, fp32);
    EXPECT_TRUE(clean.failures.empty()) << Failures(clean);
    const CaseResult clean16 = CheckExact(e, Doctor::kNone, bf16);
    EXPECT_TRUE(clean16.failures.empty()) << Failures(clean16);
    // And the loss from exact logits sits inside its (tight) bound.
    CaseResult loss;
    CeRequest none = e.rq;
    none.reduction = client::Reduction::kNone;
    CheckAgainstReference(ComputeReference(e.data.x, e.data.w, none, LogitModel::kExact), none,
                          e.data.x, e.data.w,
                          Emulate(e.data.x, e.data.w, none, {true, false, false, DType::kBf16}),
                          {true, false, false, DType::kBf16}, loss, "l");
    EXPECT_TRUE(loss.failures.empty()) << Failures(loss);
    for (Doctor d : {Doctor::kNoCast, Doctor::kTruncate, Doctor::kDxBit}) {
      const CaseResult r = CheckExact(e, d, fp32);
      EXPECT_TRUE(Mentions(r, "dX fp32 differs")) << static_cast<int>(d) << "\n" << Failures(r);
    }
    for (Doctor d : {Doctor::kNoCast, Doctor::kTruncate}) {
      const CaseResult r = CheckExact(e, d, fp32);
      EXPECT_TRUE(Mentions(r, "dW fp32 differs")) << static_cast<int>(d) << "\n" << Failures(r);
    }
    if (e.rq.reduction == client::Reduction::kMean) {
      const CaseResult r = CheckExact(e, Doctor::kCastBeforeScale, fp32);
      EXPECT_TRUE(Mentions(r, "differs")) << Failures(r);
      const CaseResult z = CheckExact(e, Doctor::kNoZLossInGrad, bf16);
      EXPECT_TRUE(Mentions(z, "dX bf16 differs")) << Failures(z);
    }
  }
}

TEST(CrossEntropyCheckTest, ExactPredictionRefusesUndecidedData) {
  Normal n = MakeNormal(0, 0, 2.0, client::Reduction::kSum);
  const CeReference ref = ComputeReference(n.x, n.w, n.rq);
  const absl::StatusOr<ExactGradients> want = PredictExactGradients(ref, n.x, n.w);
  EXPECT_EQ(want.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace logitd::validate

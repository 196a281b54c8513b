// LogProbs through the real server (cpu backend) and the client library:
// log-probs, lse, entropy, top-k and rank against an fp64 reference written
// here, the bitwise agreement with CrossEntropy that the contract promises,
// temperature, soft-capping and a masked vocabulary, shared memory, and the
// refusal of invalid requests with exact status codes.
//
// Tolerances. With integer-valued X and W the server's fp32 logits are exact,
// so what is left is the fp32 log-sum-exp: within (2V + 64)·u·(1 + |lse| +
// max|z|) (u = 2^-24; the tiles' fp32 sums of exponentials and their fp64
// fold), which also bounds the entropy (H = log S - Z/S shares S's relative
// error, times at most max|z - max| for Z/S). With normal inputs each fp32
// logit is within e_v = (K + 2)·u·Σ_k|x·w_v| of the exact one; soft-capping
// does not widen it and the temperature divides it. Top-k ids and ranks are
// compared exactly on integer logits, where ties are plentiful and the rule
// (the lower id first) decides.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "logitd/shared_region.h"
#include "tests/common/targets.h"
#include "tests/integration/integration_util.h"
#include "tests/support/run_logitctl.h"

namespace logitd::testing {
namespace {

using client::LogProbsOptions;
using client::LogProbsResult;
using ::testing::HasSubstr;

constexpr double kU = 0x1p-24;

std::uint32_t Fp32Bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

Tensor Targets(const std::vector<std::int64_t>& t, DType dtype = DType::kInt64) {
  return TargetsTensor(dtype, t);
}

// The fp64 reference of one row of z (already capped and scaled).
struct RowRef {
  double lse = 0;
  double entropy = 0;
  double max_abs = 0;
  std::vector<std::pair<double, std::int64_t>> order;  // most likely first, ties by lower id
};

RowRef Reference(const std::vector<double>& z) {
  RowRef r;
  double mx = -std::numeric_limits<double>::infinity();
  for (double v : z) {
    mx = std::max(mx, v);
    r.max_abs = std::max(r.max_abs, std::fabs(v));
  }
  double s = 0;
  for (double v : z) s += std::exp(v - mx);
  r.lse = mx + std::log(s);
  for (double v : z) {
    const double p = std::exp(v - r.lse);
    if (p > 0) r.entropy -= p * (v - r.lse);
  }
  for (std::size_t j = 0; j < z.size(); ++j) r.order.emplace_back(z[j], j);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return r;
}

double LseBound(const RowRef& r, std::int64_t v) {
  return (2.0 * static_cast<double>(v) + 64.0) * kU * (1.0 + std::fabs(r.lse) + r.max_abs);
}

// z_iv = softcap(x_i . w_v) / temperature in fp64 from the bf16 values, over
// the first `vocab` rows; and e_v, the fp32 accumulation bound of each logit.
std::vector<std::vector<double>> Logits(const Tensor& x, const Tensor& w, std::int64_t vocab,
                                        float cap, float temperature,
                                        std::vector<double>* bound = nullptr) {
  const std::int64_t m = x.dim(0);
  const std::int64_t k = x.dim(1);
  std::vector<std::vector<double>> z(m, std::vector<double>(vocab));
  if (bound != nullptr) bound->assign(m, 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t v = 0; v < vocab; ++v) {
      double y = 0;
      double abs = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        const double p = static_cast<double>(Bf16ToFloat(x.data<Bf16Bits>()[i * k + j])) *
                         Bf16ToFloat(w.data<Bf16Bits>()[v * k + j]);
        y += p;
        abs += std::fabs(p);
      }
      if (cap > 0) y = cap * std::tanh(y / cap);
      z[i][v] = y / temperature;
      if (bound != nullptr) {
        (*bound)[i] = std::max((*bound)[i], (k + 2) * kU * abs / temperature);
      }
    }
  }
  return z;
}

class LogProbsTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() { StartSharedServer({"--allow_shm"}); }
};

TEST_F(LogProbsTest, IntegerLogitsMatchTheFp64ReferenceWithExactTopKAndRanks) {
  constexpr std::int64_t kM = 12, kK = 64, kV = 300, kTopK = 7;
  const Tensor x = IntBf16({kM, kK}, 11, -2, 2);
  const Tensor w = IntBf16({kV, kK}, 12, -2, 2);
  const std::string handle = Register(w, "lp-int");
  std::vector<std::int64_t> t(kM);
  for (std::int64_t i = 0; i < kM; ++i) t[i] = (i * 97) % kV;
  t[5] = -100;  // ignored
  const Tensor targets = Targets(t, DType::kInt32);
  LogProbsOptions options;
  options.top_k = kTopK;
  options.want_entropy = options.want_lse = options.want_rank = true;
  absl::StatusOr<LogProbsResult> r = client().LogProbs(x, &targets, handle, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->logprob && r->lse && r->entropy && r->topk_ids && r->topk_logprobs && r->rank);
  EXPECT_EQ(r->topk_ids->shape(), (std::vector<std::int64_t>{kM, kTopK}));
  EXPECT_EQ(r->topk_ids->dtype(), DType::kInt32);
  EXPECT_EQ(r->rank->dtype(), DType::kInt64);

  const auto z = Logits(x, w, kV, 0.0f, 1.0f);
  for (std::int64_t i = 0; i < kM; ++i) {
    SCOPED_TRACE(i);
    const RowRef ref = Reference(z[i]);
    const double tol = LseBound(ref, kV);
    EXPECT_NEAR(r->lse->data<float>()[i], ref.lse, tol);
    EXPECT_NEAR(r->entropy->data<float>()[i], ref.entropy, tol);
    for (std::int64_t j = 0; j < kTopK; ++j) {
      EXPECT_EQ(r->topk_ids->data<std::int32_t>()[i * kTopK + j], ref.order[j].second) << j;
      EXPECT_NEAR(r->topk_logprobs->data<float>()[i * kTopK + j], ref.order[j].first - ref.lse,
                  tol);
    }
    if (t[i] == -100) {
      EXPECT_EQ(r->logprob->data<float>()[i], 0.0f);
      EXPECT_EQ(r->rank->data<std::int64_t>()[i], -1);
      continue;
    }
    EXPECT_NEAR(r->logprob->data<float>()[i], z[i][t[i]] - ref.lse, tol);
    std::int64_t rank = 0;
    while (ref.order[rank].second != t[i]) ++rank;
    EXPECT_EQ(r->rank->data<std::int64_t>()[i], rank);
  }
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, LogProbIsBitwiseMinusTheCrossEntropyLoss) {
  constexpr std::int64_t kM = 16, kK = 128, kV = 1000;  // a ragged last tile
  const Tensor x = NormalBf16({kM, kK}, 21);
  const Tensor w = NormalBf16({kV, kK}, 22);
  const std::string handle = Register(w, "lp-ce");
  std::vector<std::int64_t> t(kM);
  std::mt19937 rng(23);
  for (auto& v : t) v = std::uniform_int_distribution<std::int64_t>(0, kV - 1)(rng);
  t[3] = -100;
  const Tensor targets = Targets(t);
  client::CrossEntropyOptions ce;
  ce.reduction = client::Reduction::kNone;
  ce.want_lse = true;
  absl::StatusOr<client::CrossEntropyResult> loss = client().CrossEntropy(x, targets, handle, ce);
  ASSERT_TRUE(loss.ok()) << loss.status();
  LogProbsOptions options;
  options.want_lse = true;
  absl::StatusOr<LogProbsResult> r = client().LogProbs(x, &targets, handle, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(BitwiseEqual(*r->lse, *loss->lse));
  for (std::int64_t i = 0; i < kM; ++i) {
    const float want = t[i] == -100 ? 0.0f : -loss->loss.data<float>()[i];
    EXPECT_EQ(Fp32Bits(r->logprob->data<float>()[i]), Fp32Bits(want)) << i;
  }
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, TemperatureSoftcapAndMaskedVocabularyMatchTheReference) {
  constexpr std::int64_t kM = 6, kK = 96, kV = 700, kVocab = 651, kTopK = 5;
  const Tensor x = NormalBf16({kM, kK}, 31);
  const Tensor w = NormalBf16({kV, kK}, 32);
  const std::string handle = Register(w, "lp-opts");
  const Tensor targets = Targets({0, 650, 17, 333, 600, 1});
  for (const auto& [cap, temperature] :
       {std::make_pair(0.0f, 0.7f), std::make_pair(3.0f, 1.0f), std::make_pair(5.0f, 1.6f)}) {
    SCOPED_TRACE(::testing::Message() << "cap " << cap << " temperature " << temperature);
    LogProbsOptions options;
    options.logit_softcap = cap;
    options.temperature = temperature;
    options.vocab_size = kVocab;
    options.top_k = kTopK;
    options.want_entropy = options.want_lse = true;
    absl::StatusOr<LogProbsResult> r = client().LogProbs(x, &targets, handle, options);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<double> e;
    const auto z = Logits(x, w, kVocab, cap, temperature, &e);
    for (std::int64_t i = 0; i < kM; ++i) {
      const RowRef ref = Reference(z[i]);
      const double tol = e[i] + LseBound(ref, kVocab);
      EXPECT_NEAR(r->lse->data<float>()[i], ref.lse, tol) << i;
      EXPECT_NEAR(r->entropy->data<float>()[i], ref.entropy, 2 * tol) << i;
      const std::int64_t ti = targets.data<std::int64_t>()[i];
      EXPECT_NEAR(r->logprob->data<float>()[i], z[i][ti] - ref.lse, 2 * tol) << i;
      for (std::int64_t j = 0; j < kTopK; ++j) {
        const std::int32_t id = r->topk_ids->data<std::int32_t>()[i * kTopK + j];
        EXPECT_LT(id, kVocab);
        // Ids are exact where the reference separates neighbours by more
        // than twice the logits' bound.
        const bool separated = (j == 0 || ref.order[j - 1].first - ref.order[j].first > 2 * e[i]) &&
                               ref.order[j].first - ref.order[j + 1].first > 2 * e[i];
        if (separated) {
          EXPECT_EQ(id, ref.order[j].second) << i << " " << j;
        }
      }
    }
  }
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, SharedMemoryEqualsStreamedBitwise) {
  constexpr std::int64_t kM = 5, kK = 64, kV = 200, kTopK = 3;
  const Tensor x = NormalBf16({kM, kK}, 41);
  const Tensor w = NormalBf16({kV, kK}, 42);
  const std::string handle = Register(w, "lp-shm");
  const Tensor targets = Targets({1, 2, 3, 4, 199});
  LogProbsOptions options;
  options.top_k = kTopK;
  options.want_entropy = options.want_rank = true;
  absl::StatusOr<LogProbsResult> streamed = client().LogProbs(x, &targets, handle, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();

  absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(1 << 16);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<std::string> region_handle = client().RegisterShm(*region);
  ASSERT_TRUE(region_handle.ok()) << region_handle.status();
  std::copy_n(x.bytes(), x.nbytes(), region->data());
  std::copy_n(targets.bytes(), targets.nbytes(), region->data() + 4096);
  const auto slot = [&](std::uint64_t offset) {
    return client::ShmSlot{*region_handle, &*region, offset};
  };
  client::LogProbsShmArgs args;
  args.x = client::TensorInput::Shm(slot(0), DType::kBf16, x.shape());
  args.targets = client::TensorInput::Shm(slot(4096), targets.dtype(), targets.shape());
  args.logprob.slot = slot(8192);
  args.entropy.slot = slot(12288);
  args.topk_ids.slot = slot(16384);
  args.topk_logprobs.slot = slot(20480);
  args.rank.slot = slot(24576);
  absl::StatusOr<LogProbsResult> r = client().LogProbsShm(args, handle, options);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& [want, got] : {std::make_pair(&*streamed->logprob, &r->logprob_shm),
                                  std::make_pair(&*streamed->entropy, &r->entropy_shm),
                                  std::make_pair(&*streamed->topk_ids, &r->topk_ids_shm),
                                  std::make_pair(&*streamed->topk_logprobs, &r->topk_logprobs_shm),
                                  std::make_pair(&*streamed->rank, &r->rank_shm)}) {
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->xxh3, want->Digest());
    EXPECT_TRUE(
        std::equal(want->bytes(), want->bytes() + want->nbytes(), region->data() + (*got)->offset));
  }
  EXPECT_TRUE(client().ReleaseShm(*region_handle).ok());
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, TopKAloneNeedsNoTargets) {
  const Tensor x = IntBf16({3, 64}, 51, -1, 1);
  const Tensor w = IntBf16({128, 64}, 52, -1, 1);
  const std::string handle = Register(w, "lp-notargets");
  LogProbsOptions options;
  options.top_k = 64;
  absl::StatusOr<LogProbsResult> r = client().LogProbs(x, nullptr, handle, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->logprob.has_value());
  ASSERT_TRUE(r->topk_ids.has_value());
  EXPECT_EQ(r->topk_ids->shape(), (std::vector<std::int64_t>{3, 64}));
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, LogitctlWritesWhatTheClientGets) {
  const Tensor x = NormalBf16({4, 64}, 71);
  const Tensor w = NormalBf16({90, 64}, 72);
  const std::string handle = Register(w, "lp-ctl");
  const Tensor targets = Targets({5, 6, 7, 89}, DType::kInt32);
  LogProbsOptions options;
  options.top_k = 3;
  options.want_entropy = options.want_rank = true;
  options.temperature = 0.5f;
  absl::StatusOr<LogProbsResult> want = client().LogProbs(x, &targets, handle, options);
  ASSERT_TRUE(want.ok()) << want.status();

  char dir[] = "/tmp/logprobs-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string in = std::string(dir) + "/in.safetensors";
  const std::string out = std::string(dir) + "/out.safetensors";
  ASSERT_TRUE(WriteSafetensors(in, {{"x", &x}, {"targets", &targets}}).ok());
  const LogitctlRun run =
      RunLogitctl({"--server=" + server_->process.address(), "logprobs", "--x=" + in + ":x",
                   "--targets=" + in + ":targets", "--weight=" + handle, "--top_k=3", "--entropy",
                   "--rank", "--temperature=0.5", "--out=" + out});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  for (const auto& [name, tensor] :
       {std::make_pair("logprob", &want->logprob), std::make_pair("entropy", &want->entropy),
        std::make_pair("topk_ids", &want->topk_ids),
        std::make_pair("topk_logprobs", &want->topk_logprobs),
        std::make_pair("rank", &want->rank)}) {
    absl::StatusOr<Tensor> got = ReadSafetensorsTensor(out, name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_TRUE(BitwiseEqual(*got, **tensor)) << name;
  }
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

TEST_F(LogProbsTest, InvalidRequestsAreInvalidArgumentNamingTheField) {
  const Tensor x = NormalBf16({4, 64}, 61);
  const Tensor w = NormalBf16({100, 64}, 62);
  const std::string handle = Register(w, "lp-bad");
  const Tensor targets = Targets({0, 1, 2, 99});
  struct Case {
    std::string what;
    LogProbsOptions options;
    bool targets;
    std::string message;
  };
  std::vector<Case> cases;
  LogProbsOptions o;
  o.top_k = 65;
  cases.push_back({"top_k over 64", o, true, "top_k"});
  o = {};
  o.want_rank = true;
  cases.push_back({"rank without targets", o, false, "want_rank"});
  o = {};
  o.vocab_size = 50;
  cases.push_back({"target outside the masked vocabulary", o, true, "targets[3] = 99"});
  o = {};
  o.vocab_size = 101;
  cases.push_back({"vocab_size over V", o, true, "vocab_size"});
  o = {};
  o.temperature = -1.0f;
  cases.push_back({"negative temperature", o, true, "temperature"});
  o = {};
  cases.push_back({"no output at all", o, false, "at least one output"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<LogProbsResult> r =
        client().LogProbs(x, c.targets ? &targets : nullptr, handle, c.options);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
  }
  absl::StatusOr<LogProbsResult> unknown =
      client().LogProbs(x, &targets, "w-0123456789abcdef-100x64", {});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

}  // namespace
}  // namespace logitd::testing

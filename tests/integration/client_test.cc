// Happy paths of logitd::client::Client against the real server (cpu
// backend): weights, fp32 and bf16 logits, backward, accumulated gradients,
// the server's cast, determinism and concurrent clients.
#include "logitd/client.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/reference/blas_kernels.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using client::BackwardOptions;
using client::LogitsOptions;

using ClientTest = SharedServerTest;

TEST_F(ClientTest, InfoDescribesTheCpuBackend) {
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend, "cpu");
  EXPECT_FALSE(info->version.empty());
  EXPECT_FALSE(info->build_id.empty());
  EXPECT_GT(info->weight_budget_bytes, 0u);
  EXPECT_GT(info->max_request_bytes, 0u);
  EXPECT_EQ(info->chunk_bytes, kDefaultChunkBytes);
  // Every message the server sends fits gRPC's default receive limit.
  EXPECT_EQ(info->max_send_message_bytes, kGrpcDefaultMaxMessageBytes);
  EXPECT_EQ(info->max_request_chunk_bytes, kGrpcDefaultMaxMessageBytes);
  EXPECT_EQ(info->max_receive_message_bytes, kGrpcDefaultMaxMessageBytes + kChunkFramingBytes);
}

#if defined(__x86_64__)
// logitd runs OpenBLAS's kernels for this CPU even where OpenBLAS alone
// would take older ones (it then executes itself again, telling OpenBLAS).
TEST_F(ClientTest, TheServersBlasKernelsAreTheOnesThisCpuRuns) {
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  // Kernels the environment forced (OPENBLAS_CORETYPE, inherited by the
  // server) are kept as they are, whichever they are.
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr && *forced != 0) {
    EXPECT_NE(absl::AsciiStrToLower(info->blas_version).find(absl::AsciiStrToLower(forced)),
              std::string::npos)
        << info->blas_version << " (OPENBLAS_CORETYPE=" << forced << ")";
    return;
  }
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  // The core type is one word of the configuration string.
  for (absl::string_view word : absl::StrSplit(info->blas_version, absl::ByAnyChar(" ;"))) {
    EXPECT_EQ(BetterBlasCore(std::string(word), avx2, avx512), "") << info->blas_version;
  }
}
#endif

TEST_F(ClientTest, RegisterSameBytesGivesSameHandle) {
  const Tensor w = IntBf16({96, 64}, 11);
  absl::StatusOr<client::WeightInfo> first = client().RegisterWeight(w, "lm_head.weight");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->handle.empty());
  EXPECT_FALSE(first->already_registered);
  EXPECT_EQ(first->shape, (std::vector<std::int64_t>{96, 64}));
  EXPECT_EQ(first->xxh3, w.Digest());
  EXPECT_EQ(first->name, "lm_head.weight");
  EXPECT_GE(first->bytes, w.nbytes());

  absl::StatusOr<client::WeightInfo> again = client().RegisterWeight(w.Clone(), "another name");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->handle, first->handle);
  EXPECT_TRUE(again->already_registered);
  EXPECT_EQ(again->name, "lm_head.weight") << "the first registration's name is kept";
  EXPECT_EQ(first->registrations, 1u);
  EXPECT_EQ(again->registrations, 2u);

  // Each registration is released on its own: the first release keeps the
  // weight serving for whoever registered it second.
  absl::StatusOr<std::uint64_t> freed = client().ReleaseWeight(first->handle);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 0u);
  absl::StatusOr<Tensor> y = client().Logits(IntBf16({2, 64}, 13), first->handle);
  EXPECT_TRUE(y.ok()) << y.status();
  freed = client().ReleaseWeight(first->handle);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, w.nbytes());
  EXPECT_EQ(client().ReleaseWeight(first->handle).status().code(), absl::StatusCode::kNotFound);

  // Different bytes, same shape: a different weight.
  absl::StatusOr<client::WeightInfo> other = client().RegisterWeight(IntBf16({96, 64}, 12), "x");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->handle, first->handle);
  EXPECT_FALSE(other->already_registered);
}

TEST_F(ClientTest, ListAndRelease) {
  const Tensor w = IntBf16({40, 32}, 21);
  const std::string handle = Register(w, "to_release");
  ASSERT_FALSE(handle.empty());

  absl::StatusOr<std::vector<client::WeightInfo>> list = client().ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  bool found = false;
  for (const client::WeightInfo& info : *list) {
    if (info.handle != handle) continue;
    found = true;
    EXPECT_EQ(info.name, "to_release");
    EXPECT_EQ(info.shape, (std::vector<std::int64_t>{40, 32}));
    EXPECT_EQ(info.xxh3, w.Digest());
  }
  EXPECT_TRUE(found) << "registered handle " << handle << " missing from ListWeights";

  absl::StatusOr<std::uint64_t> freed = client().ReleaseWeight(handle);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, w.nbytes());

  list = client().ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  for (const client::WeightInfo& info : *list) {
    EXPECT_NE(info.handle, handle);
  }

  EXPECT_EQ(client().ReleaseWeight(handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().Logits(IntBf16({2, 32}, 1), handle).status().code(),
            absl::StatusCode::kNotFound);
}

// K = 4096 with integers in [-8, 8]: every partial sum is an integer below
// 2^24, so fp32 accumulation is exact in any order.
TEST_F(ClientTest, Bf16Bf16F32_NT_IntegerLogitsAreExact) {
  const std::int64_t m = 16, v = 1024, k = 4096;
  const Tensor x = IntBf16({m, k}, 101);
  const Tensor w = IntBf16({v, k}, 102);
  const std::string handle = Register(w, "int_w");
  const std::vector<std::int64_t> exact = ExactNT(x, w);

  client::Timing timing;
  absl::StatusOr<Tensor> y = client().Logits(x, handle, {}, &timing);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, exact, {m, v}));
  EXPECT_GE(timing.compute_us, 0);

  LogitsOptions bf16;
  bf16.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> yb = client().Logits(x, handle, bf16);
  ASSERT_TRUE(yb.ok()) << yb.status();
  EXPECT_TRUE(Bf16EqualsRoundedExact(*yb, exact, {m, v}));
}

TEST_F(ClientTest, LogitsIntoReusesAMatchingTensorAndReplacesAnotherOne) {
  const std::int64_t m = 8, v = 2048, k = 256;  // 64 KiB of fp32 Y
  const Tensor w = IntBf16({v, k}, 121);
  const std::string handle = Register(w, "into_w");

  Tensor y(DType::kBf16, {3, 3});  // wrong dtype and shape: replaced
  const Tensor x1 = IntBf16({m, k}, 122);
  absl::Status s = client().LogitsInto(x1, handle, &y);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Fp32EqualsExact(y, ExactNT(x1, w), {m, v}));

  // Same dtype and shape: received into the same memory, every byte rewritten.
  const std::byte* memory = y.bytes();
  const Tensor x2 = IntBf16({m, k}, 123);
  s = client().LogitsInto(x2, handle, &y);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(y.bytes(), memory);
  EXPECT_TRUE(Fp32EqualsExact(y, ExactNT(x2, w), {m, v}));

  // An error leaves the call's tensor usable and says why.
  EXPECT_EQ(client().LogitsInto(x2, "w-0000000000000000-1x1", &y).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client().LogitsInto(x2, handle, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, AlphaScalesExactly) {
  const std::int64_t m = 8, v = 256, k = 512;
  const Tensor x = IntBf16({m, k}, 111);
  const Tensor w = IntBf16({v, k}, 112);
  const std::string handle = Register(w, "alpha_w");
  std::vector<std::int64_t> exact = ExactNT(x, w);
  for (std::int64_t& e : exact) e *= -2;  // alpha = -2 is exact in fp32.
  LogitsOptions options;
  options.alpha = -2.0f;
  absl::StatusOr<Tensor> y = client().Logits(x, handle, options);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, exact, {m, v}));
}

// Random bf16 data: each fp32 logit lies within the classic bound
// |y - ref| <= gamma_K * sum_k |x_k w_k|, gamma_K = K u / (1 - K u), u = 2^-24,
// which holds for any summation order; products of bf16 values are exact.
TEST_F(ClientTest, Bf16Bf16F32_NT_RandomWithinAccumulationBound) {
  const std::int64_t m = 8, v = 512, k = 2048;
  const Tensor x = NormalBf16({m, k}, 1234);
  const Tensor w = NormalBf16({v, k}, 1235);
  const std::string handle = Register(w, "random_w");
  absl::StatusOr<Tensor> y = client().Logits(x, handle);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_EQ(y->shape(), (std::vector<std::int64_t>{m, v}));
  ASSERT_EQ(y->dtype(), DType::kFp32);

  const double u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  int outside = 0;
  double worst_ratio = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      double ref = 0, abs_sum = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double p = x.At(i * k + kk) * w.At(j * k + kk);
        ref += p;
        abs_sum += std::fabs(p);
      }
      const double err = std::fabs(y->At(i * v + j) - ref);
      const double bound = gamma * abs_sum;
      if (err > bound) ++outside;
      if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  EXPECT_EQ(outside, 0) << "elements outside the fp32 accumulation bound; worst err/bound "
                        << worst_ratio;
}

// Integers: G = dY exactly (already bf16), sums exact in fp32.
TEST_F(ClientTest, BackwardIntegerGradientsAreExact) {
  const std::int64_t m = 12, v = 384, k = 256;
  const Tensor x = IntBf16({m, k}, 201);
  const Tensor w = IntBf16({v, k}, 202);
  const Tensor dy = IntBf16({m, v}, 203);
  const std::string handle = Register(w, "bwd_w");
  const std::vector<std::int64_t> dx_exact = ExactNN(dy, w);
  const std::vector<std::int64_t> dw_exact = ExactTN(dy, x);

  absl::StatusOr<client::BackwardResult> r = client().Backward(dy, x, handle);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->dx.has_value());
  ASSERT_TRUE(r->dw.has_value());
  EXPECT_TRUE(Bf16EqualsRoundedExact(*r->dx, dx_exact, {m, k})) << "dX, default bf16";
  EXPECT_TRUE(Fp32EqualsExact(*r->dw, dw_exact, {v, k})) << "dW, default fp32";

  BackwardOptions other;
  other.dx_dtype = DType::kFp32;
  other.dw_dtype = DType::kBf16;
  r = client().Backward(dy, x, handle, other);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->dx.has_value() && r->dw.has_value());
  EXPECT_TRUE(Fp32EqualsExact(*r->dx, dx_exact, {m, k})) << "dX fp32";
  EXPECT_TRUE(Bf16EqualsRoundedExact(*r->dw, dw_exact, {v, k})) << "dW bf16";

  BackwardOptions only_dx;
  only_dx.want_dw = false;
  r = client().Backward(dy, x, handle, only_dx);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dx.has_value());
  EXPECT_FALSE(r->dw.has_value());

  BackwardOptions only_dw;
  only_dw.want_dx = false;
  r = client().Backward(dy, x, handle, only_dw);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->dx.has_value());
  ASSERT_TRUE(r->dw.has_value());
  EXPECT_TRUE(Fp32EqualsExact(*r->dw, dw_exact, {v, k}));
}

// The backward contract: an fp32 dY is rounded to bf16 once (RNE) by the
// server, so sending fp32 dY or the client's bf16(dY) gives identical bits.
TEST_F(ClientTest, BackwardFp32DyMatchesBf16DyBitwise) {
  const std::int64_t m = 16, v = 512, k = 384;
  const Tensor x = NormalBf16({m, k}, 301);
  const Tensor w = NormalBf16({v, k}, 302);
  const Tensor dy32 = NormalFp32({m, v}, 303, 1e-3f);
  Tensor dy16(DType::kBf16, {m, v});
  for (std::int64_t i = 0; i < dy32.numel(); ++i) {
    dy16.data<Bf16Bits>()[i] = FloatToBf16(dy32.data<float>()[i]);
  }
  const std::string handle = Register(w, "contract_w");
  for (DType dx_dtype : {DType::kBf16, DType::kFp32}) {
    BackwardOptions options;
    options.dx_dtype = dx_dtype;
    absl::StatusOr<client::BackwardResult> from32 = client().Backward(dy32, x, handle, options);
    absl::StatusOr<client::BackwardResult> from16 = client().Backward(dy16, x, handle, options);
    ASSERT_TRUE(from32.ok()) << from32.status();
    ASSERT_TRUE(from16.ok()) << from16.status();
    ASSERT_TRUE(from32->dx && from16->dx && from32->dw && from16->dw);
    EXPECT_TRUE(BitwiseEqual(*from32->dx, *from16->dx)) << "dX " << DTypeName(dx_dtype);
    EXPECT_TRUE(BitwiseEqual(*from32->dw, *from16->dw)) << "dW";
  }
}

TEST_F(ClientTest, AccumulateFetchAndZeroGradient) {
  const std::int64_t m = 6, v = 128, k = 96;
  const Tensor w = IntBf16({v, k}, 401);
  const std::string handle = Register(w, "accum_w");
  std::vector<std::int64_t> sum(static_cast<std::size_t>(v * k), 0);
  BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  for (std::uint32_t call = 0; call < 3; ++call) {
    const Tensor x = IntBf16({m, k}, 410 + call);
    const Tensor dy = IntBf16({m, v}, 420 + call);
    const std::vector<std::int64_t> dw = ExactTN(dy, x);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += dw[i];
    absl::StatusOr<client::BackwardResult> r = client().Backward(dy, x, handle, accumulate);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->dx.has_value());
    EXPECT_FALSE(r->dw.has_value()) << "an accumulated dW stays on the server";
  }

  absl::StatusOr<std::vector<client::WeightInfo>> list = client().ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  for (const client::WeightInfo& info : *list) {
    if (info.handle == handle) {
      EXPECT_TRUE(info.has_gradient);
    }
  }

  absl::StatusOr<client::GradientResult> g =
      client().FetchGradient(handle, /*zero_after_fetch=*/true);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 3u);
  EXPECT_TRUE(Fp32EqualsExact(g->dw, sum, {v, k}));

  g = client().FetchGradient(handle, false);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 0u);
  EXPECT_TRUE(Fp32EqualsExact(g->dw, std::vector<std::int64_t>(sum.size(), 0), {v, k}))
      << "zero_after_fetch left a non-zero buffer";

  // Accumulate once more, then ZeroGradient.
  const Tensor x = IntBf16({m, k}, 430);
  const Tensor dy = IntBf16({m, v}, 431);
  ASSERT_TRUE(client().Backward(dy, x, handle, accumulate).ok());
  g = client().FetchGradient(handle, false);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 1u);
  EXPECT_TRUE(Fp32EqualsExact(g->dw, ExactTN(dy, x), {v, k}));
  ASSERT_TRUE(client().ZeroGradient(handle).ok());
  g = client().FetchGradient(handle, false);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 0u);
  EXPECT_TRUE(Fp32EqualsExact(g->dw, std::vector<std::int64_t>(sum.size(), 0), {v, k}));
}

TEST_F(ClientTest, FetchGradientIntoReusesAMatchingTensor) {
  const std::int64_t m = 8, v = 512, k = 128;
  const Tensor w = IntBf16({v, k}, 440);
  const std::string handle = Register(w, "fetch_into_w");
  client::BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  const Tensor x1 = IntBf16({m, k}, 441);
  const Tensor dy1 = IntBf16({m, v}, 442);
  ASSERT_TRUE(client().Backward(dy1, x1, handle, accumulate).ok());

  Tensor dw(DType::kBf16, {2, 2});  // wrong dtype and shape: replaced
  absl::StatusOr<client::GradientResult> g = client().FetchGradientInto(handle, false, &dw);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 1u);
  EXPECT_EQ(g->dw.nbytes(), 0u) << "the result's dw stays empty; dW is in *dw";
  std::vector<std::int64_t> sum = ExactTN(dy1, x1);
  EXPECT_TRUE(Fp32EqualsExact(dw, sum, {v, k}));

  // Same dtype and shape: received into the same memory.
  const std::byte* memory = dw.bytes();
  const Tensor x2 = IntBf16({m, k}, 443);
  const Tensor dy2 = IntBf16({m, v}, 444);
  ASSERT_TRUE(client().Backward(dy2, x2, handle, accumulate).ok());
  g = client().FetchGradientInto(handle, /*zero_after_fetch=*/true, &dw);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->accumulated_calls, 2u);
  EXPECT_EQ(dw.bytes(), memory);
  const std::vector<std::int64_t> second = ExactTN(dy2, x2);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += second[i];
  EXPECT_TRUE(Fp32EqualsExact(dw, sum, {v, k}));

  EXPECT_EQ(client().FetchGradientInto("w-0000000000000000-1x1", false, &dw).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client().FetchGradientInto(handle, false, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, CastMatchesFloatToBf16OnEdgeValues) {
  const std::vector<std::uint32_t> edge_bits = {
      0x00000000u, 0x80000000u,               // +-0
      0x3f800000u, 0xbf800000u,               // +-1
      0x3f808000u,                            // 1 + 2^-8: tie, rounds down to even 1
      0x3f818000u,                            // 1 + 3*2^-8: tie, rounds up to even
      0x3f808001u, 0x3f807fffu,               // just above / below a tie
      0xbf818000u,                            // negative tie
      0x7f800000u, 0xff800000u,               // +-Inf
      0x7fc00000u, 0xffc00000u,               // quiet NaNs
      0x7f800001u, 0x7fc12345u, 0xff812345u,  // signalling and payload NaNs
      0x7f7fffffu,                            // FLT_MAX: past bf16 max, rounds to Inf
      0x7f7f7fffu,                            // largest value that stays finite
      0x7f7f8000u,                            // tie between bf16 max and Inf
      0xff7fffffu,                            // -FLT_MAX -> -Inf
      0x00000001u, 0x80000001u,               // smallest subnormals -> +-0
      0x00008000u, 0x00018000u,               // subnormal ties (down, up)
      0x007fffffu, 0x00800000u,               // largest subnormal, smallest normal
      0x3effffffu, 0x4b7fffffu};
  Tensor in(DType::kFp32, {static_cast<std::int64_t>(edge_bits.size())});
  // Bits are stored as integers: a signalling NaN must reach the wire unchanged.
  for (std::size_t i = 0; i < edge_bits.size(); ++i) in.data<std::uint32_t>()[i] = edge_bits[i];
  absl::StatusOr<Tensor> out = client().CastToBf16(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->dtype(), DType::kBf16);
  ASSERT_EQ(out->shape(), in.shape());
  for (std::size_t i = 0; i < edge_bits.size(); ++i) {
    EXPECT_EQ(out->data<Bf16Bits>()[i], FloatToBf16(BitsToFloat(edge_bits[i])))
        << "input bits 0x" << std::hex << edge_bits[i];
  }

  // Random bit patterns in a 2-D shape (every exponent, NaNs included).
  Tensor random(DType::kFp32, {256, 257});
  std::mt19937 rng(77);
  for (std::int64_t i = 0; i < random.numel(); ++i) random.data<std::uint32_t>()[i] = rng();
  out = client().CastToBf16(random);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), random.shape());
  int mismatches = 0;
  for (std::int64_t i = 0; i < random.numel(); ++i) {
    mismatches += out->data<Bf16Bits>()[i] != FloatToBf16(random.data<float>()[i]);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(ClientTest, SameRequestTwiceGivesSameBits) {
  const Tensor x = NormalBf16({16, 1024}, 501);
  const Tensor w = NormalBf16({768, 1024}, 502);
  const Tensor dy = NormalFp32({16, 768}, 503);
  const std::string handle = Register(w, "determinism_w");
  absl::StatusOr<Tensor> a = client().Logits(x, handle);
  absl::StatusOr<Tensor> b = client().Logits(x, handle);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  EXPECT_TRUE(BitwiseEqual(*a, *b));
  EXPECT_EQ(a->Digest(), b->Digest());

  absl::StatusOr<client::BackwardResult> ra = client().Backward(dy, x, handle);
  absl::StatusOr<client::BackwardResult> rb = client().Backward(dy, x, handle);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << " " << rb.status();
  EXPECT_TRUE(BitwiseEqual(*ra->dx, *rb->dx));
  EXPECT_TRUE(BitwiseEqual(*ra->dw, *rb->dw));
}

// Small client chunks that split elements across messages still reassemble.
TEST_F(ClientTest, OddClientChunkSizeRoundTrips) {
  client::ClientOptions options;
  options.chunk_bytes = 1001;
  absl::StatusOr<std::unique_ptr<client::Client>> c = server_->NewClient(options);
  ASSERT_TRUE(c.ok()) << c.status();
  const Tensor x = IntBf16({5, 300}, 601);
  const Tensor w = IntBf16({70, 300}, 602);
  absl::StatusOr<client::WeightInfo> info = (*c)->RegisterWeight(w, "odd_chunks");
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = (*c)->Logits(x, info->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {5, 70}));
}

// Tensors sent with their digest after their chunks (every one here:
// digest_after_bytes 1) give the bits of tensors hashed before the header,
// for every call that streams tensors; the server says it takes them.
TEST_F(ClientTest, DigestsAfterTheChunksGiveTheSameResults) {
  client::ClientOptions options;
  options.digest_after_bytes = 1;
  options.chunk_bytes = 1001;  // several chunks a tensor
  absl::StatusOr<std::unique_ptr<client::Client>> c = server_->NewClient(options);
  ASSERT_TRUE(c.ok()) << c.status();
  client::Client& after = **c;
  const Tensor x = IntBf16({6, 256}, 611);
  const Tensor w = IntBf16({90, 256}, 612);
  const Tensor dy = NormalFp32({6, 90}, 613);
  const std::string handle = Register(w, "digest_after");
  absl::StatusOr<client::ServerInfo> info = after.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->request_digest_last);

  absl::StatusOr<Tensor> y = after.Logits(x, handle);
  absl::StatusOr<Tensor> y0 = client().Logits(x, handle);
  ASSERT_TRUE(y.ok() && y0.ok()) << y.status() << " " << y0.status();
  EXPECT_TRUE(BitwiseEqual(*y, *y0));
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {6, 90}));

  absl::StatusOr<client::BackwardResult> b = after.Backward(dy, x, handle);
  absl::StatusOr<client::BackwardResult> b0 = client().Backward(dy, x, handle);
  ASSERT_TRUE(b.ok() && b0.ok()) << b.status() << " " << b0.status();
  EXPECT_TRUE(BitwiseEqual(*b->dx, *b0->dx));
  EXPECT_TRUE(BitwiseEqual(*b->dw, *b0->dw));

  absl::StatusOr<Tensor> cast = after.CastToBf16(dy);
  absl::StatusOr<Tensor> cast0 = client().CastToBf16(dy);
  ASSERT_TRUE(cast.ok() && cast0.ok()) << cast.status() << " " << cast0.status();
  EXPECT_TRUE(BitwiseEqual(*cast, *cast0));

  Tensor targets(DType::kInt64, {6});
  for (std::int64_t i = 0; i < 6; ++i) targets.data<std::int64_t>()[i] = (i * 37) % 90;
  absl::StatusOr<client::CrossEntropyResult> ce = after.CrossEntropy(x, targets, handle);
  absl::StatusOr<client::CrossEntropyResult> ce0 = client().CrossEntropy(x, targets, handle);
  ASSERT_TRUE(ce.ok() && ce0.ok()) << ce.status() << " " << ce0.status();
  EXPECT_TRUE(BitwiseEqual(ce->loss, ce0->loss));

  client::VerifyArgs v;
  v.operation = client::VerifyOperation::kLogits;
  v.weight_handle = handle;
  v.x = x;
  v.candidates["y"] = *y0;
  absl::StatusOr<client::VerifyResult> verdict = after.Verify(v);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->verdict, "bitwise_equal_to_logitd");
  ASSERT_EQ(verdict->candidates.size(), 1u);
  // The candidate's digest as the server received it, announced after it.
  EXPECT_EQ(verdict->candidates[0].xxh3, y0->Digest());
}

TEST_F(ClientTest, ConcurrentClientsGetCorrectResults) {
  const std::int64_t v = 512, k = 1024;
  const Tensor w = IntBf16({v, k}, 701);
  const std::string handle = Register(w, "concurrent_w");
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 3;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<std::unique_ptr<client::Client>> c = server_->NewClient();
      if (!c.ok()) {
        failures[t] = c.status().ToString();
        return;
      }
      for (int call = 0; call < kCallsPerThread; ++call) {
        const std::int64_t m = 3 + t + call;
        const Tensor x = IntBf16({m, k}, 710 + 10 * t + call);
        absl::StatusOr<Tensor> y = (*c)->Logits(x, handle);
        if (!y.ok()) {
          failures[t] = y.status().ToString();
          return;
        }
        ::testing::AssertionResult r = Fp32EqualsExact(*y, ExactNT(x, w), {m, v});
        if (!r) {
          failures[t] = r.message();
          return;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
  }
}

}  // namespace
}  // namespace logitd::testing

// The cuda backend under the load a shared GPU server sees: small and odd
// shapes (not multiples of 8), many threads, every tensor call mixed. Every
// call must finish (a watchdog fails the test, and ends the process, instead
// of letting it hang) and every result must equal the exact sums of its
// integer operands. The first test is the sequence that once hung the GPU
// with split-K on: weight [256, 128], three Logits, one Backward with M=4.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/cuda/cuda_backend.h"
#include "server/kernels/ops/cast.h"

namespace logitd::kernels::testing {
namespace {

// Runs fn on its own thread; a test that does not finish within `limit`
// fails, and the process ends (a hung device call cannot be interrupted).
void WithinOrDie(std::chrono::seconds limit, const std::string& what,
                 const std::function<void()>& fn) {
  std::packaged_task<void()> task(fn);
  std::future<void> done = task.get_future();
  std::thread worker(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not finish within %lld s: the device hangs\n",
                 what.c_str(), static_cast<long long>(limit.count()));
    std::fflush(nullptr);
    std::_Exit(1);
  }
  worker.join();
  done.get();
}

std::unique_ptr<Backend> MakeBackend(const std::string& split_k, std::string* skip) {
  BackendOptions options;
  options.split_k = ParseSplitK(split_k).value();
  options.device_timeout = absl::Seconds(30);
  auto created = cuda::CreateCudaBackend(options);
  if (!created.ok()) {
    *skip = std::string(created.status().message());
    return nullptr;
  }
  return *std::move(created);
}

// Exact integer sums as floats; products of integers in [-8, 8] summed over
// fewer than 2^18 terms are exact in fp32.
std::vector<double> ExactLogits(const std::vector<Bf16Bits>& x, const std::vector<Bf16Bits>& w,
                                std::int64_t m, std::int64_t v, std::int64_t k) {
  std::vector<double> y(static_cast<std::size_t>(m * v));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        s += static_cast<double>(Bf16ToFloat(x[static_cast<std::size_t>(i * k + l)])) *
             Bf16ToFloat(w[static_cast<std::size_t>(j * k + l)]);
      }
      y[static_cast<std::size_t>(i * v + j)] = s;
    }
  }
  return y;
}

std::vector<double> ExactDx(const std::vector<float>& g, const std::vector<Bf16Bits>& w,
                            std::int64_t m, std::int64_t v, std::int64_t k) {
  std::vector<double> dx(static_cast<std::size_t>(m * k), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t l = 0; l < v; ++l) {
      const double gv = g[static_cast<std::size_t>(i * v + l)];
      if (gv == 0) continue;
      for (std::int64_t j = 0; j < k; ++j) {
        dx[static_cast<std::size_t>(i * k + j)] +=
            gv * Bf16ToFloat(w[static_cast<std::size_t>(l * k + j)]);
      }
    }
  }
  return dx;
}

std::vector<double> ExactDw(const std::vector<float>& g, const std::vector<Bf16Bits>& x,
                            std::int64_t m, std::int64_t v, std::int64_t k) {
  std::vector<double> dw(static_cast<std::size_t>(v * k), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t r = 0; r < v; ++r) {
      const double gv = g[static_cast<std::size_t>(i * v + r)];
      if (gv == 0) continue;
      for (std::int64_t j = 0; j < k; ++j) {
        dw[static_cast<std::size_t>(r * k + j)] +=
            gv * Bf16ToFloat(x[static_cast<std::size_t>(i * k + j)]);
      }
    }
  }
  return dw;
}

// How many of `got` (fp32 or bf16 bytes) differ from the exact values
// (fp32: bitwise; bf16: the correctly rounded value). A zero may be -0: a sum
// of one product (M = 1 for dW) of a negative and a zero is -0 in IEEE 754.
// The first mismatch is described in `first`.
std::int64_t Mismatches(const std::vector<std::byte>& got, DType t,
                        const std::vector<double>& exact, std::string* first = nullptr) {
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const float want = t == DType::kFp32 ? static_cast<float>(exact[i])
                                         : Bf16ToFloat(FloatToBf16(static_cast<float>(exact[i])));
    const float value = t == DType::kFp32
                            ? reinterpret_cast<const float*>(got.data())[i]
                            : Bf16ToFloat(reinterpret_cast<const Bf16Bits*>(got.data())[i]);
    if (FloatBits(value) == FloatBits(want) || (value == 0.0f && want == 0.0f)) continue;
    if (bad++ == 0 && first != nullptr) {
      *first = "element " + std::to_string(i) + ": " + std::to_string(value) + ", exact " +
               std::to_string(want);
    }
  }
  return bad;
}

class DeviceTrustTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceTrustTest, SmallBackwardAfterLogitsCompletesAndIsExact) {
  std::string skip;
  std::unique_ptr<Backend> backend = MakeBackend(GetParam(), &skip);
  if (backend == nullptr) GTEST_SKIP() << "no CUDA device: " << skip;
  const std::int64_t v = 256, k = 128;
  const auto w = IntegerBf16(v * k, 1);
  auto weight = backend->LoadWeight(w.data(), v, k);
  ASSERT_TRUE(weight.ok()) << weight.status();
  WithinOrDie(std::chrono::seconds(60), "weight [256, 128]: three Logits, Backward M=4", [&] {
    for (std::int64_t m : {1, 3, 16}) {
      const auto x = IntegerBf16(m * k, 10 + static_cast<std::uint64_t>(m));
      std::vector<std::byte> y(static_cast<std::size_t>(m * v) * 4, std::byte{0xff});
      LogitsArgs args;
      args.x = x.data();
      args.m = m;
      args.y = y.data();
      const absl::Status st = backend->Logits(**weight, args, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(Mismatches(y, DType::kFp32, ExactLogits(x, w, m, v, k)), 0) << "M=" << m;
    }
    const std::int64_t m = 4;
    const auto x = IntegerBf16(m * k, 20);
    const auto dy = IntegerFp32(m * v, 21);
    std::vector<std::byte> dx(static_cast<std::size_t>(m * k) * 4, std::byte{0xff});
    std::vector<std::byte> dw(static_cast<std::size_t>(v * k) * 4, std::byte{0xff});
    BackwardArgs args;
    args.dy = dy.data();
    args.dy_dtype = DType::kFp32;
    args.x = x.data();
    args.m = m;
    args.dx = dx.data();
    args.dx_dtype = DType::kFp32;
    args.dw = dw.data();
    args.dw_dtype = DType::kFp32;
    Timing timing;
    const absl::Status st = backend->Backward(**weight, args, &timing);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(Mismatches(dx, DType::kFp32, ExactDx(dy, w, m, v, k)), 0);
    EXPECT_EQ(Mismatches(dw, DType::kFp32, ExactDw(dy, x, m, v, k)), 0);
    for (const std::string& g : timing.gemms) std::cout << "  " << g << "\n";
  });
  EXPECT_TRUE(backend->Health().ok()) << backend->Health();
}

INSTANTIATE_TEST_SUITE_P(SplitK, DeviceTrustTest, ::testing::Values("fp32", "any", "off"));

// Eight threads, each with its own small weight of an odd shape, calling
// Logits (fp32 and bf16 out), Backward (every dtype mix, with and without
// accumulation), FetchGradient and Cast with M from 1 to 8 (and now and
// then 300) for a few seconds: no call may fail and no result may differ
// from the exact one.
TEST(DeviceTrustConcurrent, OddShapesFromManyThreadsAreExact) {
  std::string skip;
  std::unique_ptr<Backend> backend = MakeBackend("fp32", &skip);
  if (backend == nullptr) GTEST_SKIP() << "no CUDA device: " << skip;
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {256, 128}, {384, 200}, {512, 64}, {130, 257}, {1000, 96}, {77, 333}, {2048, 40}, {513, 129}};
  std::atomic<std::int64_t> calls{0};
  std::atomic<std::int64_t> failures{0};
  std::atomic<std::int64_t> wrong{0};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  WithinOrDie(std::chrono::seconds(120), "8 threads of odd shapes", [&] {
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      threads.emplace_back([&, t] {
        const auto [v, k] = shapes[t];
        const auto w = IntegerBf16(v * k, 100 + t);
        auto weight = backend->LoadWeight(w.data(), v, k);
        if (!weight.ok()) {
          ++failures;
          ADD_FAILURE() << "LoadWeight [" << v << ", " << k << "]: " << weight.status();
          return;
        }
        std::mt19937_64 rng(1000 + t);
        std::vector<double> accumulated(static_cast<std::size_t>(v * k), 0.0);
        std::uint64_t accumulations = 0;
        auto fail = [&](const std::string& what, const absl::Status& st) {
          if (++failures <= 10) ADD_FAILURE() << what << " [" << v << ", " << k << "]: " << st;
        };
        std::string first;
        auto report = [&](const std::string& what, std::int64_t m, std::int64_t bad) {
          if (bad == 0) return;
          if (++wrong <= 10) {
            ADD_FAILURE() << what << " weight [" << v << ", " << k << "] M=" << m << ": " << bad
                          << " wrong, " << first;
          }
        };
        for (std::uint64_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
          const std::int64_t m = rng() % 16 == 0 ? 300 : 1 + static_cast<std::int64_t>(rng() % 8);
          const auto x = IntegerBf16(m * k, rng());
          const int kind = static_cast<int>(rng() % 5);
          ++calls;
          if (kind <= 1) {  // Logits, fp32 or bf16 out
            const DType out = kind == 0 ? DType::kFp32 : DType::kBf16;
            std::vector<std::byte> y(static_cast<std::size_t>(m * v) * ElementSize(out),
                                     std::byte{0xff});
            LogitsArgs args;
            args.x = x.data();
            args.m = m;
            args.out_dtype = out;
            args.y = y.data();
            const absl::Status st = backend->Logits(**weight, args, nullptr);
            if (!st.ok()) {
              fail("Logits", st);
              continue;
            }
            report("Logits", m, Mismatches(y, out, ExactLogits(x, w, m, v, k), &first));
          } else if (kind <= 3) {  // Backward
            const auto dy = IntegerFp32(m * v, rng());
            std::vector<Bf16Bits> dy16(dy.size());
            for (std::size_t j = 0; j < dy.size(); ++j) dy16[j] = FloatToBf16(dy[j]);
            const bool bf16_dy = rng() % 2 == 0;
            const DType dx_type = rng() % 2 == 0 ? DType::kFp32 : DType::kBf16;
            const bool accumulate = kind == 3;
            const DType dw_type = rng() % 2 == 0 ? DType::kFp32 : DType::kBf16;
            std::vector<std::byte> dx(static_cast<std::size_t>(m * k) * 4, std::byte{0xff});
            std::vector<std::byte> dw(static_cast<std::size_t>(v * k) * 4, std::byte{0xff});
            BackwardArgs args;
            args.dy = bf16_dy ? static_cast<const void*>(dy16.data()) : dy.data();
            args.dy_dtype = bf16_dy ? DType::kBf16 : DType::kFp32;
            args.x = x.data();
            args.m = m;
            args.dx = dx.data();
            args.dx_dtype = dx_type;
            args.dw = accumulate ? nullptr : dw.data();
            args.dw_dtype = dw_type;
            args.accumulate_dw = accumulate;
            const absl::Status st = backend->Backward(**weight, args, nullptr);
            if (!st.ok()) {
              fail("Backward", st);
              continue;
            }
            report("Backward dx", m, Mismatches(dx, dx_type, ExactDx(dy, w, m, v, k), &first));
            const std::vector<double> exact_dw = ExactDw(dy, x, m, v, k);
            if (accumulate) {
              for (std::size_t j = 0; j < exact_dw.size(); ++j) accumulated[j] += exact_dw[j];
              ++accumulations;
            } else {
              report("Backward dw", m, Mismatches(dw, dw_type, exact_dw, &first));
            }
          } else {  // FetchGradient, or a Cast
            if (rng() % 2 == 0) {
              std::vector<std::byte> g(static_cast<std::size_t>(v * k) * 4, std::byte{0xff});
              auto count = backend->FetchGradient(**weight, reinterpret_cast<float*>(g.data()),
                                                  /*zero_after_fetch=*/true);
              if (!count.ok()) {
                fail("FetchGradient", count.status());
                continue;
              }
              report("FetchGradient count", 0, *count != accumulations ? 1 : 0);
              report("FetchGradient", 0, Mismatches(g, DType::kFp32, accumulated, &first));
              std::fill(accumulated.begin(), accumulated.end(), 0.0);
              accumulations = 0;
            } else {
              const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 5000);
              const auto in = RandomFp32(n, rng());
              std::vector<Bf16Bits> out(static_cast<std::size_t>(n), 0xffff);
              const absl::Status st =
                  backend->Kernel(kernels::CastArgs{in.data(), n, out.data()}, nullptr);
              if (!st.ok()) {
                fail("Cast", st);
                continue;
              }
              for (std::int64_t j = 0; j < n; ++j) {
                wrong += out[static_cast<std::size_t>(j)] !=
                         FloatToBf16(in[static_cast<std::size_t>(j)]);
              }
            }
          }
        }
      });
    }
    for (auto& th : threads) th.join();
  });
  std::cout << calls.load() << " calls, " << failures.load() << " failed, " << wrong.load()
            << " wrong results\n";
  EXPECT_GT(calls.load(), 100);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(backend->Health().ok()) << backend->Health();
}

}  // namespace
}  // namespace logitd::kernels::testing

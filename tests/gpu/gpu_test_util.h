// Shared pieces of the GPU tests: a cuda backend or a skip with the reason,
// seeded operand generators, fp64 and exact integer references computed on
// all host cores, and the fp32 accumulation bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "logitd/bf16.h"
#include "server/kernels/backend.h"
#include "server/kernels/cuda/cuda_backend.h"

namespace logitd::kernels::testing {

// Runs fn(begin, end) over [0, n) split across the host's cores.
inline void ParallelFor(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::int64_t threads =
      std::max<std::int64_t>(1, std::min<std::int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const std::int64_t step = (n + threads - 1) / threads;
  for (std::int64_t t = 0; t < threads; ++t) {
    const std::int64_t begin = t * step;
    const std::int64_t end = std::min(n, begin + step);
    if (begin >= end) break;
    pool.emplace_back(fn, begin, end);
  }
  for (auto& th : pool) th.join();
}

// Integers in [-8, 8] as bf16 (exact); nonzero when asked.
inline std::vector<Bf16Bits> IntegerBf16(std::int64_t n, std::uint64_t seed, bool nonzero = false) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (auto& v : out) {
    int i = dist(rng);
    while (nonzero && i == 0) i = dist(rng);
    v = FloatToBf16(static_cast<float>(i));
  }
  return out;
}

inline std::vector<float> IntegerFp32(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& v : out) v = static_cast<float>(dist(rng));
  return out;
}

// Uniform in (-1, 1), rounded to bf16, never zero: zeros hide unwritten
// outputs and wrong indexing.
inline std::vector<Bf16Bits> RandomBf16(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (auto& v : out) {
    Bf16Bits b = FloatToBf16(dist(rng));
    if ((b & 0x7fffu) == 0) b = FloatToBf16(0.00390625f);
    v = b;
  }
  return out;
}

// Uniform in (-scale, scale) fp32 with full mantissas, never zero.
inline std::vector<float> RandomFp32(std::int64_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& v : out) {
    float f = dist(rng);
    if (f == 0.0f) f = scale * 0.5f;
    v = f;
  }
  return out;
}

inline std::vector<float> Widen(const std::vector<Bf16Bits>& b) {
  std::vector<float> out(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) out[i] = Bf16ToFloat(b[i]);
  return out;
}

// Row-major C[m, n] = P[m, k] . Q[k, n] in fp64 with the sum of |terms|,
// where P(i, l) = p[i * p_row + l * p_col] and Q(l, j) = q[l * q_row + j * q_col].
struct Reference {
  std::vector<double> value;
  std::vector<double> abs_sum;
};

inline Reference GemmReference(std::int64_t m, std::int64_t n, std::int64_t k, const float* p,
                               std::int64_t p_row, std::int64_t p_col, const float* q,
                               std::int64_t q_row, std::int64_t q_col) {
  Reference r;
  r.value.assign(static_cast<std::size_t>(m * n), 0.0);
  r.abs_sum.assign(static_cast<std::size_t>(m * n), 0.0);
  ParallelFor(m * n, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t idx = begin; idx < end; ++idx) {
      const std::int64_t i = idx / n;
      const std::int64_t j = idx % n;
      double s = 0;
      double a = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double t = static_cast<double>(p[i * p_row + l * p_col]) *
                         static_cast<double>(q[l * q_row + j * q_col]);
        s += t;
        a += std::fabs(t);
      }
      r.value[static_cast<std::size_t>(idx)] = s;
      r.abs_sum[static_cast<std::size_t>(idx)] = a;
    }
  });
  return r;
}

// Y = X W^T: P = X [m, k], Q(l, j) = W[j, l].
inline Reference LogitsReference(const std::vector<float>& x, const std::vector<float>& w,
                                 std::int64_t m, std::int64_t v, std::int64_t k) {
  return GemmReference(m, v, k, x.data(), k, 1, w.data(), 1, k);
}
// dX = G W: P = G [m, v], Q = W [v, k].
inline Reference GradInputReference(const std::vector<float>& g, const std::vector<float>& w,
                                    std::int64_t m, std::int64_t v, std::int64_t k) {
  return GemmReference(m, k, v, g.data(), v, 1, w.data(), k, 1);
}
// dW = G^T X: P(i, l) = G[l, i], Q = X [m, k].
inline Reference GradWeightReference(const std::vector<float>& g, const std::vector<float>& x,
                                     std::int64_t m, std::int64_t v, std::int64_t k) {
  return GemmReference(v, k, m, g.data(), 1, v, x.data(), k, 1);
}

constexpr double kFp32Unit = 1.0 / 16777216.0;  // 2^-24
constexpr double kBf16Unit = 1.0 / 256.0;       // 2^-8

// gamma_n = n u / (1 - n u): the bound on any order of fp32 summation of n
// products (each exact, since bf16 x bf16 fits fp32).
inline double Gamma(std::int64_t n) {
  const double nu = static_cast<double>(n) * kFp32Unit;
  return nu / (1.0 - nu);
}

// Checks |got - alpha*ref| <= bound for every element; bf16 outputs add one
// rounding of the fp32 result. NaN never passes. Returns mismatches (and
// records the first few as failures).
inline std::int64_t CheckWithinBound(const Reference& ref, std::int64_t reduction, float alpha,
                                     bool bf16_out, const std::function<double(std::int64_t)>& got,
                                     const std::string& what) {
  std::int64_t bad = 0;
  const double a = std::fabs(static_cast<double>(alpha));
  for (std::size_t i = 0; i < ref.value.size(); ++i) {
    const double exact = static_cast<double>(alpha) * ref.value[i];
    double bound = a * Gamma(reduction) * ref.abs_sum[i];
    if (alpha != 1.0f) bound += kFp32Unit * (std::fabs(exact) + bound);
    if (bf16_out) bound += kBf16Unit * (std::fabs(exact) + bound);
    const double g = got(static_cast<std::int64_t>(i));
    const double err = std::fabs(g - exact);
    if (!(err <= bound)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << ": element " << i << " got " << g << " expected " << exact
                      << " error " << err << " > bound " << bound;
      }
    }
  }
  return bad;
}

// The backend every test in a binary shares, or why there is none.
class CudaFixture : public ::testing::Test {
 protected:
  static Backend* backend() { return Shared().get(); }
  static const std::string& skip_reason() { return SkipReason(); }

  void SetUp() override {
    if (backend() == nullptr) GTEST_SKIP() << "no CUDA device: " << skip_reason();
  }

 private:
  static std::unique_ptr<Backend>& Shared() {
    static std::unique_ptr<Backend>* backend = [] {
      auto* holder = new std::unique_ptr<Backend>();
      auto created = cuda::CreateCudaBackend(BackendOptions{});
      if (created.ok()) {
        *holder = *std::move(created);
      } else {
        SkipReason() = std::string(created.status().message());
      }
      return holder;
    }();
    return *backend;
  }
  static std::string& SkipReason() {
    static std::string* reason = new std::string();
    return *reason;
  }
};

// A cuda and a cpu backend made through the public factory, as the server
// makes them; the test skips where no cuda backend can be made. Only binaries
// that link the factory (logitd_kernels) may use it.
class CudaAndCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.kind = BackendKind::kCuda;
    auto cuda = CreateBackend(options);
    if (!cuda.ok()) GTEST_SKIP() << "no cuda backend: " << cuda.status().message();
    options.kind = BackendKind::kCpu;
    auto cpu = CreateBackend(options);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cuda_ = *std::move(cuda);
    cpu_ = *std::move(cpu);
  }
  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};

}  // namespace logitd::kernels::testing

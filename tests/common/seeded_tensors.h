// Seeded tensors for the tests: the same shape and seed always give the same
// values. Header-only, like targets.h.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/tensor.h"

namespace logitd::testing {

// bf16 tensor of integers drawn uniformly from [lo, hi] (exact in bf16).
inline Tensor IntBf16(std::vector<std::int64_t> shape, std::uint32_t seed, int lo = -8,
                      int hi = 8) {
  Tensor t(DType::kBf16, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Bf16Bits* p = t.data<Bf16Bits>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = FloatToBf16(static_cast<float>(dist(rng)));
  return t;
}

// fp32 tensor of the same kind of integers.
inline Tensor IntFp32(std::vector<std::int64_t> shape, std::uint32_t seed, int lo = -8,
                      int hi = 8) {
  Tensor t(DType::kFp32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(dist(rng));
  return t;
}

// bf16 tensor of standard normal samples rounded to bf16.
inline Tensor NormalBf16(std::vector<std::int64_t> shape, std::uint32_t seed) {
  Tensor t(DType::kBf16, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Bf16Bits* p = t.data<Bf16Bits>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = FloatToBf16(dist(rng));
  return t;
}

// fp32 tensor of standard normal samples times `scale`.
inline Tensor NormalFp32(std::vector<std::int64_t> shape, std::uint32_t seed, float scale = 1.0f) {
  Tensor t(DType::kFp32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng) * scale;
  return t;
}

}  // namespace logitd::testing

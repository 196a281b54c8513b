// Seeded random LM-head inputs for the reference tests: X ~ N(0, 1) and
// W ~ N(0, w_std²) rounded to bf16, targets uniform over V with every
// `ignore_every`-th token (from `ignore_at`) set to -100.
#ifndef LOGITD_TESTS_REFERENCE_RANDOM_LM_HEAD_H_
#define LOGITD_TESTS_REFERENCE_RANDOM_LM_HEAD_H_

#include <cstdint>
#include <random>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/reference/verify_checks.h"

namespace logitd {

inline std::vector<Bf16Bits> RandomBf16(std::int64_t n, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<Bf16Bits> out(static_cast<std::size_t>(n));
  for (Bf16Bits& b : out) b = FloatToBf16(normal(rng));
  return out;
}

struct RandomLmHead {
  std::vector<Bf16Bits> x, w;
  std::vector<std::int64_t> targets;
  std::int64_t m = 0, v = 0, k = 0;
  LmHeadInputs in() const { return LmHeadInputs::Forward(x.data(), w.data(), m, v, k); }
};

inline RandomLmHead MakeRandomLmHead(std::int64_t m, std::int64_t v, std::int64_t k, float w_std,
                                     std::int64_t ignore_every, std::int64_t ignore_at,
                                     std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  RandomLmHead r;
  r.m = m;
  r.v = v;
  r.k = k;
  r.x = RandomBf16(m * k, 1.0f, rng);
  r.w = RandomBf16(v * k, w_std, rng);
  std::uniform_int_distribution<std::int64_t> id(0, v - 1);
  for (std::int64_t i = 0; i < m; ++i) {
    r.targets.push_back(i % ignore_every == ignore_at ? -100 : id(rng));
  }
  return r;
}

}  // namespace logitd

#endif  // LOGITD_TESTS_REFERENCE_RANDOM_LM_HEAD_H_

// Seeded test data for the harness. The generator (xoshiro256** seeded
// through splitmix64) is fully specified, so a seed names the same integers on
// every platform; the "portable" tensors use integer arithmetic only and are
// therefore bit-identical everywhere, which golden baselines rely on.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "logitd/tensor.h"

namespace logitd::validate {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  // A generator for one named stream of a run: DeriveSeed(seed, "w", K).
  static Rng Stream(std::uint64_t seed, absl::string_view name, std::int64_t index = 0);

  std::uint64_t Next();
  // Uniform in [lo, hi], without modulo bias.
  std::int64_t UniformInt(std::int64_t lo, std::int64_t hi);
  // Uniform in [0, 1) with 53 random bits.
  double Uniform01();
  // Standard normal by Marsaglia and Tsang's ziggurat (one draw and a
  // compare for ~99% of values: a [32768, 16384] weight takes seconds, not
  // tens of them). Uses libm, so values may differ in the last bits between
  // platforms: not for golden data.
  double Normal();

 private:
  std::uint64_t s_[4];
};

// Integers drawn uniformly from [lo, hi], stored as bf16 (exact for |v| <= 256)
// or fp32.
Tensor RandomIntegers(DType dtype, std::vector<std::int64_t> shape, std::int64_t lo,
                      std::int64_t hi, Rng& rng);
// N(0, stddev²) rounded once to the tensor's dtype (bf16 by RNE, or fp32).
Tensor RandomNormal(DType dtype, std::vector<std::int64_t> shape, double stddev, Rng& rng);
// A bell-shaped distribution (the sum of four uniform 16-bit integers,
// centred, scaled by 2^-15: mean 0, standard deviation about 1.15) computed
// with integers only, so identical on every platform.
Tensor PortableBell(DType dtype, std::vector<std::int64_t> shape, Rng& rng);
// Token ids uniform over [0, v), about one in `ignore_one_in` set to
// ignore_index (never the first, so that every case has a counted token).
std::vector<std::int64_t> RandomTargets(Rng& rng, std::int64_t m, std::int64_t v,
                                        std::int64_t ignore_index, int ignore_one_in);

}  // namespace logitd::validate

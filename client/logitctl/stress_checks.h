// What `logitctl stress` checks its results with: the run's weights and
// random inputs, an element against its fp64 reference and the proven bound
// of a sum of products (logitd/reference/bounds.h, as the harness and Verify
// take it), the sampled elements and rows, and a worker's own accumulated
// gradient, known exactly. The load, the workers and the report are
// stress.cc's.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl::stress {

// A weight of the run, on the server and here.
struct StressWeight {
  std::int64_t v = 0;
  std::int64_t k = 0;
  bool integer = false;  // integer values in [-8, 8]: exact results
  std::string handle;
  Tensor w;  // bf16 [v, k]
};

// Integer values in [-8, 8] (exact results), else normal ones.
Tensor RandomTensor(DType dtype, std::vector<std::int64_t> shape, bool integer,
                    std::mt19937_64& rng);
// Token ids in [0, v), one in twenty ignored (-100).
Tensor RandomTargets(std::int64_t m, std::int64_t v, std::mt19937_64& rng);
double Value(const Tensor& t, std::int64_t i);
// γ_n of an fp32 sum whose every step errs by up to 2^-23 (the proven
// bound's model: round-to-nearest, or a tensor core's truncating adder).
double StepGamma(std::int64_t n);

// got (element i of an fp32 or bf16 tensor) against an fp64 reference whose
// terms' magnitudes sum to `abs_sum` over n terms: bitwise for exact
// problems (a zero may be -0), else within the proven bound of such a sum
// (SumOfProductsBound), which adds the final bf16 rounding for bf16 outputs.
bool Agrees(const Tensor& got, std::int64_t i, double ref, double abs_sum, std::int64_t n,
            bool exact);

struct Sample {
  std::int64_t i, j;
};
// The four corners and 44 random elements of a [rows, cols] result.
std::vector<Sample> Samples(std::int64_t rows, std::int64_t cols, std::mt19937_64& rng);

// A worker's own weight for accumulation: its expected gradient is known
// here exactly, integer products summed in fp64.
struct OwnGradient {
  StressWeight w;
  std::vector<double> expected;  // [V, K]
  std::uint64_t accumulated = 0;

  // One accumulating Backward of random integer dY and X.
  absl::Status Accumulate(client::Client& c, std::mt19937_64& rng);
  // FetchGradient with zeroing: the count and every element exact; what is
  // wrong, or empty.
  std::string Fetch(client::Client& c, absl::Status* status);
};

// One sampled row of the logits X.W^T in fp64: its index, its logits z,
// their log-sum-exp and the largest proven bound on their fp32 error.
struct SampledRow {
  std::int64_t i = 0;
  std::vector<double> z;
  double lse = 0;
  double err = 0;
};
// Three sampled rows of a call's logits (row 0 and two random ones).
std::vector<SampledRow> SampleRows(const Tensor& x, const StressWeight& w, std::int64_t m,
                                   std::mt19937_64& rng);

}  // namespace logitd::logitctl::stress

// Compiled with -ffp-contract=off: every product and sum is rounded on its
// own, as the device's __fmul_rn and __fadd_rn round them (the products of
// bf16 values are exact, so the sequential sum is also what a fused
// multiply-add gives).
#include "logitd/reference/accumulation_models.h"

#include <algorithm>
#include <vector>

#include "logitd/reference/element_judgement.h"

namespace logitd {

void ModelSums(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t n,
               const PanelOf& panel, float* seq, double* tc) {
  constexpr std::int64_t kP = kModelPanel;
  constexpr std::int64_t kBlock = judgement::kTensorCoreBlock;
  constexpr std::int64_t kGroup = judgement::kModelGroup;
  std::vector<float> b(static_cast<std::size_t>(n * kP));
  for (std::int64_t j0 = 0; j0 < cols; j0 += kP) {
    const std::int64_t count = std::min(kP, cols - j0);
    // A panel of fewer columns is padded with zeros: their sums are
    // formed and dropped.
    if (count < kP) std::fill(b.begin(), b.end(), 0.0f);
    std::vector<float> narrow(static_cast<std::size_t>(n * count));
    panel(j0, count, count < kP ? narrow.data() : b.data());
    if (count < kP) {
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t l = 0; l < count; ++l) b[t * kP + l] = narrow[t * count + l];
      }
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* ai = a + i * n;
      float acc[kP] = {}, s1[kP] = {}, s2[kP] = {};
      for (std::int64_t g0 = 0; g0 < n; g0 += kGroup) {
        const std::int64_t g1 = std::min(n, g0 + kGroup);
        for (std::int64_t t0 = g0; t0 < g1; t0 += kBlock) {
          const std::int64_t t1 = std::min(g1, t0 + kBlock);
          for (std::int64_t t = t0; t < t1; ++t) {
            const float av = ai[t];
            const float* bt = b.data() + t * kP;
            for (std::int64_t l = 0; l < kP; ++l) acc[l] = acc[l] + av * bt[l];
          }
          for (std::int64_t l = 0; l < kP; ++l) judgement::TensorCoreDrift(acc[l], &s1[l]);
        }
        const float blocks = static_cast<float>((g1 - g0 + kBlock - 1) / kBlock);
        for (std::int64_t l = 0; l < kP; ++l) judgement::TensorCoreSpread(acc[l], blocks, &s2[l]);
      }
      for (std::int64_t l = 0; l < count; ++l) {
        seq[i * cols + j0 + l] = acc[l];
        tc[i * cols + j0 + l] = judgement::TensorCoreError(s1[l], s2[l]);
      }
    }
  }
}

}  // namespace logitd

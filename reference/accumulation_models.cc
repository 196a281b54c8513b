// Compiled with -ffp-contract=off: every product and sum is rounded on its
// own, as the device's __fmul_rn and __fadd_rn round them (the products of
// bf16 values are exact, so the sequential sum is also what a fused
// multiply-add gives).
#include "logitd/reference/accumulation_models.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "logitd/reference/element_judgement.h"

namespace logitd {
namespace {

constexpr std::int64_t kP = kModelPanel;
constexpr std::int64_t kBlock = judgement::kTensorCoreBlock;
constexpr std::int64_t kGroup = judgement::kModelGroup;
static_assert(kGroup % kBlock == 0, "whole blocks a group");

// Four lanes of fp32, as GCC and Clang vector extensions give them on any
// target (SSE on x86-64): each operation rounded on its own, as the scalar
// ones are (-ffp-contract=off).
using Lanes = float __attribute__((vector_size(16)));
constexpr int kVectors = static_cast<int>(kP) / 4;

// The sums of R rows against one panel: acc the sequential sums, s1 and s2
// the tensor-core model's (judgement::TensorCoreDrift and
// TensorCoreSpread, written out in lanes: the same roundings). Whole
// groups go through fixed loops, the last one, cut short, through the
// general one.
template <int R>
struct RowSums {
  Lanes acc[R][kVectors] = {}, s1[R][kVectors] = {}, s2[R][kVectors] = {};

  void Group(const float* const* a, const float* b, std::int64_t g0) {
    for (std::int64_t t0 = g0; t0 < g0 + kGroup; t0 += kBlock) {
      for (std::int64_t t = t0; t < t0 + kBlock; ++t) Term(a, b, t);
      Drift();
    }
    Spread(static_cast<float>(kGroup / kBlock));
  }
  void PartGroup(const float* const* a, const float* b, std::int64_t g0, std::int64_t g1) {
    for (std::int64_t t0 = g0; t0 < g1; t0 += kBlock) {
      for (std::int64_t t = t0; t < std::min(g1, t0 + kBlock); ++t) Term(a, b, t);
      Drift();
    }
    Spread(static_cast<float>((g1 - g0 + kBlock - 1) / kBlock));
  }
  void Term(const float* const* a, const float* b, std::int64_t t) {
    Lanes bt[kVectors];
    std::memcpy(bt, b + t * kP, sizeof bt);
    for (int r = 0; r < R; ++r) {
      const Lanes av = Lanes{} + a[r][t];
      for (int q = 0; q < kVectors; ++q) acc[r][q] = acc[r][q] + av * bt[q];
    }
  }
  void Drift() {
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < kVectors; ++q) s1[r][q] = s1[r][q] + acc[r][q];
    }
  }
  void Spread(float blocks) {
    const Lanes w = Lanes{} + blocks;
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < kVectors; ++q) s2[r][q] = s2[r][q] + (acc[r][q] * acc[r][q]) * w;
    }
  }
  float Acc(int r, std::int64_t l) const { return acc[r][l / 4][l % 4]; }
  float S1(int r, std::int64_t l) const { return s1[r][l / 4][l % 4]; }
  float S2(int r, std::int64_t l) const { return s2[r][l / 4][l % 4]; }
};

template <int R>
void PanelRows(const float* a, std::int64_t i, std::int64_t n, const float* b, std::int64_t cols,
               std::int64_t j0, std::int64_t count, float* seq, double* tc) {
  const float* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = a + (i + r) * n;
  RowSums<R> sums;
  std::int64_t g0 = 0;
  for (; g0 + kGroup <= n; g0 += kGroup) sums.Group(rows, b, g0);
  if (g0 < n) sums.PartGroup(rows, b, g0, n);
  for (int r = 0; r < R; ++r) {
    for (std::int64_t l = 0; l < count; ++l) {
      seq[(i + r) * cols + j0 + l] = sums.Acc(r, l);
      tc[(i + r) * cols + j0 + l] = judgement::TensorCoreError(sums.S1(r, l), sums.S2(r, l));
    }
  }
}

}  // namespace

void ModelSums(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t n,
               const PanelOf& panel, float* seq, double* tc) {
  std::vector<float> b(static_cast<std::size_t>(n * kP));
  std::vector<float> narrow(static_cast<std::size_t>(n * kP));
  for (std::int64_t j0 = 0; j0 < cols; j0 += kP) {
    const std::int64_t count = std::min(kP, cols - j0);
    // A panel of fewer columns is padded with zeros: their sums are
    // formed and dropped.
    if (count < kP) {
      std::fill(b.begin(), b.end(), 0.0f);
      panel(j0, count, narrow.data());
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t l = 0; l < count; ++l) b[t * kP + l] = narrow[t * count + l];
      }
    } else {
      panel(j0, count, b.data());
    }
    // Two rows at a time: two independent chains of additions.
    std::int64_t i = 0;
    for (; i + 2 <= rows; i += 2) PanelRows<2>(a, i, n, b.data(), cols, j0, count, seq, tc);
    if (i < rows) PanelRows<1>(a, i, n, b.data(), cols, j0, count, seq, tc);
  }
}

}  // namespace logitd

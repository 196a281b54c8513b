// The precision-class test's models (logitd/reference/accumulation_models.h)
// on the device: for a block's products C [rows, cols] = A·B of n terms,
// each output's sequential fp32 sum and the tensor-core model's error, bit
// for bit what the host's ModelSums forms. Each operand is first packed
// into a panel of fp32 values (its bf16 values, exact), term-major and
// padded with zeros to whole tiles, so that the sums read whole aligned
// rows of 16 bytes; the sums then run as a register-tiled fp32 GEMM does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace logitd::kernels::cuda {

// The padded sizes of a product's two panels: A's [terms][rows] and B's
// [terms][cols] floats.
struct ModelPanelShape {
  std::int64_t rows = 0, cols = 0, terms = 0;  // padded
  std::size_t a_floats() const { return static_cast<std::size_t>(terms * rows); }
  std::size_t b_floats() const { return static_cast<std::size_t>(terms * cols); }
};
ModelPanelShape ModelPanelShapeOf(std::int64_t rows, std::int64_t cols, std::int64_t n);

// panel[t · padded_count + i] = x[i · s_i + t · s_t] (a bf16 value held as
// a double) for i < count and t < n, 0 elsewhere in [padded_terms,
// padded_count]: A's panel with count = rows, B's with count = cols (x[j ·
// s_j + t · s_t]).
cudaError_t LaunchPackModelPanel(const double* x, std::int64_t s_i, std::int64_t s_t,
                                 std::int64_t count, std::int64_t n, std::int64_t padded_count,
                                 std::int64_t padded_terms, float* panel, cudaStream_t stream);

// seq [rows, cols] the sequential fp32 sums of the n terms A(i, t)·B(t, j)
// and tc [rows, cols] the tensor-core model's errors, from the two panels
// packed for `shape` (ModelPanelShapeOf(rows, cols, n)).
cudaError_t LaunchModelSums(const float* a_panel, const float* b_panel,
                            const ModelPanelShape& shape, std::int64_t rows, std::int64_t cols,
                            std::int64_t n, float* seq, double* tc, cudaStream_t stream);

}  // namespace logitd::kernels::cuda

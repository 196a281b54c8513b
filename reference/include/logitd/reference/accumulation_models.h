// The conforming implementations that Verify's precision-class test forms
// itself on the candidate's inputs (element_judgement.h, "The
// precision-class test" in docs/PROTOCOL.md): the sequential fp32 sum of
// the exact products, each addition rounded to nearest, and the
// tensor-core model's error along it. A device that forms them where its
// references are (the cuda backend) gives the same bits.
#pragma once

#include <cstdint>
#include <functional>

namespace logitd {

// Writes b's rows [j0, j0 + count) as a panel [n][count] of floats: panel[t
// * count + l] = b_{j0 + l}[t] (count is at most kModelPanel).
using PanelOf = std::function<void(std::int64_t j0, std::int64_t count, float* panel)>;

// Columns of the output formed together (the vector width of the loop).
inline constexpr std::int64_t kModelPanel = 16;

// For i < rows and j < cols: seq[i·cols + j] = the fp32 sum of a_i[t]·b_j[t]
// over t = 0 .. n−1 in that order, each addition rounded to nearest (the
// products of bf16 values are exact in fp32 unless they underflow), and
// tc[i·cols + j] = the tensor-core model's error magnitude along it
// (judgement::TensorCoreError). a is [rows, n] row-major; b's rows come
// through `panel` a panel at a time.
void ModelSums(const float* a, std::int64_t rows, std::int64_t cols, std::int64_t n,
               const PanelOf& panel, float* seq, double* tc);

}  // namespace logitd

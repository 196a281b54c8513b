// The precision-class test's models on the device (model_kernels.h) are the
// host's ModelSums bit for bit: the sequential sums and the tensor-core
// model's errors, on shapes that fill no tile and sums that end inside a
// block, a group or the first term, with each operand laid out either way
// (its terms or its rows along the unit stride), as Verify's logits, dX and
// dW hand them over.
#include "server/kernels/cuda/model_kernels.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "logitd/reference/accumulation_models.h"

namespace logitd::kernels::testing {
namespace {

// Device memory freed at the end of its scope.
class Memory {
 public:
  explicit Memory(std::size_t bytes) { status_ = cudaMalloc(&p_, bytes > 0 ? bytes : 1); }
  ~Memory() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  cudaError_t status() const { return status_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Shape {
  std::int64_t rows, cols, n;
};

// Values of bf16 as doubles: uniform in (-1, 1), and every seventh a
// thousand times larger, so that the sums cancel and carry.
std::vector<double> Operand(std::int64_t count, std::uint64_t seed) {
  const std::vector<Bf16Bits> bits = RandomBf16(count, seed);
  std::vector<double> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const float f = Bf16ToFloat(bits[i]);
    out[i] = i % 7 == 3 ? static_cast<double>(Bf16ToFloat(FloatToBf16(f * 1024.0f))) : f;
  }
  return out;
}

class ModelKernelsTest : public CudaFixture {
 protected:
  // A(i, t) = a[i·sa_i + t·sa_t], B(t, j) = b[t·sb_t + j·sb_j].
  void ExpectHostsBits(const Shape& s, bool a_terms_unit, bool b_terms_unit) {
    SCOPED_TRACE(::testing::Message() << s.rows << " x " << s.cols << " x " << s.n << ", A "
                                      << (a_terms_unit ? "[rows, n]" : "[n, rows]") << ", B "
                                      << (b_terms_unit ? "[cols, n]" : "[n, cols]"));
    const std::int64_t sa_i = a_terms_unit ? s.n : 1, sa_t = a_terms_unit ? 1 : s.rows;
    const std::int64_t sb_j = b_terms_unit ? s.n : 1, sb_t = b_terms_unit ? 1 : s.cols;
    const std::vector<double> a = Operand(s.rows * s.n, 101 + s.rows);
    const std::vector<double> b = Operand(s.n * s.cols, 202 + s.cols);

    const cuda::ModelPanelShape shape = cuda::ModelPanelShapeOf(s.rows, s.cols, s.n);
    const std::size_t elements = static_cast<std::size_t>(s.rows * s.cols);
    Memory da(a.size() * 8), db(b.size() * 8), pa(shape.a_floats() * 4), pb(shape.b_floats() * 4),
        seq(elements * 4), tc(elements * 8);
    for (const Memory* m : {&da, &db, &pa, &pb, &seq, &tc}) ASSERT_CUDA(m->status());
    ASSERT_CUDA(cudaMemcpy(da.as<void>(), a.data(), a.size() * 8, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(db.as<void>(), b.data(), b.size() * 8, cudaMemcpyHostToDevice));
    // Stale values where the panels' padding goes: the pack writes it.
    ASSERT_CUDA(cudaMemset(pa.as<void>(), 0x7f, shape.a_floats() * 4));
    ASSERT_CUDA(cudaMemset(pb.as<void>(), 0x7f, shape.b_floats() * 4));
    ASSERT_CUDA(cuda::LaunchPackModelPanel(da.as<double>(), sa_i, sa_t, s.rows, s.n, shape.rows,
                                           shape.terms, pa.as<float>(), nullptr));
    ASSERT_CUDA(cuda::LaunchPackModelPanel(db.as<double>(), sb_j, sb_t, s.cols, s.n, shape.cols,
                                           shape.terms, pb.as<float>(), nullptr));
    ASSERT_CUDA(cuda::LaunchModelSums(pa.as<float>(), pb.as<float>(), shape, s.rows, s.cols, s.n,
                                      seq.as<float>(), tc.as<double>(), nullptr));
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<float> dev_seq(elements);
    std::vector<double> dev_tc(elements);
    ASSERT_CUDA(cudaMemcpy(dev_seq.data(), seq.as<void>(), elements * 4, cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(dev_tc.data(), tc.as<void>(), elements * 8, cudaMemcpyDeviceToHost));

    std::vector<float> host_a(static_cast<std::size_t>(s.rows * s.n));
    for (std::int64_t i = 0; i < s.rows; ++i) {
      for (std::int64_t t = 0; t < s.n; ++t) {
        host_a[static_cast<std::size_t>(i * s.n + t)] =
            static_cast<float>(a[static_cast<std::size_t>(i * sa_i + t * sa_t)]);
      }
    }
    const PanelOf panel = [&](std::int64_t j0, std::int64_t count, float* out) {
      for (std::int64_t t = 0; t < s.n; ++t) {
        for (std::int64_t l = 0; l < count; ++l) {
          out[t * count + l] =
              static_cast<float>(b[static_cast<std::size_t>(t * sb_t + (j0 + l) * sb_j)]);
        }
      }
    };
    std::vector<float> host_seq(elements);
    std::vector<double> host_tc(elements);
    ModelSums(host_a.data(), s.rows, s.cols, s.n, panel, host_seq.data(), host_tc.data());

    int shown = 0;
    std::int64_t differing = 0;
    for (std::size_t e = 0; e < elements; ++e) {
      const bool same = std::memcmp(&dev_seq[e], &host_seq[e], 4) == 0 &&
                        std::memcmp(&dev_tc[e], &host_tc[e], 8) == 0;
      if (same) continue;
      ++differing;
      if (shown++ < 5) {
        ADD_FAILURE() << "element " << e / s.cols << ", " << e % s.cols << ": seq " << dev_seq[e]
                      << " against " << host_seq[e] << ", tc " << dev_tc[e] << " against "
                      << host_tc[e];
      }
    }
    EXPECT_EQ(differing, 0);
    // The sums are the products' (not zeros left from a skipped tile).
    EXPECT_NE(host_seq[elements - 1], 0.0f);
  }
};

TEST_F(ModelKernelsTest, TheDevicesModelsAreTheHostsBitForBit) {
  // One tile and less, tiles and a row or column past them, sums ending
  // inside the first block, inside a group and on a group's end, and a
  // long one.
  const Shape shapes[] = {{1, 1, 1},     {3, 5, 7},        {128, 64, 16},
                          {129, 65, 17}, {130, 67, 37},    {7, 300, 33},
                          {200, 3, 64},  {257, 130, 4099}, {64, 129, 1030}};
  for (const Shape& s : shapes) {
    for (const bool a_terms_unit : {true, false}) {
      for (const bool b_terms_unit : {true, false}) {
        ExpectHostsBits(s, a_terms_unit, b_terms_unit);
        if (HasFatalFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

// The row kernels' warp launch (a warp per segment, a warp per row for the
// folds, the batched in-place gradient) against the block-per-segment
// kernels they replaced, and G four columns at a time against G a column at a
// time (rows of a multiple of 4 columns or not, whole rows or a chunk's), bit
// for bit, on fp32 logits
// with full mantissas, infinities and NaNs, ragged segments, two chunks
// folded in turn, soft-capping, ignored targets, the entropy and top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "server/kernels/cuda/cross_entropy_kernels.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/logprobs_kernels.h"

namespace logitd::kernels::testing {
namespace {

using cuda::CeLaunch;

// Random logits of spread `scale` with, when the shape allows: row 1 all
// -Inf, row 2 one NaN, row 3 one +Inf, row 4 a tie for the max.
std::vector<float> Logits(std::int64_t m, std::int64_t n, std::uint64_t seed, float scale) {
  std::vector<float> y = RandomFp32(m * n, seed, scale);
  const float inf = std::numeric_limits<float>::infinity();
  auto at = [&](std::int64_t r, std::int64_t c) -> float& {
    return y[static_cast<std::size_t>(r * n + c)];
  };
  if (m > 1) {
    for (std::int64_t c = 0; c < n; ++c) at(1, c) = -inf;
  }
  if (m > 2) at(2, n / 2) = std::numeric_limits<float>::quiet_NaN();
  if (m > 3) at(3, n - 1) = inf;
  if (m > 4 && n > 1) at(4, 0) = at(4, n - 1) = 2 * scale;
  return y;
}

std::vector<std::int64_t> Targets(std::int64_t m, std::int64_t v, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, v - 1);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i)
    t[static_cast<std::size_t>(i)] = i % 7 == 5 ? -100 : dist(rng);
  return t;
}

class RowKernelsTest : public CudaFixture {
 protected:
  void SetUp() override {
    CudaFixture::SetUp();
    if (IsSkipped()) return;
    memory_ = cuda::DeviceMemory::Create(0, 0);
  }

  // A zeroed device buffer of `bytes`, kept until the test ends.
  void* Buffer(std::size_t bytes) {
    auto b = memory_->Allocate(bytes == 0 ? 1 : bytes, "test buffer");
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(cudaMemset(b->get(), 0, bytes == 0 ? 1 : bytes), cudaSuccess);
    buffers_.push_back(*std::move(b));
    return buffers_.back().get();
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    void* d = Buffer(host.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return static_cast<T*>(d);
  }

  // `count` values of T at d, as bytes (for bitwise comparison).
  template <typename T>
  static std::string Bytes(const T* d, std::size_t count) {
    std::string out(count * sizeof(T), '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  cuda::CeRowState CeState(std::int64_t m, std::int64_t segments) {
    const auto rows = static_cast<std::size_t>(m);
    const std::size_t partials = rows * static_cast<std::size_t>(segments);
    cuda::CeRowState s;
    s.run_max = static_cast<float*>(Buffer(rows * 4));
    s.run_sum = static_cast<double*>(Buffer(rows * 8));
    s.target_z = static_cast<float*>(Buffer(rows * 4));
    s.lse = static_cast<float*>(Buffer(rows * 4));
    s.coef = static_cast<float*>(Buffer(rows * 4));
    s.seg_max = static_cast<float*>(Buffer(partials * 4));
    s.seg_sum = static_cast<double*>(Buffer(partials * 8));
    return s;
  }

  std::shared_ptr<cuda::DeviceMemory> memory_;
  std::vector<cuda::DeviceBuffer> buffers_;
};

struct Shape {
  std::int64_t m;
  std::int64_t n1;  // first chunk's columns, a multiple of kCeSegmentColumns
  std::int64_t n2;  // second chunk's
};

const Shape kShapes[] = {{7, 1024, 700}, {37, 4096, 5000}, {5, 65536, 62720}, {3, 1024, 1}};

// The cross-entropy's statistics, loss and lse over two chunks, then G in
// place over whole rows, under one launch; everything as bytes.
struct CeRun {
  std::string run_max, run_sum, target_z, seg_max, seg_sum, loss, lse, g_in_place, g_separate;
};

TEST_F(RowKernelsTest, CrossEntropyWarpLaunchGivesTheBlockLaunchBits) {
  for (const Shape& shape : kShapes) {
    for (float cap : {0.0f, 20.0f}) {
      const std::int64_t m = shape.m;
      const std::int64_t n = shape.n1 + shape.n2;
      const std::vector<float> y = Logits(m, n, 11 + static_cast<std::uint64_t>(n), 9.0f);
      // The two chunks as the vocabulary walk stores them, [m, n1] and [m, n2].
      std::vector<float> y1, y2;
      for (std::int64_t r = 0; r < m; ++r) {
        y1.insert(y1.end(), y.begin() + r * n, y.begin() + r * n + shape.n1);
        y2.insert(y2.end(), y.begin() + r * n + shape.n1, y.begin() + (r + 1) * n);
      }
      const std::vector<std::int64_t> t = Targets(m, n, 5 + static_cast<std::uint64_t>(m));
      cuda::CeRowParams p;
      p.targets = Upload(t);
      p.logit_softcap = cap;
      p.z_loss = 1e-4f;
      p.grad_scale = 0.25f;
      const float* d1 = Upload(y1);
      const float* d2 = Upload(y2);

      CeRun runs[2];
      for (int i = 0; i < 2; ++i) {
        const CeLaunch launch = i == 0 ? CeLaunch::kBlocks : CeLaunch::kWarps;
        const cuda::CeRowState s = CeState(m, cuda::CeSegments(n));
        float* loss = static_cast<float*>(Buffer(static_cast<std::size_t>(m) * 4));
        float* lse = static_cast<float*>(Buffer(static_cast<std::size_t>(m) * 4));
        ASSERT_EQ(cuda::LaunchCeInit(s, m, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeChunkStats(d1, m, shape.n1, 0, p, s, nullptr, launch), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeChunkStats(d2, m, shape.n2, shape.n1, p, s, nullptr, launch),
                  cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeFinalize(m, p, s, loss, lse, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        CeRun& r = runs[i];
        const auto rows = static_cast<std::size_t>(m);
        r.run_max = Bytes(s.run_max, rows);
        r.run_sum = Bytes(s.run_sum, rows);
        r.target_z = Bytes(s.target_z, rows);
        // The second chunk's partials, [m, its segments].
        const std::size_t partials = rows * static_cast<std::size_t>(cuda::CeSegments(shape.n2));
        r.seg_max = Bytes(s.seg_max, partials);
        r.seg_sum = Bytes(s.seg_sum, partials);
        r.loss = Bytes(loss, rows);
        r.lse = Bytes(lse, rows);
        // The second chunk's G as the vocabulary walk writes it (its columns
        // start at n1, so the target test is against c0 + column).
        auto* g2 =
            static_cast<std::uint16_t*>(Buffer(rows * static_cast<std::size_t>(shape.n2) * 2));
        ASSERT_EQ(cuda::LaunchCeGradient(d2, m, shape.n2, shape.n1, p, s, g2, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::string chunk_g = Bytes(g2, rows * static_cast<std::size_t>(shape.n2));

        // Whole rows, as the token walk holds them: statistics, then G in
        // place, and G by the separate-output kernel from the same state.
        const cuda::CeRowState w = CeState(m, cuda::CeSegments(n));
        float* rows_y = Upload(y);
        float* loss2 = static_cast<float*>(Buffer(rows * 4));
        auto* g = static_cast<std::uint16_t*>(Buffer(rows * static_cast<std::size_t>(n) * 2));
        ASSERT_EQ(cuda::LaunchCeInit(w, m, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeChunkStats(rows_y, m, n, 0, p, w, nullptr, launch), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeFinalize(m, p, w, loss2, nullptr, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeGradient(rows_y, m, n, 0, p, w, g, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchCeGradientInPlace(rows_y, m, n, p, w, nullptr, launch), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(Bytes(loss2, rows), r.loss) << "one chunk against two, m=" << m << " n=" << n;
        r.g_separate = Bytes(g, rows * static_cast<std::size_t>(n));
        // In place: row i's G is the first n bf16 of its 2n.
        const std::string all = Bytes(reinterpret_cast<const std::uint16_t*>(rows_y),
                                      rows * static_cast<std::size_t>(2 * n));
        for (std::size_t row = 0; row < rows; ++row) {
          r.g_in_place +=
              all.substr(row * static_cast<std::size_t>(4 * n), static_cast<std::size_t>(2 * n));
        }
        EXPECT_EQ(r.g_in_place, r.g_separate)
            << "in-place G differs from the separate kernel's, m=" << m << " n=" << n;
        std::string tail;
        for (std::size_t row = 0; row < rows; ++row) {
          tail += r.g_separate.substr(
              row * static_cast<std::size_t>(2 * n) + static_cast<std::size_t>(2 * shape.n1),
              static_cast<std::size_t>(2 * shape.n2));
        }
        EXPECT_EQ(chunk_g, tail) << "the second chunk's G differs from the whole rows', m=" << m
                                 << " n=" << n;
      }
      const std::string what =
          "m=" + std::to_string(m) + " n=" + std::to_string(n) + " cap=" + std::to_string(cap);
      EXPECT_EQ(runs[1].seg_max, runs[0].seg_max) << what;
      EXPECT_EQ(runs[1].seg_sum, runs[0].seg_sum) << what;
      EXPECT_EQ(runs[1].run_max, runs[0].run_max) << what;
      EXPECT_EQ(runs[1].run_sum, runs[0].run_sum) << what;
      EXPECT_EQ(runs[1].target_z, runs[0].target_z) << what;
      EXPECT_EQ(runs[1].loss, runs[0].loss) << what;
      EXPECT_EQ(runs[1].lse, runs[0].lse) << what;
      EXPECT_EQ(runs[1].g_in_place, runs[0].g_in_place) << what;
    }
  }
}

TEST_F(RowKernelsTest, LogProbsWarpLaunchGivesTheBlockLaunchBits) {
  for (const Shape& shape : kShapes) {
    for (int top_k : {0, 5, 20}) {
      const std::int64_t m = shape.m;
      const std::int64_t n = shape.n1 + shape.n2;
      const std::vector<float> y = Logits(m, n, 31 + static_cast<std::uint64_t>(n), 6.0f);
      std::vector<float> y1, y2;
      for (std::int64_t r = 0; r < m; ++r) {
        y1.insert(y1.end(), y.begin() + r * n, y.begin() + r * n + shape.n1);
        y2.insert(y2.end(), y.begin() + r * n + shape.n1, y.begin() + (r + 1) * n);
      }
      const std::vector<std::int64_t> t = Targets(m, n, 9 + static_cast<std::uint64_t>(m));
      cuda::LpRowParams p;
      p.targets = Upload(t);
      p.temperature = 0.7f;
      p.logit_softcap = top_k == 5 ? 15.0f : 0.0f;
      p.entropy = true;
      p.top_k = top_k;
      const float* d1 = Upload(y1);
      const float* d2 = Upload(y2);
      const auto rows = static_cast<std::size_t>(m);
      const std::int64_t segments = cuda::CeSegments(std::max(shape.n1, shape.n2));
      const std::size_t partials = rows * static_cast<std::size_t>(segments);
      const std::size_t topk = rows * static_cast<std::size_t>(top_k);

      std::string got[2][10];
      for (int i = 0; i < 2; ++i) {
        const CeLaunch launch = i == 0 ? CeLaunch::kBlocks : CeLaunch::kWarps;
        cuda::LpRowState s;
        s.ce = CeState(m, segments);
        s.run_zsum = static_cast<double*>(Buffer(rows * 8));
        s.seg_zsum = static_cast<double*>(Buffer(partials * 8));
        cuda::LpTopKLists lists;
        lists.row_lists = segments + 1;
        lists.keys = static_cast<std::uint64_t*>(
            Buffer(topk * static_cast<std::size_t>(lists.row_lists) * 8));
        lists.merge = static_cast<std::uint64_t*>(
            Buffer(static_cast<std::size_t>(cuda::LpMergeKeys(m, lists.row_lists, top_k)) * 8));
        float* logprob = static_cast<float*>(Buffer(rows * 4));
        float* lse = static_cast<float*>(Buffer(rows * 4));
        float* entropy = static_cast<float*>(Buffer(rows * 4));
        auto* ids = static_cast<std::int32_t*>(Buffer(topk * 4));
        float* top = static_cast<float*>(Buffer(topk * 4));
        ASSERT_EQ(cuda::LaunchLpInit(m, p, s, lists, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::LaunchLpChunkStats(d1, m, shape.n1, 0, p, s, lists, nullptr, launch),
                  cudaSuccess);
        ASSERT_EQ(cuda::LaunchLpChunkStats(d2, m, shape.n2, shape.n1, p, s, lists, nullptr, launch),
                  cudaSuccess);
        ASSERT_EQ(cuda::LaunchLpFinalize(m, p, s, lists, logprob, lse, entropy, ids, top, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::size_t last = rows * static_cast<std::size_t>(cuda::CeSegments(shape.n2));
        got[i][0] = Bytes(s.ce.seg_max, last);
        got[i][1] = Bytes(s.ce.seg_sum, last);
        got[i][2] = Bytes(s.seg_zsum, last);
        got[i][3] = Bytes(s.ce.run_max, rows);
        got[i][4] = Bytes(s.ce.run_sum, rows);
        got[i][5] = Bytes(s.run_zsum, rows);
        got[i][6] = Bytes(logprob, rows) + Bytes(lse, rows);
        got[i][7] = Bytes(entropy, rows);
        got[i][8] = Bytes(ids, topk);
        got[i][9] = Bytes(top, topk);
      }
      const char* names[] = {"seg_max",  "seg_sum",         "seg_zsum", "run_max",   "run_sum",
                             "run_zsum", "logprob and lse", "entropy",  "top-k ids", "top-k"};
      for (int j = 0; j < 10; ++j) {
        EXPECT_EQ(got[1][j], got[0][j])
            << names[j] << " differs, m=" << m << " n=" << n << " top_k=" << top_k;
      }
      // Not vacuous: the top-k found something on an ordinary row.
      if (top_k > 0) {
        std::int32_t first = -1;
        std::memcpy(&first, got[1][8].data(), 4);
        EXPECT_GE(first, 0);
        EXPECT_LT(first, n);
      }
    }
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

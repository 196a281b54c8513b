// The GEMM engine below the backend: the split-K policy filters what runs
// (no split with "off"; only fp32 partial sums with "fp32"), the three
// layouts are right on integer operands under every policy, and the cache
// holds one choice per shape.
#include "server/kernels/cuda/lt_gemm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_test_util.h"
#include "server/kernels/cuda/cuda_handles.h"

namespace logitd::kernels::testing {
namespace {

using cuda::GemmShape;

struct Device {
  std::shared_ptr<cuda::DeviceMemory> memory = cuda::DeviceMemory::Create(0, 0);
  cuda::Stream stream;
  cuda::LtHandle handle;
  cuda::DeviceBuffer workspace;
  cuda::GemmStream gemm() const {
    return {handle.get(), stream.get(), workspace.get(), workspace.size()};
  }
};

class LtGemmTest : public CudaFixture {
 protected:
  void SetUp() override {
    CudaFixture::SetUp();
    if (IsSkipped()) return;
    auto stream = cuda::CreateStream();
    auto handle = cuda::CreateLtHandle();
    auto workspace = device_.memory->Allocate(32u << 20, "workspace");
    ASSERT_TRUE(stream.ok() && handle.ok() && workspace.ok());
    device_.stream = *std::move(stream);
    device_.handle = *std::move(handle);
    device_.workspace = *std::move(workspace);
  }

  cuda::DeviceBuffer Upload(const void* data, std::size_t bytes) {
    auto b = device_.memory->Allocate(bytes, "operand");
    EXPECT_TRUE(b.ok());
    EXPECT_EQ(cudaMemcpy(b->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    // The GEMMs run on a non-blocking stream, which does not wait for copies
    // on the legacy default stream.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return *std::move(b);
  }

  Device device_;
};

struct Case {
  const char* op;
  std::int64_t m, v, k;  // in the LM head's terms
};

TEST_F(LtGemmTest, SplitKPolicyIsHonouredAndResultsAreExact) {
  // Small outputs with long reductions: the shapes where the library likes
  // to split K.
  for (const Case& c : {Case{"logits", 16, 1024, 16384}, Case{"logits", 8, 256, 65536},
                        Case{"dx", 16, 65536, 256}, Case{"dw", 16384, 256, 128}}) {
    const auto x = IntegerBf16(c.m * c.k, 1);
    const auto w = IntegerBf16(c.v * c.k, 2);
    const auto gf = IntegerFp32(c.m * c.v, 3);
    std::vector<Bf16Bits> g(gf.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = FloatToBf16(gf[i]);
    auto dx_ = Upload(x.data(), x.size() * 2);
    auto dw_ = Upload(w.data(), w.size() * 2);
    auto dg_ = Upload(g.data(), g.size() * 2);
    const std::string op = c.op;
    Reference ref;
    if (op == "logits") ref = LogitsReference(Widen(x), Widen(w), c.m, c.v, c.k);
    if (op == "dx") ref = GradInputReference(gf, Widen(w), c.m, c.v, c.k);
    if (op == "dw") ref = GradWeightReference(gf, Widen(x), c.m, c.v, c.k);

    for (SplitK policy : {SplitK::kOff, SplitK::kFp32, SplitK::kAny}) {
      cuda::GemmEngineOptions options;
      options.split_k = policy;
      cuda::GemmEngine engine(options, device_.memory);
      for (cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF}) {
        GemmShape shape;
        cuda::GemmOperands ops;
        if (op == "logits") {
          shape = cuda::LogitsShape(c.m, c.v, c.k, out);
          ops = {dx_.get(), dw_.get(), nullptr};
        } else if (op == "dx") {
          shape = cuda::GradInputShape(c.m, c.v, c.k, out);
          ops = {dg_.get(), dw_.get(), nullptr};
        } else {
          shape = cuda::GradWeightShape(c.m, c.v, c.k, out);
          ops = {dg_.get(), dx_.get(), nullptr};
        }
        const std::size_t elt = out == CUDA_R_32F ? 4 : 2;
        auto dc = device_.memory->Allocate(ref.value.size() * elt, "c");
        ASSERT_TRUE(dc.ok());
        ASSERT_EQ(cudaMemset(dc->get(), 0xff, dc->size()), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ops.c = dc->get();
        const absl::Status st = engine.Run(shape, ops, device_.gemm());
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaStreamSynchronize(device_.stream.get()), cudaSuccess);
        auto choice = engine.Cached(shape, ops, device_.workspace.size());
        ASSERT_TRUE(choice.has_value());
        std::cout << shape.ToString() << " split_k=" << SplitKName(policy) << ": "
                  << choice->ToString() << "\n";
        if (policy == SplitK::kOff) {
          EXPECT_EQ(choice->split_k, 1);
        }
        if (policy == SplitK::kFp32 && out == CUDA_R_16BF) {
          EXPECT_TRUE(choice->split_k == 1 ||
                      choice->reduction == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
        }
        std::vector<std::byte> host(dc->size());
        ASSERT_EQ(cudaMemcpy(host.data(), dc->get(), host.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        // Exact sums are exact under any split; bf16 out under "any" may
        // round partial sums, so it is only reported.
        const bool must_match = !(policy == SplitK::kAny && out == CUDA_R_16BF);
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < ref.value.size(); ++i) {
          const float exact = static_cast<float>(ref.value[i]);
          const bool ok =
              out == CUDA_R_32F
                  ? FloatBits(reinterpret_cast<const float*>(host.data())[i]) == FloatBits(exact)
                  : reinterpret_cast<const Bf16Bits*>(host.data())[i] == FloatToBf16(exact);
          bad += !ok;
        }
        if (must_match) {
          EXPECT_EQ(bad, 0) << shape.ToString() << " " << SplitKName(policy);
        } else if (bad != 0) {
          std::cout << "  (split_k=any, bf16 out: " << bad << " elements differ from the "
                    << "correctly rounded sums)\n";
        }
      }
      EXPECT_EQ(engine.cache_size(), 2u);
    }
  }
}

TEST_F(LtGemmTest, WithoutTuningTheHeuristicsFirstChoiceRuns) {
  const std::int64_t m = 64, v = 4096, k = 1024;
  const auto x = RandomBf16(m * k, 5);
  const auto w = RandomBf16(v * k, 6);
  auto dx = Upload(x.data(), x.size() * 2);
  auto dw = Upload(w.data(), w.size() * 2);
  auto dc = device_.memory->Allocate(static_cast<std::size_t>(m * v) * 4, "c");
  ASSERT_TRUE(dc.ok());
  cuda::GemmEngineOptions options;
  options.autotune = false;
  cuda::GemmEngine engine(options, device_.memory);
  const GemmShape shape = cuda::LogitsShape(m, v, k, CUDA_R_32F);
  const cuda::GemmOperands ops{dx.get(), dw.get(), dc->get()};
  ASSERT_TRUE(engine.Run(shape, ops, device_.gemm()).ok());
  auto choice = engine.Cached(shape, ops, device_.workspace.size());
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->timed, 0);
  EXPECT_EQ(choice->rank, 0);
  // The GEMM ran on a non-blocking stream: a plain cudaMemcpy does not wait for it.
  ASSERT_EQ(cudaStreamSynchronize(device_.stream.get()), cudaSuccess);
  std::vector<float> y(static_cast<std::size_t>(m * v));
  ASSERT_EQ(cudaMemcpy(y.data(), dc->get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  const Reference ref = LogitsReference(Widen(x), Widen(w), m, v, k);
  EXPECT_EQ(CheckWithinBound(
                ref, k, 1.0f, false, [&](std::int64_t i) { return y[static_cast<std::size_t>(i)]; },
                "fp32"),
            0);
}

}  // namespace
}  // namespace logitd::kernels::testing

namespace logitd::kernels::testing {
namespace {

// Every configuration the heuristic offers, run on random and on integer
// operands: with fp32 out each must stay far below bf16 rounding error and be
// exact on integers; with bf16 out the ones the fp32 policy allows must equal
// the correctly rounded exact sums. Prints one line per configuration.
TEST_F(LtGemmTest, EveryOfferedConfigurationIsAccurate) {
  for (const Case& c : {Case{"logits", 16, 8192, 16384}, Case{"logits", 64, 4096, 16384},
                        Case{"dx", 16, 32768, 2048}, Case{"dw", 8192, 2048, 256}}) {
    const std::string op = c.op;
    struct Data {
      std::vector<Bf16Bits> x, w, g;
      std::vector<float> gf;
      Reference ref;
      cuda::DeviceBuffer dx, dw, dg;
    };
    Data data[2];  // 0: random, 1: integers
    for (int kind = 0; kind < 2; ++kind) {
      Data& d = data[kind];
      d.x = kind == 0 ? RandomBf16(c.m * c.k, 11) : IntegerBf16(c.m * c.k, 11);
      d.w = kind == 0 ? RandomBf16(c.v * c.k, 12) : IntegerBf16(c.v * c.k, 12);
      d.g = kind == 0 ? RandomBf16(c.m * c.v, 13) : IntegerBf16(c.m * c.v, 13);
      d.gf = Widen(d.g);
      if (op == "logits") d.ref = LogitsReference(Widen(d.x), Widen(d.w), c.m, c.v, c.k);
      if (op == "dx") d.ref = GradInputReference(d.gf, Widen(d.w), c.m, c.v, c.k);
      if (op == "dw") d.ref = GradWeightReference(d.gf, Widen(d.x), c.m, c.v, c.k);
      d.dx = Upload(d.x.data(), d.x.size() * 2);
      d.dw = Upload(d.w.data(), d.w.size() * 2);
      d.dg = Upload(d.g.data(), d.g.size() * 2);
    }
    // Mean |bf16(ref) - ref|: the error every bf16 output carries.
    double bf16_err = 0;
    for (double r : data[0].ref.value) {
      bf16_err += std::fabs(Bf16ToFloat(FloatToBf16(static_cast<float>(r))) - r);
    }
    bf16_err /= static_cast<double>(data[0].ref.value.size());

    for (cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF}) {
      auto shape_of = [&] {
        if (op == "logits") return cuda::LogitsShape(c.m, c.v, c.k, out);
        if (op == "dx") return cuda::GradInputShape(c.m, c.v, c.k, out);
        return cuda::GradWeightShape(c.m, c.v, c.k, out);
      };
      const GemmShape shape = shape_of();
      auto ops_of = [&](const Data& d, void* cptr) {
        if (op == "logits") return cuda::GemmOperands{d.dx.get(), d.dw.get(), cptr};
        if (op == "dx") return cuda::GemmOperands{d.dg.get(), d.dw.get(), cptr};
        return cuda::GemmOperands{d.dg.get(), d.dx.get(), cptr};
      };
      const std::size_t elt = out == CUDA_R_32F ? 4 : 2;
      const std::size_t count = data[0].ref.value.size();
      auto dc = device_.memory->Allocate(count * elt, "c");
      ASSERT_TRUE(dc.ok());
      cuda::GemmEngineOptions any;
      any.split_k = SplitK::kAny;
      any.heuristic_candidates = 32;
      cuda::GemmEngine lister(any, device_.memory);
      auto candidates = lister.Candidates(shape, ops_of(data[0], dc->get()), device_.gemm());
      ASSERT_TRUE(candidates.ok()) << candidates.status();
      std::vector<std::byte> host(count * elt);
      auto value = [&](std::size_t i) -> double {
        return out == CUDA_R_32F ? reinterpret_cast<const float*>(host.data())[i]
                                 : Bf16ToFloat(reinterpret_cast<const Bf16Bits*>(host.data())[i]);
      };
      for (const auto& cand : *candidates) {
        double mean_err = 0;
        std::int64_t int_bad = 0;
        for (int kind = 0; kind < 2; ++kind) {
          ASSERT_EQ(cudaMemset(dc->get(), 0xff, dc->size()), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const absl::Status st =
              lister.RunWith(shape, ops_of(data[kind], dc->get()), device_.gemm(), cand);
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_EQ(cudaStreamSynchronize(device_.stream.get()), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(host.data(), dc->get(), host.size(), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (std::size_t i = 0; i < count; ++i) {
            const double r = data[kind].ref.value[i];
            if (kind == 0) {
              mean_err += std::fabs(value(i) - r);
            } else {
              const double want =
                  out == CUDA_R_32F ? r : Bf16ToFloat(FloatToBf16(static_cast<float>(r)));
              int_bad += value(i) != want;
            }
          }
        }
        mean_err /= static_cast<double>(count);
        const double ratio = mean_err / bf16_err;
        const bool fp32_allowed = cand.split_k == 1 || out == CUDA_R_32F ||
                                  cand.reduction == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        std::cout << shape.ToString() << " " << cand.ToString() << " | err/bf16err " << ratio
                  << " | integer mismatches " << int_bad
                  << (fp32_allowed ? "" : " | (not allowed by split_k=fp32)") << "\n";
        if (!fp32_allowed) continue;
        EXPECT_EQ(int_bad, 0) << shape.ToString() << " " << cand.ToString();
        if (out == CUDA_R_32F) {
          EXPECT_LT(ratio, 0.1) << shape.ToString() << " " << cand.ToString();
        } else {
          EXPECT_LT(ratio, 1.2) << shape.ToString() << " " << cand.ToString();
        }
      }
      // And what the tuned engine settles on.
      cuda::GemmEngine tuned(cuda::GemmEngineOptions{}, device_.memory);
      const cuda::GemmOperands ops = ops_of(data[0], dc->get());
      ASSERT_TRUE(tuned.Run(shape, ops, device_.gemm()).ok());
      auto choice = tuned.Cached(shape, ops, device_.workspace.size());
      ASSERT_TRUE(choice.has_value());
      std::cout << "  tuned (split_k=fp32): " << choice->ToString() << "\n";
    }
  }
}

}  // namespace
}  // namespace logitd::kernels::testing

namespace logitd::kernels::testing {
namespace {

// Every configuration the tuner would time, for small and odd shapes (the
// LM head of a small model, token counts from 1 to 300), runs to completion
// on its own and gives the exact sums of integer operands. A configuration
// that does not finish within 10 s fails the test and ends the process: a
// hung kernel cannot be stopped.
TEST_F(LtGemmTest, EveryTuningCandidateFinishesExactlyOnOddShapes) {
  auto done = cuda::CreateEvent(false);
  ASSERT_TRUE(done.ok());
  int runs = 0;
  for (const auto& [v, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {256, 128}, {384, 200}, {130, 257}, {77, 333}}) {
    for (std::int64_t m : {1, 4, 5, 300}) {
      const auto x = IntegerBf16(m * k, 31);
      const auto w = IntegerBf16(v * k, 32);
      const auto gf = IntegerFp32(m * v, 33);
      std::vector<Bf16Bits> g(gf.size());
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = FloatToBf16(gf[i]);
      auto dx = Upload(x.data(), x.size() * 2);
      auto dw = Upload(w.data(), w.size() * 2);
      auto dg = Upload(g.data(), g.size() * 2);
      for (const std::string op : {"logits", "dx", "dw"}) {
        Reference ref;
        if (op == "logits") ref = LogitsReference(Widen(x), Widen(w), m, v, k);
        if (op == "dx") ref = GradInputReference(gf, Widen(w), m, v, k);
        if (op == "dw") ref = GradWeightReference(gf, Widen(x), m, v, k);
        for (cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF}) {
          GemmShape shape;
          cuda::GemmOperands ops;
          if (op == "logits") {
            shape = cuda::LogitsShape(m, v, k, out);
            ops = {dx.get(), dw.get(), nullptr};
          } else if (op == "dx") {
            shape = cuda::GradInputShape(m, v, k, out);
            ops = {dg.get(), dw.get(), nullptr};
          } else {
            shape = cuda::GradWeightShape(m, v, k, out);
            ops = {dg.get(), dx.get(), nullptr};
          }
          const std::size_t elt = out == CUDA_R_32F ? 4 : 2;
          auto dc = device_.memory->Allocate(ref.value.size() * elt, "c");
          ASSERT_TRUE(dc.ok());
          ops.c = dc->get();
          cuda::GemmEngine engine(cuda::GemmEngineOptions{}, device_.memory);
          auto candidates = engine.TuningCandidates(shape, ops, device_.gemm());
          ASSERT_TRUE(candidates.ok()) << shape.ToString() << ": " << candidates.status();
          std::vector<std::byte> host(dc->size());
          for (const auto& cand : *candidates) {
            ++runs;
            // On the GEMM's stream: a plain cudaMemset could still be
            // running when the GEMM writes.
            ASSERT_EQ(cudaMemsetAsync(dc->get(), 0xff, dc->size(), device_.stream.get()),
                      cudaSuccess);
            const absl::Status st = engine.RunWith(shape, ops, device_.gemm(), cand);
            ASSERT_TRUE(st.ok()) << shape.ToString() << " " << cand.ToString() << ": " << st;
            ASSERT_EQ(cudaEventRecord(done->get(), device_.stream.get()), cudaSuccess);
            const auto t0 = std::chrono::steady_clock::now();
            cudaError_t q;
            while ((q = cudaEventQuery(done->get())) == cudaErrorNotReady) {
              if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
                std::fprintf(stderr, "FAILED: %s %s did not finish within 10 s\n",
                             shape.ToString().c_str(), cand.ToString().c_str());
                std::fflush(nullptr);
                std::_Exit(1);
              }
              std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
            ASSERT_EQ(q, cudaSuccess)
                << shape.ToString() << " " << cand.ToString() << ": " << cudaGetErrorName(q);
            ASSERT_EQ(cudaMemcpy(host.data(), dc->get(), host.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            // Bitwise, except that a zero sum may be -0: a sum of one
            // product (K = 1) of a negative and a zero is -0 in IEEE 754,
            // where the fp64 reference, which starts from +0, says +0.
            std::int64_t bad = 0;
            std::string first;
            for (std::size_t i = 0; i < ref.value.size(); ++i) {
              const float exact = static_cast<float>(ref.value[i]);
              const float got =
                  out == CUDA_R_32F
                      ? reinterpret_cast<const float*>(host.data())[i]
                      : Bf16ToFloat(reinterpret_cast<const Bf16Bits*>(host.data())[i]);
              const float want = out == CUDA_R_32F ? exact : Bf16ToFloat(FloatToBf16(exact));
              const bool ok = FloatBits(got) == FloatBits(want) || (got == 0.0f && want == 0.0f);
              if (!ok && bad++ == 0) first = absl::StrCat(" first at ", i, ": ", got, " vs ", want);
            }
            EXPECT_EQ(bad, 0) << shape.ToString() << " " << cand.ToString() << first;
          }
        }
      }
    }
  }
  std::cout << runs << " configurations run\n";
}

}  // namespace
}  // namespace logitd::kernels::testing

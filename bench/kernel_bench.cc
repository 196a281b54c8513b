// logitd_kernel_bench: the LM head's GEMMs as the cuda backend runs them
// (tuned algorithm, split-K kept in fp32) against plain cuBLASLt with its
// top-1 heuristic, on the seed's grid and on training shapes; plus the cast
// kernel's bandwidth against a device-to-device copy. Random non-zero data,
// inputs rotated where they would fit in L2, median of event-timed samples
// after warm-up, sampled results checked against fp64.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_fill.h"
#include "logitd/bf16.h"
#include "nlohmann/json.hpp"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_handles.h"
#include "server/kernels/cuda/lt_gemm.h"

namespace logitd::bench {
namespace {

namespace kc = logitd::kernels::cuda;
using nlohmann::json;

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void MustOk(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

struct Options {
  std::string json_path;
  std::string shapes = "all";  // seed | train | all
  int reps = 30;
  int warmup = 10;
  double min_sample_us = 1000;  // a sample times enough calls to last this long
};

struct Problem {
  std::int64_t m, k, n;
  std::string group;
};

std::vector<Problem> Problems(const std::string& which) {
  std::vector<Problem> out;
  if (which == "seed" || which == "all") {
    for (std::int64_t m : {16, 128, 1024}) {
      for (std::int64_t k : {1024, 2048, 4096, 8192, 16384}) out.push_back({m, k, 32768, "seed"});
    }
  }
  if (which == "train" || which == "all") {
    out.push_back({8192, 4096, 128256, "train"});
    out.push_back({8192, 2304, 256000, "train"});
    out.push_back({4096, 4096, 262144, "train"});
  }
  return out;
}

struct Device {
  std::shared_ptr<kc::DeviceMemory> memory;
  kc::Stream stream;
  kc::LtHandle handle;
  kc::DeviceBuffer workspace;
  kc::Event start;
  kc::Event stop;
  kc::GemmStream gemm() const {
    return {handle.get(), stream.get(), workspace.get(), workspace.size()};
  }
};

// Times fn() per call: `inner` calls between two events, `reps` samples.
struct Sampler {
  Device* d;
  const void* scrub = nullptr;
  std::int64_t scrub_bytes = 0;
  unsigned* sink = nullptr;
  double Sample(const std::function<void()>& fn, int inner) {
    if (scrub != nullptr) {
      BENCH_CHECK_CUDA(ScrubL2(scrub, scrub_bytes, sink, d->stream.get()));
    }
    BENCH_CHECK_CUDA(cudaEventRecord(d->start.get(), d->stream.get()));
    for (int i = 0; i < inner; ++i) fn();
    BENCH_CHECK_CUDA(cudaEventRecord(d->stop.get(), d->stream.get()));
    BENCH_CHECK_CUDA(cudaEventSynchronize(d->stop.get()));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, d->start.get(), d->stop.get()));
    return 1000.0 * ms / inner;  // microseconds per call
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct OperandSet {
  kc::DeviceBuffer x, w, g;  // X [m, k], W [n, k], G [m, n], all bf16
};

struct Variant {
  std::string name;
  kc::GemmEngine* engine;
  kc::GemmShape shape;
  std::function<kc::GemmOperands(const OperandSet&)> operands;
  // Results.
  std::vector<double> samples_us = {};
  int inner = 1;
  double check_ratio = 0;  // worst |err| / bound over the sampled elements
  double rel_rms = 0;      // sqrt(sum err^2 / sum ref^2) over the sampled elements
  std::string algo = {};
};

// Gathers count bf16 values at a stride: a 2D copy on the device into a
// packed buffer (one copy-engine operation), then one plain copy home.
std::vector<float> CopyStrided(kc::DeviceMemory& memory, const void* base, std::int64_t count,
                               std::int64_t stride_elems) {
  auto packed = Must(memory.Allocate(static_cast<std::size_t>(count) * 2, "gather"), "gather");
  BENCH_CHECK_CUDA(cudaMemcpy2D(packed.get(), 2, base, static_cast<std::size_t>(stride_elems) * 2,
                                2, static_cast<std::size_t>(count), cudaMemcpyDeviceToDevice));
  std::vector<Bf16Bits> tmp(static_cast<std::size_t>(count));
  BENCH_CHECK_CUDA(cudaMemcpy(tmp.data(), packed.get(), tmp.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(tmp.size());
  for (std::size_t i = 0; i < tmp.size(); ++i) out[i] = Bf16ToFloat(tmp[i]);
  return out;
}

// Samples 48 output elements and compares each with an fp64 dot product of
// the operands' row and column, within the fp32 accumulation bound (plus one
// bf16 rounding for bf16 out). Returns the worst err / bound; *rel_rms gets
// the relative RMS error of the sample.
double CheckSamples(kc::DeviceMemory& memory, const kc::GemmShape& s, const kc::GemmOperands& o,
                    std::uint64_t seed, double* rel_rms) {
  double sum_err2 = 0;
  double sum_ref2 = 0;
  std::mt19937_64 rng(seed);
  double worst = 0;
  const double u = 1.0 / 16777216.0;
  const double gamma = s.k * u / (1 - s.k * u);
  for (int t = 0; t < 48; ++t) {
    const std::int64_t i = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.m));
    const std::int64_t j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.n));
    const auto* p = static_cast<const Bf16Bits*>(o.p);
    const auto* q = static_cast<const Bf16Bits*>(o.q);
    // P(i, l): stored [m, k] (row i, unit stride) or [k, m] (column i).
    const std::vector<float> prow = s.p_transposed ? CopyStrided(memory, p + i, s.k, s.m)
                                                   : CopyStrided(memory, p + i * s.k, s.k, 1);
    // Q(l, j): stored [k, n] (column j) or [n, k] (row j).
    const std::vector<float> qcol = s.q_transposed ? CopyStrided(memory, q + j * s.k, s.k, 1)
                                                   : CopyStrided(memory, q + j, s.k, s.n);
    double ref = 0, abs_sum = 0;
    for (std::int64_t l = 0; l < s.k; ++l) {
      const double prod = static_cast<double>(prow[static_cast<std::size_t>(l)]) *
                          qcol[static_cast<std::size_t>(l)];
      ref += prod;
      abs_sum += std::fabs(prod);
    }
    double got = 0;
    const std::size_t idx = static_cast<std::size_t>(i * s.n + j);
    if (s.c_type == CUDA_R_32F) {
      float f = 0;
      BENCH_CHECK_CUDA(
          cudaMemcpy(&f, static_cast<const float*>(o.c) + idx, 4, cudaMemcpyDeviceToHost));
      got = f;
    } else {
      Bf16Bits b = 0;
      BENCH_CHECK_CUDA(
          cudaMemcpy(&b, static_cast<const Bf16Bits*>(o.c) + idx, 2, cudaMemcpyDeviceToHost));
      got = Bf16ToFloat(b);
    }
    double bound = gamma * abs_sum;
    if (s.c_type != CUDA_R_32F) bound += (std::fabs(ref) + bound) / 256.0;
    const double err = std::fabs(got - ref);
    sum_err2 += err * err;
    sum_ref2 += ref * ref;
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0 : 1e30);
    if (!(ratio <= worst)) worst = std::isnan(ratio) ? 1e30 : std::max(worst, ratio);
  }
  *rel_rms = sum_ref2 > 0 ? std::sqrt(sum_err2 / sum_ref2) : 0;
  return worst;
}

std::string VersionString(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

int Run(const Options& opt) {
  BENCH_CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  BENCH_CHECK_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  const std::size_t lt = cublasLtGetVersion();

  Device d;
  d.memory = kc::DeviceMemory::Create(0, 0);
  d.stream = Must(kc::CreateStream(), "stream");
  d.handle = Must(kc::CreateLtHandle(), "cublasLtCreate");
  d.workspace = Must(d.memory->Allocate(32u << 20, "workspace"), "workspace");
  d.start = Must(kc::CreateEvent(true), "event");
  d.stop = Must(kc::CreateEvent(true), "event");
  // A buffer twice the size of L2, read before every sample.
  const std::int64_t scrub_bytes = 2 * static_cast<std::int64_t>(prop.l2CacheSize);
  auto scrub =
      Must(d.memory->Allocate(static_cast<std::size_t>(scrub_bytes) + 16, "scrub"), "alloc scrub");
  BENCH_CHECK_CUDA(cudaMemset(scrub.get(), 0, scrub.size()));
  Sampler sampler{&d, scrub.get(), scrub_bytes,
                  reinterpret_cast<unsigned*>(scrub.as<std::byte>() + scrub_bytes)};

  // The backend's engine and plain cuBLASLt: split-K any, heuristic first.
  kc::GemmEngine tuned(kc::GemmEngineOptions{logitd::kernels::SplitK::kFp32}, d.memory);
  kc::GemmEngineOptions plain_options;
  plain_options.split_k = logitd::kernels::SplitK::kAny;
  plain_options.autotune = false;
  kc::GemmEngine plain(plain_options, d.memory);

  json report;
  report["date"] = "2026-12-02";
  report["device"] = {
      {"name", prop.name},
      {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
      {"sms", prop.multiProcessorCount},
      {"l2_bytes", prop.l2CacheSize},
      {"driver_cuda", VersionString(driver)},
      {"runtime", VersionString(runtime)},
      {"cublaslt", std::to_string(lt / 10000) + "." + std::to_string((lt / 100) % 100) + "." +
                       std::to_string(lt % 100)}};
  report["method"] = {{"reps", opt.reps},
                      {"warmup", opt.warmup},
                      {"min_sample_us", opt.min_sample_us},
                      {"statistic",
                       "median of per-call times; a sample = inner calls between "
                       "two CUDA events"},
                      {"data", "uniform (-1,1) bf16, never zero"},
                      {"rotation", "operand sets rotated until they span 4x L2"}};
  std::printf("device: %s (cc %d.%d, %d SMs, L2 %d MiB), CUDA driver %s, runtime %s, cuBLASLt %s\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              VersionString(driver).c_str(), VersionString(runtime).c_str(),
              report["device"]["cublaslt"].get<std::string>().c_str());

  json gemm = json::array();
  for (const Problem& pb : Problems(opt.shapes)) {
    const std::int64_t m = pb.m, k = pb.k, n = pb.n;
    const std::size_t set_bytes = static_cast<std::size_t>(m * k + n * k + m * n) * 2;
    const std::size_t l2 = static_cast<std::size_t>(prop.l2CacheSize);
    const int sets =
        static_cast<int>(std::clamp<std::size_t>((4 * l2 + set_bytes - 1) / set_bytes, 1, 8));
    std::vector<OperandSet> operand_sets(static_cast<std::size_t>(sets));
    for (int s = 0; s < sets; ++s) {
      auto& os = operand_sets[static_cast<std::size_t>(s)];
      os.x = Must(d.memory->Allocate(static_cast<std::size_t>(m * k) * 2, "x"), "alloc x");
      os.w = Must(d.memory->Allocate(static_cast<std::size_t>(n * k) * 2, "w"), "alloc w");
      os.g = Must(d.memory->Allocate(static_cast<std::size_t>(m * n) * 2, "g"), "alloc g");
      BENCH_CHECK_CUDA(FillRandomBf16(os.x.as<std::uint16_t>(), m * k, 1000 + s, d.stream.get()));
      BENCH_CHECK_CUDA(FillRandomBf16(os.w.as<std::uint16_t>(), n * k, 2000 + s, d.stream.get()));
      BENCH_CHECK_CUDA(FillRandomBf16(os.g.as<std::uint16_t>(), m * n, 3000 + s, d.stream.get()));
    }
    auto y = Must(d.memory->Allocate(static_cast<std::size_t>(m * n) * 4, "y"), "alloc y");
    auto dx = Must(d.memory->Allocate(static_cast<std::size_t>(m * k) * 4, "dx"), "alloc dx");
    auto dw = Must(d.memory->Allocate(static_cast<std::size_t>(n * k) * 4, "dw"), "alloc dw");
    BENCH_CHECK_CUDA(cudaStreamSynchronize(d.stream.get()));

    auto logits_ops = [&y](const OperandSet& os) {
      return kc::GemmOperands{os.x.get(), os.w.get(), y.get()};
    };
    auto dx_ops = [&dx](const OperandSet& os) {
      return kc::GemmOperands{os.g.get(), os.w.get(), dx.get()};
    };
    auto dw_ops = [&dw](const OperandSet& os) {
      return kc::GemmOperands{os.g.get(), os.x.get(), dw.get()};
    };
    std::vector<Variant> variants;
    variants.push_back({"logitd_fp32", &tuned, kc::LogitsShape(m, n, k, CUDA_R_32F), logits_ops});
    variants.push_back({"logitd_bf16", &tuned, kc::LogitsShape(m, n, k, CUDA_R_16BF), logits_ops});
    variants.push_back({"lt_bf16_top1", &plain, kc::LogitsShape(m, n, k, CUDA_R_16BF), logits_ops});
    variants.push_back({"lt_fp32_top1", &plain, kc::LogitsShape(m, n, k, CUDA_R_32F), logits_ops});
    variants.push_back({"logitd_dx", &tuned, kc::GradInputShape(m, n, k, CUDA_R_16BF), dx_ops});
    variants.push_back({"lt_dx_top1", &plain, kc::GradInputShape(m, n, k, CUDA_R_16BF), dx_ops});
    variants.push_back({"logitd_dw", &tuned, kc::GradWeightShape(m, n, k, CUDA_R_32F), dw_ops});
    variants.push_back({"lt_dw_top1", &plain, kc::GradWeightShape(m, n, k, CUDA_R_32F), dw_ops});

    int counter = 0;
    auto call = [&](Variant& v) {
      const OperandSet& os = operand_sets[static_cast<std::size_t>(counter++ % sets)];
      MustOk(v.engine->Run(v.shape, v.operands(os), d.gemm()), v.name.c_str());
    };
    // Warm-up (the first call tunes), then size each sample.
    for (auto& v : variants) {
      for (int i = 0; i < opt.warmup; ++i) call(v);
      const double est = sampler.Sample([&] { call(v); }, 3);
      v.inner = static_cast<int>(
          std::clamp(std::ceil(opt.min_sample_us / std::max(est, 1e-3)), 1.0, 64.0));
    }
    // Variants interleaved within each repetition, starting one further on
    // each time, so drift and ordering weigh on all alike.
    for (int r = 0; r < opt.reps; ++r) {
      for (std::size_t j = 0; j < variants.size(); ++j) {
        Variant& v = variants[(j + static_cast<std::size_t>(r)) % variants.size()];
        v.samples_us.push_back(sampler.Sample([&] { call(v); }, v.inner));
      }
    }
    json entry = {{"m", m}, {"k", k}, {"n", n}, {"group", pb.group}, {"sets", sets}};
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
    for (auto& v : variants) {
      const kc::GemmOperands ops = v.operands(operand_sets[0]);
      MustOk(v.engine->Run(v.shape, ops, d.gemm()), v.name.c_str());
      BENCH_CHECK_CUDA(cudaStreamSynchronize(d.stream.get()));
      v.check_ratio =
          CheckSamples(*d.memory, v.shape, ops, static_cast<std::uint64_t>(m * 31 + k), &v.rel_rms);
      auto choice = v.engine->Cached(v.shape, ops, d.workspace.size());
      v.algo = choice ? choice->ToString() : "?";
      const double med = Median(v.samples_us);
      entry["variants"][v.name] = {
          {"median_us", med},
          {"tflops", flops / (med * 1e-6) / 1e12},
          {"inner", v.inner},
          {"samples", v.samples_us.size()},
          {"min_us", *std::min_element(v.samples_us.begin(), v.samples_us.end())},
          {"check_ratio", v.check_ratio},
          {"rel_rms_err", v.rel_rms},
          {"check_ok", v.check_ratio <= 1.0},
          {"algo", v.algo}};
    }
    auto tf = [&](const char* name) { return entry["variants"][name]["tflops"].get<double>(); };
    std::printf(
        "M=%5lld K=%5lld N=%6lld | fp32 %6.1f bf16 %6.1f lt-bf16 %6.1f lt-fp32 %6.1f | "
        "fp32/lt-bf16 %.3f | dX %6.1f (lt %6.1f) dW %6.1f (lt %6.1f) | check %s\n",
        static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
        tf("logitd_fp32"), tf("logitd_bf16"), tf("lt_bf16_top1"), tf("lt_fp32_top1"),
        tf("logitd_fp32") / tf("lt_bf16_top1"), tf("logitd_dx"), tf("lt_dx_top1"), tf("logitd_dw"),
        tf("lt_dw_top1"),
        std::all_of(variants.begin(), variants.end(),
                    [](const Variant& v) { return v.check_ratio <= 1.0; })
            ? "ok"
            : "FAILED");
    std::printf("    fp32 algo: %s | sampled rel rms err: fp32 %.2e, bf16 %.2e\n",
                entry["variants"]["logitd_fp32"]["algo"].get<std::string>().c_str(),
                entry["variants"]["logitd_fp32"]["rel_rms_err"].get<double>(),
                entry["variants"]["logitd_bf16"]["rel_rms_err"].get<double>());
    std::fflush(stdout);
    gemm.push_back(entry);
  }
  report["gemm"] = gemm;

  // Cast bandwidth against a device-to-device copy of the same input.
  {
    const std::int64_t n = std::int64_t{1} << 28;
    auto in = Must(d.memory->Allocate(static_cast<std::size_t>(n) * 4, "cast in"), "alloc");
    auto out = Must(d.memory->Allocate(static_cast<std::size_t>(n) * 2, "cast out"), "alloc");
    auto copy = Must(d.memory->Allocate(static_cast<std::size_t>(n) * 4, "copy out"), "alloc");
    BENCH_CHECK_CUDA(FillRandomFp32(in.as<float>(), n, 77, 1e3f, d.stream.get()));
    auto cast = [&] {
      BENCH_CHECK_CUDA(
          kc::LaunchCastFp32ToBf16(in.as<float>(), n, out.as<std::uint16_t>(), d.stream.get()));
    };
    auto memcpy_d2d = [&] {
      BENCH_CHECK_CUDA(cudaMemcpyAsync(copy.get(), in.get(), static_cast<std::size_t>(n) * 4,
                                       cudaMemcpyDeviceToDevice, d.stream.get()));
    };
    for (int i = 0; i < opt.warmup; ++i) {
      cast();
      memcpy_d2d();
    }
    std::vector<double> cast_us, copy_us;
    for (int r = 0; r < opt.reps; ++r) {
      cast_us.push_back(sampler.Sample(cast, 1));
      copy_us.push_back(sampler.Sample(memcpy_d2d, 1));
    }
    // Check a stretch of the output against the host rounding.
    std::vector<float> hin(1 << 20);
    std::vector<Bf16Bits> hout(1 << 20);
    BENCH_CHECK_CUDA(cudaMemcpy(hin.data(), in.get(), hin.size() * 4, cudaMemcpyDeviceToHost));
    BENCH_CHECK_CUDA(cudaMemcpy(hout.data(), out.get(), hout.size() * 2, cudaMemcpyDeviceToHost));
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < hin.size(); ++i) bad += hout[i] != FloatToBf16(hin[i]);
    const double cast_gbs = 6.0 * n / (Median(cast_us) * 1e-6) / 1e9;
    const double copy_gbs = 8.0 * n / (Median(copy_us) * 1e-6) / 1e9;
    report["cast"] = {{"n", n},
                      {"cast_median_us", Median(cast_us)},
                      {"copy_median_us", Median(copy_us)},
                      {"cast_gbs", cast_gbs},
                      {"copy_gbs", copy_gbs},
                      {"ratio", cast_gbs / copy_gbs},
                      {"check_ok", bad == 0},
                      {"bytes_note", "cast moves 4n read + 2n written; copy 4n read + 4n written"}};
    std::printf(
        "cast fp32->bf16 n=2^28: %.1f us, %.0f GB/s | D2D copy 1 GiB: %.1f us, %.0f GB/s "
        "| ratio %.3f | check %s\n",
        Median(cast_us), cast_gbs, Median(copy_us), copy_gbs, cast_gbs / copy_gbs,
        bad == 0 ? "ok" : "FAILED");
  }

  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << report.dump(2) << "\n";
    std::printf("wrote %s\n", opt.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace logitd::bench

int main(int argc, char** argv) {
  logitd::bench::Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") {
      opt.json_path = value("--json");
    } else if (a == "--shapes") {
      opt.shapes = value("--shapes");
    } else if (a == "--reps") {
      opt.reps = std::max(1, std::atoi(value("--reps").c_str()));
    } else if (a == "--warmup") {
      opt.warmup = std::max(1, std::atoi(value("--warmup").c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json FILE] [--shapes seed|train|all] [--reps N] [--warmup N]\n",
                   argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  return logitd::bench::Run(opt);
}

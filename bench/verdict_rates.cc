// Verify's two error rates, counted: every conforming implementation of
// the emulated library (tests/reference/emulated_kernels.h) on inputs of
// every kind and mixed shapes, where a fail is a false alarm; and every
// defect at the reduction lengths and call sizes issue 47 names, where a
// pass is a miss. Prints two tables (docs/BENCHMARKS.md, "Verify's
// verdicts") and, with --json, writes them.
//
//   usage: logitd_verdict_rates [--conforming_calls=N] [--defect_calls=N]
//                               [--ks=1024,4096,16384,65536] [--threads=N]
//                               [--seed=S] [--json=FILE] [--changes_only]
//                               [--cross_entropy_calls=N] [--gradient_calls=N]
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/reference/verdict_library.h"

namespace logitd::verdicts {
namespace {

struct Flags {
  int conforming_calls = 10000;
  int defect_calls = 300;
  std::vector<std::int64_t> ks = {1024, 4096, 16384, 65536};
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::uint64_t seed = 47;
  std::string json;
  bool changes_only = false;  // only the defects made by changing a conforming output
  int cross_entropy_calls = 100;
  int gradient_calls = 30;
};

bool Take(const char* arg, const char* name, std::string* value) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (Take(argv[i], "--conforming_calls", &v)) {
      f.conforming_calls = std::atoi(v.c_str());
    } else if (Take(argv[i], "--defect_calls", &v)) {
      f.defect_calls = std::atoi(v.c_str());
    } else if (Take(argv[i], "--threads", &v)) {
      f.threads = std::max(1, std::atoi(v.c_str()));
    } else if (Take(argv[i], "--seed", &v)) {
      f.seed = std::strtoull(v.c_str(), nullptr, 10);
    } else if (Take(argv[i], "--cross_entropy_calls", &v)) {
      f.cross_entropy_calls = std::atoi(v.c_str());
    } else if (Take(argv[i], "--gradient_calls", &v)) {
      f.gradient_calls = std::atoi(v.c_str());
    } else if (std::strcmp(argv[i], "--changes_only") == 0) {
      f.changes_only = true;
    } else if (Take(argv[i], "--json", &v)) {
      f.json = v;
    } else if (Take(argv[i], "--ks", &v)) {
      f.ks.clear();
      for (char* p = v.data(); *p != '\0';) {
        f.ks.push_back(std::strtoll(p, &p, 10));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "logitd_verdict_rates: unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
  return f;
}

// fn(i) for i < n on `threads` threads.
template <typename Fn>
void Parallel(int n, int threads, const Fn& fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

struct Tally {
  int calls = 0, outside_bound = 0, outside_class = 0;
  double worst_margin = 0;  // the largest RMS ratio over its threshold seen
  std::string worst;
};

// Mixed shapes: reductions from 16 to 8,192 (dW's over M up to 512), calls
// of 1 to about 8,000 elements; every output, kind and implementation.
void Conforming(const Flags& f, std::string* json) {
  const std::vector<emulated::Implementation> impls = emulated::ConformingImplementations();
  const std::vector<std::string> kinds = emulated::CaseKinds();
  std::map<std::string, Tally> by_kind;
  std::mutex mu;
  Parallel(f.conforming_calls, f.threads, [&](int i) {
    std::mt19937_64 rng(f.seed * 1000003 + static_cast<std::uint64_t>(i));
    const std::string& kind = kinds[rng() % kinds.size()];
    const Output output = static_cast<Output>(rng() % 3);
    const std::int64_t k = std::int64_t{16} << (rng() % 10);  // 16 .. 8192
    const std::int64_t m =
        1 + static_cast<std::int64_t>(rng() % (output == Output::kGradWeight ? 64 : 8));
    const std::int64_t v = 1 + static_cast<std::int64_t>(rng() % 96);
    const std::int64_t kk = output == Output::kGradWeight ? std::min<std::int64_t>(k, 512) : k;
    const emulated::Implementation& impl = impls[rng() % impls.size()];
    const CaseInputs in = MakeInputs(kind, m, v, kk, rng());
    const Judged j = JudgeImplementation(impl, in, output);
    std::lock_guard<std::mutex> lock(mu);
    Tally& t = by_kind[kind];
    ++t.calls;
    t.outside_bound += j.outside_bound;
    t.outside_class += !j.outside_bound && !j.passed;
    const double margin = j.threshold > 0 ? j.rms_ratio / j.threshold : 0;
    if (margin > t.worst_margin) {
      t.worst_margin = margin;
      t.worst = impl.name + " " + OutputName(output) + " [" + std::to_string(m) + ", " +
                std::to_string(v) + ", " + std::to_string(kk) + "]";
    }
    if (!j.passed)
      std::fprintf(stderr, "FALSE FAIL %s on %s: %s\n", impl.name.c_str(), kind.c_str(),
                   j.describe.c_str());
  });
  std::printf("\nConforming implementations (%zu of them), %d calls of mixed shapes\n\n",
              impls.size(), f.conforming_calls);
  std::printf(
      "| inputs | calls | outside the proven bound | outside the precision class | "
      "largest RMS ratio / threshold (where) |\n|---|---|---|---|---|\n");
  Tally all;
  *json += "\"conforming\":[";
  bool first = true;
  for (const auto& [kind, t] : by_kind) {
    std::printf("| %s | %d | %d | %d | %.2f (%s) |\n", kind.c_str(), t.calls, t.outside_bound,
                t.outside_class, t.worst_margin, t.worst.c_str());
    all.calls += t.calls;
    all.outside_bound += t.outside_bound;
    all.outside_class += t.outside_class;
    all.worst_margin = std::max(all.worst_margin, t.worst_margin);
    char row[512];
    std::snprintf(row, sizeof row,
                  "%s{\"inputs\":\"%s\",\"calls\":%d,\"outside_bound\":%d,\"outside_class\":%d,"
                  "\"worst_margin\":%.4f}",
                  first ? "" : ",", kind.c_str(), t.calls, t.outside_bound, t.outside_class,
                  t.worst_margin);
    *json += row;
    first = false;
  }
  *json += "]";
  std::printf("| all | %d | %d | %d | %.2f |\n", all.calls, all.outside_bound, all.outside_class,
              all.worst_margin);
}

struct Defect {
  std::string name;
  const emulated::Implementation* impl;
  Change change;
  Output output;
};

void Defects(const Flags& f, std::string* json) {
  const std::vector<emulated::Implementation> bad = emulated::DefectiveImplementations();
  const std::vector<emulated::Implementation> good = emulated::ConformingImplementations();
  const emulated::Implementation& base = good.front();  // sequential fp32
  std::vector<Defect> defects;
  if (!f.changes_only) {
    for (const emulated::Implementation& d : bad) {
      defects.push_back({d.name, &d, Change::kNone, Output::kLogits});
    }
  }
  defects.push_back({ChangeName(Change::kOneElementPlus1Percent), &base,
                     Change::kOneElementPlus1Percent, Output::kLogits});
  defects.push_back({ChangeName(Change::kRowShifted), &base, Change::kRowShifted, Output::kLogits});
  // Small calls (M·V = 4,096) and larger ones (M·V = 32,768).
  const std::int64_t sizes[2][2] = {{16, 256}, {64, 512}};
  std::printf(
      "\nDefects caught, of %d calls each (inputs \"normal\": X ~ N(0, 1), W ~ N(0, 0.02²))\n\n",
      f.defect_calls);
  std::printf("| defect | M·V |");
  for (std::int64_t k : f.ks) std::printf(" K=%lld |", static_cast<long long>(k));
  std::printf("\n|---|---|");
  for (std::size_t i = 0; i < f.ks.size(); ++i) std::printf("---|");
  std::printf("\n");
  *json += ",\"defects\":[";
  bool first = true;
  for (const Defect& d : defects) {
    for (const auto& size : sizes) {
      std::printf("| %s | %lld |", d.name.c_str(), static_cast<long long>(size[0] * size[1]));
      for (std::int64_t k : f.ks) {
        // The largest reductions at the larger size take long: fewer calls.
        const int calls = size[0] * size[1] > 4096 && k > 16384 ? std::max(1, f.defect_calls / 10)
                                                                : f.defect_calls;
        std::atomic<int> caught{0};
        Parallel(calls, f.threads, [&](int i) {
          const CaseInputs in = MakeInputs(
              "normal", size[0], size[1], k,
              f.seed * 7919 + static_cast<std::uint64_t>(i) * 31 + static_cast<std::uint64_t>(k));
          caught += !JudgeImplementation(*d.impl, in, d.output, d.change).passed;
        });
        std::printf(" %d/%d |", caught.load(), calls);
        std::fflush(stdout);
        char row[512];
        std::snprintf(
            row, sizeof row,
            "%s{\"defect\":\"%s\",\"elements\":%lld,\"k\":%lld,\"caught\":%d,\"calls\":%d}",
            first ? "" : ",", d.name.c_str(), static_cast<long long>(size[0] * size[1]),
            static_cast<long long>(k), caught.load(), calls);
        *json += row;
        first = false;
      }
      std::printf("\n");
    }
  }
  *json += "]";
}

// The cross-entropy's per-token loss and lse at V = 32,768 over 64 tokens:
// logitd's own fp32 logits (OpenBLAS) through a conforming fp32 softmax,
// which must pass, and the same logits rounded to bf16 first, which must
// fail.
void CrossEntropy(const Flags& f, std::string* json) {
  constexpr std::int64_t kM = 64, kV = 32768;
  std::printf(
      "\nThe cross-entropy's per-token outputs, %d calls each of %lld tokens over V = %lld "
      "(inputs \"lm logits\": z ~ N(0, 3²)): conforming (fp32 logits) failed, and from bf16 logits "
      "caught\n\n",
      f.cross_entropy_calls, static_cast<long long>(kM), static_cast<long long>(kV));
  std::printf(
      "| output | K | fp32 logits failed | bf16 logits caught | largest conforming "
      "RMS ratio / threshold | smallest bf16 RMS ratio / threshold |\n"
      "|---|---|---|---|---|---|\n");
  *json += "\"cross_entropy\":[";
  bool first = true;
  for (std::int64_t k : f.ks) {
    std::atomic<int> failed[2] = {0, 0}, caught[2] = {0, 0};
    std::mutex mu;
    double worst_pass[2] = {0, 0}, least_catch[2] = {1e300, 1e300};
    Parallel(f.cross_entropy_calls, f.threads, [&](int i) {
      const std::uint64_t seed =
          f.seed * 104729 + static_cast<std::uint64_t>(i) * 37 + static_cast<std::uint64_t>(k);
      const CaseInputs in = MakeInputs("lm logits", kM, kV, k, seed);
      const std::vector<std::int64_t> targets = MakeTargets(kM, kV, seed);
      const CeJudged fp32 = JudgeCrossEntropy(nullptr, in, targets, false, i % 2 == 1);
      const CeJudged bf16 = JudgeCrossEntropy(nullptr, in, targets, true);
      const Judged* pass[2] = {&fp32.loss, &fp32.lse};
      const Judged* fail[2] = {&bf16.loss, &bf16.lse};
      std::lock_guard<std::mutex> lock(mu);
      for (int o = 0; o < 2; ++o) {
        failed[o] += !pass[o]->passed;
        caught[o] += !fail[o]->passed;
        if (pass[o]->threshold > 0) {
          worst_pass[o] = std::max(worst_pass[o], pass[o]->rms_ratio / pass[o]->threshold);
        }
        if (fail[o]->threshold > 0) {
          least_catch[o] = std::min(least_catch[o], fail[o]->rms_ratio / fail[o]->threshold);
        }
        if (!pass[o]->passed) std::fprintf(stderr, "FALSE FAIL: %s\n", pass[o]->describe.c_str());
      }
    });
    for (int o = 0; o < 2; ++o) {
      const char* name = o == 0 ? "loss" : "lse";
      std::printf("| %s | %lld | %d/%d | %d/%d | %.2f | %.2f |\n", name, static_cast<long long>(k),
                  failed[o].load(), f.cross_entropy_calls, caught[o].load(), f.cross_entropy_calls,
                  worst_pass[o], least_catch[o]);
      char row[512];
      std::snprintf(row, sizeof row,
                    "%s{\"output\":\"%s\",\"k\":%lld,\"calls\":%d,\"fp32_failed\":%d,"
                    "\"bf16_caught\":%d}",
                    first ? "" : ",", name, static_cast<long long>(k), f.cross_entropy_calls,
                    failed[o].load(), caught[o].load());
      *json += row;
      first = false;
    }
    std::fflush(stdout);
  }
  *json += "]";
}

// The cross-entropy's dX and dW (mean over 16 tokens, V = 4,096, inputs
// "lm logits"): logitd's own fp32 logits through a conforming fp32 softmax,
// G = bf16(g), each product summed in sequential fp32, which must pass; and
// g off by 1% and 2%, and g from logits rounded to bf16, which must fail.
void Gradients(const Flags& f, std::string* json) {
  constexpr std::int64_t kM = 16, kV = 4096;
  const emulated::Implementation base = emulated::ConformingImplementations().front();
  std::printf(
      "\nThe cross-entropy's gradients, %d calls each (mean over %lld tokens, V = %lld, inputs "
      "\"lm logits\"): conforming failed, and each defect caught (dX / dW)\n\n",
      f.gradient_calls, static_cast<long long>(kM), static_cast<long long>(kV));
  std::printf(
      "| K | conforming failed | g +1%% caught | g +2%% caught | g from bf16 logits caught | "
      "largest conforming RMS ratio / threshold | smallest bf16-logits RMS ratio / threshold "
      "|\n|---|---|---|---|---|---|---|\n");
  *json += "\"gradients\":[";
  bool first = true;
  for (std::int64_t k : f.ks) {
    // [variant][dx, dw]: conforming failed, then caught for +1%, +2%, bf16.
    std::atomic<int> counts[4][2] = {};
    std::mutex mu;
    double worst_pass = 0, least_catch = 1e300;
    Parallel(f.gradient_calls, f.threads, [&](int i) {
      const std::uint64_t seed =
          f.seed * 7727 + static_cast<std::uint64_t>(i) * 41 + static_cast<std::uint64_t>(k);
      const CaseInputs in = MakeInputs("lm logits", kM, kV, k, seed);
      const std::vector<std::int64_t> targets = MakeTargets(kM, kV, seed);
      const CeGradJudged judged[4] = {
          JudgeCrossEntropyGradients(nullptr, base, in, targets, GradientPath::kConforming, 0,
                                     i % 2 == 1),
          JudgeCrossEntropyGradients(nullptr, base, in, targets, GradientPath::kScaled, 0.01),
          JudgeCrossEntropyGradients(nullptr, base, in, targets, GradientPath::kScaled, 0.02),
          JudgeCrossEntropyGradients(nullptr, base, in, targets, GradientPath::kBf16Logits)};
      std::lock_guard<std::mutex> lock(mu);
      for (int d = 0; d < 4; ++d) {
        const Judged* o[2] = {&judged[d].dx, &judged[d].dw};
        for (int g = 0; g < 2; ++g) {
          counts[d][g] += !o[g]->passed;
          if (o[g]->threshold <= 0) continue;
          const double r = o[g]->rms_ratio / o[g]->threshold;
          if (d == 0) worst_pass = std::max(worst_pass, r);
          if (d == 3) least_catch = std::min(least_catch, r);
          if (d == 0 && !o[g]->passed) {
            std::fprintf(stderr, "FALSE FAIL: %s\n", o[g]->describe.c_str());
          }
        }
      }
    });
    std::printf("| %lld |", static_cast<long long>(k));
    for (int d = 0; d < 4; ++d) {
      std::printf(" %d/%d / %d/%d |", counts[d][0].load(), f.gradient_calls, counts[d][1].load(),
                  f.gradient_calls);
    }
    std::printf(" %.2f | %.2f |\n", worst_pass, least_catch);
    std::fflush(stdout);
    char row[512];
    std::snprintf(row, sizeof row,
                  "%s{\"k\":%lld,\"calls\":%d,\"conforming_failed\":[%d,%d],"
                  "\"plus1_caught\":[%d,%d],\"plus2_caught\":[%d,%d],\"bf16_caught\":[%d,%d]}",
                  first ? "" : ",", static_cast<long long>(k), f.gradient_calls,
                  counts[0][0].load(), counts[0][1].load(), counts[1][0].load(),
                  counts[1][1].load(), counts[2][0].load(), counts[2][1].load(),
                  counts[3][0].load(), counts[3][1].load());
    *json += row;
    first = false;
  }
  *json += "]";
}

}  // namespace
}  // namespace logitd::verdicts

int main(int argc, char** argv) {
  using namespace logitd::verdicts;
  const Flags f = Parse(argc, argv);
  std::string json = "{";
  if (f.conforming_calls > 0) Conforming(f, &json);
  if (f.defect_calls > 0) {
    if (f.conforming_calls > 0) json += ",";
    Defects(f, &json);
  }
  if (f.cross_entropy_calls > 0) {
    if (json.size() > 1) json += ",";
    CrossEntropy(f, &json);
  }
  if (f.gradient_calls > 0) {
    if (json.size() > 1) json += ",";
    Gradients(f, &json);
  }
  json += "}";
  if (!f.json.empty()) std::ofstream(f.json) << json << "\n";
  return 0;
}

// What recording adds to a Verify, end to end: against a running logitd
// (any --history), the same logits Verify of logitd's own output with and
// without `record`, interleaved call by call so that both see the same
// machine, and each recording run compared with its branch's latest (as
// a CI gate's call is). Prints each one's p50 and p99 and the difference of
// the p50s (issue 50's limit: 2 ms).
//
//   logitd_verify_record_bench --server=HOST:PORT [--calls=300] [--m=16] [--k=1024] [--v=4096]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "logitd/bf16.h"
#include "logitd/client.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string Flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return fallback;
}

logitd::Tensor RandomBf16(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  logitd::Tensor t(logitd::DType::kBf16, {rows, cols});
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto* bits = t.data<logitd::Bf16Bits>();
  for (std::int64_t i = 0; i < rows * cols; ++i) bits[i] = logitd::FloatToBf16(normal(gen));
  return t;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string server = Flag(argc, argv, "server", "");
  if (server.empty()) {
    std::fprintf(stderr, "usage: logitd_verify_record_bench --server=HOST:PORT [--calls=300]\n");
    return 2;
  }
  const long calls = std::atol(Flag(argc, argv, "calls", "300").c_str());
  const long m = std::atol(Flag(argc, argv, "m", "16").c_str());
  const long k = std::atol(Flag(argc, argv, "k", "1024").c_str());
  const long v = std::atol(Flag(argc, argv, "v", "4096").c_str());
  auto client = logitd::client::Client::Create(server);
  if (!client.ok()) return Fail("connect", client.status());
  const logitd::Tensor w = RandomBf16(v, k, 1), x = RandomBf16(m, k, 2);
  auto weight = (*client)->RegisterWeight(w, "verify-record-bench");
  if (!weight.ok()) return Fail("RegisterWeight", weight.status());
  auto y = (*client)->Logits(x, weight->handle);
  if (!y.ok()) return Fail("Logits", y.status());

  std::vector<double> plain_ms, recorded_ms;
  for (long i = 0; i < 2 * calls; ++i) {
    const bool record = i % 2 == 1;
    logitd::client::VerifyArgs args;
    args.operation = logitd::client::VerifyOperation::kLogits;
    args.weight_handle = weight->handle;
    args.x = x;
    args.candidates["y"] = *y;
    if (record) {
      args.record = logitd::client::RunLabels{"verify-record-bench", "logits", "main",
                                              "r" + std::to_string(i)};
      args.compare = logitd::client::BaselineSelector{"main", "", 0, "", true};
    }
    const auto start = Clock::now();
    auto r = (*client)->Verify(args);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!r.ok()) return Fail("Verify", r.status());
    if (record && !r->record_error.empty()) {
      std::fprintf(stderr, "not recorded: %s\n", r->record_error.c_str());
      return 1;
    }
    (record ? recorded_ms : plain_ms).push_back(ms);
  }
  (void)(*client)->DeleteProject("verify-record-bench");
  std::printf("logits Verify of [%ld, %ld] x [%ld, %ld], %ld calls each, interleaved\n\n", m, k, v,
              k, calls);
  std::printf("| Verify | p50 | p99 |\n|---|---|---|\n");
  std::printf("| without record | %.3f ms | %.3f ms |\n", Percentile(plain_ms, 0.5),
              Percentile(plain_ms, 0.99));
  std::printf("| recorded, compared with main's latest | %.3f ms | %.3f ms |\n",
              Percentile(recorded_ms, 0.5), Percentile(recorded_ms, 0.99));
  std::printf("\nrecording adds (p50): %.3f ms (limit 2 ms)\n",
              Percentile(recorded_ms, 0.5) - Percentile(plain_ms, 0.5));
  return 0;
}

// The host's share of a tensor call's integrity checks: the xxh3-64 digest
// every tensor travels with (Xxh3), and a shared-memory input's copy out of
// the region with its digest (CopyXxh3), against a plain memcpy of the same
// bytes. Sizes: X of an M=8192, K=4096 bf16 call (64 MiB) and the fp32 logits
// of an M=1024, V=32768 one (128 MiB). BM_Xxh3PlainEntry is libxxhash's
// XXH3_64bits, which Xxh3 used before it took the runtime-dispatched entry
// point (see cmake/LogitdDependencies.cmake).
//
//   build/ci/bench/logitd_digest_bench [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "logitd/tensor.h"

namespace {

std::vector<std::byte> Bytes(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(i * 2654435761u >> 13);
  return b;
}

void BM_Xxh3(benchmark::State& state) {
  const std::vector<std::byte> src = Bytes(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(logitd::Xxh3(src.data(), src.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_Xxh3PlainEntry(benchmark::State& state) {
  const std::vector<std::byte> src = Bytes(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(XXH3_64bits(src.data(), src.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<std::byte> src = Bytes(static_cast<std::size_t>(state.range(0)));
  std::vector<std::byte> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_MemcpyThenXxh3(benchmark::State& state) {
  const std::vector<std::byte> src = Bytes(static_cast<std::size_t>(state.range(0)));
  std::vector<std::byte> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(logitd::Xxh3(dst.data(), dst.size()));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_CopyXxh3(benchmark::State& state) {
  const std::vector<std::byte> src = Bytes(static_cast<std::size_t>(state.range(0)));
  std::vector<std::byte> dst(src.size());
  for (auto _ : state)
    benchmark::DoNotOptimize(logitd::CopyXxh3(dst.data(), src.data(), src.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

constexpr std::int64_t k64MiB = std::int64_t{64} << 20;
constexpr std::int64_t k128MiB = std::int64_t{128} << 20;
BENCHMARK(BM_Xxh3)->Arg(k64MiB)->Arg(k128MiB)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Xxh3PlainEntry)->Arg(k64MiB)->Arg(k128MiB)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Memcpy)->Arg(k64MiB)->Arg(k128MiB)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyThenXxh3)->Arg(k64MiB)->Arg(k128MiB)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyXxh3)->Arg(k64MiB)->Arg(k128MiB)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

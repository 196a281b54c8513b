// cuBLASLt GEMMs for the LM head: the three products (logits, dX, dW) in
// row-major terms, the split-K policy that keeps partial sums in fp32, and a
// per-shape algorithm cache filled by timing the top heuristic candidates,
// optionally kept in a file shared by every process of the platform, so that
// a restarted server runs the same algorithms (and so gives the same bits).
// Used by the backend and by the kernel benchmark alike.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "server/kernels/algo_cache_file.h"
#include "server/kernels/backend.h"
#include "server/kernels/cuda/cuda_handles.h"

namespace logitd::kernels::cuda {

// Row-major C[m, n] = alpha * P[m, k] . Q[k, n] + beta * C with bf16 P and Q
// and fp32 accumulation. P is stored row-major as [m, k], or as [k, m] when
// p_transposed; Q as [k, n], or as [n, k] when q_transposed.
struct GemmShape {
  const char* op = "gemm";  // "logits", "dx", "dw": part of the key and of messages
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  bool p_transposed = false;
  bool q_transposed = false;
  cudaDataType_t c_type = CUDA_R_32F;  // CUDA_R_32F or CUDA_R_16BF
  // P's row stride in elements as stored; 0 means packed (its stored row
  // length). Larger strides let P be a strided view, such as G written over
  // the first half of each fp32 logits row.
  std::int64_t p_ld = 0;

  std::string ToString() const;  // "logits(M=16,N=32768,K=4096,fp32)"
};

// Y[m, v] = X[m, k] . W[v, k]^T: P = X, Q = W^T.
GemmShape LogitsShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out);
// dX[m, k] = G[m, v] . W[v, k]: P = G, Q = W.
GemmShape GradInputShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out);
// dW[v, k] = G[m, v]^T . X[m, k]: P = G^T, Q = X.
GemmShape GradWeightShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out);

struct GemmOperands {
  const void* p = nullptr;
  const void* q = nullptr;
  void* c = nullptr;  // read when beta != 0, always written
  float alpha = 1.0f;
  float beta = 0.0f;
};

// What one stream brings to a GEMM. cuBLAS reproduces results bit for bit
// only for the same algorithm with the same workspace size on one stream at
// a time, so every context owns a handle and a workspace of the same size.
struct GemmStream {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // When set, Run appends "shape: configuration" for each distinct product it
  // runs (what a call reports of its GEMMs, see AlgoChoice::Brief).
  std::vector<std::string>* record = nullptr;
};

// The configuration chosen for a shape, for reports and the benchmark.
struct AlgoChoice {
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
  int algo_id = 0;
  int tile_id = 0;
  int stages_id = 0;
  int cluster_id = 0;
  int split_k = 1;
  int reduction = 0;  // cublasLtReductionScheme_t
  int swizzle = 0;
  int custom = 0;
  int rank = 0;            // position in the heuristic's list; 100 + i: choice i split differently
  int candidates = 0;      // how many passed the split-K filter
  int timed = 0;           // how many were timed (0: not tuned)
  double time_us = 0;      // median of the winner while tuning
  bool from_file = false;  // loaded from the algorithm cache file

  std::string ToString() const;
  // The configuration alone, the same in every process that runs it:
  // "algo=21 tile=18 stages=35 cluster=0 splitk=1 red=0 swizzle=0 custom=0".
  std::string Brief() const;
};

// Borrowed descriptor handles for one product.
struct RawHandles {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // Q
  cublasLtMatrixLayout_t b = nullptr;  // P
  cublasLtMatrixLayout_t c = nullptr;  // C and D
};

struct GemmEngineOptions {
  // Which split-K algorithms may run (see SplitK).
  SplitK split_k = SplitK::kFp32;
  // Time the top candidates once per shape and keep the fastest; otherwise
  // take the heuristic's first.
  bool autotune = true;
  int heuristic_candidates = 16;
  int tune_candidates = 8;
  // The first this many heuristic choices are also tried at other split
  // counts (fp32 partials only), for outputs of at most this many elements;
  // only kernels whose capabilities say they split K, and only counts that
  // leave every split at least min_split_reduction elements of the reduction.
  // Off by default: on an H100 with cuBLASLt 13.1, algorithm 66 split in
  // three (compute-type reduction, accepted by cublasLtMatmulAlgoCheck) gave
  // wrong sums for dW with a reduction of 1,729 rows (logitd_gemm_sweep
  // --tokens=1729), so only the heuristic's own configurations are timed.
  int split_variants = 0;
  double split_variants_max_outputs = 32.0 * 1024 * 1024;
  std::int64_t min_split_reduction = 256;
  int tune_repeats = 5;
  // A candidate replaces an earlier-ranked one only when faster by more than
  // this fraction, so timing noise rarely changes the choice between runs.
  double tune_margin = 0.02;
  // Where the engine reports what an operator should see (a cache file it
  // cannot write); may be empty.
  std::function<void(const std::string&)> warn = nullptr;
};

class GemmEngine {
 public:
  // `memory` provides scratch output when tuning a product that accumulates
  // (beta != 0), which must not run on the real output.
  GemmEngine(GemmEngineOptions options, std::shared_ptr<DeviceMemory> memory);
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // Enqueues the product on s.stream (no synchronization on the cached
  // path). Operands are device pointers.
  absl::Status Run(const GemmShape& shape, const GemmOperands& operands, const GemmStream& s);

  // Keeps the chosen algorithms in `path` (see docs/OPERATIONS.md): loads the
  // entries recorded for `platform` (entries of other platforms stay in the
  // file), checks each with cublasLtMatmulAlgoCheck on `s` and drops those
  // the library refuses. Every later choice is claimed in the file: a shape
  // another process has chosen for since is run with that process's choice,
  // so every process of the platform runs one algorithm per shape. `summary`
  // receives one line for the log. An error (the file's directory cannot be
  // created or written) leaves the engine choosing in memory only.
  absl::Status UseCacheFile(const std::string& path, const std::string& platform,
                            const GemmStream& s, std::string* summary);

  // The cached choice for this shape with these operands' alignment.
  std::optional<AlgoChoice> Cached(const GemmShape& shape, const GemmOperands& operands,
                                   std::size_t workspace_bytes) const;
  std::size_t cache_size() const;
  const GemmEngineOptions& options() const { return options_; }

  // What the heuristic offers for this shape that the split-K policy
  // allows, in its order (for diagnostics and tests).
  absl::StatusOr<std::vector<AlgoChoice>> Candidates(const GemmShape& shape,
                                                     const GemmOperands& operands,
                                                     const GemmStream& s) const;
  // Every configuration the tuner would time for this shape: the
  // heuristic's first tune_candidates plus their split-count variants.
  absl::StatusOr<std::vector<AlgoChoice>> TuningCandidates(const GemmShape& shape,
                                                           const GemmOperands& operands,
                                                           const GemmStream& s) const;
  // cublasLtMatmulAlgoCheck of `algo` for this shape: the configuration as
  // the library will run it, or the reason it will not (including a
  // workspace larger than s's).
  absl::StatusOr<AlgoChoice> Check(const GemmShape& shape, const GemmStream& s,
                                   const cublasLtMatmulAlgo_t& algo) const;
  // Runs one given configuration, bypassing the cache.
  absl::Status RunWith(const GemmShape& shape, const GemmOperands& operands, const GemmStream& s,
                       const AlgoChoice& choice) const;

 private:
  using Key = std::tuple<std::string, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                         bool, int, int, int, int, int, std::size_t>;
  Key MakeKey(const GemmShape& shape, const GemmOperands& operands,
              std::size_t workspace_bytes) const;
  absl::StatusOr<std::vector<AlgoChoice>> Heuristic(const GemmShape& shape,
                                                    const GemmOperands& operands,
                                                    const GemmStream& s, const RawHandles& h) const;
  absl::StatusOr<std::vector<AlgoChoice>> ListCandidates(const GemmShape& shape,
                                                         const GemmOperands& operands,
                                                         const GemmStream& s,
                                                         const RawHandles& h) const;
  absl::StatusOr<AlgoChoice> Choose(const GemmShape& shape, const GemmOperands& operands,
                                    const GemmStream& s, const RawHandles& h);
  // The choice for `key` that every process of the platform runs: the cache
  // file's entry when another process recorded one, else `choice`, recorded
  // there now. Without a file, `choice`.
  AlgoChoice Settle(const Key& key, const GemmShape& shape, const GemmStream& s,
                    const AlgoChoice& choice);
  // A cache file entry as (key, checked choice), or why it is refused.
  absl::StatusOr<std::pair<Key, AlgoChoice>> FromEntry(const nlohmann::json& e,
                                                       const GemmStream& s) const;

  GemmEngineOptions options_;
  std::shared_ptr<DeviceMemory> memory_;
  mutable absl::Mutex mu_;
  std::map<Key, AlgoChoice> cache_ ABSL_GUARDED_BY(mu_);
  // The algorithm cache file, when one is kept.
  std::optional<AlgoCacheFile> file_;
  std::atomic<bool> file_failure_reported_{false};
};

// The key a cache file's entries are valid for: the device (name, SMs), the
// driver, CUDA runtime and cuBLASLt versions, the workspace size, the
// split-K policy and the tuner's candidate rule. Any difference can change
// which algorithm is best or how it sums.
std::string AlgoCachePlatform(const std::string& device_name, int multiprocessors,
                              const std::string& driver, const std::string& runtime,
                              const std::string& cublaslt, std::size_t workspace_bytes,
                              SplitK split_k);

}  // namespace logitd::kernels::cuda

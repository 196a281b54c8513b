// Golden baseline files: what `--record FILE` writes and `--baseline FILE`
// compares against. Per output a baseline keeps the xxh3-64 digest, a digest
// per block (row) and sampled values, plus every value when the output is
// small, so that a mismatch can say how many elements differ (exactly for
// small outputs; which blocks for large ones) and by how many ULPs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {

// Outputs up to this many elements are stored whole (base64 of their bytes).
inline constexpr std::int64_t kFullValuesMaxElements = 32768;
// Sampled values per output, besides the first and last element.
inline constexpr int kSamplesPerOutput = 62;

struct OutputRecord {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t xxh3 = 0;
  // Elements per block: the last dimension for a matrix, else 1024.
  std::int64_t block_elements = 0;
  std::vector<std::uint64_t> block_xxh3;
  // (flat index, bits) of sampled elements.
  std::vector<std::pair<std::int64_t, std::uint32_t>> samples;
  // The raw little-endian bytes, for small outputs.
  std::optional<std::string> values;
};

struct CaseRecord {
  std::string name;
  // Digest of the case's inputs, so that a baseline made with different
  // inputs (another harness version) is reported as such.
  std::uint64_t inputs_xxh3 = 0;
  std::vector<OutputRecord> outputs;
  // The GEMM configurations the server ran for the case (its calls'
  // "logitd-gemm" trailers); empty when the server sent none.
  std::string gemms;
  // Whether every output lay within its bound of an fp64 reference when
  // recorded, and the worst error as a fraction of its bound; unset in
  // baselines written before these were recorded.
  std::optional<bool> within_bounds;
  double worst_bound_fraction = 0;
};

// What makes bitwise results comparable: backend, device and the libraries
// doing the arithmetic. logitd's own version is deliberately not part of it:
// a new logitd build on the same platform is what the gate checks.
struct Platform {
  std::string backend;
  std::string device_name;
  std::string compute_capability;
  // SMs (cuda) or hardware threads (cpu), and the driver: cuBLASLt's
  // heuristics depend on both. Empty in baselines of format 1, which did not
  // record them (then not compared).
  std::string multiprocessors;
  std::string driver_version;
  std::string cuda_runtime_version;
  std::string cublaslt_version;
  std::string blas_version;
};
Platform PlatformOf(const client::ServerInfo& info);
// Empty when equal; else "device: 'A' vs 'B'; cuBLASLt: 1 vs 2" (recorded vs current).
std::string PlatformDifference(const Platform& recorded, const Platform& current);
std::string PlatformString(const Platform& p);

struct Baseline {
  std::string recorded_at;
  // The recording server's build: version, build_id, split_k. What it ran on
  // is `platform`, held once (files written before kept the whole
  // ServerInfo here; they are read as they are).
  nlohmann::ordered_json server;
  Platform platform;
  std::vector<CaseRecord> cases;

  const CaseRecord* Find(const std::string& case_name) const;
};

OutputRecord RecordOutput(const std::string& name, const Tensor& t);

nlohmann::ordered_json BaselineToJson(const Baseline& baseline);
absl::StatusOr<Baseline> BaselineFromJson(const nlohmann::json& j);
absl::StatusOr<Baseline> ReadBaseline(const std::string& path);
absl::Status WriteBaseline(const std::string& path, const Baseline& baseline);

struct OutputComparison {
  bool equal = false;
  // Exact count when values are stored, else -1.
  std::int64_t differing_elements = -1;
  std::int64_t differing_blocks = 0;
  std::int64_t total_blocks = 0;
  std::int64_t sampled = 0;
  std::int64_t sampled_differing = 0;
  // Largest ULP distance found (over all elements when stored, else over
  // the samples); INT64_MAX for NaN against a number.
  std::int64_t max_ulp = 0;
  std::string message;
};
OutputComparison CompareOutput(const OutputRecord& recorded, const Tensor& current);

}  // namespace logitd::validate

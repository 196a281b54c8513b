// The GEMM engine's side of the algorithm cache file (algo_cache_file.h):
// choices written as entries and read back, checked with the library, and
// a new choice claimed so that every process of the platform runs the first
// one recorded.
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/kernels/cuda/lt_gemm.h"

namespace logitd::kernels::cuda {

namespace {

const char* InternOp(const std::string& op) {
  for (const char* known : {"logits", "dx", "dw"}) {
    if (op == known) return known;
  }
  return nullptr;
}

std::string AlgoHex(const cublasLtMatmulAlgo_t& algo) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(&algo), sizeof algo));
}

bool AlgoFromHex(const std::string& hex, cublasLtMatmulAlgo_t* algo) {
  if (hex.size() != 2 * sizeof *algo || hex.find_first_not_of("0123456789abcdef") != hex.npos) {
    return false;
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::memcpy(algo, bytes.data(), sizeof *algo);
  return true;
}

// What an entry is recorded under in the file: the product and its operands'
// alignment (split-K policy and workspace are part of the platform).
std::string EntryKey(const nlohmann::json& e) {
  if (!e.is_object()) return std::string();
  const nlohmann::json align = e.value("align", nlohmann::json::array());
  return absl::StrCat(e.value("op", std::string()), " m=", e.value("m", std::int64_t{0}),
                      " n=", e.value("n", std::int64_t{0}), " k=", e.value("k", std::int64_t{0}),
                      " p_ld=", e.value("p_ld", std::int64_t{0}),
                      " pt=", e.value("p_transposed", false) ? 1 : 0,
                      " qt=", e.value("q_transposed", false) ? 1 : 0,
                      " c=", e.value("c_type", std::string()), " align=", align.dump());
}

}  // namespace

absl::StatusOr<std::pair<GemmEngine::Key, AlgoChoice>> GemmEngine::FromEntry(
    const nlohmann::json& e, const GemmStream& s) const {
  GemmShape shape;
  const char* op = e.is_object() ? InternOp(e.value("op", std::string())) : nullptr;
  cublasLtMatmulAlgo_t algo{};
  const std::string c_type = e.is_object() ? e.value("c_type", std::string()) : "";
  if (op == nullptr || !AlgoFromHex(e.value("algo", std::string()), &algo) ||
      (c_type != "fp32" && c_type != "bf16") || !e.contains("align") || !e["align"].is_array() ||
      e["align"].size() != 3 || !e["align"][0].is_number_integer() ||
      !e["align"][1].is_number_integer() || !e["align"][2].is_number_integer()) {
    return absl::InvalidArgumentError("an entry does not parse");
  }
  shape.op = op;
  shape.m = e.value("m", std::int64_t{0});
  shape.n = e.value("n", std::int64_t{0});
  shape.k = e.value("k", std::int64_t{0});
  shape.p_ld = e.value("p_ld", std::int64_t{0});
  shape.p_transposed = e.value("p_transposed", false);
  shape.q_transposed = e.value("q_transposed", false);
  shape.c_type = c_type == "fp32" ? CUDA_R_32F : CUDA_R_16BF;
  absl::StatusOr<AlgoChoice> checked = Check(shape, s, algo);
  if (!checked.ok()) return checked.status();
  if (checked->Brief() != e.value("config", std::string())) {
    return absl::FailedPreconditionError(
        absl::StrCat(shape.ToString(), ": the library describes it as ", checked->Brief()));
  }
  checked->from_file = true;
  const Key key(shape.op, shape.m, shape.n, shape.k, shape.p_ld, shape.p_transposed,
                shape.q_transposed, static_cast<int>(shape.c_type), e["align"][0].get<int>(),
                e["align"][1].get<int>(), e["align"][2].get<int>(),
                static_cast<int>(options_.split_k), s.workspace_bytes);
  return std::make_pair(key, *checked);
}

absl::Status GemmEngine::UseCacheFile(const std::string& path, const std::string& platform,
                                      const GemmStream& s, std::string* summary) {
  absl::StatusOr<AlgoCacheFile> file = AlgoCacheFile::Open(path, platform, EntryKey);
  if (!file.ok()) return file.status();
  const AlgoCacheFile::Loaded loaded = file->Load();
  int accepted = 0;
  int refused = 0;
  std::string first_refusal;
  for (const nlohmann::json& e : loaded.entries) {
    absl::StatusOr<std::pair<Key, AlgoChoice>> entry = FromEntry(e, s);
    if (!entry.ok()) {
      ++refused;
      if (first_refusal.empty()) first_refusal = std::string(entry.status().message());
      continue;
    }
    absl::MutexLock lock(&mu_);
    cache_.insert(*std::move(entry));
    ++accepted;
  }
  file_ = *std::move(file);
  if (summary != nullptr) {
    *summary = absl::StrCat("algorithm cache ", path, ": ", accepted, " choices loaded");
    if (refused > 0) {
      absl::StrAppend(summary, ", ", refused, " refused (", first_refusal,
                      ") and to be chosen again");
    }
    if (loaded.other_platform_entries > 0) {
      absl::StrAppend(summary, "; ", loaded.other_platform_entries,
                      " kept for other platforms (this one is '", platform, "')");
    }
    if (!loaded.ignored.empty()) {
      absl::StrAppend(summary, "; the file ", loaded.ignored,
                      ": ignored, and replaced once an algorithm is chosen");
    }
  }
  return absl::OkStatus();
}

AlgoChoice GemmEngine::Settle(const Key& key, const GemmShape& shape, const GemmStream& s,
                              const AlgoChoice& choice) {
  if (!file_.has_value()) return choice;
  nlohmann::json e;
  e["op"] = std::get<0>(key);
  e["m"] = std::get<1>(key);
  e["n"] = std::get<2>(key);
  e["k"] = std::get<3>(key);
  e["p_ld"] = std::get<4>(key);
  e["p_transposed"] = std::get<5>(key);
  e["q_transposed"] = std::get<6>(key);
  e["c_type"] = std::get<7>(key) == static_cast<int>(CUDA_R_32F) ? "fp32" : "bf16";
  e["align"] = {std::get<8>(key), std::get<9>(key), std::get<10>(key)};
  e["config"] = choice.Brief();
  e["algo"] = AlgoHex(choice.algo);
  absl::StatusOr<nlohmann::json> standing = file_->Claim(e);
  std::string problem;
  if (!standing.ok()) {
    problem = std::string(standing.status().message());
  } else if (*standing != e) {
    // Another process chose first: run its choice, so that both give the
    // same bits.
    absl::StatusOr<std::pair<Key, AlgoChoice>> theirs = FromEntry(*standing, s);
    if (theirs.ok() && theirs->first == key) return theirs->second;
    problem = absl::StrCat(shape.ToString(), ": the entry another process recorded is refused (",
                           theirs.ok() ? "another key" : theirs.status().message(), ")");
  }
  if (!problem.empty() && options_.warn && !file_failure_reported_.exchange(true)) {
    options_.warn(absl::StrCat(problem,
                               "; this choice is kept in memory only, and a restart may choose "
                               "another (reported once)"));
  }
  return choice;
}

}  // namespace logitd::kernels::cuda

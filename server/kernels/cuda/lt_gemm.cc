#include "server/kernels/cuda/lt_gemm.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/kernels/cuda/cuda_status.h"

namespace logitd::kernels::cuda {
namespace {

// Largest power of two dividing the address, capped at 256: what the
// heuristic must be told so that it only offers kernels whose vector
// accesses these pointers allow.
int Alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && a % (2u * static_cast<unsigned>(alignment)) == 0) alignment *= 2;
  return alignment;
}

const char* TypeName(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "fp32";
    case CUDA_R_16BF:
      return "bf16";
    default:
      return "?";
  }
}

std::size_t TypeSize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

std::string Dims(const GemmShape& s) {
  return absl::StrCat("M=", s.m, ",N=", s.n, ",K=", s.k, ",", TypeName(s.c_type), " out",
                      s.p_ld > 0 ? absl::StrCat(",ldP=", s.p_ld) : "");
}

template <typename T>
T ConfigValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return value;
}

AlgoChoice Describe(const cublasLtMatmulHeuristicResult_t& r) {
  AlgoChoice c;
  c.algo = r.algo;
  c.workspace_bytes = r.workspaceSize;
  c.algo_id = ConfigValue<std::int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID);
  c.tile_id = static_cast<int>(ConfigValue<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
  c.split_k = ConfigValue<std::int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  if (c.split_k < 1) c.split_k = 1;
  c.reduction =
      static_cast<int>(ConfigValue<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  c.swizzle =
      static_cast<int>(ConfigValue<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  c.custom =
      static_cast<int>(ConfigValue<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  c.stages_id =
      static_cast<int>(ConfigValue<std::uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  c.cluster_id =
      static_cast<int>(ConfigValue<std::uint16_t>(r.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return c;
}

// Whether a configuration keeps every partial sum in fp32 as the policy asks.
// With fp32 D every scheme (in place in D, in a compute-type workspace, in an
// output-type workspace) sums in fp32. With bf16 D only the compute-type
// workspace does: in-place and output-type reductions store bf16 partials,
// which is exactly what the legacy path had to ban.
bool Allowed(SplitK policy, cudaDataType_t c_type, const AlgoChoice& c) {
  if (c.split_k <= 1) return true;
  switch (policy) {
    case SplitK::kOff:
      return false;
    case SplitK::kAny:
      return true;
    case SplitK::kFp32:
      return c_type == CUDA_R_32F || c.reduction == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  }
  return false;
}

std::uint32_t ReductionMask(SplitK policy, cudaDataType_t c_type) {
  switch (policy) {
    case SplitK::kOff:
      return CUBLASLT_REDUCTION_SCHEME_NONE;
    case SplitK::kAny:
      return CUBLASLT_REDUCTION_SCHEME_MASK;
    case SplitK::kFp32:
      return c_type == CUDA_R_32F ? CUBLASLT_REDUCTION_SCHEME_MASK
                                  : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  }
  return CUBLASLT_REDUCTION_SCHEME_NONE;
}

template <typename T>
std::optional<T> CapValue(const cublasLtMatmulAlgo_t& algo,
                          cublasLtMatmulAlgoCapAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &value, sizeof value, &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return std::nullopt;
  }
  return value;
}

bool SameConfig(const AlgoChoice& a, const AlgoChoice& b) {
  return a.algo_id == b.algo_id && a.tile_id == b.tile_id && a.stages_id == b.stages_id &&
         a.cluster_id == b.cluster_id && a.split_k == b.split_k && a.reduction == b.reduction &&
         a.swizzle == b.swizzle && a.custom == b.custom;
}

struct Descriptors {
  LtMatmulDesc desc;
  LtLayout a;  // Q
  LtLayout b;  // P
  LtLayout c;  // C and D
};

// cuBLASLt is column-major: the row-major C[m, n] is the column-major
// C^T[n, m] = Q^T . P^T, so cuBLASLt's A is Q and its B is P, and a row-major
// [r, c] array is a column-major [c, r] one with leading dimension c.
absl::StatusOr<Descriptors> MakeDescriptors(const GemmShape& s) {
  Descriptors d;
  const std::string what = absl::StrCat(s.op, ": ");
  cublasLtMatmulDesc_t desc = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what,
                         "cublasLtMatmulDescCreate(", Dims(s), ")");
  d.desc = LtMatmulDesc(desc);
  const cublasOperation_t trans_a = s.q_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = s.p_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a),
      what, "cublasLtMatmulDescSetAttribute(TRANSA)");
  RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b),
      what, "cublasLtMatmulDescSetAttribute(TRANSB)");
  const auto m = static_cast<std::uint64_t>(s.m);
  const auto n = static_cast<std::uint64_t>(s.n);
  const auto k = static_cast<std::uint64_t>(s.k);
  // Q stored [k, n] is column-major [n, k]; stored [n, k] it is [k, n].
  const std::uint64_t a_rows = s.q_transposed ? k : n;
  const std::uint64_t a_cols = s.q_transposed ? n : k;
  // P stored [m, k] is column-major [k, m]; stored [k, m] it is [m, k].
  const std::uint64_t b_rows = s.p_transposed ? m : k;
  const std::uint64_t b_cols = s.p_transposed ? k : m;
  cublasLtMatrixLayout_t layout = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, a_rows, a_cols,
                                                    static_cast<std::int64_t>(a_rows)),
                         what, "cublasLtMatrixLayoutCreate(A, ", Dims(s), ")");
  d.a = LtLayout(layout);
  const std::int64_t b_ld = s.p_ld > 0 ? s.p_ld : static_cast<std::int64_t>(b_rows);
  if (b_ld < static_cast<std::int64_t>(b_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "P's row stride ", s.p_ld, " is shorter than its rows (", Dims(s), ")"));
  }
  RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, b_rows, b_cols, b_ld),
                         what, "cublasLtMatrixLayoutCreate(B, ", Dims(s), ")");
  d.b = LtLayout(layout);
  RETURN_IF_CUBLAS_ERROR(
      cublasLtMatrixLayoutCreate(&layout, s.c_type, n, m, static_cast<std::int64_t>(n)), what,
      "cublasLtMatrixLayoutCreate(C, ", Dims(s), ")");
  d.c = LtLayout(layout);
  return d;
}

absl::Status Matmul(const GemmShape& shape, const RawHandles& d, const cublasLtMatmulAlgo_t& algo,
                    const void* p, const void* q, void* c, float alpha, float beta,
                    const GemmStream& s) {
  RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(s.handle, d.desc, &alpha, q, d.a, p, d.b, &beta, c, d.c, c,
                                        d.c, &algo, s.workspace, s.workspace_bytes, s.stream),
                         shape.op, ": cublasLtMatmul(", Dims(shape), ")");
  return absl::OkStatus();
}

}  // namespace

std::string GemmShape::ToString() const { return absl::StrCat(op, "(", Dims(*this), ")"); }

GemmShape LogitsShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out) {
  GemmShape s;
  s.op = "logits";
  s.m = m;
  s.n = v;
  s.k = k;
  s.q_transposed = true;  // Q = W^T, W stored [v, k]
  s.c_type = out;
  return s;
}

GemmShape GradInputShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out) {
  GemmShape s;
  s.op = "dx";
  s.m = m;
  s.n = k;
  s.k = v;
  s.c_type = out;
  return s;
}

GemmShape GradWeightShape(std::int64_t m, std::int64_t v, std::int64_t k, cudaDataType_t out) {
  GemmShape s;
  s.op = "dw";
  s.m = v;
  s.n = k;
  s.k = m;
  s.p_transposed = true;  // P = G^T, G stored [m, v]
  s.c_type = out;
  return s;
}

std::string AlgoChoice::ToString() const {
  return absl::StrFormat("%s ws=%d rank=%d/%d timed=%d t=%.1fus%s", Brief(),
                         static_cast<long long>(workspace_bytes), rank, candidates, timed, time_us,
                         from_file ? " (from the cache file)" : "");
}

std::string AlgoChoice::Brief() const {
  return absl::StrFormat(
      "algo=%d tile=%d stages=%d cluster=%d splitk=%d red=%d swizzle=%d custom=%d", algo_id,
      tile_id, stages_id, cluster_id, split_k, reduction, swizzle, custom);
}

std::string AlgoCachePlatform(const std::string& device_name, int multiprocessors,
                              const std::string& driver, const std::string& runtime,
                              const std::string& cublaslt, std::size_t workspace_bytes,
                              SplitK split_k) {
  // The tuner's candidate rule is part of it: a file written while the
  // tuner also timed its own split variants (one of which summed wrongly,
  // lt_gemm.h) holds choices no longer to be run.
  return absl::StrCat(device_name, "; ", multiprocessors, " SMs; driver ", driver, "; CUDA ",
                      runtime, "; cuBLASLt ", cublaslt, "; workspace ", workspace_bytes,
                      "; split_k=", SplitKName(split_k), "; the heuristic's configurations");
}

GemmEngine::GemmEngine(GemmEngineOptions options, std::shared_ptr<DeviceMemory> memory)
    : options_(options), memory_(std::move(memory)) {}

GemmEngine::Key GemmEngine::MakeKey(const GemmShape& s, const GemmOperands& o,
                                    std::size_t workspace_bytes) const {
  return Key(s.op, s.m, s.n, s.k, s.p_ld, s.p_transposed, s.q_transposed,
             static_cast<int>(s.c_type), Alignment(o.p), Alignment(o.q), Alignment(o.c),
             static_cast<int>(options_.split_k), workspace_bytes);
}

std::optional<AlgoChoice> GemmEngine::Cached(const GemmShape& shape, const GemmOperands& operands,
                                             std::size_t workspace_bytes) const {
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(MakeKey(shape, operands, workspace_bytes));
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

std::size_t GemmEngine::cache_size() const {
  absl::MutexLock lock(&mu_);
  return cache_.size();
}

absl::StatusOr<std::vector<AlgoChoice>> GemmEngine::Heuristic(const GemmShape& shape,
                                                              const GemmOperands& o,
                                                              const GemmStream& s,
                                                              const RawHandles& h) const {
  const std::string what = absl::StrCat(shape.op, ": ");
  std::vector<cublasLtMatmulHeuristicResult_t> results(
      static_cast<std::size_t>(std::max(1, options_.heuristic_candidates)));
  int returned = 0;
  // Asks with the policy's reduction mask first; if the library then offers
  // nothing, asks without it and relies on the filter below.
  for (int attempt = 0; attempt < 2 && returned == 0; ++attempt) {
    cublasLtMatmulPreference_t raw = nullptr;
    RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&raw), what,
                           "cublasLtMatmulPreferenceCreate");
    LtPreference pref(raw);
    const std::uint64_t ws = s.workspace_bytes;
    RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceSetAttribute(
                               raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                           what, "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    if (attempt == 0) {
      const std::uint32_t mask = ReductionMask(options_.split_k, shape.c_type);
      RETURN_IF_CUBLAS_ERROR(
          cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &mask, sizeof mask),
          what, "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
    }
    const std::uint32_t align_a = static_cast<std::uint32_t>(Alignment(o.q));
    const std::uint32_t align_b = static_cast<std::uint32_t>(Alignment(o.p));
    const std::uint32_t align_c = static_cast<std::uint32_t>(Alignment(o.c));
    for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}}) {
      RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceSetAttribute(raw, attr, &value, sizeof value),
                             what, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    }
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(s.handle, h.desc, h.a, h.b, h.c, h.c, raw,
                                       static_cast<int>(results.size()), results.data(), &returned);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
      returned = 0;
      continue;
    }
    RETURN_IF_CUBLAS_ERROR(st, what, "cublasLtMatmulAlgoGetHeuristic(", Dims(shape), ")");
  }

  std::vector<AlgoChoice> candidates;
  for (int i = 0; i < returned; ++i) {
    const auto& r = results[static_cast<std::size_t>(i)];
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > s.workspace_bytes) continue;
    AlgoChoice choice = Describe(r);
    choice.rank = i;
    if (Allowed(options_.split_k, shape.c_type, choice)) candidates.push_back(choice);
  }
  if (candidates.empty()) {
    return absl::UnimplementedError(
        absl::StrCat(what, "cublasLtMatmulAlgoGetHeuristic(", Dims(shape), ") offered ", returned,
                     " algorithms, none allowed by split_k=", SplitKName(options_.split_k),
                     " within a workspace of ", s.workspace_bytes, " bytes"));
  }
  for (auto& cand : candidates) cand.candidates = static_cast<int>(candidates.size());
  return candidates;
}

absl::StatusOr<std::vector<AlgoChoice>> GemmEngine::Candidates(const GemmShape& shape,
                                                               const GemmOperands& operands,
                                                               const GemmStream& s) const {
  auto d = MakeDescriptors(shape);
  if (!d.ok()) return d.status();
  return Heuristic(shape, operands, s,
                   RawHandles{d->desc.get(), d->a.get(), d->b.get(), d->c.get()});
}

absl::StatusOr<std::vector<AlgoChoice>> GemmEngine::TuningCandidates(const GemmShape& shape,
                                                                     const GemmOperands& operands,
                                                                     const GemmStream& s) const {
  auto d = MakeDescriptors(shape);
  if (!d.ok()) return d.status();
  return ListCandidates(shape, operands, s,
                        RawHandles{d->desc.get(), d->a.get(), d->b.get(), d->c.get()});
}

absl::StatusOr<AlgoChoice> GemmEngine::Check(const GemmShape& shape, const GemmStream& s,
                                             const cublasLtMatmulAlgo_t& algo) const {
  auto d = MakeDescriptors(shape);
  if (!d.ok()) return d.status();
  cublasLtMatmulHeuristicResult_t check{};
  RETURN_IF_CUBLAS_ERROR(cublasLtMatmulAlgoCheck(s.handle, d->desc.get(), d->a.get(), d->b.get(),
                                                 d->c.get(), d->c.get(), &algo, &check),
                         shape.op, ": cublasLtMatmulAlgoCheck(", Dims(shape), ")");
  if (check.workspaceSize > s.workspace_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(shape.op, ": the configuration needs ", check.workspaceSize,
                     " bytes of workspace, more than the ", s.workspace_bytes, " available"));
  }
  check.algo = algo;
  return Describe(check);
}

absl::Status GemmEngine::RunWith(const GemmShape& shape, const GemmOperands& operands,
                                 const GemmStream& s, const AlgoChoice& choice) const {
  auto d = MakeDescriptors(shape);
  if (!d.ok()) return d.status();
  return Matmul(shape, RawHandles{d->desc.get(), d->a.get(), d->b.get(), d->c.get()}, choice.algo,
                operands.p, operands.q, operands.c, operands.alpha, operands.beta, s);
}

absl::StatusOr<std::vector<AlgoChoice>> GemmEngine::ListCandidates(const GemmShape& shape,
                                                                   const GemmOperands& o,
                                                                   const GemmStream& s,
                                                                   const RawHandles& h) const {
  auto listed = Heuristic(shape, o, s, h);
  if (!listed.ok()) return listed.status();
  std::vector<AlgoChoice> candidates = *std::move(listed);
  if (!options_.autotune) {
    candidates.resize(1);
    return candidates;
  }
  const int listed_count =
      std::min(static_cast<int>(candidates.size()), std::max(1, options_.tune_candidates));
  candidates.resize(static_cast<std::size_t>(listed_count));
  // The heuristic's list keeps each kernel at one split count. Products with
  // few output tiles and a long reduction are often faster with another
  // count, so the leading kernels are also offered split differently, with
  // fp32 partial sums in the workspace. Only kernels that declare split-K
  // support and the compute-type reduction are split, only so that every
  // split keeps a real share of the reduction (a split with nothing to sum
  // is where a kernel's bookkeeping goes wrong), and only configurations that
  // cublasLtMatmulAlgoCheck accepts as given.
  const bool small_output = static_cast<double>(shape.m) * static_cast<double>(shape.n) <=
                            options_.split_variants_max_outputs;
  if (options_.split_k != SplitK::kOff && options_.split_variants > 0 && small_output) {
    const int base_count = std::min(listed_count, options_.split_variants);
    for (int i = 0; i < base_count; ++i) {
      const AlgoChoice& base = candidates[static_cast<std::size_t>(i)];
      const auto supports_split =
          CapValue<std::int32_t>(base.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
      const auto schemes =
          CapValue<std::uint32_t>(base.algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
      if (!supports_split || *supports_split == 0 || !schemes ||
          (*schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) == 0) {
        continue;
      }
      for (std::int32_t split : {1, 2, 3, 4, 6, 8, 12, 16}) {
        if (split > 1 && shape.k / split < options_.min_split_reduction) break;
        AlgoChoice variant = base;
        const std::uint32_t scheme =
            split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
        if (cublasLtMatmulAlgoConfigSetAttribute(&variant.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                 &split, sizeof split) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&variant.algo,
                                                 CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                 sizeof scheme) != CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(s.handle, h.desc, h.a, h.b, h.c, h.c, &variant.algo, &check) !=
                CUBLAS_STATUS_SUCCESS ||
            check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > s.workspace_bytes) {
          continue;
        }
        check.algo = variant.algo;
        AlgoChoice described = Describe(check);
        // The library must run what was asked for, not something it
        // substituted.
        if (described.split_k != split ||
            (split > 1 && described.reduction != static_cast<int>(scheme))) {
          continue;
        }
        described.rank = 100 + i;  // derived from the heuristic's choice i
        if (!Allowed(options_.split_k, shape.c_type, described)) continue;
        bool seen = false;
        for (const auto& c : candidates) seen = seen || SameConfig(c, described);
        if (!seen) candidates.push_back(described);
      }
    }
  }
  for (auto& cand : candidates) cand.candidates = static_cast<int>(candidates.size());
  return candidates;
}

namespace {

struct Fastest {
  int index = -1;  // into the candidates
  double median_us = 0;
};

// The candidate (live[j]) whose times[j] have the smallest median. Candidates
// come in the heuristic's order: a later one must win by `margin` (a
// fraction), so that noise rarely moves the choice between processes.
Fastest FastestByMedian(const std::vector<int>& live, std::vector<std::vector<double>>& times,
                        double margin) {
  Fastest best;
  for (std::size_t j = 0; j < live.size(); ++j) {
    std::sort(times[j].begin(), times[j].end());
    const double median = times[j][times[j].size() / 2];
    if (best.index < 0 || median < best.median_us * (1.0 - margin)) {
      best.index = live[j];
      best.median_us = median;
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<AlgoChoice> GemmEngine::Choose(const GemmShape& shape, const GemmOperands& o,
                                              const GemmStream& s, const RawHandles& h) {
  auto listed = ListCandidates(shape, o, s, h);
  if (!listed.ok()) return listed.status();
  std::vector<AlgoChoice>& candidates = *listed;
  const int count = static_cast<int>(candidates.size());
  if (count == 1) return candidates.front();
  const std::string what = absl::StrCat(shape.op, ": ");

  // Timing runs write C. When the call accumulates, C holds state that must
  // survive, so the runs go to scratch; if none can be had, the heuristic's
  // first choice stands.
  void* target = o.c;
  DeviceBuffer scratch;
  if (o.beta != 0.0f) {
    auto buffer =
        memory_->Allocate(static_cast<std::size_t>(shape.m * shape.n) * TypeSize(shape.c_type),
                          absl::StrCat(what, "tuning scratch"));
    if (!buffer.ok()) return candidates.front();
    scratch = *std::move(buffer);
    target = scratch.get();
  }

  const int repeats = std::max(1, options_.tune_repeats);
  // One warm-up run each; a candidate the library then refuses is dropped.
  std::vector<int> live;
  absl::Status first_error;
  for (int i = 0; i < count; ++i) {
    absl::Status st = Matmul(shape, h, candidates[static_cast<std::size_t>(i)].algo, o.p, o.q,
                             target, o.alpha, 0.0f, s);
    if (st.ok()) {
      live.push_back(i);
    } else if (first_error.ok()) {
      first_error = st;
    }
  }
  if (live.empty()) return first_error;
  // Round-robin: each round times every candidate once, so clock and power
  // drift over the tuning weigh on all of them alike.
  const std::size_t slots = live.size() * static_cast<std::size_t>(repeats);
  std::vector<Event> events;
  for (std::size_t i = 0; i < slots + 1; ++i) {
    auto event = CreateEvent(true);
    if (!event.ok()) return event.status();
    events.push_back(*std::move(event));
  }
  RETURN_IF_CUDA_ERROR(cudaEventRecord(events[0].get(), s.stream), what, "cudaEventRecord");
  std::size_t slot = 0;
  for (int r = 0; r < repeats; ++r) {
    for (int i : live) {
      LOGITD_CUDA_RETURN_IF_ERROR(Matmul(shape, h, candidates[static_cast<std::size_t>(i)].algo,
                                         o.p, o.q, target, o.alpha, 0.0f, s));
      RETURN_IF_CUDA_ERROR(cudaEventRecord(events[++slot].get(), s.stream), what,
                           "cudaEventRecord");
    }
  }
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(events.back().get()), what,
                       "cudaEventSynchronize(tuning ", Dims(shape), ")");
  std::vector<std::vector<double>> times(live.size());
  for (std::size_t k = 0; k < slots; ++k) {
    float ms = 0;
    RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, events[k].get(), events[k + 1].get()), what,
                         "cudaEventElapsedTime");
    times[k % live.size()].push_back(1000.0 * ms);
  }
  const Fastest fastest = FastestByMedian(live, times, options_.tune_margin);
  AlgoChoice winner = candidates[static_cast<std::size_t>(fastest.index)];
  winner.timed = static_cast<int>(live.size());
  winner.time_us = fastest.median_us;
  return winner;
}

absl::Status GemmEngine::Run(const GemmShape& shape, const GemmOperands& operands,
                             const GemmStream& s) {
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.op, ": expected positive dimensions, got ", Dims(shape)));
  }
  auto descriptors = MakeDescriptors(shape);
  if (!descriptors.ok()) return descriptors.status();
  const RawHandles h{descriptors->desc.get(), descriptors->a.get(), descriptors->b.get(),
                     descriptors->c.get()};
  const Key key = MakeKey(shape, operands, s.workspace_bytes);
  AlgoChoice chosen;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      chosen = it->second;
      found = true;
    }
  }
  if (!found) {
    // Two threads may tune the same shape at once; the first to finish
    // fills the cache and both then run its choice, so every request of a
    // shape uses one algorithm for the life of the process.
    auto choice = Choose(shape, operands, s, h);
    if (!choice.ok()) return choice.status();
    const AlgoChoice settled = Settle(key, shape, s, *choice);
    absl::MutexLock lock(&mu_);
    chosen = cache_.emplace(key, settled).first->second;
  }
  if (s.record != nullptr) {
    std::string line = absl::StrCat(shape.ToString(), ": ", chosen.Brief());
    if (std::find(s.record->begin(), s.record->end(), line) == s.record->end()) {
      s.record->push_back(std::move(line));
    }
  }
  return Matmul(shape, h, chosen.algo, operands.p, operands.q, operands.c, operands.alpha,
                operands.beta, s);
}

}  // namespace logitd::kernels::cuda

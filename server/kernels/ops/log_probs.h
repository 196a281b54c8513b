// Per-token log-probabilities of the fp32 logits z = softcap(X . W^T) /
// temperature over the first `vocab` entries (see logitd.v1.LogProbsHeader):
// lse, the target's log-prob and rank, the entropy and the top-k, computed
// chunk by chunk over V without [m, V] at once. With temperature 1, no
// soft-capping and vocab = V, lse and logprob are bitwise those of
// CrossEntropy (logprob = -loss). Kernels: cpu/log_probs.cc (OpenBLAS
// walks, cpu/walks.cc), cuda/walk_calls.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"
#include "logitd/protocol.h"
#include "logitd/status_macros.h"
#include "server/kernels/arg_checks.h"
#include "server/kernels/backend.h"
#include "server/kernels/kernel.h"

namespace logitd::kernels {

struct LogProbsArgs {
  static constexpr absl::string_view kName = "log probs";
  const Weight* weight = nullptr;  // W [V, K], loaded by the backend that runs the call
  const Bf16Bits* x = nullptr;     // [m, K] bf16
  std::int64_t m = 0;
  // [m], each in [0, vocab) or == ignore_index; null for no targets.
  const std::int64_t* targets = nullptr;
  std::int64_t ignore_index = -100;
  float temperature = 1.0f;    // > 0; z = softcap(y) / temperature
  float logit_softcap = 0.0f;  // 0 = off
  // Vocabulary entries that count (the first `vocab` rows of W), 1..V.
  std::int64_t vocab = 0;
  // Outputs; null for those not asked. logprob and rank need targets.
  float* logprob = nullptr;          // [m]; 0 for an ignored target
  float* lse = nullptr;              // [m]
  float* entropy = nullptr;          // [m]
  std::int64_t top_k = 0;            // 0..kMaxTopK
  std::int32_t* topk_ids = nullptr;  // [m, top_k], most likely first, ties by lower id
  float* topk_logprobs = nullptr;    // [m, top_k]
  std::int64_t* rank = nullptr;      // [m]; -1 for an ignored target
  // Vocabulary rows per chunk; 0 lets the backend choose.
  std::int64_t vocab_chunk = 0;
};

// Rows [r0, r0 + rows) of a LogProbs call with a weight of K columns as a
// call of their own (the service's row blocks; Backend::LogProbsBlockRows): the same options, every
// pointer moved to the block's first row.
inline LogProbsArgs LogProbsRowsOf(const LogProbsArgs& args, std::int64_t k, std::int64_t r0,
                                   std::int64_t rows) {
  LogProbsArgs b = args;
  const auto at = [r0](auto* p, std::int64_t per_row) {
    return p == nullptr ? p : p + r0 * per_row;
  };
  b.m = rows;
  b.x = at(args.x, k);
  b.targets = at(args.targets, 1);
  b.logprob = at(args.logprob, 1);
  b.lse = at(args.lse, 1);
  b.entropy = at(args.entropy, 1);
  b.topk_ids = at(args.topk_ids, args.top_k);
  b.topk_logprobs = at(args.topk_logprobs, args.top_k);
  b.rank = at(args.rank, 1);
  return b;
}

inline absl::Status CheckArgs(const LogProbsArgs& args) {
  constexpr absl::string_view kCall = "log probs";
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "weight", args.weight));
  const Weight& w = *args.weight;
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "x", args.x));
  LOGITD_RETURN_IF_ERROR(CheckRows(kCall, args.m));
  if (!std::isfinite(args.temperature) || args.temperature <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("log probs: expected temperature finite and > 0, got ", args.temperature));
  }
  if (!std::isfinite(args.logit_softcap) || args.logit_softcap < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log probs: expected logit_softcap finite and >= 0, got ", args.logit_softcap));
  }
  if (args.vocab < 1 || args.vocab > w.v()) {
    return absl::InvalidArgumentError(
        absl::StrCat("log probs: expected vocab 1 to ", w.v(), ", got ", args.vocab));
  }
  const std::int64_t max_k = std::min(kMaxTopK, args.vocab);
  if (args.top_k < 0 || args.top_k > max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("log probs: expected top_k 0 to ", max_k, ", got ", args.top_k));
  }
  if (args.top_k > 0) {
    LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "topk_ids", args.topk_ids));
    LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "topk_logprobs", args.topk_logprobs));
  }
  LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  if (args.targets == nullptr) {
    if (args.logprob != nullptr || args.rank != nullptr) {
      return absl::InvalidArgumentError("log probs: logprob and rank need targets");
    }
    return absl::OkStatus();
  }
  for (std::int64_t i = 0; i < args.m; ++i) {
    const std::int64_t t = args.targets[i];
    if (t != args.ignore_index && (t < 0 || t >= args.vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("log probs: targets[", i, "] = ", t,
                                                     ": expected a token id in [0, ", args.vocab,
                                                     ") or ignore_index ", args.ignore_index));
    }
  }
  return absl::OkStatus();
}

inline std::vector<KernelOutput> OutputsOf(const LogProbsArgs& args) {
  const auto m = static_cast<std::size_t>(args.m);
  const auto mk = m * static_cast<std::size_t>(args.top_k);
  std::vector<KernelOutput> outputs;
  const auto add = [&](absl::string_view name, DType dtype, void* data, std::size_t bytes) {
    if (data != nullptr) outputs.push_back({name, dtype, static_cast<std::byte*>(data), bytes});
  };
  add("logprob", DType::kFp32, args.logprob, m * 4);
  add("lse", DType::kFp32, args.lse, m * 4);
  add("entropy", DType::kFp32, args.entropy, m * 4);
  add("topk_ids", DType::kInt32, args.topk_ids, mk * 4);
  add("topk_logprobs", DType::kFp32, args.topk_logprobs, mk * 4);
  add("rank", DType::kInt64, args.rank, m * 8);
  return outputs;
}

}  // namespace logitd::kernels

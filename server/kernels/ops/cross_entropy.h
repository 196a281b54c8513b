// Fused cross-entropy (see logitd.v1.CrossEntropyHeader for the formulas):
// fp32 logits computed chunk by chunk over V, never all of [m, V] at once;
// G = bf16(dL/dz * dz/dy * grad_scale) per chunk (RNE, once), dX in fp32
// and rounded once, dW in fp32.
// Kernels: cpu_backend.cc (CpuBackend::CrossEntropyCall), the cuda
// backend's walk_calls.cc (CudaBackend::CrossEntropyCall).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "logitd/tensor.h"
#include "server/kernels/arg_checks.h"
#include "server/kernels/backend.h"
#include "server/kernels/kernel.h"

namespace logitd::kernels {

struct CrossEntropyArgs {
  static constexpr absl::string_view kName = "cross entropy";
  // W [V, K], loaded by the backend that runs the call; its fp32 gradient
  // buffer takes dW when accumulate_dw.
  Weight* weight = nullptr;
  const Bf16Bits* x = nullptr;  // [m, K] bf16
  std::int64_t m = 0;
  const std::int64_t* targets = nullptr;  // [m], each in [0, V) or == ignore_index
  std::int64_t ignore_index = -100;
  float z_loss = 0.0f;         // coefficient of z_loss * lse^2; 0 = off
  float logit_softcap = 0.0f;  // z = cap * tanh(y / cap); 0 = off
  // Multiplies every counted token's dL/dz before the bf16 cast of G (the
  // service folds the incoming gradient and 1/count for a mean into it).
  float grad_scale = 1.0f;
  float* loss = nullptr;  // [m] per-token loss; 0 for ignored tokens. Required.
  float* lse = nullptr;   // [m] or null
  void* dx = nullptr;     // [m, K] of dx_dtype, or null
  DType dx_dtype = DType::kBf16;
  float* dw = nullptr;         // [V, K] fp32, or null
  bool accumulate_dw = false;  // dW += G^T X into the weight's fp32 buffer; dw unused
  // Vocabulary rows per chunk, which asks for a walk over the vocabulary; 0
  // lets the backend choose the walk and its chunk from its memory.
  std::int64_t vocab_chunk = 0;
};

// Rows [r0, r0 + rows) of a CrossEntropy call without dW as a call of its
// own: the same options (grad_scale included), every pointer moved to the
// block's first row.
inline CrossEntropyArgs CrossEntropyRowsOf(const CrossEntropyArgs& args, std::int64_t k,
                                           std::int64_t r0, std::int64_t rows) {
  CrossEntropyArgs b = args;
  b.m = rows;
  b.x = args.x + r0 * k;
  b.targets = args.targets == nullptr ? nullptr : args.targets + r0;
  b.loss = args.loss == nullptr ? nullptr : args.loss + r0;
  b.lse = args.lse == nullptr ? nullptr : args.lse + r0;
  b.dx = args.dx == nullptr ? nullptr
                            : static_cast<std::byte*>(args.dx) +
                                  static_cast<std::size_t>(r0 * k) * ElementSize(args.dx_dtype);
  return b;
}

inline absl::Status CheckCeOption(absl::string_view name, float value, bool non_negative) {
  if (!std::isfinite(value) || (non_negative && value < 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("cross entropy: expected ", name, " finite",
                                                   non_negative ? " and >= 0" : "", ", got ",
                                                   value));
  }
  return absl::OkStatus();
}

inline absl::Status CheckArgs(const CrossEntropyArgs& args) {
  constexpr absl::string_view kCall = "cross entropy";
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "weight", args.weight));
  const Weight& w = *args.weight;
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "x", args.x));
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "targets", args.targets));
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "loss", args.loss));
  LOGITD_RETURN_IF_ERROR(CheckRows(kCall, args.m));
  if (args.dx != nullptr) {
    LOGITD_RETURN_IF_ERROR(CheckFloatDType(kCall, "dx_dtype", args.dx_dtype));
  }
  LOGITD_RETURN_IF_ERROR(CheckCeOption("z_loss", args.z_loss, true));
  LOGITD_RETURN_IF_ERROR(CheckCeOption("logit_softcap", args.logit_softcap, true));
  LOGITD_RETURN_IF_ERROR(CheckCeOption("grad_scale", args.grad_scale, false));
  LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  if (args.dx != nullptr) {
    LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "dx", {args.m, w.k()}, args.dx_dtype));
  }
  if (args.dw != nullptr || args.accumulate_dw) {
    LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "dw", {w.v(), w.k()}, DType::kFp32));
  }
  for (std::int64_t i = 0; i < args.m; ++i) {
    const std::int64_t t = args.targets[i];
    if (t != args.ignore_index && (t < 0 || t >= w.v())) {
      return absl::InvalidArgumentError(absl::StrCat("cross entropy: targets[", i, "] = ", t,
                                                     ": expected a token id in [0, ", w.v(),
                                                     ") or ignore_index ", args.ignore_index));
    }
  }
  return absl::OkStatus();
}

inline std::vector<KernelOutput> OutputsOf(const CrossEntropyArgs& args) {
  const auto m = static_cast<std::size_t>(args.m);
  const auto k = static_cast<std::size_t>(args.weight->k());
  const auto v = static_cast<std::size_t>(args.weight->v());
  std::vector<KernelOutput> outputs;
  outputs.push_back({"loss", DType::kFp32, reinterpret_cast<std::byte*>(args.loss), m * 4});
  if (args.lse != nullptr) {
    outputs.push_back({"lse", DType::kFp32, reinterpret_cast<std::byte*>(args.lse), m * 4});
  }
  if (args.dx != nullptr) {
    outputs.push_back({"dx", args.dx_dtype, static_cast<std::byte*>(args.dx),
                       m * k * ElementSize(args.dx_dtype)});
  }
  if (args.dw != nullptr && !args.accumulate_dw) {
    outputs.push_back({"dw", DType::kFp32, reinterpret_cast<std::byte*>(args.dw), v * k * 4});
  }
  return outputs;
}

}  // namespace logitd::kernels

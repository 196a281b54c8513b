// Logits: Y[m, V] = alpha * X[m, K] . W[V, K]^T, bf16 operands, fp32
// accumulation; fp32 out, or rounded to bf16 once (RNE). Kernels: the cpu
// backend's OpenBLAS GEMM (cpu/cpu_backend.cc), the cuda backend's cuBLASLt
// GEMM (cuda/gemm_calls.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "logitd/tensor.h"
#include "server/kernels/arg_checks.h"
#include "server/kernels/kernel.h"
#include "server/kernels/weight.h"

namespace logitd::kernels {

struct LogitsArgs {
  static constexpr absl::string_view kName = "logits";
  const Bf16Bits* x = nullptr;  // [m, K] bf16
  std::int64_t m = 0;
  float alpha = 1.0f;
  DType out_dtype = DType::kFp32;  // kFp32 or kBf16
  void* y = nullptr;               // [m, V] of out_dtype
  // W [V, K], loaded by the backend that runs the call (Backend::Logits
  // sets it).
  const Weight* weight = nullptr;
};

inline absl::Status CheckArgs(const LogitsArgs& args) {
  constexpr absl::string_view kCall = "logits";
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "weight", args.weight));
  const Weight& w = *args.weight;
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "x", args.x));
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "y", args.y));
  LOGITD_RETURN_IF_ERROR(CheckRows(kCall, args.m));
  LOGITD_RETURN_IF_ERROR(CheckFloatDType(kCall, "out_dtype", args.out_dtype));
  LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  return CheckBytes(kCall, "y", {args.m, w.v()}, args.out_dtype);
}

inline std::vector<KernelOutput> OutputsOf(const LogitsArgs& args) {
  return {{"y", args.out_dtype, static_cast<std::byte*>(args.y),
           static_cast<std::size_t>(args.m * args.weight->v()) * ElementSize(args.out_dtype)}};
}

}  // namespace logitd::kernels

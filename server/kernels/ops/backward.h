// Backward: G = bf16(dY) (RNE, once); dX = G.W [m, K]; dW = G^T.X [V, K];
// fp32 accumulation, outputs rounded once to their dtype, or dW added into
// the weight's fp32 gradient buffer. Kernels: cpu/cpu_backend.cc,
// cuda/gemm_calls.cc.
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

struct BackwardArgs {
  static constexpr absl::string_view kName = "backward";
  const void* dy = nullptr;       // [m, V]
  DType dy_dtype = DType::kFp32;  // kFp32 or kBf16
  const Bf16Bits* x = nullptr;    // [m, K] bf16
  std::int64_t m = 0;
  void* dx = nullptr;             // [m, K] of dx_dtype, or null for none
  DType dx_dtype = DType::kBf16;  // kBf16 or kFp32
  void* dw = nullptr;             // [V, K] of dw_dtype, or null for none
  DType dw_dtype = DType::kFp32;  // kFp32 or kBf16
  bool accumulate_dw = false;     // dW += G^T X into the weight's fp32 buffer; dw unused
  // W [V, K], loaded by the backend that runs the call (Backend::Backward
  // sets it); its gradient buffer takes an accumulated dW.
  Weight* weight = nullptr;
};

inline absl::Status CheckArgs(const BackwardArgs& args) {
  constexpr absl::string_view kCall = "backward";
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "weight", args.weight));
  const Weight& w = *args.weight;
  LOGITD_RETURN_IF_ERROR(CheckNotNull(kCall, "dy", args.dy));
  LOGITD_RETURN_IF_ERROR(CheckFloatDType(kCall, "dy_dtype", args.dy_dtype));
  LOGITD_RETURN_IF_ERROR(CheckRows(kCall, args.m));
  const bool want_dx = args.dx != nullptr;
  const bool return_dw = args.dw != nullptr && !args.accumulate_dw;
  if (!want_dx && !return_dw && !args.accumulate_dw) {
    return absl::InvalidArgumentError(
        "backward: nothing to compute: expected dx, dw or accumulate_dw, got none");
  }
  if (want_dx) LOGITD_RETURN_IF_ERROR(CheckFloatDType(kCall, "dx_dtype", args.dx_dtype));
  if (return_dw) LOGITD_RETURN_IF_ERROR(CheckFloatDType(kCall, "dw_dtype", args.dw_dtype));
  // dX = G.W needs no x; dW = G^T.X does.
  if ((return_dw || args.accumulate_dw) && args.x == nullptr) {
    return absl::InvalidArgumentError("backward: x is null but dW was asked for");
  }
  LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "dy", {args.m, w.v()}, args.dy_dtype));
  LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  if (want_dx) {
    LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "dx", {args.m, w.k()}, args.dx_dtype));
  }
  if (return_dw || args.accumulate_dw) {
    // Returned in dw_dtype or accumulated in fp32: [V, K] fp32 bounds both.
    LOGITD_RETURN_IF_ERROR(CheckBytes(kCall, "dw", {w.v(), w.k()}, DType::kFp32));
  }
  return absl::OkStatus();
}

// dX when asked, dW when returned (an accumulated dW stays in the weight's
// buffer).
inline std::vector<KernelOutput> OutputsOf(const BackwardArgs& args) {
  std::vector<KernelOutput> outputs;
  const Weight& w = *args.weight;
  if (args.dx != nullptr) {
    outputs.push_back({"dx", args.dx_dtype, static_cast<std::byte*>(args.dx),
                       static_cast<std::size_t>(args.m * w.k()) * ElementSize(args.dx_dtype)});
  }
  if (args.dw != nullptr && !args.accumulate_dw) {
    outputs.push_back({"dw", args.dw_dtype, static_cast<std::byte*>(args.dw),
                       static_cast<std::size_t>(w.v() * w.k()) * ElementSize(args.dw_dtype)});
  }
  return outputs;
}

}  // namespace logitd::kernels

#include "server/kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "logitd/reference/fp64_products.h"

namespace logitd::kernels {

Weight::Weight(std::int64_t v, std::int64_t k)
    : v_(v), k_(k), memo_(std::make_shared<WeightMemo>()) {}

namespace {

absl::Status CheckNotNull(absl::string_view call, absl::string_view name, const void* p) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(call, ": ", name, " is null"));
  return absl::OkStatus();
}

absl::Status CheckRows(absl::string_view call, std::int64_t m) {
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": expected m (rows of x) >= 1, got ", m));
  }
  return absl::OkStatus();
}

// The dtypes every floating-point tensor of the interface may take.
absl::Status CheckFloatDType(absl::string_view call, absl::string_view name, DType dtype) {
  if (dtype != DType::kFp32 && dtype != DType::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": expected ", name, " fp32 or bf16, got ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

// A tensor the call reads or writes must have a byte count that fits in
// int64 (and so in size_t): backends then size it without overflow.
absl::Status CheckBytes(absl::string_view call, absl::string_view name,
                        std::initializer_list<std::int64_t> shape, DType dtype) {
  absl::StatusOr<std::int64_t> bytes = CheckedByteCount(shape, dtype);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": ", name, " ", DTypeName(dtype), ": ", bytes.status().message()));
  }
  return absl::OkStatus();
}

absl::Status CheckCeOption(absl::string_view name, float value, bool non_negative) {
  if (!std::isfinite(value) || (non_negative && value < 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("cross entropy: expected ", name, " finite",
                                                   non_negative ? " and >= 0" : "", ", got ",
                                                   value));
  }
  return absl::OkStatus();
}

}  // namespace

// Returns `expr`'s status unless it is OK.
#define RETURN_IF_ERROR_(expr)                         \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (false)

absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "auto") return BackendKind::kAuto;
  if (n == "cuda") return BackendKind::kCuda;
  if (n == "cpu") return BackendKind::kCpu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "': expected auto, cuda or cpu"));
}

absl::StatusOr<SplitK> ParseSplitK(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "off") return SplitK::kOff;
  if (n == "fp32") return SplitK::kFp32;
  if (n == "any") return SplitK::kAny;
  return absl::InvalidArgumentError(
      absl::StrCat("split_k: expected off, fp32 or any, got '", name, "'"));
}

const char* SplitKName(SplitK split_k) {
  switch (split_k) {
    case SplitK::kOff:
      return "off";
    case SplitK::kFp32:
      return "fp32";
    case SplitK::kAny:
      return "any";
  }
  return "?";
}

absl::Status CheckLoadWeightArgs(const Bf16Bits* w, std::int64_t v, std::int64_t k) {
  RETURN_IF_ERROR_(CheckNotNull("load weight", "w", w));
  if (v < 1 || k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("load weight: expected V and K >= 1, got ", ShapeString({v, k})));
  }
  return CheckBytes("load weight", "w", {v, k}, DType::kBf16);
}

absl::Status CheckLogitsArgs(const Weight& w, const LogitsArgs& args) {
  constexpr absl::string_view kCall = "logits";
  RETURN_IF_ERROR_(CheckNotNull(kCall, "x", args.x));
  RETURN_IF_ERROR_(CheckNotNull(kCall, "y", args.y));
  RETURN_IF_ERROR_(CheckRows(kCall, args.m));
  RETURN_IF_ERROR_(CheckFloatDType(kCall, "out_dtype", args.out_dtype));
  RETURN_IF_ERROR_(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  return CheckBytes(kCall, "y", {args.m, w.v()}, args.out_dtype);
}

absl::Status CheckBackwardArgs(const Weight& w, const BackwardArgs& args) {
  constexpr absl::string_view kCall = "backward";
  RETURN_IF_ERROR_(CheckNotNull(kCall, "dy", args.dy));
  RETURN_IF_ERROR_(CheckFloatDType(kCall, "dy_dtype", args.dy_dtype));
  RETURN_IF_ERROR_(CheckRows(kCall, args.m));
  const bool want_dx = args.dx != nullptr;
  const bool return_dw = args.dw != nullptr && !args.accumulate_dw;
  if (!want_dx && !return_dw && !args.accumulate_dw) {
    return absl::InvalidArgumentError(
        "backward: nothing to compute: expected dx, dw or accumulate_dw, got none");
  }
  if (want_dx) RETURN_IF_ERROR_(CheckFloatDType(kCall, "dx_dtype", args.dx_dtype));
  if (return_dw) RETURN_IF_ERROR_(CheckFloatDType(kCall, "dw_dtype", args.dw_dtype));
  // dX = G.W needs no x; dW = G^T.X does.
  if ((return_dw || args.accumulate_dw) && args.x == nullptr) {
    return absl::InvalidArgumentError("backward: x is null but dW was asked for");
  }
  RETURN_IF_ERROR_(CheckBytes(kCall, "dy", {args.m, w.v()}, args.dy_dtype));
  RETURN_IF_ERROR_(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  if (want_dx) {
    RETURN_IF_ERROR_(CheckBytes(kCall, "dx", {args.m, w.k()}, args.dx_dtype));
  }
  if (return_dw || args.accumulate_dw) {
    // Returned in dw_dtype or accumulated in fp32: [V, K] fp32 bounds both.
    RETURN_IF_ERROR_(CheckBytes(kCall, "dw", {w.v(), w.k()}, DType::kFp32));
  }
  return absl::OkStatus();
}

absl::Status CheckCrossEntropyArgs(const Weight& w, const CrossEntropyArgs& args) {
  constexpr absl::string_view kCall = "cross entropy";
  RETURN_IF_ERROR_(CheckNotNull(kCall, "x", args.x));
  RETURN_IF_ERROR_(CheckNotNull(kCall, "targets", args.targets));
  RETURN_IF_ERROR_(CheckNotNull(kCall, "loss", args.loss));
  RETURN_IF_ERROR_(CheckRows(kCall, args.m));
  if (args.dx != nullptr) {
    RETURN_IF_ERROR_(CheckFloatDType(kCall, "dx_dtype", args.dx_dtype));
  }
  RETURN_IF_ERROR_(CheckCeOption("z_loss", args.z_loss, true));
  RETURN_IF_ERROR_(CheckCeOption("logit_softcap", args.logit_softcap, true));
  RETURN_IF_ERROR_(CheckCeOption("grad_scale", args.grad_scale, false));
  RETURN_IF_ERROR_(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
  if (args.dx != nullptr) {
    RETURN_IF_ERROR_(CheckBytes(kCall, "dx", {args.m, w.k()}, args.dx_dtype));
  }
  if (args.dw != nullptr || args.accumulate_dw) {
    RETURN_IF_ERROR_(CheckBytes(kCall, "dw", {w.v(), w.k()}, DType::kFp32));
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

absl::Status CheckLogProbsArgs(const Weight& w, const LogProbsArgs& args) {
  constexpr absl::string_view kCall = "log probs";
  RETURN_IF_ERROR_(CheckNotNull(kCall, "x", args.x));
  RETURN_IF_ERROR_(CheckRows(kCall, args.m));
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
    RETURN_IF_ERROR_(CheckNotNull(kCall, "topk_ids", args.topk_ids));
    RETURN_IF_ERROR_(CheckNotNull(kCall, "topk_logprobs", args.topk_logprobs));
  }
  RETURN_IF_ERROR_(CheckBytes(kCall, "x", {args.m, w.k()}, DType::kBf16));
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

absl::Status CheckCastArgs(const float* in, std::int64_t n, const Bf16Bits* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cast to bf16: expected n >= 0, got ", n));
  }
  if (n > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError("cast to bf16: in or out is null");
  }
  return absl::OkStatus();
}

absl::Status ForeignWeightError(absl::string_view call, absl::string_view backend,
                                const Weight& w) {
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": expected a weight loaded by the ", backend, " backend, got one ",
                   ShapeString({w.v(), w.k()}), " from another backend"));
}

#undef RETURN_IF_ERROR_

}  // namespace logitd::kernels

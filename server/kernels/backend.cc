#include "server/kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "logitd/reference/fp64_products.h"
#include "server/kernels/arg_checks.h"

namespace logitd::kernels {

Weight::Weight(std::int64_t v, std::int64_t k)
    : v_(v), k_(k), memo_(std::make_shared<WeightMemo>()) {}

namespace {}  // namespace

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

absl::Status ForeignWeightError(absl::string_view call, absl::string_view backend,
                                const Weight& w) {
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": expected a weight loaded by the ", backend, " backend, got one ",
                   ShapeString({w.v(), w.k()}), " from another backend"));
}

#undef RETURN_IF_ERROR_

}  // namespace logitd::kernels

#include "server/kernels/backend.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace logitd::kernels {

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

}  // namespace logitd::kernels

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

}  // namespace logitd::kernels
